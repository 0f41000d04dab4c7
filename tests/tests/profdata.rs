//! Indexed profiles (`.profdata`) as `livecov convert` input, against
//! LLVM 22's `llvm-cov export -format=lcov` over the same files:
//! byte-identical LCOV for indexed profiles written by llvm-profdata 22, 19,
//! 14 and 13 (`--instr-profile`, repeated, mixed with raw profiles, or given
//! to `--profraw`), and errors, never panics, for damaged ones.

use std::path::{Path, PathBuf};
use std::process::Command;

use livecov::profile::{read_indexed_profile, Counters, Lookup};
use livecov_tests::{fixture, livecov_bin, llvm_tool, profdata_tool, run_checked, Fixture, Run, Toolchain};

/// Fixtures whose raw profiles (version 10) LLVM 19 and 22 both read.
const RAW_V10: &[&str] = &["rust", "c-clang19", "cpp", "sharedlib"];

/// A Debian LLVM tool (`llvm-profdata-19`...), panicking with the package to install.
fn debian_tool(name: &str, package: &str) -> PathBuf {
    let path = Path::new("/usr/bin").join(name);
    assert!(path.is_file(), "`{name}` not found: install the Debian package {package} (`make test` installs it)");
    path
}

fn llvm_profdata_19() -> PathBuf {
    debian_tool("llvm-profdata-19", "llvm-19")
}

/// `tool merge -o OUT INPUTS...`.
fn merge(tool: &Path, inputs: &[PathBuf], out: &Path) -> PathBuf {
    let mut command = Command::new(tool);
    command.args(["merge", "-o"]).arg(out).args(inputs);
    run_checked(&mut command, &format!("{} merge into {}", tool.display(), out.display()));
    out.to_owned()
}

/// An indexed profile of the run written by `tool`, which must read the
/// run's raw profiles.
fn indexed(tool: &Path, run: &Run, name: &str) -> PathBuf {
    merge(tool, &run.profraws, &run.dir.join(name))
}

/// An indexed profile of LLVM 14 of a run whose raw profiles LLVM 14 cannot
/// read: LLVM 22 writes the text format, which LLVM 14 indexes.
fn indexed_by_14_through_text(run: &Run, name: &str) -> PathBuf {
    let text = run.dir.join(format!("{name}.proftext"));
    let mut command = Command::new(llvm_tool("llvm-profdata"));
    command.args(["merge", "-text", "-o"]).arg(&text).args(&run.profraws);
    run_checked(&mut command, "llvm-profdata merge -text");
    merge(&profdata_tool(Toolchain::Clang14), &[text], &run.dir.join(name))
}

/// LLVM 22's `llvm-cov export -format=lcov` of the fixture over `profdata`.
fn llvm_cov(f: &Fixture, profdata: &Path) -> String {
    let mut command = Command::new(llvm_tool("llvm-cov"));
    command.args(["export", "-format=lcov"]).arg(&f.binary);
    for object in &f.objects {
        command.arg("-object").arg(object);
    }
    command.arg("-instr-profile").arg(profdata);
    let out = run_checked(&mut command, &format!("llvm-cov export of {}", f.name));
    String::from_utf8(out.stdout).expect("LCOV is UTF-8")
}

/// `livecov convert --no-demangle` of the fixture with `args`.
fn convert(f: &Fixture, args: &[&dyn AsRef<std::ffi::OsStr>]) -> std::process::Output {
    let mut command = Command::new(livecov_bin());
    command.args(["convert", "--no-demangle", "--binary"]).arg(&f.binary);
    for object in &f.objects {
        command.arg("--object").arg(object);
    }
    for arg in args {
        command.arg(arg);
    }
    command.output().expect("run livecov convert")
}

fn convert_ok(f: &Fixture, args: &[&dyn AsRef<std::ffi::OsStr>]) -> String {
    let out = convert(f, args);
    assert!(out.status.success(), "livecov convert failed for {}: {}", f.name, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("LCOV is UTF-8")
}

/// Fails with the first line where the two reports differ.
fn assert_same(context: &str, ours: &str, expected: &str) {
    assert!(expected.contains("SF:"), "{context}: llvm-cov reported no file");
    if ours == expected {
        return;
    }
    let line = ours.lines().zip(expected.lines()).position(|(a, b)| a != b).unwrap_or(0);
    panic!(
        "{context}: livecov differs from llvm-cov at line {}: {:?} against {:?}",
        line + 1,
        ours.lines().nth(line),
        expected.lines().nth(line)
    );
}

/// `--instr-profile P` and `--profraw P` both give llvm-cov's report over P.
fn check_indexed(f: &Fixture, profdata: &Path, context: &str) {
    let expected = llvm_cov(f, profdata);
    assert_same(&format!("{context} --instr-profile"), &convert_ok(f, &[&"--instr-profile", &profdata]), &expected);
    assert_same(&format!("{context} --profraw"), &convert_ok(f, &[&"--profraw", &profdata]), &expected);
}

#[test]
fn indexed_profiles_of_llvm_profdata_22_match_llvm_cov() {
    let tool = llvm_tool("llvm-profdata");
    for name in RAW_V10 {
        let f = fixture(name);
        for run in &f.runs {
            let profdata = indexed(&tool, run, "indexed-22.profdata");
            check_indexed(f, &profdata, &format!("{name} / {} / LLVM 22", run.label));
        }
    }
}

#[test]
fn indexed_profiles_of_llvm_profdata_19_match_llvm_cov() {
    let tool = llvm_profdata_19();
    for name in RAW_V10 {
        let f = fixture(name);
        for run in &f.runs {
            let profdata = indexed(&tool, run, "indexed-19.profdata");
            check_indexed(f, &profdata, &format!("{name} / {} / LLVM 19", run.label));
        }
    }
}

#[test]
fn indexed_profiles_of_llvm_profdata_14_and_13_match_llvm_cov() {
    // Their own compilers' raw profiles (versions 8 and 7).
    for (name, toolchain) in [("c-clang14", Toolchain::Clang14), ("c-clang13", Toolchain::Clang13)] {
        let f = fixture(name);
        for run in &f.runs {
            let profdata = indexed(&profdata_tool(toolchain), run, "indexed-old.profdata");
            check_indexed(f, &profdata, &format!("{name} / {}", run.label));
        }
    }
    // LLVM 14's indexed profile of one execution with the raw profiles of the others.
    let f = fixture("c-clang14");
    let tool = profdata_tool(Toolchain::Clang14);
    for run in f.runs.iter().filter(|run| run.profraws.len() >= 2) {
        let (first, rest) = run.profraws.split_at(1);
        let part = merge(&tool, first, &run.dir.join("first-14.profdata"));
        let mut inputs = rest.to_vec();
        inputs.push(part.clone());
        let expected = llvm_cov(f, &merge(&tool, &inputs, &run.dir.join("mixed-14.profdata")));
        let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"--instr-profile", &part, &"--profraw"];
        args.extend(rest.iter().map(|p| p as &dyn AsRef<std::ffi::OsStr>));
        assert_same(&format!("c-clang14 / {}: LLVM 14's --instr-profile with --profraw", run.label), &convert_ok(f, &args), &expected);
    }
    // The newer compilers' counters, indexed by LLVM 14 from the text format.
    for name in RAW_V10 {
        let f = fixture(name);
        for run in &f.runs {
            let profdata = indexed_by_14_through_text(run, "indexed-14.profdata");
            check_indexed(f, &profdata, &format!("{name} / {} / LLVM 14", run.label));
        }
    }
}

#[test]
fn indexed_versions_4_to_6_read_as_llvm_cov_reads_them() {
    // Versions 4 to 7 share one layout (they differ in what compilers count
    // and hash): LLVM 14's version 7 file relabelled is what older tools wrote.
    let f = fixture("c-clang14");
    let run = &f.runs[0];
    let profdata = indexed(&profdata_tool(Toolchain::Clang14), run, "indexed-v7.profdata");
    let mut bytes = std::fs::read(&profdata).expect("read the indexed profile");
    assert_eq!(bytes[8], 7, "LLVM 14 writes indexed version 7");
    for version in [4u8, 5, 6] {
        bytes[8] = version;
        let relabelled = run.dir.join(format!("indexed-v{version}.profdata"));
        std::fs::write(&relabelled, &bytes).expect("write the indexed profile");
        check_indexed(f, &relabelled, &format!("c-clang14 / version {version}"));
    }
}

#[test]
fn indexed_and_raw_profiles_merge_as_llvm_profdata_merges_them() {
    let tool = llvm_tool("llvm-profdata");
    for name in RAW_V10 {
        let f = fixture(name);
        for run in f.runs.iter().filter(|run| run.profraws.len() >= 2) {
            let context = format!("{name} / {}", run.label);
            let (first, rest) = run.profraws.split_at(1);
            let part = merge(&tool, first, &run.dir.join("first.profdata"));
            let mut inputs = rest.to_vec();
            inputs.push(part.clone());
            let all = merge(&tool, &inputs, &run.dir.join("mixed.profdata"));
            let expected = llvm_cov(f, &all);

            let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"--instr-profile", &part, &"--profraw"];
            args.extend(rest.iter().map(|p| p as &dyn AsRef<std::ffi::OsStr>));
            assert_same(&format!("{context}: --instr-profile with --profraw"), &convert_ok(f, &args), &expected);

            let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"--profraw"];
            args.extend(inputs.iter().map(|p| p as &dyn AsRef<std::ffi::OsStr>));
            assert_same(&format!("{context}: a .profdata among --profraw"), &convert_ok(f, &args), &expected);

            // Each raw profile indexed alone, by LLVM 19, given twice over.
            let singles: Vec<PathBuf> = run
                .profraws
                .iter()
                .enumerate()
                .map(|(i, raw)| merge(&llvm_profdata_19(), std::slice::from_ref(raw), &run.dir.join(format!("single-{i}.profdata"))))
                .collect();
            let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = Vec::new();
            for single in &singles {
                args.push(&"--instr-profile");
                args.push(single);
            }
            let expected = llvm_cov(f, &merge(&tool, &singles, &run.dir.join("singles.profdata")));
            assert_same(&format!("{context}: repeated --instr-profile"), &convert_ok(f, &args), &expected);
        }
    }
}

#[test]
fn damaged_indexed_profiles_are_errors_never_panics() {
    let tool = llvm_tool("llvm-profdata");
    let mut inputs = Vec::new();
    for name in ["c-clang19", "rust"] {
        let f = fixture(name);
        inputs.push(std::fs::read(indexed(&tool, &f.runs[0], "damaged-22.profdata")).expect("read"));
    }
    let f = fixture("c-clang14");
    inputs.push(std::fs::read(indexed(&profdata_tool(Toolchain::Clang14), &f.runs[0], "damaged-14.profdata")).expect("read"));

    let exercise = |bytes: &[u8]| {
        if let Ok(profile) = read_indexed_profile(bytes) {
            let mut counters = Counters::new();
            let probes: Vec<_> = profile.records.iter().map(|r| (r.counters.name_ref, r.counters.hash)).collect();
            let _ = counters.add_indexed(profile.clone());
            let _ = counters.add_indexed(profile);
            for (name_ref, hash) in probes {
                assert!(matches!(counters.lookup(name_ref, hash), Lookup::Found { .. }));
            }
        }
    };
    for input in &inputs {
        read_indexed_profile(input).expect("the undamaged profile reads");
        let table = u64::from_le_bytes(input[32..40].try_into().expect("8 bytes")) as usize;
        for len in 0..input.len() {
            // A cut before the end of the hash table's counts loses records
            // or the table: an error. Cuts after the table (binary
            // ids and later sections, which coverage does not need) may read.
            if len < table + 16 {
                assert!(read_indexed_profile(&input[..len]).is_err(), "{len} bytes of {} read", input.len());
            }
            exercise(&input[..len]);
        }
        let mut flipped = input.clone();
        for bit in 0..input.len() * 8 {
            flipped[bit / 8] ^= 1 << (bit % 8);
            exercise(&flipped);
            flipped[bit / 8] ^= 1 << (bit % 8);
        }
    }
    // Cut in the middle of its records, a profile is an error naming the file.
    let cut = f.runs[0].dir.join("truncated.profdata");
    std::fs::write(&cut, &inputs[2][..inputs[2].len() / 2]).expect("write");
    let out = convert(f, &[&"--instr-profile", &cut]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a truncated indexed profile was accepted");
    assert!(stderr.contains("reading indexed profile") && stderr.contains("truncated.profdata"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `fixtures/c` built by clang-19 with MC/DC (`-fcoverage-mcdc`) and run
/// twice; returns the binary and its raw profiles.
fn mcdc_build(dir: &Path) -> (PathBuf, Vec<PathBuf>) {
    std::fs::create_dir_all(dir).expect("create the MC/DC build folder");
    let binary = dir.join("main");
    let mut clang = Command::new(debian_tool("clang-19", "clang-19"));
    clang
        .args(["-fprofile-instr-generate", "-fcoverage-mapping", "-fcoverage-mcdc", "-O0", "main.c", "util.c", "-o"])
        .arg(&binary)
        .current_dir(livecov_tests::workspace_root().join("fixtures/c"));
    run_checked(&mut clang, "clang-19 -fcoverage-mcdc");
    let runs: [&[&str]; 2] = [&["classify", "5", "-3", "0", "12", "-40"], &["grade", "95", "81", "42", "120"]];
    let profraws = runs
        .iter()
        .enumerate()
        .map(|(i, args)| {
            let profraw = dir.join(format!("{i}.profraw"));
            let mut run = Command::new(&binary);
            run.args(*args).env("LLVM_PROFILE_FILE", &profraw).current_dir(dir);
            run_checked(&mut run, "the MC/DC build");
            profraw
        })
        .collect();
    (binary, profraws)
}

#[test]
fn mcdc_bitmaps_of_indexed_profiles_are_those_of_the_raw_profiles() {
    let dir = livecov_tests::workspace_root().join(format!("target/profdata-mcdc/{}", std::process::id()));
    let (binary, profraws) = mcdc_build(&dir);
    let mut raw = Counters::new();
    let mut reader = livecov::profile::ProfileReader::new();
    for p in &profraws {
        reader.read_into(&std::fs::read(p).expect("read"), &mut raw, |_| {}).expect("a raw profile");
    }
    let f = Fixture {
        name: "c-mcdc".into(),
        toolchain: Toolchain::Clang19,
        source_dir: dir.clone(),
        sources: Vec::new(),
        binary,
        objects: Vec::new(),
        runs: Vec::new(),
    };
    for (tool, version) in [(llvm_tool("llvm-profdata"), 13), (llvm_profdata_19(), 12)] {
        let profdata = merge(&tool, &profraws, &dir.join(format!("v{version}.profdata")));
        let profile = read_indexed_profile(&std::fs::read(&profdata).expect("read")).expect("an indexed profile");
        assert_eq!(profile.version, version);
        assert!(profile.records.iter().any(|r| r.counters.bitmap.iter().any(|&b| b != 0)), "no MC/DC bitmap was set");
        for r in &profile.records {
            let c = &r.counters;
            match raw.lookup(c.name_ref, c.hash) {
                Lookup::Found { counters, bitmap } => {
                    assert_eq!((counters, bitmap), (&c.counters[..], &c.bitmap[..]), "{} in version {version}", r.name)
                }
                other => panic!("{} of version {version} is {other:?} in the raw profiles", r.name),
            }
        }
        check_indexed(&f, &profdata, &format!("MC/DC build / version {version}"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn versions_and_hash_types_livecov_does_not_read_are_refused_saying_what_to_do() {
    let f = fixture("c-clang19");
    let profdata = indexed(&llvm_tool("llvm-profdata"), &f.runs[0], "refused.profdata");
    let bytes = std::fs::read(&profdata).expect("read");
    let with = |at: usize, value: u8| {
        let mut changed = bytes.clone();
        changed[at] = value;
        read_indexed_profile(&changed).expect_err("refused").to_string()
    };
    let newer = with(8, 14);
    assert!(newer.contains("version 14") && newer.contains("raw profiles"), "{newer}");
    let older = with(8, 3);
    assert!(older.contains("version 3") && older.contains("llvm-profdata merge"), "{older}");
    let hash = with(24, 1);
    assert!(hash.contains("hash type 1"), "{hash}");
    // The indexed magic given where only raw profiles go names what it is.
    let not_raw = livecov::profile::read_raw_profiles(&bytes).expect_err("not a raw profile").to_string();
    assert!(not_raw.contains("indexed profile"), "{not_raw}");
}
