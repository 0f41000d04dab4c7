//! A live agent's records, updated dump after dump from the functions that
//! ran (`livecov::lcov::LiveFile`), are the records computed whole from the
//! same counts, byte for byte, at every dump.
//!
//! The program is real and not ours: {fmt}'s test executables from Debian's
//! source package (tests/scripts/deps-fmt.sh, clang++-19 coverage), all
//! loaded at once as an agent sees a program and its shared objects. Their
//! templates are instantiated in every executable, and their headers'
//! inline functions are compiled into each, so most stretches of source
//! hold several functions. The counts grow as a service's do: the first
//! dump has a run of each executable that runs no test (so that, as in a
//! live process, every record is there from the start), and each later one
//! adds the raw profile of one more test run (a few test suites of one
//! executable, then of another), so that a dump changes some functions of
//! a stretch and not others. A record no report holds is written over in
//! place when no line changed its length; one a report holds never is. At
//! every dump, each function counted from what the agent keeps of it (its
//! counting body) has the counts llvm-cov's loading gives it, and the same
//! functions are left out.
//!
//! The last dumps go back and forth between the counts without the last
//! run and with it, as the counts of a function that is running while they
//! are read go back and forth between zero and one: from the second of them
//! on, every record updates from the counts alone (each function's last two
//! summaries are kept).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use livecov::coverage::{Coverage, Tallies};
use livecov::lcov::{self, LiveFile};
use livecov::mapping::{Counter, CoverageMapping, FileName};
use livecov::profile::{read_raw_profiles, Counters, Lookup};
use livecov_tests::workspace_root;
use rustc_hash::FxHashMap;

const EXECUTABLES: [&str; 4] = ["core-test", "args-test", "printf-test", "ranges-test"];

/// The test runs, in dump order: (executable, gtest filter). The first
/// dump has the first four.
const RUNS: [(&str, &str); 11] = [
    ("core-test", "none"),
    ("args-test", "none"),
    ("printf-test", "none"),
    ("ranges-test", "none"),
    ("core-test", "string_view_test.*"),
    ("core-test", "buffer_test.*:arg_test.*"),
    ("args-test", "*"),
    ("core-test", "core_test.*"),
    ("printf-test", "printf_test.*"),
    ("core-test", "numeric_arg_test*"),
    ("ranges-test", "*"),
];

fn binary(name: &str) -> PathBuf {
    let path = workspace_root().join("target/fmtlib/current/build/bin").join(name);
    assert!(path.is_file(), "{} not found: run tests/scripts/deps-fmt.sh (`make test` runs it)", path.display());
    path
}

/// Runs every entry of [`RUNS`], each writing its raw profile into `dir`.
fn profiles(dir: &Path) -> Vec<PathBuf> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    RUNS.iter()
        .enumerate()
        .map(|(i, (name, filter))| {
            let profile = dir.join(format!("{i}-{name}.profraw"));
            let run = Command::new(binary(name))
                .arg(format!("--gtest_filter={filter}"))
                .env("LLVM_PROFILE_FILE", &profile)
                .current_dir(dir)
                .output()
                .unwrap();
            assert!(run.status.success(), "{name} {filter} failed: {}", String::from_utf8_lossy(&run.stdout));
            profile
        })
        .collect()
}

fn counters_of(profiles: &[PathBuf]) -> Counters {
    let mut counters = Counters::new();
    for path in profiles {
        for profile in read_raw_profiles(&std::fs::read(path).unwrap()).unwrap() {
            counters.add(profile).unwrap();
        }
    }
    counters
}

fn counts<'c>(counters: &'c Counters, mapping: &CoverageMapping, function: usize) -> Option<&'c [u64]> {
    let f = &mapping.functions[function];
    match counters.lookup(f.name_ref, f.hash) {
        Lookup::Found { counters, .. } => Some(counters),
        _ => None,
    }
}

fn sf(mapping: &CoverageMapping, file: FileName) -> String {
    format!("SF:{}\n", mapping.file_name(file))
}

/// Every record of `whole`, as `llvm-cov export` writes it, by file.
fn whole_records(whole: &Coverage<'_>) -> BTreeMap<FileName, String> {
    let options = lcov::Options { no_demangle: true, ..lcov::Options::default() };
    whole
        .source_files()
        .into_iter()
        .map(|file| {
            let mut out = String::new();
            lcov::write_file(&mut out, whole, file, &options);
            (file, out)
        })
        .collect()
}

#[test]
fn records_updated_dump_after_dump_are_the_records_computed_whole() {
    let images: Vec<Vec<u8>> = EXECUTABLES.iter().map(|name| std::fs::read(binary(name)).unwrap()).collect();
    let mut mapping = CoverageMapping::new();
    for image in &images {
        mapping.add_object(image).unwrap().expect("a coverage mapping");
    }
    let profiles = profiles(&workspace_root().join("target/live-records"));

    let baseline = EXECUTABLES.len();
    let first = counters_of(&profiles[..baseline]);
    let whole = Coverage::new(&mapping, &first);
    let mut live: BTreeMap<FileName, LiveFile> =
        whole.source_files().into_iter().map(|file| (file, LiveFile::new(&whole, file, sf(&mapping, file), true))).collect();
    drop(whole);
    // What counting reads of each function, as the agent keeps it of those
    // that ran.
    let bodies: Vec<_> = mapping.functions.iter().map(|f| f.counting_body()).collect();
    let (mut updated_files, mut kept_stretches_reached, mut written_over, mut from_counts) = (0, 0, 0, 0);
    let mut grown_over = 0;
    // Each dump's counts: those of the first `runs` runs.
    let all = profiles.len();
    let runs: Vec<usize> = (baseline..=all).chain([all - 1, all, all - 1, all]).collect();
    for (dump, pair) in runs.windows(2).enumerate() {
        let (before, now) = (counters_of(&profiles[..pair[0]]), counters_of(&profiles[..pair[1]]));
        let back_and_forth = dump > all - baseline;
        let changed: Vec<usize> =
            (0..mapping.functions.len()).filter(|&i| counts(&before, &mapping, i) != counts(&now, &mapping, i)).collect();
        assert!(!changed.is_empty(), "run {dump} changed no count: the test shows nothing");

        // As the agent does: a changed zero-region stub (whether llvm-cov
        // loads it depends on its counts) has its files computed whole.
        let whole = Coverage::new(&mapping, &now);

        // Every function counted from its counting body alone, as the agent
        // counts those that ran, reads as llvm-cov's loading counts it: the
        // same functions (duplicates across the executables left out, and
        // stubs), each with the same counts.
        let every: Vec<usize> = (0..mapping.functions.len()).collect();
        let tallies = Tallies::count(&mapping, &now, &every, |i| bodies.get(i));
        let loaded: Vec<usize> = whole.functions.iter().map(|f| f.mapping_index).collect();
        let tallied: Vec<usize> = every.iter().copied().filter(|&i| tallies.position(i).is_some()).collect();
        if tallied != loaded {
            let at = tallied.iter().zip(&loaded).position(|(a, b)| a != b).unwrap_or(tallied.len().min(loaded.len()));
            panic!(
                "dump {dump}: {} functions tallied, {} loaded; from the {at}th on, function {:?} tallied against {:?} loaded",
                tallied.len(),
                loaded.len(),
                tallied.get(at),
                loaded.get(at)
            );
        }
        for f in &whole.functions {
            let tally = tallies.at(tallies.position(f.mapping_index).unwrap());
            let counts = f.regions.iter().map(|r| r.count).chain(f.branches.iter().flat_map(|b| [b.count, b.false_count]));
            assert!(tally.counts().eq(counts), "dump {dump}: {} is tallied with other counts", whole.name_of(f));
            assert_eq!(tally.execution_count(), f.execution_count, "dump {dump}: {}", whole.name_of(f));
        }
        let mut touched: FxHashMap<FileName, Vec<usize>> = FxHashMap::default();
        for &i in &changed {
            let f = &mapping.functions[i];
            let stub = f.regions().len() == 1 && f.regions()[0].count == Counter::ZERO;
            for &file in mapping.filenames(f) {
                if stub {
                    live.insert(file, LiveFile::new(&whole, file, sf(&mapping, file), true));
                } else if live.contains_key(&file) {
                    let of_file = touched.entry(file).or_default();
                    if of_file.last() != Some(&i) {
                        of_file.push(i);
                    }
                }
            }
        }
        let mut loaded = changed.clone();
        let touched: Vec<_> = touched.into_iter().map(|(file, changed)| (file, live[&file].reach(changed))).collect();
        for (file, reach) in &touched {
            let before = loaded.len();
            loaded.extend(live[file].needs(reach));
            kept_stretches_reached += usize::from(loaded.len() == before);
        }
        loaded.sort_unstable();
        loaded.dedup();
        let tallies = Tallies::count(&mapping, &now, &changed, |i| bodies.get(i));
        let partial = Coverage::of_functions(&mapping, &now, loaded.into_iter());
        let index_of = partial.places();
        let records = lcov::Records { coverage: &partial, index_of: &index_of };
        // One scratch for every record, as the agent's dumps share it.
        let mut work = lcov::Work::default();
        let mut mask = Vec::new();
        // Every other dump, a report still holds the last texts, as one
        // being sent does: they must stay as they were.
        let held: Vec<(bytes::Bytes, Vec<u8>)> = match dump % 2 {
            0 => touched.iter().map(|(file, _)| (live[file].text().clone(), live[file].text().to_vec())).collect(),
            _ => Vec::new(),
        };
        for (file, reach) in &touched {
            let (before, len) = (live[file].text().as_ptr(), live[file].text().len());
            // From the counts alone where they tell enough, as the agent
            // updates most records.
            let record = live.get_mut(file).unwrap();
            if record.records_needed(reach, &tallies, &mut mask).is_empty() {
                record.update(&tallies, None, reach, &mut work);
                from_counts += 1;
            } else {
                assert!(!back_and_forth, "dump {dump}: {} needed functions decoded", mapping.file_name(*file));
                record.update(&tallies, Some(&records), reach, &mut work);
            }
            updated_files += 1;
            if live[file].text().as_ptr() == before {
                written_over += 1;
                grown_over += usize::from(live[file].text().len() > len);
            }
        }
        for (text, bytes) in &held {
            assert_eq!(text[..], bytes[..], "dump {dump}: a text a report held was changed");
        }

        let expected = whole_records(&whole);
        assert_eq!(live.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>(), "dump {dump}: the files differ");
        for (file, record) in &expected {
            let text = std::str::from_utf8(live[file].text()).unwrap();
            if text != record {
                let line = text.lines().zip(record.lines()).position(|(a, b)| a != b).unwrap_or(0);
                panic!(
                    "dump {dump}: {} differs from its whole record at line {}: {:?} instead of {:?}",
                    mapping.file_name(*file),
                    line + 1,
                    text.lines().nth(line),
                    record.lines().nth(line)
                );
            }
        }
    }
    // The dumps updated records, some of them through the parts their
    // stretches keep (no other function of the stretch loaded again).
    assert!(updated_files > 50, "only {updated_files} records were updated");
    assert!(kept_stretches_reached > 0, "no update used the parts a stretch keeps");
    assert!(
        from_counts > 0 && from_counts < updated_files,
        "{from_counts} of {updated_files} records were updated from the counts alone"
    );
    // The lines of a record no report holds are written over its last
    // text, some of them longer than they were (a count gained a digit);
    // those of a text a report holds make a new one.
    assert!(
        written_over > 0 && written_over < updated_files,
        "{written_over} of {updated_files} records were written over in place"
    );
    assert!(grown_over > 0, "no record grew in place ({written_over} written over)");
}
