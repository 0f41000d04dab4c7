//! `livecov convert --format json` against `llvm-profdata merge` +
//! `llvm-cov export -format=text` of LLVM 22: byte-identical documents for
//! every fixture and run, in full, with `--summary-only`, `--skip-functions`
//! and `--ignore-filename-regex`.

use std::path::{Path, PathBuf};
use std::process::Command;

use livecov_tests::{fixture, livecov_bin, llvm_tool, merge_profdata, run_checked, Fixture, Run};

/// Pairs of (livecov flags, llvm-cov flags) that must give the same output.
const FLAG_SETS: &[(&[&str], &[&str])] = &[
    (&[], &[]),
    (&["--summary-only"], &["-summary-only"]),
    (&["--skip-functions"], &["-skip-functions"]),
    (&["--ignore-filename-regex", r"shared\.h$|/shapes/|plugin\.c$"], &[r"-ignore-filename-regex=shared\.h$|/shapes/|plugin\.c$"]),
];

fn convert(f: &Fixture, run: &Run, flags: &[&str]) -> String {
    let mut cmd = Command::new(livecov_bin());
    cmd.args(["convert", "--format", "json", "--binary"]).arg(&f.binary);
    for o in &f.objects {
        cmd.arg("--object").arg(o);
    }
    cmd.arg("--profraw").args(&run.profraws).args(flags);
    let out = cmd.output().expect("run livecov convert");
    assert!(
        out.status.success(),
        "livecov convert failed for {} / {}: {}",
        f.name,
        run.label,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("JSON is UTF-8")
}

fn oracle(f: &Fixture, profdata: &Path, flags: &[&str]) -> String {
    let mut cmd = Command::new(llvm_tool("llvm-cov"));
    cmd.args(["export", "-format=text"]).arg(&f.binary);
    for o in &f.objects {
        cmd.arg("-object").arg(o);
    }
    cmd.arg("-instr-profile").arg(profdata).args(flags);
    let out = run_checked(&mut cmd, &format!("llvm-cov export -format=text of {}", f.name));
    String::from_utf8(out.stdout).expect("llvm-cov's JSON is UTF-8")
}

/// Fails showing where the documents part, and whether they differ as
/// values too or only in how they are written.
fn assert_same(context: &str, ours: &str, expected: &str) {
    if ours == expected {
        return;
    }
    let at = ours.bytes().zip(expected.bytes()).position(|(a, b)| a != b).unwrap_or(ours.len().min(expected.len()));
    let around = |s: &str| String::from_utf8_lossy(&s.as_bytes()[at.saturating_sub(200)..(at + 200).min(s.len())]).into_owned();
    let parse = |s: &str| serde_json::from_str::<serde_json::Value>(s).ok();
    let same_values = parse(ours).is_some() && parse(ours) == parse(expected);
    panic!(
        "{context}: livecov differs from llvm-cov at byte {at} (same values: {same_values})\n--- livecov ---\n{}\n--- llvm-cov ---\n{}",
        around(ours),
        around(expected),
    );
}

fn check_fixture(name: &str) {
    let f = fixture(name);
    for run in &f.runs {
        let profdata: PathBuf = run.dir.join("json-export.profdata");
        merge_profdata(f, run, &profdata);
        for (ours_flags, llvm_flags) in FLAG_SETS {
            let context = format!("{} / run {} / flags {:?}", f.name, run.label, ours_flags);
            let expected = oracle(f, &profdata, llvm_flags);
            assert!(expected.contains("\"filename\""), "{context}: the oracle reported no file");
            assert_same(&context, &convert(f, run, ours_flags), &expected);
        }
        let _ = std::fs::remove_file(&profdata);
    }
}

#[test]
fn rust_fixture_matches_llvm_cov() {
    check_fixture("rust");
}

#[test]
fn c_clang19_fixture_matches_llvm_cov() {
    check_fixture("c-clang19");
}

#[test]
fn c_clang14_fixture_matches_llvm_cov() {
    check_fixture("c-clang14");
}

#[test]
fn c_clang13_fixture_matches_llvm_cov() {
    check_fixture("c-clang13");
}

#[test]
fn cpp_fixture_matches_llvm_cov() {
    check_fixture("cpp");
}

#[test]
fn shared_object_fixture_matches_llvm_cov() {
    check_fixture("sharedlib");
}

/// The comparisons above mean something only if the documents carry what
/// LCOV cannot: branches (clang-19 writes branch regions), macro
/// expansions with their own branches, and percentages that are not whole.
#[test]
fn the_clang19_document_has_branches_expansions_and_fractional_percentages() {
    let f = fixture("c-clang19");
    let run = f.runs.last().expect("a run");
    let doc: serde_json::Value = serde_json::from_str(&convert(f, run, &[])).expect("valid JSON");
    let data = &doc["data"][0];
    let files = data["files"].as_array().expect("files");
    let nonempty = |v: &serde_json::Value| v.as_array().is_some_and(|a| !a.is_empty());
    assert!(files.iter().any(|file| nonempty(&file["branches"])), "no file has branches");
    assert!(
        files.iter().any(|file| file["expansions"].as_array().is_some_and(|e| e.iter().any(|e| nonempty(&e["branches"])))),
        "no expansion has branches"
    );
    assert!(data["functions"].as_array().is_some_and(|fs| fs.iter().any(|f| nonempty(&f["branches"]))));
    let percent = data["totals"]["lines"]["percent"].as_f64().expect("a percentage");
    assert!(percent.fract() != 0.0, "the fixture's line coverage is a whole number: {percent}");
    assert_eq!(doc["version"], "3.1.0");
}
