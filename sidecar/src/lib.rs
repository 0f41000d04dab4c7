//! The library behind the `livecov` command: LCOV merging ([`merge`]), the
//! client of livecov agents ([`client`]), and the subcommands built on them.

pub mod client;
pub mod dump;
pub mod merge;
pub mod merge_command;
pub mod output;
