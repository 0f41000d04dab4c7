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
    std::thread::Builder::new().name(name.to_owned()).spawn(|| {
        super::descriptors::mark_agent_thread();
        f()
    })
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

/// Asks for short turns on a CPU for the calling thread: an EEVDF slice of
/// 0.1 ms (Linux 6.12 on; older kernels take the request and ignore it).
/// A thread that wakes with a shorter slice than the running thread's may
/// take the CPU at once, where it would wait for that thread's slice to end
/// (1.4 ms on 2 CPUs). A dump wakes the agent's threads at least twice (the
/// request, the blocking pool), and in a program that keeps its CPUs busy
/// those waits were most of a warm dump's time: mini-redis under
/// redis-benchmark, p50 over 8 runs each, 1.16-1.72 ms (median 1.41)
/// against 1.15-1.36 ms with it, but for one run at 1.73 (median 1.27),
/// for 0.58 ms of the agent's CPU. The thread's share of the CPU is its
/// weight's, which stays: its policy and nice value are kept, and a thread
/// of another policy (a real-time program's) is left as it is. For the
/// threads that answer requests, not the one of periodic reports (see
/// [`lower_priority`]).
pub fn ask_for_short_slices() {
    const SLICE_NS: u64 = 100_000;
    let Some(mut attr) = scheduling().filter(|a| a.sched_policy == libc::SCHED_OTHER as u32) else { return };
    attr.sched_runtime = SLICE_NS;
    // Safety: sched_setattr on the calling thread (0), with a struct of the
    // size it says. A refusal (a seccomp filter) leaves the thread as it
    // was, which works.
    unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const libc::sched_attr, 0) };
}

/// The calling thread's scheduling attributes (`None` where the kernel
/// refuses them), their size set for `sched_setattr`.
fn scheduling() -> Option<libc::sched_attr> {
    let size = std::mem::size_of::<libc::sched_attr>();
    // Safety: sched_getattr on the calling thread (0) fills a struct of the
    // size given; it is read only then.
    unsafe {
        let mut attr: libc::sched_attr = std::mem::zeroed();
        let got = libc::syscall(libc::SYS_sched_getattr, 0, &mut attr as *mut libc::sched_attr, size as libc::c_uint, 0);
        attr.size = size as u32;
        (got == 0).then_some(attr)
    }
}

/// Signals blocked in the calling thread until dropped (then its mask is
/// what it was).
pub(super) struct BlockedHere {
    before: libc::sigset_t,
}

impl BlockedHere {
    /// Every asynchronous signal.
    fn new() -> BlockedHere {
        // Safety: sigset_t is plain data, filled by sigfillset/sigdelset
        // before it is read.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut set);
            for signal in SYNCHRONOUS {
                libc::sigdelset(&mut set, signal);
            }
            BlockedHere::set(&set)
        }
    }

    /// `signal` alone.
    pub(super) fn only(signal: libc::c_int) -> BlockedHere {
        BlockedHere::set(&just(signal))
    }

    fn set(set: &libc::sigset_t) -> BlockedHere {
        // Safety: `before` is filled by pthread_sigmask before it is read.
        unsafe {
            let mut before: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, set, &mut before);
            BlockedHere { before }
        }
    }
}

/// The set of `signal` alone.
pub(super) fn just(signal: libc::c_int) -> libc::sigset_t {
    // Safety: the set is initialized by sigemptyset before it is read.
    unsafe {
        let mut set = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        set
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

    fn attributes() -> libc::sched_attr {
        scheduling().unwrap_or_else(|| panic!("sched_getattr: {}", io::Error::last_os_error()))
    }

    #[test]
    fn short_slices_keep_the_threads_policy_and_nice_value() {
        let (tx, rx) = std::sync::mpsc::channel();
        spawn("livecov-test", move || {
            lower_priority();
            let before = attributes();
            ask_for_short_slices();
            let after = attributes();
            let _ = tx.send((before.sched_policy, before.sched_nice, after.sched_policy, after.sched_nice, after.sched_runtime));
        })
        .unwrap()
        .join()
        .unwrap();
        let (policy, nice, policy_after, nice_after, slice) = rx.recv().unwrap();
        assert_eq!((policy_after, nice_after), (policy, nice));
        assert_eq!(nice_after, 10);
        // Kernels before 6.12 ignore the slice and report none.
        let mut uname: libc::utsname = unsafe { std::mem::zeroed() };
        // Safety: uname fills the struct it is given.
        unsafe { libc::uname(&mut uname) };
        let release: String = uname.release.iter().take_while(|&&c| c != 0).map(|&c| c as u8 as char).collect();
        let version: Vec<u32> = release.split(|c: char| !c.is_ascii_digit()).take(2).filter_map(|n| n.parse().ok()).collect();
        if version >= vec![6, 12] {
            assert_eq!(slice, 100_000, "kernel {release}");
        }
    }
}
