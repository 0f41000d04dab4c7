//! The oracle: what real LLVM tools say about a run. `llvm-profdata merge`
//! (LLVM 13's or 14's for clang-13 or clang-14 profiles, LLVM 22's
//! otherwise), then LLVM 22's `llvm-cov export -format=lcov`.

use crate::tools::{llvm_tool, run_checked, system_tool};
use crate::{Fixture, Run, Toolchain};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The `llvm-profdata` that reads `toolchain`'s raw profiles: LLVM 22's (rustup
/// llvm-tools) for rustc and clang-19, Debian's llvm-profdata-14 for clang-14
/// and llvm-profdata-13 for clang-13 (LLVM 22 rejects raw profile versions 7
/// and 8).
pub fn profdata_tool(toolchain: Toolchain) -> PathBuf {
    match toolchain {
        Toolchain::Rustc | Toolchain::Clang19 => llvm_tool("llvm-profdata"),
        Toolchain::Clang14 => system_tool("llvm-profdata-14", "llvm-14"),
        Toolchain::Clang13 => system_tool("llvm-profdata-13", "llvm-13"),
    }
}

/// Merges the run's `.profraw` files into the indexed profile `output`.
pub fn merge_profdata(fixture: &Fixture, run: &Run, output: &Path) {
    let mut command = Command::new(profdata_tool(fixture.toolchain));
    command
        .args(["merge", "-o"])
        .arg(output)
        .args(&run.profraws);
    run_checked(
        &mut command,
        &format!("llvm-profdata merge of {}/{}", fixture.name, run.label),
    );
}

/// A fresh temporary path in the fixture's output folder (`target/fixtures/<name>/tmp`).
fn temp_path(fixture: &Fixture, extension: &str) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let dir = fixture
        .binary
        .parent()
        .expect("the binary is in a folder")
        .join("tmp");
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    dir.join(format!("{}-{n}.{extension}", std::process::id()))
}

/// LCOV of one run as LLVM 22 computes it: `llvm-cov export -format=lcov BINARY
/// [-object OBJ]... -instr-profile MERGED EXTRA_ARGS...`. Panics with llvm-cov's
/// stderr when it fails.
pub fn oracle_lcov(fixture: &Fixture, run: &Run, extra_args: &[&str]) -> String {
    let profdata = temp_path(fixture, "profdata");
    merge_profdata(fixture, run, &profdata);
    let mut command = Command::new(llvm_tool("llvm-cov"));
    command
        .args(["export", "-format=lcov"])
        .arg(&fixture.binary);
    for object in &fixture.objects {
        command.arg("-object").arg(object);
    }
    command
        .arg("-instr-profile")
        .arg(&profdata)
        .args(extra_args);
    let what = format!("llvm-cov export of {}/{}", fixture.name, run.label);
    let output = run_checked(&mut command, &what);
    let _ = std::fs::remove_file(&profdata);
    String::from_utf8(output.stdout).unwrap_or_else(|_| panic!("{what} printed non-UTF-8 LCOV"))
}

/// `llvm-cov export -format=FORMAT BINARY [-object OBJ]...` (LLVM 22) over
/// `profraws` merged in `dir`, leaving out what the Rust agent leaves out
/// by default (its `DEFAULT_IGNORE`, and its own sources): what a program
/// built with the agent crate must answer for the same moment.
pub fn rust_agent_oracle(format: &str, binary: &Path, objects: &[&Path], profraws: &[PathBuf], dir: &Path) -> String {
    let profdata = dir.join("merged.profdata");
    let mut merge = Command::new(llvm_tool("llvm-profdata"));
    merge.arg("merge").args(profraws).arg("-o").arg(&profdata);
    run_checked(&mut merge, "llvm-profdata merge");
    let mut command = Command::new(llvm_tool("llvm-cov"));
    command.arg("export").arg(format!("-format={format}")).arg(binary);
    for o in objects {
        command.arg("-object").arg(o);
    }
    let own = format!("{}/", crate::workspace_root().join("agent-rust/src").display());
    command
        .arg("-instr-profile")
        .arg(&profdata)
        .arg(format!("-ignore-filename-regex={}", livecov::agent::DEFAULT_IGNORE))
        .arg(format!("-ignore-filename-regex={}", regex_escape(&own)));
    let output = run_checked(&mut command, "llvm-cov export");
    String::from_utf8(output.stdout).expect("llvm-cov printed non-UTF-8")
}

/// `s` as a regular expression that matches it literally.
pub fn regex_escape(s: &str) -> String {
    s.chars().map(|c| if "\\.+*?()|[]{}^$".contains(c) { format!("\\{c}") } else { c.to_string() }).collect()
}
