//! `livecov dump` and `livecov reset`: one target's coverage, now.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::client::{self, Client, CoverageQuery, Target};
use crate::output::{Output, StdoutClosed};
use crate::stderr::say;

/// The target forms, shown after the examples of both commands.
macro_rules! target_forms {
    () => {
        "\n\nTARGET is one of:\n  \
         unix:/path/to.sock, PATH.sock   an agent's socket, $LIVECOV_DIR/sockets/<instance>.sock\n  \
         http://HOST:PORT                an agent's LIVECOV_LISTEN address (send --token), or a sidecar"
    };
}

/// How to reach a target.
#[derive(clap::Args, Debug)]
pub struct Connection {
    /// The agent: unix:/path/to.sock, a path ending in .sock, or http://HOST:PORT.
    #[arg(value_name = "TARGET")]
    target: Target,
    /// Bearer token for a TCP target (the process's LIVECOV_TOKEN); not sent to Unix sockets.
    #[arg(long, value_name = "TOKEN", env = "LIVECOV_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Read the bearer token from this file (its first line); --token wins over it.
    #[arg(long, value_name = "PATH", env = "LIVECOV_TOKEN_FILE", hide_env_values = true)]
    token_file: Option<PathBuf>,
    /// Give up when the answer is not complete after this many seconds.
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = parse_seconds)]
    timeout: Duration,
    /// Refuse answers larger than this many MiB.
    #[arg(long, value_name = "MIB", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    max_size: u64,
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.parse().map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(format!("{s}: give between 0 and 86400 seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}

impl Connection {
    fn client(&self) -> Result<Client> {
        let token = client::resolve_token(self.token.as_ref(), self.token_file.as_ref())?;
        Ok(Client::new(self.target.clone())
            .token(token)
            .timeout(self.timeout)
            .max_body(usize::try_from(self.max_size << 20).unwrap_or(usize::MAX)))
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// LCOV text
    Lcov,
    /// a raw profile per instrumented module, for llvm-profdata
    Profraw,
    /// per-file and total line, function and branch counts
    Json,
}

#[derive(clap::Args, Debug)]
#[command(
    about = "Write the live coverage of one running process (GET /coverage)",
    long_about = "Write the live coverage of one running process: what its agent's GET /coverage \
                  answers, cumulative since it started or was last reset. The instance that \
                  answered is printed on standard error.",
    after_help = concat!(
        "Examples:\n  \
         livecov dump $LIVECOV_DIR/sockets/rust-4711-9f2c3a1b0d4e5f60.sock -o app.lcov\n  \
         livecov dump unix:/cov/sockets/app.sock --test login --reset -o login.lcov\n  \
         livecov dump http://10.0.0.7:9464 --token-file /run/secrets/livecov-token --format json",
        target_forms!()
    )
)]
pub struct DumpArgs {
    #[command(flatten)]
    connection: Connection,
    /// Name the report's records (TN:NAME), e.g. after the test that just ran.
    #[arg(long, value_name = "NAME")]
    test: Option<String>,
    /// Reset the counters in the same step (no hit is lost between dump and reset).
    #[arg(long)]
    reset: bool,
    /// What to ask for.
    #[arg(long, value_enum, default_value_t = Format::Lcov)]
    format: Format,
    /// Write here (atomically) instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    output: Option<PathBuf>,
}

pub fn dump(args: DumpArgs) -> Result<()> {
    let client = args.connection.client()?;
    // Opened first, with room kept for a reset's result (its counts are
    // only in it): a reset must not happen when the result cannot be
    // written.
    let output = Output::open(args.output.as_deref())?;
    let reserved = if args.reset { output.reserve()? } else { None };
    if args.format == Format::Profraw && output.is_stdout() && std::io::stdout().is_terminal() {
        bail!("a raw profile is binary: write it to a file with -o OUT.profraw");
    }
    let query = CoverageQuery {
        test: args.test,
        reset: args.reset,
        format: match args.format {
            Format::Lcov => None,
            Format::Profraw => Some("profraw".to_owned()),
            Format::Json => Some("json".to_owned()),
        },
    };
    let response = client::block_on(client.coverage(&query)).context("cannot start the client runtime")??;
    say(format_args!(
        "livecov: instance {}: {} bytes{}",
        response.instance().unwrap_or("(unnamed)"),
        response.body.len(),
        if args.reset { ", counters reset" } else { "" }
    ));
    drop(reserved);
    match output.commit(&response.body) {
        Err(e) if args.reset && e.downcast_ref::<StdoutClosed>().is_some() => {
            bail!("{e}: the counts this dump reset are lost (write them to a file with -o OUT)")
        }
        written => written,
    }
}

#[derive(clap::Args, Debug)]
#[command(
    about = "Reset the coverage counters of one running process (POST /reset)",
    long_about = "Reset the coverage counters of one running process (POST /reset), e.g. before \
                  a test whose own coverage you want. To keep what was counted until now, use \
                  `livecov dump --reset` instead: it dumps and resets in one step.",
    after_help = concat!(
        "Examples:\n  \
         livecov reset $LIVECOV_DIR/sockets/rust-4711-9f2c3a1b0d4e5f60.sock\n  \
         livecov reset http://127.0.0.1:9464 --token \"$LIVECOV_TOKEN\"",
        target_forms!()
    )
)]
pub struct ResetArgs {
    #[command(flatten)]
    connection: Connection,
}

pub fn reset(args: ResetArgs) -> Result<()> {
    let client = args.connection.client()?;
    let instance = client::block_on(client.reset()).context("cannot start the client runtime")??;
    say(format_args!("livecov: reset instance {}", instance.as_deref().unwrap_or("(unnamed)")));
    Ok(())
}
