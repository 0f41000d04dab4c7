//! The fixtures build, run, and give llvm-cov something real to report: each
//! run's LCOV names the fixture's own sources, and different inputs give
//! different coverage. Also checks the coverage mapping versions of clang-14
//! and clang-19.

use livecov_tests::{fixture, fixtures, oracle_lcov};
use object::{Object, ObjectSection};

#[test]
fn every_fixture_has_runs_with_distinct_coverage() {
    let all = fixtures();
    let names: Vec<&str> = all.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        ["rust", "c-clang19", "c-clang14", "c-clang13", "cpp", "sharedlib"]
    );
    for fixture in all {
        assert!(
            fixture.runs.len() >= 2,
            "{} has fewer than two runs",
            fixture.name
        );
        assert!(
            fixture.runs.iter().any(|run| run.profraws.len() > 1),
            "{} has no run of several executions",
            fixture.name
        );
        let mut reports = Vec::new();
        for run in &fixture.runs {
            assert!(
                !run.profraws.is_empty(),
                "{}/{} wrote no profile",
                fixture.name,
                run.label
            );
            let lcov = oracle_lcov(fixture, run, &[]);
            assert!(
                !lcov.trim().is_empty(),
                "{}/{}: empty LCOV",
                fixture.name,
                run.label
            );
            for source in &fixture.sources {
                let is_header = source.extension().is_some_and(|ext| ext == "h");
                if is_header && fixture.name == "sharedlib" {
                    continue; // plugin.h declares only: no coverage of its own
                }
                let record = format!("SF:{}\n", source.display());
                assert!(
                    lcov.contains(&record),
                    "{}/{}: no {record:?} in\n{lcov}",
                    fixture.name,
                    run.label
                );
            }
            reports.push(lcov);
        }
        let first = &reports[0];
        assert!(
            reports.iter().skip(1).any(|other| other != first),
            "{}: every run gives the same LCOV",
            fixture.name
        );
        assert_ne!(
            reports[0], reports[1],
            "{}: the first two runs give the same LCOV",
            fixture.name
        );
    }
}

/// The 4th u32 of the `__llvm_covmap` header: the coverage mapping format version.
fn covmap_version(binary: &std::path::Path) -> u32 {
    let data = std::fs::read(binary).expect("the fixture binary is readable");
    let file = object::File::parse(&*data).expect("the fixture binary is an ELF file");
    let section = file
        .section_by_name("__llvm_covmap")
        .expect("the fixture binary has a __llvm_covmap section");
    let bytes = section.data().expect("__llvm_covmap has contents");
    assert!(
        bytes.len() >= 16,
        "__llvm_covmap is shorter than its header"
    );
    u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes"))
}

#[test]
fn clang14_and_clang19_have_different_covmap_versions() {
    let clang14 = covmap_version(&fixture("c-clang14").binary);
    let clang19 = covmap_version(&fixture("c-clang19").binary);
    assert_eq!(
        clang14, 5,
        "clang-14's coverage mapping version (stored 0-based: Version6)"
    );
    assert_eq!(
        clang19, 6,
        "clang-19's coverage mapping version (stored 0-based: Version7)"
    );
    assert_ne!(clang14, clang19);
}
