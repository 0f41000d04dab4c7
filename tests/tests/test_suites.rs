//! A real C++ test suite of several executables, converted together as
//! `llvm-cov -object` reports them: {fmt} from Debian's source package, its
//! tests built by clang++-19 with coverage (tests/scripts/deps-fmt.sh, which
//! `make test` runs). Every test executable links the library and
//! instantiates the same templates, so hundreds of functions are defined in
//! several of them, some used in one and unused (a hash-0 record) in
//! another. `livecov convert --binary A --object B ...` over all their raw
//! profiles must be LLVM 22's report byte for byte, after `llvm-profdata
//! merge` and, with `--sparse`, after `llvm-profdata merge -sparse` (which
//! takes another object's record of such functions); each executable alone
//! too, and the mismatch warnings must count what llvm-cov counts. The
//! same for the test binaries of a cargo workspace (fixtures/rust's
//! library: its unit tests and two integration tests, which instantiate
//! its generic functions).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use livecov_tests::{coverage_build, livecov_bin, llvm_tool, run_checked, workspace_root};

/// The test executables, as deps-fmt.sh built them, and a raw profile of
/// each one's run (all their tests pass).
struct Suite {
    binaries: Vec<PathBuf>,
    profiles: Vec<PathBuf>,
    dir: PathBuf,
}

fn suite() -> &'static Suite {
    static SUITE: OnceLock<Suite> = OnceLock::new();
    SUITE.get_or_init(|| {
        let bin = workspace_root().join("target/fmtlib/current/build/bin");
        let binaries: Vec<PathBuf> = ["args-test", "assert-test", "color-test", "core-test", "ostream-test", "printf-test", "ranges-test"]
            .iter()
            .map(|name| bin.join(name))
            .collect();
        for b in &binaries {
            assert!(b.is_file(), "{} not found: run tests/scripts/deps-fmt.sh (`make test` runs it)", b.display());
        }
        let dir = workspace_root().join("target/test-suites");
        let profiles = run_each(&binaries, &dir, &[]);
        Suite { binaries, profiles, dir }
    })
}

/// Runs each test binary with `args` in `dir` (made empty first), which
/// gets its raw profile; all their tests must pass.
fn run_each(binaries: &[PathBuf], dir: &Path, args: &[&str]) -> Vec<PathBuf> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    binaries
        .iter()
        .map(|b| {
            let profile = dir.join(format!("{}.profraw", b.file_name().unwrap().to_string_lossy()));
            let run = Command::new(b).args(args).env("LLVM_PROFILE_FILE", &profile).current_dir(dir).output().unwrap();
            assert!(run.status.success(), "{} failed: {}", b.display(), String::from_utf8_lossy(&run.stdout));
            assert!(profile.is_file(), "{} wrote no profile", b.display());
            profile
        })
        .collect()
}

/// LLVM 22: `llvm-profdata merge [-sparse]` of `profiles`, then `llvm-cov
/// export -format=lcov` of the first binary with the others as `-object`.
/// The report, and llvm-cov's count of mismatched functions.
fn llvm(binaries: &[PathBuf], profiles: &[PathBuf], sparse: bool, name: &str) -> (String, usize) {
    llvm_with(binaries, profiles, sparse, name, &[])
}

fn llvm_with(binaries: &[PathBuf], profiles: &[PathBuf], sparse: bool, name: &str, args: &[&str]) -> (String, usize) {
    let profdata = suite().dir.join(format!("{name}.profdata"));
    let mut merge = Command::new(llvm_tool("llvm-profdata"));
    merge.arg("merge").args(sparse.then_some("-sparse")).arg("-o").arg(&profdata).args(profiles);
    run_checked(&mut merge, "llvm-profdata merge");
    let mut export = Command::new(llvm_tool("llvm-cov"));
    export.args(["export", "-format=lcov"]).args(args).arg("-instr-profile").arg(&profdata).arg(&binaries[0]);
    for object in &binaries[1..] {
        export.arg("-object").arg(object);
    }
    let out = run_checked(&mut export, "llvm-cov export");
    (String::from_utf8(out.stdout).unwrap(), mismatched(&String::from_utf8_lossy(&out.stderr)))
}

fn livecov(binaries: &[PathBuf], profiles: &[PathBuf], sparse: bool) -> (String, usize) {
    livecov_with(binaries, profiles, sparse, &[])
}

fn livecov_with(binaries: &[PathBuf], profiles: &[PathBuf], sparse: bool, args: &[&str]) -> (String, usize) {
    let mut convert = Command::new(livecov_bin());
    convert.args(["convert", "--no-demangle"]).args(args).arg("--binary").arg(&binaries[0]);
    for object in &binaries[1..] {
        convert.arg("--object").arg(object);
    }
    convert.args(sparse.then_some("--sparse")).arg("--profraw").args(profiles);
    let out = run_checked(&mut convert, "livecov convert");
    (String::from_utf8(out.stdout).unwrap(), mismatched(&String::from_utf8_lossy(&out.stderr)))
}

/// N of "N functions have mismatched data" (0 without the warning).
fn mismatched(stderr: &str) -> usize {
    stderr
        .lines()
        .find_map(|l| l.split(" functions have mismatched data").next().filter(|_| l.contains("mismatched data")))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

fn differing_lines(a: &str, b: &str) -> usize {
    let (mut a, mut b): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    a.sort_unstable();
    b.sort_unstable();
    a.iter().filter(|l| b.binary_search(l).is_err()).count() + b.iter().filter(|l| a.binary_search(l).is_err()).count()
}

fn assert_same(what: &str, llvm: &(String, usize), ours: &(String, usize)) {
    if llvm.0 != ours.0 {
        let at = llvm.0.lines().zip(ours.0.lines()).position(|(a, b)| a != b).unwrap_or(0);
        panic!(
            "{what}: differs from llvm-cov from line {} ({} lines in another place or different):\n llvm-cov: {:?}\n livecov:  {:?}",
            at + 1,
            llvm.0.lines().zip(ours.0.lines()).filter(|(a, b)| a != b).count(),
            llvm.0.lines().nth(at),
            ours.0.lines().nth(at)
        );
    }
    assert_eq!(llvm.1, ours.1, "{what}: mismatched functions");
}

#[test]
fn several_test_executables_convert_together_as_llvm_cov_reports_them() {
    let s = suite();
    let dense = llvm(&s.binaries, &s.profiles, false, "all");
    let sparse = llvm(&s.binaries, &s.profiles, true, "all-sparse");
    // The suite has what makes the two differ: functions defined in several
    // executables, unused in some.
    assert_ne!(dense.0, sparse.0, "the suite no longer shares functions between executables");
    assert!(dense.1 > sparse.1 && sparse.1 > 0, "mismatched functions: {} merged, {} with -sparse", dense.1, sparse.1);
    assert!(dense.0.matches("SF:").count() > 20, "{}", dense.0.len());

    assert_same("convert", &dense, &livecov(&s.binaries, &s.profiles, false));
    assert_same("convert --sparse", &sparse, &livecov(&s.binaries, &s.profiles, true));
    // The difference is the order of functions, not their counts.
    assert!(differing_lines(&dense.0, &sparse.0) == 0, "llvm-cov's two reports differ by more than order");
}

#[test]
fn unify_instantiations_gives_llvm_cov_s_report_with_it() {
    let s = suite();
    let unified = llvm_with(&s.binaries, &s.profiles, false, "all-unified", &["-unify-instantiations"]);
    assert_same("convert --unify-instantiations", &unified, &livecov_with(&s.binaries, &s.profiles, false, &["--unify-instantiations"]));
}

#[test]
fn each_test_executable_alone_converts_as_llvm_cov_reports_it() {
    let s = suite();
    for (binary, profile) in s.binaries.iter().zip(&s.profiles) {
        let name = binary.file_name().unwrap().to_string_lossy();
        let one = |p: &Path| vec![p.to_path_buf()];
        for sparse in [false, true] {
            let llvm = llvm(&one(binary), &one(profile), sparse, &name);
            assert_same(&format!("{name} (sparse: {sparse})"), &llvm, &livecov(&one(binary), &one(profile), sparse));
        }
    }
}

/// fixtures/rust's library test binaries, built with coverage (`cargo test
/// --no-run`), and a raw profile of each one's run.
fn cargo_tests() -> (Vec<PathBuf>, Vec<PathBuf>) {
    let root = workspace_root();
    let target = root.join("target/fixtures/rust-tests");
    let mut build = Command::new("cargo");
    coverage_build(&mut build, &target)
        .args(["test", "--offline", "--locked", "--no-run", "--message-format=json", "-p", "shapes"])
        .current_dir(root.join("fixtures/rust"))
        .stdin(std::process::Stdio::null());
    let out = run_checked(&mut build, "cargo test --no-run of fixtures/rust");
    let binaries: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["profile"]["test"] == true)
        .filter_map(|m| m["executable"].as_str().map(PathBuf::from))
        .collect();
    assert_eq!(binaries.len(), 3, "the unit tests and two integration tests: {binaries:?}");
    let profiles = run_each(&binaries, &target.join("profiles"), &["-q"]);
    (binaries, profiles)
}

#[test]
fn a_cargo_workspace_s_test_binaries_convert_together_as_llvm_cov_reports_them() {
    let (binaries, profiles) = cargo_tests();
    for sparse in [false, true] {
        let llvm = llvm(&binaries, &profiles, sparse, &format!("cargo-tests-{sparse}"));
        assert!(llvm.0.contains("shapes/src/lib.rs") && llvm.0.contains("FNDA:"), "{}", llvm.0);
        assert_same(&format!("cargo test binaries (sparse: {sparse})"), &llvm, &livecov(&binaries, &profiles, sparse));
    }
}
