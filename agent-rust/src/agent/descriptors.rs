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
//! report files by the code that opens them, the runtime's by the numbers
//! it took while it was built (the lowest free), of the kinds it makes.
//!
//! The server's connections are listed apart, for a forked child to close
//! its copies of them (see [`accept_listed`]).

use std::cell::{Cell, RefCell};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::task::Poll;

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

/// The numbers the agent leaves to the program, where it can: programs
/// put descriptors at small fixed numbers (a forked child hands them to
/// the program it runs next, `dup2(socket, 3)`, as socket activation
/// passes them), and a `dup2` onto one of the agent's closes it under the
/// agent. A child that made 3 to 12 its pipe's writing end put the pipe in
/// place of the runtime's `epoll` (the agent's thread stopped, with a
/// panic on the program's stderr; its `eventfd` could have written into
/// the pipe) and of the executable's file kept open (its final report
/// failed: "Permission denied").
const PROGRAM_NUMBERS: RawFd = 64;

/// `value`'s descriptor moved past [`PROGRAM_NUMBERS`] (a duplicate there,
/// the first closed), for a descriptor the agent keeps; as it was when the
/// kernel makes none there. Before it is listed ([`keep`]): the C shim
/// would refuse the close of a listed one.
pub fn moved_up<T: From<OwnedFd> + Into<OwnedFd>>(value: T) -> T {
    let fd: OwnedFd = value.into();
    // Safety: the result is a new descriptor, ours alone.
    let high = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, PROGRAM_NUMBERS) };
    if high < 0 {
        return T::from(fd);
    }
    drop(fd);
    // Safety: made just above, owned by nothing else.
    T::from(unsafe { OwnedFd::from_raw_fd(high) })
}

/// The free numbers below [`PROGRAM_NUMBERS`], taken until it is dropped:
/// the descriptors made meanwhile take higher ones. Only where no thread
/// of the program runs (a forked child, before `fork` returns there): a
/// program thread's would too.
pub struct ProgramNumbersHeld(Vec<RawFd>);

/// Takes the free numbers below [`PROGRAM_NUMBERS`] (duplicates of one
/// descriptor of our own), none when the process may not open many more
/// than those (`RLIMIT_NOFILE`): the agent's own would not fit past them.
pub fn hold_program_numbers() -> ProgramNumbersHeld {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // Safety: getrlimit into a value of the type it fills.
    let room = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0
        && limit.rlim_cur >= 4 * PROGRAM_NUMBERS as libc::rlim_t;
    ProgramNumbersHeld(if room { take_free(|_, fd| fd < PROGRAM_NUMBERS) } else { Vec::new() })
}

/// Whether the calling thread is the process's only one: then no thread of
/// the program opens a descriptor while the numbers are held.
pub fn only_thread() -> bool {
    std::fs::read_dir("/proc/self/task").is_ok_and(|tasks| tasks.count() == 1)
}

/// Takes free numbers, the lowest first (duplicates of one descriptor of
/// our own), while `more(how many taken, the next)` says so; the caller
/// closes them.
fn take_free(mut more: impl FnMut(usize, RawFd) -> bool) -> Vec<RawFd> {
    let mut taken = Vec::new();
    // Safety: a descriptor of our own, closed below or by the caller.
    let first = unsafe { libc::open(c"/".as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    let mut fd = first;
    while fd >= 0 {
        if !more(taken.len(), fd) {
            // Safety: ours, made here and not taken.
            unsafe { libc::close(fd) };
            break;
        }
        taken.push(fd);
        // Safety: duplicates our own descriptor.
        fd = unsafe { libc::fcntl(first, libc::F_DUPFD_CLOEXEC, 0) };
    }
    taken
}

impl Drop for ProgramNumbersHeld {
    fn drop(&mut self) {
        for &fd in &self.0 {
            // Safety: ours, made by `hold_program_numbers`.
            unsafe { libc::close(fd) };
        }
    }
}

/// How many descriptors a runtime makes at most, of those [`next_free`]
/// names: tokio's makes an `epoll` and an `eventfd`.
const RUNTIME_DESCRIPTORS: usize = 8;

/// The numbers the next descriptors made will take: the kernel gives each
/// new descriptor the lowest number free. Found by making them (each a
/// duplicate of the first), then closed. Not by listing /proc/self/fd: a
/// server has thousands open (its connections), and a forked child lists
/// them slowly (its entries are made as they are listed): with 1,000 open,
/// the child's agent took 15 ms to start, where the child of a program
/// without them took 1.
pub fn next_free() -> Vec<RawFd> {
    let free = take_free(|taken, _| taken < RUNTIME_DESCRIPTORS);
    for &fd in &free {
        // Safety: ours, made above.
        unsafe { libc::close(fd) };
    }
    free
}

/// Lists the descriptors of a runtime built since [`next_free`] named the
/// `free` numbers: of the kinds it makes (an `epoll` and an `eventfd`),
/// among those numbers. When a thread of the program took some of them
/// meanwhile, the runtime's came after them: then every descriptor open
/// from the first of them on is looked at. Another thread of the program
/// could make one of these kinds in the same instant; it would then stay
/// open when the program closes it.
pub fn keep_runtime_descriptors(free: &[RawFd]) {
    let mut found = [false; 2];
    for &fd in free {
        if let Some(kind) = runtime_kind(fd) {
            found[kind] = true;
            keep(fd);
        }
    }
    if found == [true, true] {
        return;
    }
    let Some(&lowest) = free.first() else { return };
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return };
    let open = dir.flatten().filter_map(|e| e.file_name().to_str()?.parse::<RawFd>().ok());
    for fd in open.filter(|fd| *fd >= lowest && !free.contains(fd)) {
        if runtime_kind(fd).is_some() {
            keep(fd);
        }
    }
}

/// Whether `fd` is an `epoll` (0) or an `eventfd` (1).
fn runtime_kind(fd: RawFd) -> Option<usize> {
    let target = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    match target.to_str()? {
        "anon_inode:[eventpoll]" => Some(0),
        "anon_inode:[eventfd]" => Some(1),
        _ => None,
    }
}

/// The connections the agent's server has open. A child the program forks
/// closes its copies of them ([`close_connections_in_child`]): left open
/// there, a connection the parent's agent answered and closed stayed open
/// at the client's end for as long as the child lived, and a client
/// reading to the end waited that long. A connection is accepted and
/// listed under this lock, and a fork waits for it ([`hold_for_fork`]):
/// a child then has every connection its parent's agent had, listed, and
/// no number listed that is not one of them. (Listed without the lock, a
/// fork between the `accept` and the listing, which copies the process's
/// descriptors and its memory one after the other, could list in the
/// child a number that is the program's there.)
static CONNECTIONS: Mutex<Vec<RawFd>> = Mutex::new(Vec::new());

thread_local! {
    /// The list, held by the thread that forks, from before the fork to
    /// after it (in both processes: see [`hold_for_fork`]).
    static HELD_FOR_FORK: RefCell<Option<MutexGuard<'static, Vec<RawFd>>>> = const { RefCell::new(None) };
}

fn connections() -> MutexGuard<'static, Vec<RawFd>> {
    // Poisoned only by a panic while pushing or removing a number, which
    // leaves the list whole.
    CONNECTIONS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A connection's place on the list of open connections, which it leaves
/// when dropped: to be dropped before the connection is closed (a number
/// listed after its close could be the program's next descriptor).
pub struct Listed(RawFd);

impl Drop for Listed {
    fn drop(&mut self) {
        let mut open = connections();
        if let Some(at) = open.iter().position(|&fd| fd == self.0) {
            open.swap_remove(at);
        }
    }
}

/// `accept` (which does not wait: a poll of a listener) with the list of
/// open connections locked, and the connection it accepted listed.
pub fn accept_listed<T: AsRawFd>(accept: impl FnOnce() -> Poll<std::io::Result<T>>) -> Poll<std::io::Result<(T, Listed)>> {
    let mut open = connections();
    accept().map_ok(|connection| {
        let fd = connection.as_raw_fd();
        open.push(fd);
        (connection, Listed(fd))
    })
}

/// How long a fork waits for the list of open connections, at most.
const FORK_WAIT_STEPS: u32 = 100;
const FORK_WAIT_STEP_NS: libc::c_long = 100_000;

/// Before a fork, on the thread that forks: takes the list of open
/// connections, which the agent's thread then neither adds to nor takes
/// from until [`release_after_fork`] (in the parent) or
/// [`close_connections_in_child`]. The agent's thread holds it for an
/// `accept` that does not wait, but which may allocate: where another
/// fork handler, run before this one, holds the lock of the allocator,
/// waiting for the list would wait forever. After 10 ms, the fork goes on
/// without it, and the child closes none.
pub fn hold_for_fork() {
    let step = libc::timespec { tv_sec: 0, tv_nsec: FORK_WAIT_STEP_NS };
    for _ in 0..FORK_WAIT_STEPS {
        let held = match CONNECTIONS.try_lock() {
            Ok(held) => held,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                // Safety: nanosleep with a valid timespec.
                unsafe { libc::nanosleep(&step, std::ptr::null_mut()) };
                continue;
            }
        };
        let _ = HELD_FOR_FORK.try_with(|slot| *slot.borrow_mut() = Some(held));
        return;
    }
}

/// After a fork, in the parent: lets the agent's thread list and unlist
/// connections again.
pub fn release_after_fork() {
    let _ = HELD_FOR_FORK.try_with(|slot| slot.borrow_mut().take());
}

/// In a forked child: closes the child's copies of its parent agent's
/// connections, and empties the list. The child's agent is a new one, with
/// connections of its own.
pub fn close_connections_in_child() {
    let _ = HELD_FOR_FORK.try_with(|slot| {
        let Some(mut open) = slot.borrow_mut().take() else { return };
        for fd in open.drain(..) {
            // Safety: a descriptor of the parent's agent, which nothing in
            // the child uses: its runtime did not survive the fork.
            unsafe { libc::close(fd) };
        }
    });
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

    /// Builds a runtime between [`next_free`] and
    /// [`keep_runtime_descriptors`], with `taken` descriptors made in
    /// between (as a program thread would), `held` made before: those
    /// kept are the runtime's `epoll` and `eventfd`, none of the program's.
    fn keeps_the_runtime_s_descriptors(held: usize, taken: usize) {
        let open = |n: usize| -> Vec<std::fs::File> { (0..n).map(|_| std::fs::File::open("/dev/null").unwrap()).collect() };
        let program = open(held);
        let free = next_free();
        let taken = open(taken);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
        keep_runtime_descriptors(&free);
        let mut own = [0; SLOTS];
        let n = own_in(0, RawFd::MAX, &mut own);
        let kept = &own[..n];
        let kinds: Vec<Option<usize>> = kept.iter().map(|&fd| runtime_kind(fd)).collect();
        assert!(kinds.contains(&Some(0)) && kinds.contains(&Some(1)), "kept {kept:?}, of kinds {kinds:?}");
        assert!(kinds.iter().all(Option::is_some), "kept {kept:?}, of kinds {kinds:?}");
        use std::os::fd::AsRawFd;
        assert!(program.iter().chain(&taken).all(|f| !is_own(f.as_raw_fd())));
        kept.iter().for_each(|&fd| forget(fd));
        drop(runtime);
    }

    #[test]
    fn a_kept_descriptor_moves_past_the_program_s_numbers() {
        use std::io::Read;
        let file = moved_up(std::fs::File::open("/proc/self/status").unwrap());
        assert!(file.as_raw_fd() >= PROGRAM_NUMBERS, "at {}", file.as_raw_fd());
        let mut status = String::new();
        (&file).read_to_string(&mut status).unwrap();
        assert!(status.starts_with("Name:"), "{status}");
    }

    /// Runs in a process of its own (this test binary again, this test
    /// alone): the other tests' threads open descriptors and list theirs
    /// in the same process-wide list, which would make the check flaky.
    #[test]
    fn the_runtime_s_descriptors_are_found_among_a_thousand_and_past_those_a_program_thread_took() {
        const ALONE: &str = "DESCRIPTORS_TEST_ALONE";
        if std::env::var_os(ALONE).is_some() {
            keeps_the_runtime_s_descriptors(1000, 0);
            keeps_the_runtime_s_descriptors(0, super::RUNTIME_DESCRIPTORS + 2);
            return;
        }
        let name = "agent::descriptors::tests::the_runtime_s_descriptors_are_found_among_a_thousand_and_past_those_a_program_thread_took";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", name, "--test-threads=1", "--nocapture"])
            .env(ALONE, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
    }
}
