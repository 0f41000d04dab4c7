//! `livecov merge`: LCOV files in, one merged LCOV report out.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::merge::Merger;
use crate::output::Output;
use crate::path_equivalence::PathEquivalence;
use crate::stderr::say;

#[derive(clap::Args, Debug)]
#[command(
    about = "Merge LCOV reports into one",
    long_about = "Merge LCOV reports into one: records are matched by test name (TN:) and source \
                  file (SF:); line (DA), function (FNDA) and branch (BRDA) counts are summed, and \
                  the summary records (LF/LH, FNF/FNH, BRF/BRH) recomputed. Reads the LCOV of \
                  livecov agents, llvm-cov, lcov/geninfo, c8 and coverage.py. A malformed line \
                  is an error naming the file and line.",
    after_help = "Examples:\n  \
                  livecov merge reports/*.lcov -o coverage.lcov\n  \
                  curl -s --unix-socket app.sock localhost/coverage | livecov merge - old.lcov > all.lcov\n  \
                  livecov merge image.lcov --path-equivalence /app/src,$PWD/src -o local.lcov"
)]
pub struct Args {
    /// LCOV files to merge; `-` reads standard input.
    #[arg(value_name = "FILE", required = true)]
    files: Vec<PathBuf>,
    /// Write the merged report here (atomically: a temporary file, then a
    /// rename) instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    output: Option<PathBuf>,
    /// Rewrite paths that start with the folder FROM to start with TO
    /// instead, as llvm-cov's -path-equivalence (and `livecov report`);
    /// repeatable, the first that applies wins. Records that end up with
    /// the same path are merged.
    #[arg(long, value_name = "FROM,TO", value_parser = PathEquivalence::parse)]
    path_equivalence: Vec<PathEquivalence>,
}

pub fn run(args: Args) -> Result<()> {
    let output = Output::open_derived(args.output.as_deref())?;
    let mut merger = merge_files(&args.files)?;
    if !args.path_equivalence.is_empty() {
        merger = merger.rekey(|test, file| Some((test.to_owned(), PathEquivalence::rewrite(&args.path_equivalence, file))));
    }
    let totals = merger.totals();
    output.commit_with(|w| merger.write_to(w))?;
    if let Some(out) = args.output.as_deref().filter(|o| *o != Path::new("-")) {
        say(format_args!(
            "livecov: merged {} file(s) into {}: {} record(s), {}",
            args.files.len(),
            out.display(),
            totals.records,
            totals.summary
        ));
    }
    Ok(())
}

/// Merges the files, in parallel over contiguous runs of them (merging is
/// associative, and each run is absorbed in order, so the result is the
/// one a sequential merge gives).
pub fn merge_files(files: &[PathBuf]) -> Result<Merger> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(files.len()).max(1);
    let chunk = files.len().div_ceil(threads).max(1);
    let parts: Vec<Result<Merger>> = std::thread::scope(|scope| {
        let workers: Vec<_> = files
            .chunks(chunk)
            .map(|chunk| {
                scope.spawn(move || {
                    let mut merger = Merger::new();
                    for file in chunk {
                        add_file(&mut merger, file)?;
                    }
                    Ok(merger)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    });
    let mut merger = Merger::new();
    for part in parts {
        merger.absorb(part?);
    }
    Ok(merger)
}

fn add_file(merger: &mut Merger, file: &Path) -> Result<()> {
    if file == Path::new("-") {
        let stdin = std::io::stdin();
        merger.add_reader("<stdin>", stdin.lock())?;
    } else {
        let f = File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
        merger.add_reader(&file.display().to_string(), f)?;
    }
    Ok(())
}
