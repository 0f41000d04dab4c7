//! The `livecov` command.
//!
//! `livecov convert` turns an instrumented binary and its raw profiles into
//! LCOV with no LLVM tool installed; `livecov merge` merges LCOV reports;
//! `livecov dump` and `livecov reset` talk to one running agent;
//! `livecov sidecar` serves the merged coverage of many processes and
//! replicas, `livecov collect` collects it once. All are built on the same
//! library (`livecov_cli`).

mod convert;

use livecov_cli::{collect, dump, merge_command, sidecar};

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "livecov", version, about = "Live code coverage from running programs, as LCOV")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Convert(convert::Args),
    Merge(merge_command::Args),
    Dump(dump::DumpArgs),
    Reset(dump::ResetArgs),
    Sidecar(sidecar::Args),
    Collect(collect::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Convert(args) => convert::run(args),
        Command::Merge(args) => merge_command::run(args),
        Command::Dump(args) => dump::dump(args),
        Command::Reset(args) => dump::reset(args),
        Command::Sidecar(args) => sidecar::run(args),
        Command::Collect(args) => collect::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("livecov: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
