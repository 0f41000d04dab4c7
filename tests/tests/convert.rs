//! `livecov convert` against `llvm-profdata merge` + `llvm-cov export
//! -format=lcov` of LLVM 22: byte-identical LCOV for every fixture, every
//! run and every flag, with mangled names, and identical after demangling
//! both sides by default.

use std::process::Command;

use livecov_tests::{fixture, livecov_bin, Fixture, Run};

/// Pairs of (livecov flags, llvm-cov flags) that must give the same output.
const FLAG_SETS: &[(&[&str], &[&str])] = &[
    (&[], &[]),
    (&["--skip-functions"], &["-skip-functions"]),
    (&["--skip-branches"], &["-skip-branches"]),
    (&["--summary-only"], &["-summary-only"]),
    (&["--ignore-filename-regex", r"shared\.h$|/shapes/|plugin\.c$"], &[r"-ignore-filename-regex=shared\.h$|/shapes/|plugin\.c$"]),
];

fn convert(f: &Fixture, run: &Run, flags: &[&str]) -> String {
    let mut cmd = Command::new(livecov_bin());
    cmd.arg("convert").arg("--binary").arg(&f.binary);
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
    String::from_utf8(out.stdout).expect("LCOV is UTF-8")
}

/// Demangles the names of FN and FNDA records, as livecov does by default.
fn demangle_names(lcov: &str) -> String {
    let mut out = String::new();
    for line in lcov.lines() {
        let renamed = ["FN:", "FNDA:"].iter().find_map(|tag| {
            let rest = line.strip_prefix(tag)?;
            let (number, name) = rest.split_once(',')?;
            Some(format!("{tag}{number},{}", livecov::lcov::display_name(name, false)))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// Fails with the first lines where the two reports differ.
fn assert_same(context: &str, ours: &str, expected: &str) {
    if ours == expected {
        return;
    }
    let ours: Vec<&str> = ours.lines().collect();
    let theirs: Vec<&str> = expected.lines().collect();
    let first = ours.iter().zip(&theirs).position(|(a, b)| a != b).unwrap_or(ours.len().min(theirs.len()));
    let from = first.saturating_sub(8);
    panic!(
        "{context}: livecov differs from llvm-cov at line {}\n--- livecov ---\n{}\n--- llvm-cov ---\n{}",
        first + 1,
        ours[from..(first + 8).min(ours.len())].join("\n"),
        theirs[from..(first + 8).min(theirs.len())].join("\n"),
    );
}

fn check_fixture(name: &str) {
    let f = fixture(name);
    for run in &f.runs {
        for (ours_flags, llvm_flags) in FLAG_SETS {
            let context = format!("{} / run {} / flags {:?}", f.name, run.label, ours_flags);
            let expected = livecov_tests::oracle_lcov(f, run, llvm_flags);
            assert!(expected.contains("SF:"), "{context}: the oracle reported no file");
            let mut raw_flags = vec!["--no-demangle"];
            raw_flags.extend_from_slice(ours_flags);
            assert_same(&context, &convert(f, run, &raw_flags), &expected);
            assert_same(
                &format!("{context} (demangled)"),
                &convert(f, run, ours_flags),
                &demangle_names(&expected),
            );
        }
    }
}

livecov_tests::test_each_fixture!(check_fixture);

#[test]
fn a_profile_of_another_build_is_refused_naming_both_build_ids() {
    // The clang-19 build's profile against the clang-14 build of the same
    // sources: both carry GNU build ids, and they differ.
    let theirs = fixture("c-clang19");
    let ours = fixture("c-clang14");
    let out = Command::new(livecov_bin())
        .arg("convert")
        .arg("--binary")
        .arg(&ours.binary)
        .arg("--profraw")
        .args(&theirs.runs[0].profraws)
        .output()
        .expect("run livecov convert");
    assert!(!out.status.success(), "a foreign profile was accepted");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let id = |binary: &std::path::Path| {
        let data = std::fs::read(binary).expect("read the fixture binary");
        let file = object::File::parse(&*data).expect("an ELF file");
        use object::Object;
        let id = file.build_id().expect("build id note").expect("a build id");
        id.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    assert!(stderr.contains(&id(&theirs.binary)), "the profile's build id is not named: {stderr}");
    assert!(stderr.contains(&id(&ours.binary)), "the binary's build id is not named: {stderr}");
    assert!(stderr.contains("build id"), "{stderr}");
}

#[test]
fn path_equivalence_rewrites_the_source_files_and_nothing_else() {
    // llvm-cov export keeps its paths with -path-equivalence (it finds
    // sources with it): the oracle is its report with the SF: lines moved.
    let f = fixture("c-clang19");
    let run = &f.runs[0];
    let src = f.source_dir.to_str().expect("a UTF-8 path");
    let expected = livecov_tests::oracle_lcov(f, run, &[]);
    let moved: String = expected
        .lines()
        .map(|line| match line.strip_prefix("SF:").and_then(|p| p.strip_prefix(src)) {
            Some(rest) => format!("SF:/src/fixture{rest}\n"),
            None => format!("{line}\n"),
        })
        .collect();
    assert!(moved.contains("SF:/src/fixture/"), "no file of the fixture under {src}:\n{expected}");
    let ours = convert(f, run, &["--no-demangle", "--path-equivalence", &format!("{src}/,/src/fixture")]);
    assert_same("c-clang19 with --path-equivalence", &ours, &moved);

    let out = Command::new(livecov_bin())
        .args(["convert", "--format", "json", "--path-equivalence", "/a,/b", "--binary"])
        .arg(&f.binary)
        .arg("--profraw")
        .args(&run.profraws)
        .output()
        .expect("run livecov convert");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--path-equivalence rewrites LCOV"), "{out:?}");
}
