//! The library behind the `livecov` command: LCOV merging ([`merge`]), the
//! client of livecov agents ([`client`]), and the subcommands built on them:
//! `livecov sidecar` ([`sidecar`], with its live page, [`live_page`]) and
//! `livecov collect` ([`collect`]) over the targets of [`targets`], asked
//! through [`fanout`]; and `livecov report` ([`report`]): tables, Cobertura
//! XML and thresholds over merged LCOV; `livecov push` ([`push`]): a
//! collection to an OCI registry.
pub mod client;
pub mod collect;
pub mod dump;
pub mod fanout;
pub mod go_coverage;
pub mod live_page;
pub mod merge;
pub mod merge_command;
pub mod metrics;
pub mod output;
pub mod path_equivalence;
pub mod push;
pub mod report;
pub mod sidecar;
pub mod snapshot;
pub mod stderr;
pub mod targets;
