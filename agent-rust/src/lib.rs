//! livecov: LLVM source-based coverage, computed in-process.
//!
//! The engine turns an instrumented object's coverage mapping and a set of
//! counters into LCOV exactly as `llvm-cov export -format=lcov` (LLVM 22)
//! would. It is split along three seams so that a live agent can feed it
//! counters read from memory instead of a file:
//!
//! - [`mapping`]: what the compiler recorded about source regions (read once
//!   from the object file and cached);
//! - [`profile`]: where the counters come from (raw profiles on disk; live
//!   memory implements [`coverage::CounterSource`] the same way);
//! - [`coverage`] and [`lcov`]: the computation and the report;
//! - [`fleet`]: the same split across processes, for a collector that
//!   merges the counters of many processes of one build exactly.

#[cfg(feature = "agent")]
pub mod agent;
mod bytes;
pub mod coverage;
pub mod error;
mod file_pattern;
pub mod fleet;
pub mod json_export;
pub mod lcov;
pub mod mapping;
pub mod mcdc;
mod prefetch;
pub mod profile;

#[cfg(feature = "agent")]
pub use agent::{start, start_with, Config};
pub use bytes::Endian;
pub use error::{Error, Result};
