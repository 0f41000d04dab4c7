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

use super::threads::{just, BlockedHere};

/// Writes `livecov: <message>` and a newline to descriptor 2.
pub fn say(message: fmt::Arguments<'_>) {
    let mut line = String::with_capacity(160);
    let _ = writeln!(line, "livecov: {message}");
    let held = (!super::descriptors::on_agent_thread()).then(|| (BlockedHere::only(libc::SIGPIPE), sigpipe_pending()));
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
    // A SIGPIPE the write raised is taken while still blocked (the mask
    // comes back when `_blocked` drops), unless one was pending before.
    if let Some((_blocked, false)) = held {
        if sigpipe_pending() {
            let now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // Safety: a zero timeout never waits.
            unsafe { libc::sigtimedwait(&just(libc::SIGPIPE), std::ptr::null_mut(), &now) };
        }
    }
}

fn sigpipe_pending() -> bool {
    // Safety: the set is initialized by sigemptyset before it is read.
    unsafe {
        let mut pending = std::mem::zeroed();
        libc::sigemptyset(&mut pending);
        libc::sigpending(&mut pending) == 0 && libc::sigismember(&pending, libc::SIGPIPE) == 1
    }
}
