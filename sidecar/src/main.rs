//! The `livecov` command.
//!
//! `livecov convert` turns an instrumented binary and its raw profiles into
//! LCOV with no LLVM tool installed. The sidecar, collection and merge
//! subcommands build on the same engine (crate `livecov`).

mod convert;

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Convert(args) => convert::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("livecov: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
