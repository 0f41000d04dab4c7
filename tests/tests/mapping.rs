//! The decoded mapping's regions can be released and decoded again from
//! the object (what a live agent does between dumps, see
//! `CoverageMapping::release`): what comes back is what was first decoded,
//! for every fixture binary and shared object; a mapping read leaving out
//! the functions of ignored files is the whole mapping without them; and a
//! damaged or missing section is an error, never a panic or a wrong mapping.

use livecov::mapping::CoverageMapping;
use livecov_tests::{fixture, fixtures};

fn binaries() -> Vec<std::path::PathBuf> {
    let mut all: Vec<_> = fixtures().iter().chain([fixture("c-clang13")]).collect();
    all.dedup_by(|a, b| a.name == b.name);
    all.iter().flat_map(|f| std::iter::once(f.binary.clone()).chain(f.objects.iter().cloned())).collect()
}

#[test]
fn released_regions_are_decoded_again_as_first_decoded() {
    for path in binaries() {
        let image = std::fs::read(&path).unwrap();
        let mut mapping = CoverageMapping::new();
        mapping.add_object(&image).unwrap().expect("a coverage mapping");
        let first: Vec<_> = mapping.functions.iter().map(|f| (f.expressions().to_vec(), f.regions().to_vec())).collect();
        assert!(first.iter().any(|(_, regions)| !regions.is_empty()), "{}", path.display());
        let covfun = CoverageMapping::covfun_range(&image).expect("__llvm_covfun");

        mapping.release();
        assert!(mapping.functions.iter().all(|f| f.regions().is_empty() && f.expressions().is_empty()));
        // Some functions, then all: a restored function is not decoded twice.
        let some: Vec<usize> = (0..mapping.functions.len()).step_by(3).collect();
        mapping.restore(&some, |_| image.get(covfun.clone())).unwrap();
        for (i, f) in mapping.functions.iter().enumerate() {
            if i % 3 != 0 {
                assert!(f.regions().is_empty(), "{}: function {i} restored unasked", path.display());
            }
        }
        let all: Vec<usize> = (0..mapping.functions.len()).collect();
        mapping.restore(&all, |_| image.get(covfun.clone())).unwrap();
        for (f, (expressions, regions)) in mapping.functions.iter().zip(&first) {
            assert_eq!(f.regions(), &regions[..], "{}: {}", path.display(), mapping.name(f));
            assert_eq!(f.expressions(), &expressions[..], "{}: {}", path.display(), mapping.name(f));
        }
    }
}

#[test]
fn a_mapping_read_leaving_out_files_is_the_whole_without_their_functions() {
    let mut some_left_out = false;
    for path in binaries() {
        let image = std::fs::read(&path).unwrap();
        let mut whole = CoverageMapping::new();
        whole.add_object(&image).unwrap().expect("a coverage mapping");
        // Each file, alone, and every other file, in turn (a function of
        // several files stays while one of them is not ignored).
        let mut files = whole.files.clone();
        files.sort();
        let patterns: Vec<String> = files
            .iter()
            .map(|f| format!("^{}$", regex_lite::escape(f)))
            .chain(files.iter().step_by(2).map(|f| regex_lite::escape(f)))
            .collect();
        for pattern in patterns {
            let ignore = vec![regex_lite::Regex::new(&pattern).unwrap()];
            let mut read = CoverageMapping::new().leaving_out(&ignore);
            read.add_object(&image).unwrap().expect("a coverage mapping");
            let kept = |m: &CoverageMapping| -> Vec<_> {
                m.functions
                    .iter()
                    .filter(|f| m.filenames(f).iter().any(|&file| !ignore[0].is_match(m.file_name(file))))
                    .map(|f| (m.name(f).to_owned(), f.hash, m.filenames(f).iter().map(|&file| m.file_name(file).to_owned()).collect::<Vec<_>>(), f.regions().to_vec()))
                    .collect()
            };
            let expected = kept(&whole);
            assert_eq!(kept(&read), expected, "{} leaving out {pattern}", path.display());
            assert_eq!(read.functions.len(), expected.len(), "{} leaving out {pattern}: functions of ignored files read", path.display());
            some_left_out |= expected.len() < whole.functions.len();
        }
    }
    assert!(some_left_out, "no pattern left a function out");
}

#[test]
fn a_damaged_or_missing_section_is_an_error() {
    let path = &fixture("rust").binary;
    let image = std::fs::read(path).unwrap();
    let mut mapping = CoverageMapping::new();
    mapping.add_object(&image).unwrap().expect("a coverage mapping");
    let covfun = CoverageMapping::covfun_range(&image).expect("__llvm_covfun");
    mapping.release();
    let all: Vec<usize> = (0..mapping.functions.len()).collect();

    let err = mapping.restore(&all, |_| None).unwrap_err();
    assert!(err.to_string().contains("gone"), "{err}");

    let section = &image[covfun.clone()];
    let err = mapping.restore(&all, |_| Some(&section[..section.len() / 2])).unwrap_err();
    assert!(err.to_string().contains("__llvm_covfun"), "{err}");

    // Every record's bytes overwritten: each restore either fails with an
    // error or decodes something, and never panics.
    let garbage = vec![0xffu8; section.len()];
    for i in 0..mapping.functions.len().min(200) {
        let _ = mapping.restore(&[i], |_| Some(&garbage[..]));
    }
    let zeros = vec![0u8; section.len()];
    let err = mapping.restore(&all, |_| Some(&zeros[..])).unwrap_err();
    assert!(err.to_string().contains("changed"), "{err}");
}
