//! `livecov convert`: binary + raw or indexed profiles -> LCOV, offline.
//!
//! A drop-in for `llvm-profdata merge` followed by
//! `llvm-cov export -format=lcov`: same output, no LLVM tool, and raw and
//! indexed profiles from any LLVM 11 to 22 whatever LLVM is installed.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};

use anyhow::{bail, Context, Result};
use livecov::coverage::Coverage;
use livecov::lcov;
use livecov::mapping::CoverageMapping;
use livecov::profile::{is_indexed_profile, read_indexed_profile, Counters, NameTable, ProfileReader};
use livecov_cli::output::Output;
use livecov_cli::path_equivalence::PathEquivalence;
use livecov_cli::stderr::say;

#[derive(clap::Args)]
#[command(
    about = "Convert profiles (.profraw, .profdata) of an instrumented binary to LCOV",
    long_about = "Convert raw profiles (.profraw) and indexed profiles (.profdata) of an \
                  instrumented binary to LCOV, exactly as `llvm-profdata merge` + \
                  `llvm-cov export -format=lcov` of LLVM 22 would, without any LLVM tool.",
    after_help = "Examples:\n  livecov convert --binary target/debug/app --profraw default_*.profraw -o coverage.lcov\n  \
                  livecov convert --binary target/debug/app --instr-profile app.profdata -o coverage.lcov\n  \
                  livecov convert --go-coverdir covdata/ -o coverage.lcov"
)]
pub struct Args {
    /// The instrumented executable (or shared object) the profiles came from.
    #[arg(long, value_name = "PATH", required_unless_present = "go_coverdir")]
    binary: Option<PathBuf>,
    /// More instrumented objects whose coverage to include (shared objects).
    #[arg(long = "object", value_name = "PATH")]
    objects: Vec<PathBuf>,
    /// Raw profiles to merge; each file may hold several concatenated profiles.
    /// An indexed profile (.profdata) given here is recognised and merged too.
    #[arg(long, value_name = "FILE", num_args = 1.., required_unless_present_any = ["go_coverdir", "instr_profile"])]
    profraw: Vec<PathBuf>,
    /// An indexed profile (.profdata, from `llvm-profdata merge` of LLVM 11 to
    /// 22) to merge, after the raw profiles (repeatable).
    #[arg(long = "instr-profile", value_name = "FILE")]
    instr_profile: Vec<PathBuf>,
    /// Give the report of `llvm-profdata merge -sparse` + `llvm-cov export`
    /// (clang's documentation and cargo-llvm-cov merge with -sparse). It
    /// differs from the default only when objects given with --object share
    /// functions: which object's record of such a function is reported.
    #[arg(long, conflicts_with = "go_coverdir")]
    sparse: bool,
    /// As llvm-cov's -unify-instantiations: the branches of a template's or
    /// generic function's instantiations summed by place. llvm-cov 22's
    /// export sums them so without it too, and so does livecov: the report
    /// is the same either way.
    #[arg(long, conflicts_with = "go_coverdir")]
    unify_instantiations: bool,
    /// Instead of a binary and raw profiles: a Go GOCOVERDIR (covmeta and
    /// covcounters files, as a Go -cover build writes them), read with no Go tool.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["binary", "profraw", "instr_profile", "objects", "no_demangle", "skip_branches"])]
    go_coverdir: Option<PathBuf>,
    /// Write the LCOV report here instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    output: Option<PathBuf>,
    /// Leave out source files whose path matches this regular expression (repeatable).
    #[arg(long = "ignore-filename-regex", value_name = "RE")]
    ignore_filename_regex: Vec<String>,
    /// Print function names as the compiler wrote them (mangled).
    #[arg(long)]
    no_demangle: bool,
    /// Leave out FN/FNDA records.
    #[arg(long)]
    skip_functions: bool,
    /// Leave out branch records (BRDA, BRF, BRH).
    #[arg(long)]
    skip_branches: bool,
    /// Only the per-file summary records (FNF/FNH, BRF/BRH, LF/LH); in JSON,
    /// only each file's and the total summaries.
    #[arg(long)]
    summary_only: bool,
    /// `lcov`, or `json`: llvm-cov's JSON export (`llvm-cov export -format=text`),
    /// with regions, segments, branches and summaries; names as compiled.
    #[arg(long, value_enum, default_value_t = Format::Lcov, conflicts_with = "go_coverdir")]
    format: Format,
    /// Rewrite the source files' paths (SF:) that start with the folder FROM
    /// to start with TO instead (the build machine's paths to the
    /// checkout), as llvm-cov's -path-equivalence; repeatable, the first
    /// that applies wins. LCOV only.
    #[arg(long, value_name = "FROM,TO", value_parser = PathEquivalence::parse)]
    path_equivalence: Vec<PathEquivalence>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Lcov,
    Json,
}

pub fn run(args: Args) -> Result<()> {
    if let Some(dir) = &args.go_coverdir {
        return convert_go(dir, &args);
    }
    let binary = args.binary.as_deref().context("--binary is required")?;
    if args.format == Format::Json && !args.path_equivalence.is_empty() {
        bail!("--path-equivalence rewrites LCOV: leave it out with --format json, or convert to LCOV");
    }
    let options = lcov::Options {
        ignore_filename_regex: args
            .ignore_filename_regex
            .iter()
            .map(|re| regex_lite::Regex::new(re).with_context(|| format!("--ignore-filename-regex {re:?} is not a valid regular expression")))
            .collect::<Result<_>>()?,
        no_demangle: args.no_demangle,
        skip_functions: args.skip_functions,
        skip_branches: args.skip_branches,
        summary_only: args.summary_only,
        test_name: None,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };

    // The mapping and the profiles are read side by side. The binary's
    // names section is the one its profiles carry: the profiles' reader
    // hands the table it decoded to the mapping's.
    let (mapping, profiles) = std::thread::scope(|scope| {
        let (names, profile_names) = mpsc::sync_channel(1);
        let mapping = scope.spawn(|| load_mapping(binary, &args.objects, profile_names));
        let profiles = load_profiles(args.profraw.iter().chain(&args.instr_profile), names);
        let mapping = mapping.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (mapping, profiles)
    });
    let (mapping, build_ids) = mapping?;
    let (mut counters, profile_ids) = profiles?;
    counters.set_sparse(args.sparse);
    // Accepted for the scripts that pass it; see its help.
    let _ = args.unify_instantiations;
    for (path, ids) in &profile_ids {
        check_binary_ids(path, ids, &build_ids)?;
    }
    for w in counters.warnings() {
        say(format_args!("livecov: warning: {w}"));
    }

    // JSON shows MC/DC records; LCOV does not, and is spared finding them.
    let coverage = Coverage::load_on(&mapping, &counters, args.format == Format::Json, options.threads);
    if !coverage.mismatched.is_empty() {
        say(format_args!(
            "livecov: warning: {} functions have mismatched data (the binary does not match the profile; they are left out)",
            coverage.mismatched.len()
        ));
    }
    let write = |out: &mut dyn Write| match args.format {
        Format::Lcov if !args.path_equivalence.is_empty() => {
            // Rewritten whole: the engine's writes are not promised to be
            // whole lines.
            let mut text = Vec::new();
            lcov::write_to(&coverage, &options, &mut text)?;
            out.write_all(&PathEquivalence::rewrite_lcov(&args.path_equivalence, &text))
        }
        Format::Lcov => lcov::write_to(&coverage, &options, &mut &mut *out),
        Format::Json => livecov::json_export::write_to(&coverage, &options, &mut &mut *out),
    };
    Output::open_derived(args.output.as_deref())?.commit_with(|out| write(out))?;
    // The process ends here: freeing the coverage, the mapping and the
    // counters allocation by allocation would cost a tenth of the
    // conversion, and the kernel takes the memory back at once.
    std::mem::forget(coverage);
    std::mem::forget(mapping);
    std::mem::forget(counters);
    Ok(())
}

/// `--go-coverdir`: a GOCOVERDIR's meta-data and counter files to LCOV.
fn convert_go(dir: &Path, args: &Args) -> Result<()> {
    if args.skip_functions || args.summary_only {
        bail!("--skip-functions and --summary-only are not available with --go-coverdir");
    }
    let options = livecov_cli::go_coverage::Options {
        ignore: args
            .ignore_filename_regex
            .iter()
            .map(|re| regex_lite::Regex::new(re).with_context(|| format!("--ignore-filename-regex {re:?} is not a valid regular expression")))
            .collect::<Result<_>>()?,
    };
    let lcov = livecov_cli::go_coverage::lcov_from_dir(dir, &options)?;
    let lcov = PathEquivalence::rewrite_lcov(&args.path_equivalence, lcov.as_bytes());
    Output::open_derived(args.output.as_deref())?.commit(&lcov)
}

/// Objects and their build ids.
type BuildIds = Vec<(PathBuf, Vec<u8>)>;
/// Profile files and the build ids each of their profiles names.
type ProfileIds = Vec<(PathBuf, Vec<Vec<u8>>)>;

/// Reads the coverage mapping of the binary and the extra objects, with the
/// build id of each object that has one. The binary's names table comes
/// from `profile_names` when the profiles have the same names section.
fn load_mapping(
    binary: &Path,
    objects: &[PathBuf],
    profile_names: mpsc::Receiver<Arc<NameTable>>,
) -> Result<(CoverageMapping, BuildIds)> {
    let mut mapping = CoverageMapping::new();
    let mut build_ids = Vec::new();
    let mut found = false;
    for (i, path) in std::iter::once(binary).chain(objects.iter().map(PathBuf::as_path)).enumerate() {
        let image = map(path)?;
        let info = if i == 0 {
            mapping.add_object_with_names(&image, |section| match profile_names.recv() {
                Ok(table) if table.is_section(section) => Ok(table),
                // No profile read, or one of another module.
                _ => NameTable::decode(section).map(Arc::new),
            })
        } else {
            mapping.add_object(&image)
        };
        let info = info.with_context(|| format!("reading the coverage mapping of {}", path.display()))?;
        match info {
            Some(info) => {
                found = true;
                if let Some(id) = info.build_id {
                    build_ids.push((path.to_owned(), id));
                }
            }
            None => say(format_args!(
                "livecov: warning: {} has no coverage mapping (__llvm_covmap); was it built with \
                 -C instrument-coverage or -fprofile-instr-generate -fcoverage-mapping?",
                path.display()
            )),
        }
    }
    if !found {
        bail!(
            "no coverage mapping found in {}: build with -C instrument-coverage (Rust) or \
             -fprofile-instr-generate -fcoverage-mapping (clang), and do not strip it with llvm-strip",
            binary.display()
        );
    }
    Ok((mapping, build_ids))
}

/// Reads and merges the profiles, raw or indexed (told apart by their
/// magic), in order; returns the binary ids each raw profile names, for
/// checking against the objects. The first names table decoded goes to
/// `names` as soon as it is (dropped unsent when there is none).
fn load_profiles<'a>(
    paths: impl Iterator<Item = &'a PathBuf>,
    names: mpsc::SyncSender<Arc<NameTable>>,
) -> Result<(Counters, ProfileIds)> {
    let mut counters = Counters::new();
    let mut reader = ProfileReader::new();
    let mut ids = Vec::new();
    let mut names = Some(names);
    for path in paths {
        let data = read(path)?;
        if is_indexed_profile(&data) {
            match read_indexed_profile(&data).and_then(|profile| counters.add_indexed(profile)) {
                Ok(()) => continue,
                Err(e @ livecov::Error::Mismatch(_)) => {
                    return Err(e).with_context(|| format!("merging indexed profile {}", path.display()))
                }
                Err(e) => return Err(e).with_context(|| format!("reading indexed profile {}", path.display())),
            }
        }
        let first_names = |table: &Arc<NameTable>| {
            if let Some(names) = names.take() {
                // The mapping's reader may have finished without it.
                let _ = names.send(table.clone());
            }
        };
        match reader.read_into(&data, &mut counters, first_names) {
            Ok(profiles) => ids.extend(profiles.into_iter().map(|p| (path.clone(), p))),
            Err(e @ livecov::Error::Mismatch(_)) => {
                return Err(e).with_context(|| format!("merging raw profile {}", path.display()))
            }
            Err(e) => return Err(e).with_context(|| format!("reading raw profile {}", path.display())),
        }
    }
    Ok((counters, ids))
}

/// Maps an object file rather than reading it: only its headers and the
/// coverage sections are touched, a small part of a binary with debug info.
fn map(path: &Path) -> Result<memmap2::Mmap> {
    let file = fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    // Safety: the mapping is read-only and private to this process; a file
    // truncated underneath would fault, which a coverage build being
    // replaced while it is converted is not worth guarding against.
    unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("cannot map {}", path.display()))
}

fn read(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

/// A profile that names the build ids of the modules that wrote it must come
/// from one of the given objects.
fn check_binary_ids(profile: &Path, ids: &[Vec<u8>], objects: &[(PathBuf, Vec<u8>)]) -> Result<()> {
    if ids.is_empty() || objects.is_empty() {
        return Ok(());
    }
    if ids.iter().any(|id| objects.iter().any(|(_, o)| o == id)) {
        return Ok(());
    }
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let theirs: Vec<String> = ids.iter().map(|i| hex(i)).collect();
    let ours: Vec<String> = objects.iter().map(|(p, i)| format!("{} has {}", p.display(), hex(i))).collect();
    bail!(
        "{} was written by a binary with build id {}, but {}: pass the binary that wrote the profile",
        profile.display(),
        theirs.join(", "),
        ours.join(", ")
    )
}
