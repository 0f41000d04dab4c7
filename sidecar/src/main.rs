//! The `livecov` command.
//!
//! `livecov convert` turns an instrumented binary and its raw profiles into
//! LCOV with no LLVM tool installed; `livecov merge` merges LCOV reports;
//! `livecov dump` and `livecov reset` talk to one running agent. The sidecar
//! and collection subcommands build on the same library (`livecov_cli`).

mod convert;

use livecov_cli::{dump, merge_command};

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Convert(args) => convert::run(args),
        Command::Merge(args) => merge_command::run(args),
        Command::Dump(args) => dump::dump(args),
        Command::Reset(args) => dump::reset(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("livecov: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
