//! The agent's messages on the program's standard error.
//!
//! `eprintln!` does not do inside someone else's process. It panics when
//! the write fails: stderr redirected to a file on a full disk, or a pipe
//! whose reader is gone in a program that ignores SIGPIPE. On the thread of
//! periodic and final reports, that panic ended the thread for good at the
//! first report the full disk refused, and with it every later report, the
//! final one too, even once there was room again. And it takes std's lock
//! of stderr, which a child forked while an agent thread held it would
//! wait for forever.
//!
//! A message here is one `write(2)` of a whole line, so that the lines of
//! concurrent writers do not mix, without a lock; when it fails, the
//! message is lost and nothing else.
//!
//! A write to a pipe whose reader is gone raises SIGPIPE in the writing
//! thread. The agent's threads block it for their whole life (see
//! `threads`). On a program thread (the constructor, `livecov::start`, a
//! forked child's new agent) it would end a program that keeps SIGPIPE's
//! default action, so it is blocked around the write there, and a SIGPIPE
//! the write raised is taken back before it is unblocked.

use std::fmt::{self, Write as _};
use std::io;

/// Writes `livecov: <message>` and a newline to descriptor 2.
pub fn say(message: fmt::Arguments<'_>) {
    let mut line = String::with_capacity(160);
    let _ = writeln!(line, "livecov: {message}");
    let _held = (!super::descriptors::on_agent_thread()).then(SigpipeHeld::new);
    let mut rest = line.as_bytes();
    while !rest.is_empty() {
        // Safety: writes bytes borrowed for the call.
        let written = unsafe { libc::write(2, rest.as_ptr().cast(), rest.len()) };
        match usize::try_from(written) {
            Ok(n) if n > 0 => rest = &rest[n.min(rest.len())..],
            Err(_) if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            _ => break,
        }
    }
}

/// SIGPIPE blocked in the calling thread while it lives; when dropped, a
/// SIGPIPE that became pending meanwhile is taken (unless one already was)
/// and the thread's mask is restored.
struct SigpipeHeld {
    old: libc::sigset_t,
    was_pending: bool,
}

impl SigpipeHeld {
    fn new() -> SigpipeHeld {
        // Safety: signal sets on the stack, filled by the calls that read them.
        unsafe {
            let pipe = sigpipe();
            let mut old = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &pipe, &mut old);
            SigpipeHeld { old, was_pending: sigpipe_pending() }
        }
    }
}

impl Drop for SigpipeHeld {
    fn drop(&mut self) {
        // Safety: as in `new`; a zero timeout never waits.
        unsafe {
            if !self.was_pending && sigpipe_pending() {
                let now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
                libc::sigtimedwait(&sigpipe(), std::ptr::null_mut(), &now);
            }
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut());
        }
    }
}

fn sigpipe() -> libc::sigset_t {
    // Safety: the set is initialized by sigemptyset before it is read.
    unsafe {
        let mut set = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        set
    }
}

fn sigpipe_pending() -> bool {
    // Safety: as in `sigpipe`.
    unsafe {
        let mut pending = std::mem::zeroed();
        libc::sigemptyset(&mut pending);
        libc::sigpending(&mut pending) == 0 && libc::sigismember(&pending, libc::SIGPIPE) == 1
    }
}
