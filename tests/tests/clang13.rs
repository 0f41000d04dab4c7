//! The `c-clang13` fixture is what it is there for: clang-13 writes raw
//! profile version 7 (the only producer of it: LLVM 13) and coverage
//! mapping Version6 (stored 5), which `convert.rs` compares with llvm-cov.

use livecov_tests::fixture;
use object::{Object, ObjectSection};

#[test]
fn clang13_writes_raw_profile_version_7_and_covmap_version6() {
    let f = fixture("c-clang13");
    for run in &f.runs {
        for path in &run.profraws {
            let data = std::fs::read(path).expect("read a clang-13 profile");
            let profiles =
                livecov::profile::read_raw_profiles(&data).expect("a clang-13 profile reads");
            assert_eq!(profiles.len(), 1, "{}", path.display());
            assert_eq!(
                profiles[0].version,
                7,
                "{}: raw profile version",
                path.display()
            );
        }
    }
    let image = std::fs::read(&f.binary).expect("read the clang-13 binary");
    let file = object::File::parse(&*image).expect("the clang-13 binary is an ELF file");
    let covmap = file
        .section_by_name("__llvm_covmap")
        .and_then(|s| s.data().ok())
        .expect("the clang-13 binary has a __llvm_covmap section");
    let version = u32::from_le_bytes(covmap[12..16].try_into().expect("a covmap header"));
    assert_eq!(
        version, 5,
        "clang-13's coverage mapping version (stored 0-based: Version6)"
    );
}
