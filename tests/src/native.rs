//! The C agent as users build it (`liblivecov.so`), C programs of
//! `fixtures/native` built with clang-19 and coverage to run under it, and
//! commands free of the caller's livecov and profile environment.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::builder::{build_native, lock, without_outer_cargo};
use crate::tools::{require_profile_runtime, run_checked, system_tool, workspace_root};

/// `liblivecov.so` from `cargo build -p livecov-native --profile
/// release-native`, in `target/fixtures/native/cargo` (a target folder of
/// its own, not to wait for the cargo running the tests; the one
/// tests/tests/native.rs builds in, under the same lock), once per process.
pub fn liblivecov() -> &'static Path {
    static SO: OnceLock<PathBuf> = OnceLock::new();
    SO.get_or_init(|| {
        let target = workspace_root().join("target/fixtures/native/cargo");
        let _lock = lock(&target);
        let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        without_outer_cargo(&mut cargo);
        cargo
            .args(["build", "--quiet", "-p", "livecov-native", "--profile", "release-native"])
            .env("CARGO_TARGET_DIR", &target)
            .current_dir(workspace_root());
        run_checked(&mut cargo, "cargo build -p livecov-native --profile release-native");
        let so = target.join("release-native/liblivecov.so");
        assert!(so.is_file(), "cargo built no {}", so.display());
        so
    })
}

/// Builds each `(name, source)` of `fixtures/native` with clang-19 and
/// coverage (`-O0 -g -fprofile-instr-generate -fcoverage-mapping`, C99,
/// warnings as errors, threads) into `target/fixtures/<group>/<name>`,
/// again only when a source or a flag changed. Returns the programs in the
/// order given.
pub fn clang19_programs(group: &str, programs: &[(&str, &str)]) -> Vec<PathBuf> {
    let clang = system_tool("clang-19", "clang-19");
    require_profile_runtime(&clang, "libclang-rt-19-dev");
    let src = workspace_root().join("fixtures/native");
    let sources: Vec<PathBuf> = programs.iter().map(|(_, source)| src.join(source)).collect();
    let names: Vec<&str> = programs.iter().map(|(name, _)| *name).collect();
    let flags = [
        "-O0", "-g", "-fprofile-instr-generate", "-fcoverage-mapping", "-std=c99", "-D_GNU_SOURCE", "-Wall",
        "-Wextra", "-pedantic", "-Werror", "-pthread",
    ];
    build_native(&workspace_root().join("target/fixtures").join(group), &sources, &names, |dir| {
        programs
            .iter()
            .zip(&sources)
            .map(|((name, _), source)| {
                let mut command = Command::new(&clang);
                command.args(flags).arg("-o").arg(dir.join(name)).arg(source);
                command
            })
            .collect()
    })
}

/// `path` in the build of Debian's source package `package` that
/// `tests/scripts/deps-<package>.sh` made (`target/<package>/current`); a
/// missing build is a panic that says how to make it.
pub fn debian_build(package: &str, path: &str) -> PathBuf {
    let file = workspace_root().join("target").join(package).join("current").join(path);
    assert!(
        file.is_file(),
        "{} not found: run tests/scripts/deps-{package}.sh (`make test` runs it through install-deps.sh)",
        file.display()
    );
    file
}

/// `program` with none of the caller's `LIVECOV_*`, `LLVM_PROFILE_FILE` or
/// `LD_PRELOAD`: what a test sets is all the agent sees.
pub fn clean_command(program: &Path) -> Command {
    let mut command = Command::new(program);
    for (name, _) in std::env::vars() {
        if name.starts_with("LIVECOV_") || name == "LLVM_PROFILE_FILE" || name == "LD_PRELOAD" {
            command.env_remove(name);
        }
    }
    command
}

/// User and system CPU time of process `pid` so far, in clock ticks (10 ms).
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the process's stat");
    // After the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')').expect("a stat line").1.split_whitespace().collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

/// A daemon the test started (not its child, so not waited for), killed
/// when dropped: a test that fails leaves none running.
pub struct Daemon(pub u32);

impl Daemon {
    pub fn signal(&self, signal: i32) {
        // Safety: a signal to the daemon, whose pid the test read.
        assert_eq!(unsafe { libc::kill(self.0 as i32, signal) }, 0, "signal {signal} to daemon {}", self.0);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Safety: as above; no process left, nothing done.
        unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
    }
}
