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

livecov_tests::test_each_fixture!(check_fixture);

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

/// A C program built by clang-19 with MC/DC (`-fcoverage-mcdc`) into
/// `target/json-export-mcdc/`, and runs of it: each run's executions (the
/// arguments of each) give one raw profile apiece, merged as one.
fn mcdc_fixture(name: &str, sources: &[&str], runs: &[(&str, &[&[&str]])]) -> Fixture {
    let source_dir = livecov_tests::workspace_root().join("fixtures").join(name);
    let dir = livecov_tests::workspace_root().join(format!("target/json-export-mcdc/{}/{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the MC/DC build folder");
    let binary = dir.join("main");
    let clang = Path::new("/usr/bin/clang-19");
    assert!(clang.is_file(), "clang-19 not found: install the Debian package clang-19 (`make test` installs it)");
    let mut build = Command::new(clang);
    build
        .args(["-fprofile-instr-generate", "-fcoverage-mapping", "-fcoverage-mcdc", "-O0"])
        .args(sources)
        .arg("-o")
        .arg(&binary)
        .current_dir(&source_dir);
    run_checked(&mut build, &format!("clang-19 -fcoverage-mcdc of fixtures/{name}"));
    let runs = runs
        .iter()
        .map(|&(label, executions)| {
            let run_dir = dir.join(label);
            std::fs::create_dir_all(&run_dir).expect("create the run folder");
            let profraws = executions
                .iter()
                .enumerate()
                .map(|(i, args)| {
                    let profraw = run_dir.join(format!("{i}.profraw"));
                    let mut run = Command::new(&binary);
                    run.args(*args).env("LLVM_PROFILE_FILE", &profraw).current_dir(&run_dir);
                    run_checked(&mut run, &format!("the MC/DC build of fixtures/{name}"));
                    profraw
                })
                .collect();
            Run {
                label: label.into(),
                args: executions.iter().map(|a| a.iter().map(|s| s.to_string()).collect()).collect(),
                profraws,
                dir: run_dir,
            }
        })
        .collect();
    Fixture {
        name: format!("{name} (MC/DC)"),
        toolchain: livecov_tests::Toolchain::Clang19,
        source_dir,
        sources: Vec::new(),
        binary,
        objects: Vec::new(),
        runs,
    }
}

/// `fixture`'s documents against llvm-cov's for every run, in full, with
/// `--summary-only` and with `--skip-functions`; returns the full
/// documents.
fn check_mcdc_fixture(f: &Fixture) -> Vec<serde_json::Value> {
    let mut docs = Vec::new();
    for run in &f.runs {
        let profdata = run.dir.join("json-export.profdata");
        let mut merge = Command::new(llvm_tool("llvm-profdata"));
        merge.args(["merge", "-o"]).arg(&profdata).args(&run.profraws);
        run_checked(&mut merge, "llvm-profdata merge");
        for (ours_flags, llvm_flags) in &FLAG_SETS[..3] {
            let context = format!("{} / run {} / flags {:?}", f.name, run.label, ours_flags);
            let expected = oracle(f, &profdata, llvm_flags);
            let ours = convert(f, run, ours_flags);
            assert_same(&context, &ours, &expected);
            if ours_flags.is_empty() {
                docs.push(serde_json::from_str(&ours).expect("valid JSON"));
            }
        }
    }
    docs
}

/// What makes the MC/DC comparisons mean something: records in functions
/// and files, an independence pair covered, a condition not evaluated in
/// some executed vector, counted summaries.
fn assert_mcdc_detail(context: &str, doc: &serde_json::Value) {
    let data = &doc["data"][0];
    let records: Vec<&serde_json::Value> = data["functions"]
        .as_array()
        .expect("functions")
        .iter()
        .flat_map(|f| f["mcdc_records"].as_array().expect("mcdc_records"))
        .collect();
    assert!(!records.is_empty(), "{context}: no function has MC/DC records");
    let files = data["files"].as_array().expect("files");
    assert!(
        files.iter().any(|f| f["mcdc_records"].as_array().is_some_and(|r| !r.is_empty())),
        "{context}: no file has MC/DC records"
    );
    assert!(
        records.iter().any(|r| r[9].as_array().is_some_and(|c| c.contains(&serde_json::Value::Bool(true)))),
        "{context}: no independence pair is covered"
    );
    assert!(
        records.iter().any(|r| r[10].as_array().is_some_and(|v| v.iter().any(|v| v["conditions"]
            .as_array()
            .is_some_and(|c| c.contains(&serde_json::Value::Null))))),
        "{context}: no executed vector leaves a condition out"
    );
    let mcdc = &data["totals"]["mcdc"];
    assert!(mcdc["count"].as_u64() > Some(0) && mcdc["covered"].as_u64() > Some(0), "{context}: totals {mcdc}");
}

#[test]
fn mcdc_records_of_the_c_fixture_match_llvm_cov() {
    let f = mcdc_fixture(
        "c",
        &["main.c", "util.c"],
        &[
            ("classify", &[&["classify", "5", "-3", "0", "12", "-40"]]),
            ("both", &[&["classify", "5", "-3", "0", "12", "-40"], &["grade", "95", "81", "42", "120"]]),
        ],
    );
    for doc in check_mcdc_fixture(&f) {
        assert_mcdc_detail(&f.name, &doc);
    }
    let _ = std::fs::remove_dir_all(f.binary.parent().expect("the build folder"));
}

/// fixtures/c-mcdc: chains of 2 to 6 conditions, mixed and nested ones,
/// decisions in macros (of its own file and of a header), constant-folded
/// conditions, a function that never runs, a static inline function of
/// two units; one execution, and three merged.
#[test]
fn mcdc_records_of_the_mcdc_fixture_match_llvm_cov() {
    let all: Vec<String> = (0..64).map(|i| i.to_string()).collect();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let f = mcdc_fixture(
        "c-mcdc",
        &["mcdc.c", "other.c"],
        &[
            ("zero", &[&["0"]]),
            ("some", &[&["0", "1", "3", "7", "33"]]),
            ("merged", &[&["2", "5", "21", "42", "63", "12", "9"], &all, &["0", "1", "3", "7", "33"]]),
        ],
    );
    let docs = check_mcdc_fixture(&f);
    for doc in &docs[1..] {
        assert_mcdc_detail(&f.name, doc);
    }
    // Folded conditions are shown but not counted; `never` has a record
    // with no executed vector.
    let functions = docs[2]["data"][0]["functions"].as_array().expect("functions");
    let never = functions.iter().find(|f| f["name"] == "mcdc.c:never").expect("never");
    assert_eq!(never["mcdc_records"][0][10], serde_json::json!([]));
    mcdc_parameters_are_released_and_restored(&f.binary);
    let _ = std::fs::remove_dir_all(f.binary.parent().expect("the build folder"));
}

/// The MC/DC parameters, kept beside the regions, go and come back with
/// them (`CoverageMapping::release` and `restore`, as the live agent
/// uses them).
fn mcdc_parameters_are_released_and_restored(binary: &Path) {
    use livecov::mapping::CoverageMapping;
    let image = std::fs::read(binary).expect("read the MC/DC build");
    let mut mapping = CoverageMapping::new();
    mapping.add_object(&image).expect("a readable object").expect("a coverage mapping");
    let first: Vec<_> = mapping.functions.iter().map(|f| f.mcdc().to_vec()).collect();
    assert!(first.iter().any(|m| !m.is_empty()), "no function has MC/DC parameters");
    mapping.release();
    assert!(mapping.functions.iter().all(|f| f.mcdc().is_empty()), "MC/DC parameters kept after release");
    let covfun = CoverageMapping::covfun_range(&image).expect("__llvm_covfun");
    let all: Vec<usize> = (0..mapping.functions.len()).collect();
    mapping.restore(&all, |_| image.get(covfun.clone())).expect("restore");
    for (f, mcdc) in mapping.functions.iter().zip(&first) {
        assert_eq!(f.mcdc(), &mcdc[..], "{}", mapping.name(f));
    }
}
