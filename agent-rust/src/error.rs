//! The engine's error type.
//!
//! Every malformed input is an `Error` that names what was being read and
//! where (a byte offset into that input), so a user can tell a truncated
//! profile from a binary built without coverage.

use std::fmt;

/// What went wrong while reading coverage inputs or computing a report.
#[derive(Debug)]
pub enum Error {
    /// Bytes that do not follow the format they claim to be in.
    Malformed {
        /// Which input and structure, e.g. "raw profile data record".
        what: String,
        /// Byte offset into that input where the problem was found.
        offset: u64,
        /// What was wrong there.
        detail: String,
    },
    /// Well-formed input this engine does not handle (a version, a flag).
    Unsupported(String),
    /// Inputs that are each valid but do not belong together.
    Mismatch(String),
    /// An I/O error, with the path it concerned.
    Io { path: String, source: std::io::Error },
}

impl Error {
    pub(crate) fn malformed(what: impl Into<String>, offset: u64, detail: impl Into<String>) -> Self {
        Error::Malformed {
            what: what.into(),
            offset,
            detail: detail.into(),
        }
    }

    /// Prefixes the `what` of a malformed error with the input it came from.
    pub fn context(self, input: &str) -> Self {
        match self {
            Error::Malformed { what, offset, detail } => Error::Malformed {
                what: format!("{input}: {what}"),
                offset,
                detail,
            },
            Error::Unsupported(m) => Error::Unsupported(format!("{input}: {m}")),
            Error::Mismatch(m) => Error::Mismatch(format!("{input}: {m}")),
            other => other,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Malformed { what, offset, detail } => {
                write!(f, "malformed {what} at offset {offset:#x}: {detail}")
            }
            Error::Unsupported(m) | Error::Mismatch(m) => f.write_str(m),
            Error::Io { path, source } => write!(f, "{path}: {source}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
