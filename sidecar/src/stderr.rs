//! The command's messages on standard error.
//!
//! `eprintln!` panics when its write fails: stderr redirected to a full
//! disk, or a pipe whose reader is gone (Rust programs ignore SIGPIPE, so
//! the write returns EPIPE). A warning would then end a `merge` or a
//! `convert` before its result, a sidecar started with `--listen` and no
//! `--token` would end at its start, and a poll or a request of the
//! sidecar would end where it logs. A message here is one write of a whole
//! line; when it fails, the message is lost and nothing else.

use std::fmt;
use std::io::Write;

/// Writes `message` and a newline to standard error.
pub fn say(message: fmt::Arguments<'_>) {
    let line = format!("{message}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}
