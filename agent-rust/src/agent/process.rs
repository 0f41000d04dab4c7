//! Hooks into the host process: exit, `_exit`, SIGTERM/SIGINT and fork.
//!
//! Nothing here runs agent work inside a signal handler: the handler marks
//! the signal pending and wakes the agent's flush thread (a futex: no
//! descriptor, see [`Wakeup`]). That thread writes the final report,
//! restores the default action and raises the signal again, so the process
//! ends with the status the signal gives. Meanwhile the handler holds the
//! thread it interrupted: were it to return, the program would go on
//! (`pause`, `sleep`, `poll` return early after a handler) and might end
//! another way first, e.g. `exit(0)`, which is not what SIGTERM does to it.
//! Handlers the program installed itself are left alone.

use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bumped by each wake-up of the flush thread, which waits on it.
static WAKE_SEQUENCE: AtomicU32 = AtomicU32::new(0);
/// The wake-ups not yet taken, a bit each (see [`wake_bit`]).
static WAKE_PENDING: AtomicU64 = AtomicU64::new(0);
/// Whether a flush thread takes wake-ups.
static WAKE_OPEN: AtomicBool = AtomicBool::new(false);
/// Set when the flush thread will not end the process after all (the
/// program installed a handler of its own meanwhile): the held thread
/// goes on.
static RELEASED: AtomicBool = AtomicBool::new(false);
/// How long the handler holds its thread for the final report, at most;
/// then the process ends as the signal says, report or not. A thread in
/// `_exit` waits as long.
const FINAL_REPORT_WAIT: Duration = Duration::from_secs(10);
/// Bumped once the flush thread wrote the final report a thread in `_exit`
/// asked for (see [`wait_for_final_report`]).
static FINAL_REPORTS: AtomicU32 = AtomicU32::new(0);

/// The flush thread's wake-ups: signal numbers, and bytes of the agent's
/// own (0 asks the thread to end).
///
/// Kept in memory, not in a pipe: a daemon that closes every descriptor
/// at start (dnsmasq does) closed the pipe's two, and reused their numbers
/// for its own files, which the agent then wrote a byte to and read from,
/// in a loop that took a CPU. Written here because no crate offers a wait
/// that a signal handler may end: a futex (`FUTEX_WAKE` is a plain system
/// call, safe in a handler).
pub struct Wakeup(());

impl Wakeup {
    pub fn new() -> Wakeup {
        WAKE_PENDING.store(0, Ordering::SeqCst);
        WAKE_OPEN.store(true, Ordering::SeqCst);
        Wakeup(())
    }

    /// Waits up to `timeout` (forever when `None`); returns what woke it
    /// (the thread's end first, then a signal), if anything did.
    pub fn wait(&self, timeout: Option<Duration>) -> Option<i32> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let seen = WAKE_SEQUENCE.load(Ordering::SeqCst);
            if let Some(woken) = take_pending() {
                return Some(woken);
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left == Some(Duration::ZERO) {
                return None;
            }
            let left = left.map(|l| libc::timespec { tv_sec: l.as_secs() as libc::time_t, tv_nsec: l.subsec_nanos() as _ });
            let left_ptr = left.as_ref().map_or(std::ptr::null(), |l| l as *const libc::timespec);
            // Safety: a wait on our own atomic, with a relative timeout
            // (or none); it returns at once if the sequence moved.
            unsafe {
                libc::syscall(libc::SYS_futex, WAKE_SEQUENCE.as_ptr(), libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG, seen, left_ptr);
            }
        }
    }
}

/// No flush thread takes wake-ups any longer: it ended, did not start, or
/// (in a forked child) did not survive the fork.
pub fn close_wakeup() {
    WAKE_OPEN.store(false, Ordering::SeqCst);
}

/// A wake-up's bit: signal numbers are below 64, and the agent's own
/// bytes (0 and 255) do not share one with SIGTERM or SIGINT.
fn wake_bit(byte: u8) -> u64 {
    1 << (byte & 63)
}

/// The most urgent wake-up pending, taken: the end (0), then a signal,
/// then the agent's own (an `_exit`'s, a fork's that asks for records for
/// the children, then work done).
fn take_pending() -> Option<i32> {
    let pending = WAKE_PENDING.load(Ordering::SeqCst);
    let byte = match pending {
        0 => return None,
        p if p & 1 != 0 => 0,
        p if p & !wake_bit(255) != 0 => (p & !wake_bit(255)).trailing_zeros() as u8,
        _ => 255,
    };
    WAKE_PENDING.fetch_and(!wake_bit(byte), Ordering::SeqCst);
    Some(i32::from(byte))
}

/// Sends `byte` to the flush thread (0 asks it to end). False when there
/// is no flush thread to wake. Safe in a signal handler: atomics and a
/// system call.
pub fn wake_flush_thread(byte: u8) -> bool {
    if !WAKE_OPEN.load(Ordering::SeqCst) {
        return false;
    }
    WAKE_PENDING.fetch_or(wake_bit(byte), Ordering::SeqCst);
    WAKE_SEQUENCE.fetch_add(1, Ordering::SeqCst);
    // Safety: wakes the waiters of our own atomic.
    unsafe { libc::syscall(libc::SYS_futex, WAKE_SEQUENCE.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, i32::MAX) };
    true
}

/// Has the flush thread write the final report (`byte` asks for it, see
/// `agent::EXITING`) and waits until it is written, [`FINAL_REPORT_WAIT`]
/// at most; not when no flush thread takes wake-ups. Safe where `_exit`
/// is, in a signal handler: atomics and futex calls.
pub fn wait_for_final_report(byte: u8) {
    let seen = FINAL_REPORTS.load(Ordering::SeqCst);
    if !wake_flush_thread(byte) {
        return;
    }
    let deadline = Instant::now() + FINAL_REPORT_WAIT;
    while FINAL_REPORTS.load(Ordering::SeqCst) == seen {
        let left = deadline.saturating_duration_since(Instant::now());
        if left == Duration::ZERO {
            break;
        }
        let left = libc::timespec { tv_sec: left.as_secs() as libc::time_t, tv_nsec: left.subsec_nanos() as _ };
        // Safety: a wait on our own atomic, with a relative timeout; it
        // returns at once if the count moved.
        unsafe {
            libc::syscall(libc::SYS_futex, FINAL_REPORTS.as_ptr(), libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG, seen, &left);
        }
    }
}

/// Lets the threads in [`wait_for_final_report`] go on.
pub fn final_report_written() {
    FINAL_REPORTS.fetch_add(1, Ordering::SeqCst);
    // Safety: wakes the waiters of our own atomic.
    unsafe { libc::syscall(libc::SYS_futex, FINAL_REPORTS.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, i32::MAX) };
}

/// Lets a thread held in the handler go on (the flush thread will not end
/// the process).
fn release_held_thread() {
    RELEASED.store(true, Ordering::SeqCst);
}

extern "C" fn on_signal(signal: libc::c_int) {
    if !wake_flush_thread(signal as u8) {
        end_as_the_signal_would(signal);
        return;
    }
    // Hold this thread until the flush thread ends the process (nanosleep
    // and atomics are async-signal-safe; 1 ms steps cost nothing here).
    let step = libc::timespec { tv_sec: 0, tv_nsec: 1_000_000 };
    let steps = FINAL_REPORT_WAIT.as_millis() as u64;
    for _ in 0..steps {
        if RELEASED.load(Ordering::SeqCst) {
            return;
        }
        // Safety: nanosleep with a valid timespec.
        unsafe { libc::nanosleep(&step, std::ptr::null_mut()) };
    }
    end_as_the_signal_would(signal);
}

/// From inside the handler, without the agent: the default action back,
/// and the signal raised again on this thread, where it is blocked until
/// the handler returns, then ends the process.
fn end_as_the_signal_would(signal: libc::c_int) {
    set_default_action(signal);
    // Safety: raise is async-signal-safe.
    unsafe { libc::raise(signal) };
}

/// `signal` back to its default action (async-signal-safe: one sigaction).
fn set_default_action(signal: libc::c_int) {
    // Safety: a zeroed sigaction with SIG_DFL and an empty mask.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(signal, &action, std::ptr::null_mut());
    }
}

/// Installs the wake-up handler for SIGTERM and SIGINT where the program
/// left them at their default action.
pub fn install_signal_handlers() {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // Safety: sigaction with a zeroed struct queries the current action.
        unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut current) != 0 || current.sa_sigaction != libc::SIG_DFL {
                continue;
            }
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            // While one is held in the handler, the other waits.
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaddset(&mut action.sa_mask, libc::SIGTERM);
            libc::sigaddset(&mut action.sa_mask, libc::SIGINT);
            RELEASED.store(false, Ordering::SeqCst);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// Puts SIGTERM and SIGINT back to their default action where our handler
/// is installed (when the agent stops).
pub fn restore_signal_handlers() {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        if ours(signal) {
            set_default_action(signal);
        }
    }
}

/// Whether our handler is still the one installed for `signal` (the
/// program may have installed its own since).
fn ours(signal: i32) -> bool {
    // Safety: query only.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut current) == 0
            && current.sa_sigaction == on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t
    }
}

/// Ends the process as `signal` would have, after the final report: the
/// default action back, the signal sent to the process again, and the
/// thread held in the handler let go (where the program's other threads
/// block the signal, it is delivered as that thread returns from the
/// handler). If the program installed a handler of its own meanwhile, the
/// held thread just goes on.
pub fn reraise(signal: i32) {
    if ours(signal) {
        set_default_action(signal);
        // Safety: a signal to this process.
        unsafe { libc::kill(libc::getpid(), signal) };
    }
    release_held_thread();
}

/// Registers `at_exit` with the C runtime (runs on `exit`, also from Rust's
/// `std::process::exit` and a return from `main`), `prepare` before fork,
/// `parent` after it in the parent and `child` in the child.
pub fn install_exit_and_fork_hooks(
    at_exit: extern "C" fn(),
    prepare: extern "C" fn(),
    parent: extern "C" fn(),
    child: unsafe extern "C" fn(),
) {
    // Safety: plain registrations of `extern "C"` functions.
    unsafe {
        libc::atexit(at_exit);
        libc::pthread_atfork(Some(prepare), Some(parent), Some(child));
    }
}

/// The descriptor of this process's claim (see [`claim_process`]).
static CLAIM_FD: AtomicI32 = AtomicI32::new(-1);

/// Claims "the livecov agent of this process" for this copy of livecov: an
/// abstract Unix socket named after the pid namespace and the pid, which a
/// second copy in the same process (the C shim preloaded into a Rust
/// program that starts its own agent) cannot bind. It is closed on `exec`:
/// the next program of the process may claim it again. Where abstract
/// sockets are not available the claim is skipped.
pub fn claim_process() -> Result<(), String> {
    if CLAIM_FD.load(Ordering::SeqCst) >= 0 {
        return Ok(());
    }
    match bind_claim() {
        Claim::Taken => Err("another livecov agent already runs in this process (e.g. the C shim preloaded \
                             into a program that starts its own)"
            .into()),
        Claim::Unavailable => Ok(()),
        Claim::Bound(fd) => {
            // Safety: the descriptor just made, ours alone.
            let fd = super::descriptors::moved_up(unsafe { OwnedFd::from_raw_fd(fd) }).into_raw_fd();
            CLAIM_FD.store(fd, Ordering::SeqCst);
            super::descriptors::keep(fd);
            Ok(())
        }
    }
}

/// Whether an agent of this program runs in this process: this copy's,
/// or another copy's that holds the claim (see [`claim_process`]).
pub fn agent_runs_here() -> bool {
    if CLAIM_FD.load(Ordering::SeqCst) >= 0 {
        return true;
    }
    match bind_claim() {
        Claim::Taken => true,
        Claim::Unavailable => false,
        Claim::Bound(fd) => {
            // Safety: the descriptor just made.
            unsafe { libc::close(fd) };
            false
        }
    }
}

enum Claim {
    Bound(i32),
    Taken,
    Unavailable,
}

fn bind_claim() -> Claim {
    let namespace = std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| std::os::unix::fs::MetadataExt::ino(&m));
    let name = format!("livecov-agent-{namespace}-{}", std::process::id());
    // Safety: a socket, bound to an abstract address built in a zeroed
    // sockaddr_un (first byte of sun_path 0, the name after it).
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Claim::Unavailable;
        }
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (i, b) in name.bytes().enumerate().take(addr.sun_path.len() - 1) {
            addr.sun_path[i + 1] = b as libc::c_char;
        }
        let len = (std::mem::size_of::<libc::sa_family_t>() + 1 + name.len().min(addr.sun_path.len() - 1)) as libc::socklen_t;
        if libc::bind(fd, &addr as *const libc::sockaddr_un as *const libc::sockaddr, len) != 0 {
            let err = std::io::Error::last_os_error();
            libc::close(fd);
            return match err.raw_os_error() == Some(libc::EADDRINUSE) {
                true => Claim::Taken,
                false => Claim::Unavailable,
            };
        }
        Claim::Bound(fd)
    }
}

/// Gives the claim up (the agent stopped).
pub fn release_process() {
    let fd = CLAIM_FD.swap(-1, Ordering::SeqCst);
    if fd >= 0 {
        super::descriptors::forget(fd);
        // Safety: our own descriptor.
        unsafe { libc::close(fd) };
    }
}

/// In a forked child: the claim inherited is the parent's; drop our copy
/// of it (the child claims its own pid when its agent starts).
pub fn forget_claim_in_child() {
    release_process();
}
