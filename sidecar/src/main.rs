//! The `livecov` command.
//!
//! `livecov convert` turns an instrumented binary and its raw profiles into
//! LCOV with no LLVM tool installed; `livecov merge` merges LCOV reports,
//! `livecov report` reports on them (tables, Cobertura XML, thresholds);
//! `livecov dump` and `livecov reset` talk to one running agent;
//! `livecov sidecar` serves the merged coverage of many processes and
//! replicas, `livecov collect` collects it once, and `livecov push` sends
//! a collection to an OCI registry. All are built on the same
//! library (`livecov_cli`).

mod convert;

use livecov_cli::stderr::say;
use livecov_cli::{collect, dump, merge_command, output, push, report, sidecar};

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
    Report(report::Args),
    Dump(dump::DumpArgs),
    Reset(dump::ResetArgs),
    Sidecar(sidecar::Args),
    Collect(collect::Args),
    Push(push::Args),
}

/// Caps glibc's malloc arenas at two. glibc gives a thread that allocates
/// while others do an arena of its own, and keeps memory freed there for
/// that arena: the checks of answers and the merges run on tokio's blocking
/// threads, each of which would keep the megabytes it decoded (a sidecar
/// over 48 redis processes under traffic peaked at 122 MiB, 50 MiB so; a
/// collect of them at 55 MiB, 39 MiB so). `MALLOC_ARENA_MAX`, when set, wins.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn cap_malloc_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // Safety: called in main before any thread starts; mallopt
        // only sets an allocator parameter.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 2) };
    }
}

/// Lets glibc's malloc grow its heaps in large steps and never give memory
/// back, for a command that ends once its one result is out: a conversion
/// otherwise grows and trims its threads' heaps page by page (`livecov
/// convert` of a 16k-function binary: 1720 mprotect calls and 8915 page
/// faults, against 12 and 7614). The pages are still only taken as they
/// are used. `MALLOC_TOP_PAD_` or `MALLOC_TRIM_THRESHOLD_`, when set, win.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn grow_malloc_heaps_in_large_steps() {
    if std::env::var_os("MALLOC_TOP_PAD_").is_none() && std::env::var_os("MALLOC_TRIM_THRESHOLD_").is_none() {
        // Safety: called before any thread starts; mallopt only sets
        // allocator parameters.
        unsafe {
            libc::mallopt(libc::M_TOP_PAD, 16 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        }
    }
}

/// Starts `convert` again, once, with glibc's malloc backing its heaps with
/// transparent huge pages. Where the kernel gives them only to memory that
/// asks (`madvise`, the usual setting), glibc asks only when told so as the
/// process starts (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`), and a
/// conversion fills tens of megabytes of fresh heap page by page otherwise
/// (ripgrep's 16k functions: 7051 page faults, 2405 so, and 10% less
/// time; the restart costs under 1 ms). Does nothing when `GLIBC_TUNABLES`
/// names the setting already (which also ends the restarts), or when the
/// kernel gives huge pages to all memory or to none; returns when the exec
/// fails, and the conversion runs as it is.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn restart_with_huge_pages() {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    const HUGETLB: &[u8] = b"glibc.malloc.hugetlb";
    let mut tunables = std::env::var_os("GLIBC_TUNABLES").unwrap_or_default();
    if tunables.as_bytes().windows(HUGETLB.len()).any(|w| w == HUGETLB) {
        return;
    }
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if !thp.contains("[madvise]") {
        return;
    }
    if !tunables.is_empty() {
        tunables.push(":");
    }
    tunables.push("glibc.malloc.hugetlb=1");
    // The executable by its own path (not /proc/self/exe, whose name the
    // process would then show in ps).
    let Ok(exe) = std::env::current_exe() else { return };
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_default();
    let _ = std::process::Command::new(exe).arg0(arg0).args(args).env("GLIBC_TUNABLES", tunables).exec();
}

fn main() -> ExitCode {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // First: the restarted process parses the arguments and caps the
        // arenas itself.
        if std::env::args_os().nth(1).is_some_and(|command| command == "convert") {
            restart_with_huge_pages();
        }
        cap_malloc_arenas();
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Convert(args) => {
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            grow_malloc_heaps_in_large_steps();
            convert::run(args)
        }
        Command::Merge(args) => merge_command::run(args),
        Command::Report(args) => report::run(args),
        Command::Dump(args) => dump::dump(args),
        Command::Reset(args) => dump::reset(args),
        Command::Sidecar(args) => sidecar::run(args),
        Command::Collect(args) => collect::run(args),
        Command::Push(args) => push::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<output::StdoutClosed>().is_some() => ExitCode::SUCCESS,
        Err(e) => {
            match e.downcast_ref::<report::UnderThreshold>() {
                // Not an error: the report was written, and the gate says why it fails.
                Some(under) => under.0.iter().for_each(|line| say(format_args!("livecov: {line}"))),
                None => say(format_args!("livecov: error: {e:#}")),
            }
            ExitCode::FAILURE
        }
    }
}
