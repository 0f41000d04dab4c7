//! The threads livecov starts inside someone else's process, and the one
//! rule they keep: they take none of its asynchronous signals.
//!
//! The kernel delivers a process-directed signal to any thread that does not
//! block it. A program that blocks a signal in its own threads and waits for
//! it (`sigsuspend`, `sigwait`, `signalfd`: the master loop of nginx and of
//! many C daemons) would otherwise have it delivered to one of ours: its
//! handler runs on our thread, the thread that waits is never woken, and the
//! program hangs. So every thread livecov starts blocks every asynchronous
//! signal for its whole life, and the program's own threads receive them
//! exactly as without the agent. (SIGTERM and SIGINT reach the agent through
//! the handler of `process.rs`, which runs on a program thread and only
//! writes to a pipe.)
//!
//! A new thread inherits the signal mask of the thread that creates it, so
//! the mask is set around the creation: set first thing in the new thread,
//! it would leave a window in which a signal could still land there. Threads
//! our threads create (tokio's blocking pool) inherit it in turn.
//!
//! Synchronous signals stay unblocked: they are a fault of the thread that
//! raised them, and a fault while they are blocked kills the process without
//! its handler. glibc's own internal signals (thread cancellation, `setuid`
//! across threads) cannot be blocked by `pthread_sigmask` and are not.

use std::io;
use std::thread::JoinHandle;

/// Signals raised by a fault of the running thread itself.
const SYNCHRONOUS: [libc::c_int; 6] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGSYS];

/// Starts a named thread that blocks every asynchronous signal.
pub fn spawn<F>(name: &str, f: F) -> io::Result<JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    let _blocked = BlockedHere::new();
    std::thread::Builder::new().name(name.to_owned()).spawn(f)
}

/// Lowers the calling thread's scheduling priority (nice 10; on Linux the
/// nice value is per thread, and a new thread takes its creator's). For
/// the thread of periodic and final reports, which nobody waits for; not
/// for dumps: a warm one computes in a millisecond or a few, and at nice 10
/// waited for a busy CPU several times as long (fixtures/service under
/// traffic: p50 1.60 ms against 1.23, p95 7.2 ms against 3.2).
pub fn lower_priority() {
    // Safety: setpriority on our own thread id.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10);
    }
}

/// The asynchronous signals, blocked in the calling thread until dropped
/// (then its mask is what it was).
struct BlockedHere {
    before: libc::sigset_t,
}

impl BlockedHere {
    fn new() -> BlockedHere {
        // Safety: sigset_t is plain data, filled by sigfillset/sigdelset and
        // pthread_sigmask before it is read.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut set);
            for signal in SYNCHRONOUS {
                libc::sigdelset(&mut set, signal);
            }
            let mut before: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut before);
            BlockedHere { before }
        }
    }
}

impl Drop for BlockedHere {
    fn drop(&mut self) {
        // Safety: restores the mask saved by `new` on this same thread.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.before, std::ptr::null_mut()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked_in_this_thread(signal: libc::c_int) -> bool {
        // Safety: a query of this thread's mask into a local.
        unsafe {
            let mut mask: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut mask);
            libc::sigismember(&mask, signal) == 1
        }
    }

    #[test]
    fn a_spawned_thread_blocks_asynchronous_signals_and_the_caller_keeps_its_mask() {
        let before = blocked_in_this_thread(libc::SIGUSR1);
        let seen = spawn("livecov-test", || {
            let async_blocked = [libc::SIGTERM, libc::SIGINT, libc::SIGQUIT, libc::SIGHUP, libc::SIGUSR1, libc::SIGCHLD]
                .iter()
                .all(|&s| blocked_in_this_thread(s));
            let sync_open = SYNCHRONOUS.iter().all(|&s| !blocked_in_this_thread(s));
            assert!(async_blocked && sync_open);
        })
        .unwrap()
        .join();
        assert!(seen.is_ok(), "the thread's mask is not as it should be");
        assert_eq!(blocked_in_this_thread(libc::SIGUSR1), before);
    }
}
