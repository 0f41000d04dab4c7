//! The agent's own descriptors, kept from a program that closes every
//! descriptor it did not open.
//!
//! Daemons close every descriptor above standard error as they start
//! (dnsmasq loops `close` over all of them; others call `closefrom` or
//! `close_range`): the agent's socket, its runtime's `epoll` and `eventfd`
//! and its report files went with them, the agent answered no more dumps,
//! and the program's next files took their numbers, which the agent's
//! runtime and reports still used. The C shim, preloaded or linked,
//! answers the program's `close`, `close_range` and `closefrom` in the C
//! library's place, and leaves the descriptors listed here open: to the
//! program they are as closed (`EBADF`), as they would be without the
//! agent. The agent's own threads close them as usual.
//!
//! A descriptor is listed as soon as the agent made it: the socket and
//! report files by the code that opens them, the runtime's by what appeared
//! in `/proc/self/fd` while it was built, of the kinds it makes.

use std::cell::Cell;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// Room for the agent's descriptors: a socket or two, a claim, three report
/// files, and a runtime's three.
pub const SLOTS: usize = 32;

static OWN: [AtomicI32; SLOTS] = [const { AtomicI32::new(-1) }; SLOTS];

/// Whether the agent is starting in the background (from the C shim's
/// constructor), making descriptors not listed yet: the program's closes
/// wait for it (see [`wait_for_start`]).
static STARTING: AtomicBool = AtomicBool::new(false);

/// How long a program's close waits for the agent's start, at most.
const START_WAIT_STEPS: u32 = 20_000;
const START_WAIT_STEP_NS: libc::c_long = 100_000;

thread_local! {
    /// Whether this thread is one of the agent's.
    static AGENT_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Lists `fd` as the agent's (silently not when every slot is taken: it is
/// then as unprotected as before).
pub fn keep(fd: RawFd) {
    if fd < 0 || is_own(fd) {
        return;
    }
    for slot in &OWN {
        if slot.compare_exchange(-1, fd, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            return;
        }
    }
}

/// Takes `fd` off the list (the agent closes it, or it is not the agent's
/// any longer).
pub fn forget(fd: RawFd) {
    if fd < 0 {
        return;
    }
    for slot in &OWN {
        let _ = slot.compare_exchange(fd, -1, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// Takes every descriptor off the list: in a forked child, the parent's
/// agent's are not the child's.
pub fn forget_all() {
    for slot in &OWN {
        slot.store(-1, Ordering::SeqCst);
    }
}

/// Whether `fd` is one of the agent's.
pub fn is_own(fd: RawFd) -> bool {
    fd >= 0 && OWN.iter().any(|slot| slot.load(Ordering::Relaxed) == fd)
}

/// The agent's descriptors in `first..=last`, ascending, in `out`; how
/// many. Safe in a signal handler and after a fork (no allocation).
pub fn own_in(first: RawFd, last: RawFd, out: &mut [RawFd; SLOTS]) -> usize {
    let mut n = 0;
    for slot in &OWN {
        let fd = slot.load(Ordering::Relaxed);
        if fd >= first && fd <= last && fd >= 0 {
            out[n] = fd;
            n += 1;
        }
    }
    out[..n].sort_unstable();
    n
}

/// Whether the calling thread is one of the agent's.
pub fn on_agent_thread() -> bool {
    AGENT_THREAD.try_with(Cell::get).unwrap_or(false)
}

/// Marks the calling thread as one of the agent's: its closes are the
/// agent's own.
pub fn mark_agent_thread() {
    AGENT_THREAD.with(|t| t.set(true));
}

/// Says that the agent starts in the background (`true`), or is done
/// starting, listening or not (`false`).
pub fn starting(on: bool) {
    STARTING.store(on, Ordering::SeqCst);
}

/// On a program's thread, while the agent starts in the background: waits
/// until it is done (a few milliseconds; 2 s at most). A daemon closes
/// every descriptor as its `main` begins, while the agent's thread makes
/// its socket, runtime and files, and lists them only once made: dnsmasq
/// closed the listing of /proc/self/fd the agent was reading, and the
/// agent did not start. Safe in a signal handler (`nanosleep`).
pub fn wait_for_start() {
    if !STARTING.load(Ordering::SeqCst) || on_agent_thread() {
        return;
    }
    let step = libc::timespec { tv_sec: 0, tv_nsec: START_WAIT_STEP_NS };
    for _ in 0..START_WAIT_STEPS {
        if !STARTING.load(Ordering::SeqCst) {
            return;
        }
        // Safety: nanosleep with a valid timespec.
        unsafe { libc::nanosleep(&step, std::ptr::null_mut()) };
    }
}

/// Whether a close of `fd` by the calling thread may go ahead: any
/// descriptor but the agent's, and the agent's on its own threads (then
/// taken off the list first); once the agent started (see
/// [`wait_for_start`]). Safe in a signal handler and after a fork:
/// atomics, a thread-local flag and `nanosleep`.
pub fn may_close(fd: RawFd) -> bool {
    wait_for_start();
    if !is_own(fd) {
        return true;
    }
    if on_agent_thread() {
        forget(fd);
        return true;
    }
    false
}

/// The descriptors open now of the kinds an async runtime makes (`epoll`,
/// `eventfd`), ascending (none when `/proc` cannot say).
pub fn runtime_kinds_open() -> Vec<RawFd> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return Vec::new() };
    let runtime_kind = |fd: &RawFd| {
        std::fs::read_link(format!("/proc/self/fd/{fd}"))
            .is_ok_and(|target| matches!(target.to_str(), Some("anon_inode:[eventpoll]" | "anon_inode:[eventfd]")))
    };
    let mut fds: Vec<RawFd> = dir.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).filter(runtime_kind).collect();
    fds.sort_unstable();
    fds
}

/// Lists the descriptors of [`runtime_kinds_open`] now that were not open
/// `before`: those of a runtime built between the two (another thread of
/// the program could make one of these kinds in the same instant; it
/// would then stay open when the program closes it).
pub fn keep_runtime_descriptors(before: &[RawFd]) {
    for fd in runtime_kinds_open() {
        if before.binary_search(&fd).is_err() {
            keep(fd);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_agents_threads_close_its_descriptors() {
        keep(1000);
        keep(1000);
        assert!(is_own(1000) && !is_own(1001));
        assert!(may_close(1001));
        assert!(!may_close(1000), "a program thread closed one of the agent's descriptors");
        let agent = std::thread::spawn(|| {
            mark_agent_thread();
            may_close(1000)
        });
        assert!(agent.join().unwrap());
        assert!(!is_own(1000), "closed by the agent, still listed");
        assert!(may_close(1000));
    }
}
