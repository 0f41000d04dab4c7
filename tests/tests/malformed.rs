//! Malformed inputs never make livecov panic or hang.
//!
//! The real instrumented binaries and raw profiles of the fixtures are
//! mutated deterministically (a seeded PRNG): truncated at many offsets,
//! bytes flipped, ranges zeroed, ranges duplicated over others or inserted.
//! Binaries are mutated mostly inside `__llvm_covmap`, `__llvm_covfun` and
//! `__llvm_prf_names`, in place, so the ELF file stays readable and the
//! coverage mapping decoder sees the damage; the sections are also given
//! truncated or grown to [`CoverageMapping::add_sections`] directly.
//!
//! For each mutant the readers (`CoverageMapping::add_object`,
//! `add_sections`, `read_raw_profiles`, `Counters::add`) and, when they
//! accept it, the whole pipeline (`Coverage::new` + `lcov::write`) must
//! return normally, within [`CASE_LIMIT`]. A malformed-input error must be
//! [`Error::Malformed`] with an offset inside the input (for a raw
//! profile) and a message naming it, or [`Error::Unsupported`] naming the
//! version or flags. Files of the wrong kind and `livecov convert` on bad
//! inputs are checked too: an error naming the file and the problem, never
//! a panic.
//!
//! A failing mutant is written to `target/malformed-failures/` so that it
//! can be replayed.

use std::collections::HashMap;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use livecov::coverage::Coverage;
use livecov::lcov;
use livecov::mapping::CoverageMapping;
use livecov::profile::{decode_names, name_ref, read_raw_profiles, Counters};
use livecov::{Endian, Error};
use livecov_tests::{fixture, fixtures, livecov_bin, workspace_root, Fixture};
use object::{Object, ObjectSection};

/// Longest one mutant may take (reading it and, if it reads, the whole
/// report) in a debug build before the test calls it a hang.
const CASE_LIMIT: Duration = Duration::from_secs(10);

/// The coverage sections of an instrumented object.
const SECTIONS: [&str; 3] = ["__llvm_covmap", "__llvm_covfun", "__llvm_prf_names"];

// ---------------------------------------------------------------------------
// Deterministic mutations

/// SplitMix64: small, fast, and good enough to pick offsets.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `range` (which must not be empty).
    fn in_range(&mut self, range: Range<usize>) -> usize {
        range.start + (self.next() % (range.end - range.start) as u64) as usize
    }

    /// A length from 1 to `max`, short ones more likely.
    fn len(&mut self, max: usize) -> usize {
        let cap = [4, 16, 64, 256][self.in_range(0..4)].min(max.max(1));
        self.in_range(1..cap + 1)
    }
}

/// One change to a byte buffer.
#[derive(Clone, Debug)]
enum Mutation {
    /// Keep only the first `n` bytes.
    Truncate(usize),
    /// XOR the byte at `at` with `mask` (not zero).
    Flip { at: usize, mask: u8 },
    /// Several flips at once.
    Flips(Vec<(usize, u8)>),
    /// Set `len` bytes from `at` to zero.
    Zero { at: usize, len: usize },
    /// Copy `len` bytes from `from` over the bytes at `to` (size unchanged).
    Overwrite { from: usize, to: usize, len: usize },
    /// Insert a copy of `len` bytes from `from` at `to` (grows the buffer).
    Insert { from: usize, to: usize, len: usize },
    /// Set the 4 or 8 bytes at `at` to an extreme little-endian value.
    Word { at: usize, width: usize, value: u64 },
}

impl Mutation {
    fn apply(&self, data: &mut Vec<u8>) {
        match *self {
            Mutation::Truncate(n) => data.truncate(n),
            Mutation::Flip { at, mask } => data[at] ^= mask,
            Mutation::Flips(ref flips) => {
                for &(at, mask) in flips {
                    data[at] ^= mask;
                }
            }
            Mutation::Zero { at, len } => data[at..at + len].fill(0),
            Mutation::Overwrite { from, to, len } => data.copy_within(from..from + len, to),
            Mutation::Insert { from, to, len } => {
                let copy = data[from..from + len].to_vec();
                data.splice(to..to, copy);
            }
            Mutation::Word { at, width, value } => {
                data[at..at + width].copy_from_slice(&value.to_le_bytes()[..width])
            }
        }
    }

    /// Whether the buffer keeps its size (required inside an ELF file).
    fn in_place(&self) -> bool {
        !matches!(self, Mutation::Truncate(_) | Mutation::Insert { .. })
    }
}

/// A random size-preserving mutation inside `region` (not empty) of a
/// buffer; copies come from inside `region` too.
fn random_in_place(rng: &mut Rng, region: Range<usize>) -> Mutation {
    let len_max = region.len();
    match rng.in_range(0..10) {
        0..=2 => Mutation::Flip {
            at: rng.in_range(region),
            mask: 1 << rng.in_range(0..8),
        },
        3 => Mutation::Flip {
            at: rng.in_range(region),
            mask: rng.in_range(1..256) as u8,
        },
        4 => {
            let n = rng.in_range(2..6);
            Mutation::Flips(
                (0..n)
                    .map(|_| (rng.in_range(region.clone()), rng.in_range(1..256) as u8))
                    .collect(),
            )
        }
        5 | 6 => {
            let len = rng.len(len_max);
            Mutation::Zero {
                at: rng.in_range(region.start..region.end - len + 1),
                len,
            }
        }
        7 | 8 => {
            let len = rng.len(len_max);
            let span = region.start..region.end - len + 1;
            Mutation::Overwrite {
                from: rng.in_range(span.clone()),
                to: rng.in_range(span),
                len,
            }
        }
        _ => {
            let width = if rng.next().is_multiple_of(2) { 4 } else { 8 };
            if len_max < width {
                return Mutation::Flip {
                    at: rng.in_range(region),
                    mask: 0x80,
                };
            }
            let values = [
                0,
                u64::MAX,
                1 << 31,
                1 << 63,
                0x7fff_ffff,
                0xffff_fffe,
                1 << 56,
            ];
            let value = values[rng.in_range(0..values.len())];
            // Mostly at aligned offsets, where the formats keep their fields.
            let start = region.start.next_multiple_of(4).min(region.end - width);
            let mut at = rng.in_range(start..region.end - width + 1);
            if !rng.next().is_multiple_of(4) {
                at = (at & !3).max(start);
            }
            Mutation::Word { at, width, value }
        }
    }
}

/// A random mutation of a buffer of `len` bytes, size-changing ones included.
fn random_any(rng: &mut Rng, len: usize) -> Mutation {
    match rng.in_range(0..8) {
        0 => Mutation::Truncate(rng.in_range(0..len)),
        1 => {
            let n = rng.len(len);
            Mutation::Insert {
                from: rng.in_range(0..len - n + 1),
                to: rng.in_range(0..len + 1),
                len: n,
            }
        }
        _ => random_in_place(rng, 0..len),
    }
}

// ---------------------------------------------------------------------------
// Running cases with a time bound and panic capture

/// A property failure: what was mutated, how, and what went wrong.
struct Failure {
    case: String,
    problem: String,
    input: Vec<u8>,
}

/// What became of a mutant that broke no property.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Read without error and reported.
    Accepted,
    /// Refused with a proper error.
    Refused,
}

/// One mutant: a description, the input, and how to check it (`Err` for
/// a property violation).
struct Case {
    name: String,
    input: Vec<u8>,
    check: Check,
}

/// How a case's input is checked: `Err` for a property violation.
type Check = Box<dyn Fn(&[u8]) -> Result<Outcome, String>>;

impl Case {
    fn new(
        name: String,
        input: Vec<u8>,
        check: impl Fn(&[u8]) -> Result<Outcome, String> + 'static,
    ) -> Self {
        Case {
            name,
            input,
            check: Box::new(check),
        }
    }
}

/// Runs cases `make(0)` to `make(count - 1)` on a worker thread. A panic
/// in a check, a property violation, or a case that takes longer than
/// [`CASE_LIMIT`] fails the test; every failure's input is saved.
fn run_cases(label: &str, count: usize, make: impl Fn(usize) -> Case + Send + 'static) {
    let current = Arc::new(Mutex::new((String::new(), Vec::<u8>::new())));
    let started = Arc::new(Mutex::new(Instant::now()));
    let progress = Arc::new(AtomicUsize::new(0));
    let (done_tx, done_rx) = mpsc::channel();
    {
        let current = Arc::clone(&current);
        let started = Arc::clone(&started);
        let progress = Arc::clone(&progress);
        install_panic_hook();
        std::thread::spawn(move || {
            IN_CASE.with(|c| c.set(true));
            let mut failures = Vec::new();
            let mut slowest = (Duration::ZERO, String::new());
            let mut accepted = 0;
            for i in 0..count {
                let Case {
                    name: case,
                    input,
                    check,
                } = make(i);
                *current.lock().unwrap() = (case.clone(), input.clone());
                let t0 = Instant::now();
                *started.lock().unwrap() = t0;
                progress.store(i + 1, Ordering::SeqCst);
                let result = catch_unwind(AssertUnwindSafe(|| check(&input)));
                let took = t0.elapsed();
                if took > slowest.0 {
                    slowest = (took, case.clone());
                }
                let problem = match result {
                    Ok(Ok(outcome)) => {
                        accepted += usize::from(outcome == Outcome::Accepted);
                        continue;
                    }
                    Ok(Err(problem)) => problem,
                    Err(panic) => format!("PANIC: {}", panic_message(&panic)),
                };
                failures.push(Failure {
                    case,
                    problem,
                    input,
                });
            }
            let _ = done_tx.send((failures, slowest, accepted));
        });
    }
    let t0 = Instant::now();
    let (failures, slowest, accepted) = loop {
        match done_rx.recv_timeout(Duration::from_millis(100)) {
            Ok(done) => break done,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let elapsed = started.lock().unwrap().elapsed();
                if elapsed > CASE_LIMIT {
                    let (case, input) = current.lock().unwrap().clone();
                    let saved = save_failure(label, 0, &input);
                    panic!(
                        "{label}: case {} ({case}) runs for more than {CASE_LIMIT:?}: a hang \
                         (input saved to {})",
                        progress.load(Ordering::SeqCst),
                        saved.display()
                    );
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{label}: the worker died"),
        }
    };
    eprintln!(
        "{label}: {count} cases ({accepted} read and reported, the others refused) in {:.1?}, \
         slowest {:.1?} ({})",
        t0.elapsed(),
        slowest.0,
        slowest.1
    );
    if !failures.is_empty() {
        let mut report = format!("{label}: {} of {count} cases failed:\n", failures.len());
        for (n, f) in failures.iter().enumerate() {
            let saved = save_failure(label, n, &f.input);
            if n < 20 {
                report.push_str(&format!(
                    "- {}: {}\n  input: {}{}\n",
                    f.case,
                    f.problem,
                    saved.display(),
                    if f.input.len() <= 256 {
                        format!(" = {}", hex(&f.input))
                    } else {
                        String::new()
                    }
                ));
            }
        }
        panic!("{report}");
    }
}

thread_local! {
    /// Set on case-running threads: their panics are caught and reported
    /// with the case, so the panic hook only records where they happened.
    static IN_CASE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static LAST_PANIC_AT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Installs (once) a panic hook that records the location of panics on
/// case-running threads instead of printing them; other panics print as usual.
fn install_panic_hook() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_CASE.with(|c| c.get()) {
                let at = info.location().map_or(String::new(), |l| l.to_string());
                LAST_PANIC_AT.with(|p| *p.borrow_mut() = at);
            } else {
                previous(info);
            }
        }));
    });
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    let message = if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".into()
    };
    let at = LAST_PANIC_AT.with(|p| p.borrow().clone());
    format!("{message} (at {at})")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn save_failure(label: &str, n: usize, input: &[u8]) -> PathBuf {
    let dir = workspace_root().join("target/malformed-failures");
    let _ = std::fs::create_dir_all(&dir);
    let name: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let path = dir.join(format!("{name}-{n}.bin"));
    let _ = std::fs::write(&path, input);
    path
}

// ---------------------------------------------------------------------------
// What is checked of each result

/// Checks that an error for malformed `input_len` bytes says what and where.
/// `strict_offset`: the offset must lie within the input (it may point into
/// decompressed data otherwise).
fn check_error(error: &Error, input_len: usize, strict_offset: bool) -> Result<Outcome, String> {
    let text = error.to_string();
    match error {
        Error::Malformed {
            what,
            offset,
            detail,
        } => {
            if what.is_empty() || detail.is_empty() {
                return Err(format!("Malformed error without what or detail: {text:?}"));
            }
            if strict_offset && *offset > input_len as u64 {
                return Err(format!(
                    "error offset {offset:#x} is beyond the {input_len}-byte input: {text}"
                ));
            }
            if !text.contains(&format!("offset {offset:#x}")) {
                return Err(format!("error message does not name its offset: {text:?}"));
            }
            Ok(Outcome::Refused)
        }
        Error::Unsupported(m) => {
            let lower = m.to_lowercase();
            if lower.contains("version") || lower.contains("flag") || lower.contains("correlat") {
                Ok(Outcome::Refused)
            } else {
                Err(format!("Unsupported error for malformed input: {text:?}"))
            }
        }
        Error::Mismatch(_) => Err(format!("Mismatch error while reading one input: {text:?}")),
        Error::Io { .. } => Err(format!("I/O error while decoding bytes: {text:?}")),
    }
}

/// The fixture's counters, merged from the profiles of its first run.
fn counters_of(f: &Fixture) -> Counters {
    let mut counters = Counters::new();
    for path in &f.runs[0].profraws {
        let data = std::fs::read(path).expect("read a fixture profile");
        for p in read_raw_profiles(&data).expect("the fixture profiles read") {
            counters.add(p).expect("the fixture profiles merge");
        }
    }
    counters
}

/// `Coverage::new` + `lcov::write` (and, if `summary`, once more with
/// `--summary-only --no-demangle`).
fn report(mapping: &CoverageMapping, counters: &Counters, summary: bool) -> String {
    let coverage = Coverage::new(mapping, counters);
    let mut out = lcov::write(&coverage, &lcov::Options::default());
    if summary {
        let options = lcov::Options {
            summary_only: true,
            no_demangle: true,
            ..Default::default()
        };
        out.push_str(&lcov::write(&coverage, &options));
    }
    out
}

/// The binaries of every fixture (shared objects too) and c-clang13's.
fn all_fixtures() -> Vec<&'static Fixture> {
    let mut all: Vec<&Fixture> = fixtures().iter().collect();
    all.push(fixture("c-clang13"));
    all
}

/// An instrumented object: its bytes, the file ranges of its coverage
/// sections, and the counters of its fixture's first run.
struct Binary {
    name: String,
    image: Vec<u8>,
    sections: Vec<(&'static str, Range<usize>)>,
    counters: Counters,
}

impl Binary {
    fn section(&self, name: &str) -> &[u8] {
        let range = &self
            .sections
            .iter()
            .find(|(n, _)| *n == name)
            .expect("section")
            .1;
        &self.image[range.clone()]
    }
}

fn binaries() -> &'static [Binary] {
    static BINARIES: OnceLock<Vec<Binary>> = OnceLock::new();
    BINARIES.get_or_init(|| {
        let mut out = Vec::new();
        for f in all_fixtures() {
            for path in std::iter::once(&f.binary).chain(&f.objects) {
                let image = std::fs::read(path).expect("read a fixture binary");
                let file = object::File::parse(&*image).expect("a fixture binary parses");
                let sections = SECTIONS
                    .iter()
                    .map(|&name| {
                        let s = file
                            .section_by_name(name)
                            .unwrap_or_else(|| panic!("{} has no {name}", path.display()));
                        let (start, len) = s.file_range().expect("the section has file data");
                        (name, start as usize..(start + len) as usize)
                    })
                    .collect();
                let name = format!("{}/{}", f.name, path.file_name().unwrap().to_string_lossy());
                out.push(Binary {
                    name,
                    image,
                    sections,
                    counters: counters_of(f),
                });
            }
        }
        out
    })
}

/// Reads an object image and, if that works, reports its coverage.
fn check_object(binary: &Binary, image: &[u8]) -> Result<Outcome, String> {
    let mut mapping = CoverageMapping::new();
    match mapping.add_object(image) {
        Err(e) => check_error(&e, image.len(), false),
        Ok(None) => Ok(Outcome::Refused),
        Ok(Some(_)) => {
            report(&mapping, &binary.counters, true);
            Ok(Outcome::Accepted)
        }
    }
}

/// `add_sections` on the (mutated) section contents `covmap`, `covfun`
/// and `names`, laid end to end in `input` with the given lengths.
fn check_sections(binary: &Binary, input: &[u8], lens: [usize; 2]) -> Result<Outcome, String> {
    let (covmap, rest) = input.split_at(lens[0]);
    let (covfun, names) = rest.split_at(lens[1]);
    let names = match decode_names(names) {
        Ok(names) => names,
        Err(e) => return check_error(&e, names.len(), true),
    };
    let names: HashMap<u64, String> = names.iter().map(|n| (name_ref(n), n.to_owned())).collect();
    let mut mapping = CoverageMapping::new();
    match mapping.add_sections(covmap, covfun, &names, Endian::Little) {
        Err(e) => check_error(&e, covmap.len().max(covfun.len()), false),
        Ok(()) => {
            report(&mapping, &binary.counters, true);
            Ok(Outcome::Accepted)
        }
    }
}

// ---------------------------------------------------------------------------
// Binaries

#[test]
fn mutated_binaries_never_panic() {
    let all = binaries();
    // The unmutated binaries read and report: the mutants start from there.
    for binary in all {
        assert!(
            check_object(binary, &binary.image).unwrap() == Outcome::Accepted,
            "{}",
            binary.name
        );
    }
    // Mostly inside the coverage sections, in place; a few anywhere.
    const PER_BINARY: usize = 120;
    run_cases("mutated binaries", all.len() * PER_BINARY, move |i| {
        let binary = &all[i / PER_BINARY];
        let mut rng = Rng::new(0x5eed_0000 + i as u64);
        let region = if i % PER_BINARY < PER_BINARY - 10 {
            // covfun is where most of the mapping is: weigh it double.
            let which = [0, 1, 1, 2][rng.in_range(0..4)];
            binary.sections[which].1.clone()
        } else {
            0..binary.image.len()
        };
        let mutation = random_in_place(&mut rng, region);
        assert!(mutation.in_place());
        let mut image = binary.image.clone();
        mutation.apply(&mut image);
        Case::new(
            format!("{} {mutation:?}", binary.name),
            image,
            move |image| check_object(binary, image),
        )
    });
}

#[test]
fn truncated_binaries_never_panic() {
    let all = binaries();
    // Truncations at offsets in and around the coverage sections, and a few
    // elsewhere (the ELF reader must then refuse the file or its sections).
    let mut cases: Vec<(usize, usize)> = Vec::new();
    for (b, binary) in all.iter().enumerate() {
        let mut rng = Rng::new(0x7a11 + b as u64);
        for (_, range) in &binary.sections {
            for _ in 0..4 {
                cases.push((b, rng.in_range(range.clone())));
            }
        }
        for _ in 0..4 {
            cases.push((b, rng.in_range(0..binary.image.len())));
        }
        cases.push((b, 0));
        cases.push((b, 63));
    }
    run_cases("truncated binaries", cases.len(), move |i| {
        let (b, at) = cases[i];
        let binary = &all[b];
        Case::new(
            format!("{} truncated to {at} bytes", binary.name),
            binary.image[..at].to_vec(),
            move |image| check_object(binary, image),
        )
    });
}

/// The three coverage sections of `binary`, section `s` mutated, given to
/// [`check_sections`] together.
fn section_case(binary: &'static Binary, s: usize, mutation: &Mutation) -> Case {
    let mut parts: Vec<Vec<u8>> = SECTIONS
        .iter()
        .map(|name| binary.section(name).to_vec())
        .collect();
    mutation.apply(&mut parts[s]);
    let lens = [parts[0].len(), parts[1].len()];
    Case::new(
        format!(
            "{} {} {mutation:?} (input: covmap, covfun, names of {}, {} and {} bytes)",
            binary.name,
            SECTIONS[s],
            lens[0],
            lens[1],
            parts[2].len()
        ),
        parts.concat(),
        move |input| check_sections(binary, input, lens),
    )
}

#[test]
fn mutated_coverage_sections_never_panic() {
    let all = binaries();
    // The three sections given to add_sections directly, so that they can
    // also be truncated and grown: truncations at many offsets of each,
    // then random mutations of all three.
    let mut cases: Vec<(usize, usize, Mutation)> = Vec::new();
    for (b, binary) in all.iter().enumerate() {
        let mut rng = Rng::new(0xc0f0 + b as u64);
        for (s, name) in SECTIONS.iter().enumerate() {
            let len = binary.section(name).len();
            let step = (len / 40).max(1);
            for at in (0..len).step_by(step) {
                cases.push((b, s, Mutation::Truncate(at)));
            }
            for _ in 0..8 {
                cases.push((b, s, Mutation::Truncate(rng.in_range(0..len))));
            }
        }
        for _ in 0..60 {
            let s = [0, 1, 1, 1, 2][rng.in_range(0..5)];
            let len = binary.section(SECTIONS[s]).len();
            cases.push((b, s, random_any(&mut rng, len)));
        }
    }
    run_cases("mutated coverage sections", cases.len(), move |i| {
        let (b, s, ref mutation) = cases[i];
        section_case(&all[b], s, mutation)
    });
}

/// Extreme values for the 4- and 8-byte fields of the formats.
const EXTREMES: [u64; 12] = [
    0,
    1,
    2,
    7,
    8,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_fffe,
    0xffff_ffff,
    1 << 56,
    1 << 63,
    u64::MAX,
];

/// A few of [`EXTREMES`], for inputs whose mutants are slower to check.
const FEW_EXTREMES: [u64; 7] = [0, 1, 0x8000_0000, 0xffff_ffff, 1 << 56, 1 << 63, u64::MAX];

/// Every 4-byte field of `region` set to every one of `values` that fits,
/// and every 8-aligned 8-byte field to every one that does not (and 2^31).
fn word_mutations(region: Range<usize>, values: &[u64]) -> Vec<Mutation> {
    let mut out = Vec::new();
    for at in (region.start..region.end.saturating_sub(3)).step_by(4) {
        for &value in values.iter().filter(|&&v| v <= u64::from(u32::MAX)) {
            out.push(Mutation::Word {
                at,
                width: 4,
                value,
            });
        }
        if at % 8 == 0 && at + 8 <= region.end {
            for &value in values
                .iter()
                .filter(|&&v| v > u64::from(u32::MAX) || v == 0x8000_0000)
            {
                out.push(Mutation::Word {
                    at,
                    width: 8,
                    value,
                });
            }
        }
    }
    out
}

#[test]
fn extreme_section_fields_never_panic() {
    // The fixed-size fields of the first header of __llvm_covmap and of the
    // first two function records of __llvm_covfun, and the first LEB128
    // bytes of the first record's mapping data.
    let all = binaries();
    let mut cases: Vec<(usize, usize, Mutation)> = Vec::new();
    for (b, binary) in all.iter().enumerate() {
        for m in word_mutations(0..16, &EXTREMES) {
            cases.push((b, 0, m));
        }
        let covfun = binary.section("__llvm_covfun");
        let second = 28 + u32::from_le_bytes(covfun[8..12].try_into().unwrap()) as usize;
        let second = second.next_multiple_of(8);
        for m in word_mutations(0..28, &EXTREMES)
            .into_iter()
            .chain(word_mutations(second..second + 28, &EXTREMES))
        {
            cases.push((b, 1, m));
        }
        for at in 28..40 {
            for mask in [0x80, 0x7f, 0xff] {
                cases.push((b, 1, Mutation::Flip { at, mask }));
            }
        }
    }
    run_cases("extreme section fields", cases.len(), move |i| {
        let (b, s, ref mutation) = cases[i];
        section_case(&all[b], s, mutation)
    });
}

// ---------------------------------------------------------------------------
// Raw profiles

/// A raw profile of a fixture with the mapping it goes with.
struct Profile {
    name: String,
    data: Vec<u8>,
    mapping: CoverageMapping,
}

fn profiles() -> &'static [Profile] {
    static PROFILES: OnceLock<Vec<Profile>> = OnceLock::new();
    PROFILES.get_or_init(|| {
        let mut out = Vec::new();
        for f in all_fixtures() {
            let mut mapping = CoverageMapping::new();
            for path in std::iter::once(&f.binary).chain(&f.objects) {
                let image = std::fs::read(path).expect("read a fixture binary");
                mapping.add_object(&image).expect("a fixture binary reads");
            }
            // One profile per fixture; sharedlib's holds two (host and plugin).
            let path = &f.runs[0].profraws[0];
            let data = std::fs::read(path).expect("read a fixture profile");
            let name = format!("{}/{}", f.name, path.file_name().unwrap().to_string_lossy());
            out.push(Profile {
                name,
                data,
                mapping,
            });
        }
        out
    })
}

/// Reads a (mutated) profile, merges it alone and after the original, and
/// reports coverage with it.
fn check_profile(original: &Profile, data: &[u8]) -> Result<Outcome, String> {
    let read = match read_raw_profiles(data) {
        Err(e) => return check_error(&e, data.len(), true),
        Ok(read) => read,
    };
    let mut alone = Counters::new();
    let mut merged = Counters::new();
    for p in read_raw_profiles(&original.data).expect("the original reads") {
        merged.add(p).expect("the original merges");
    }
    for p in read {
        if let Err(e) = alone.add(p.clone()) {
            return Err(format!("a profile does not merge into empty counters: {e}"));
        }
        if let Err(e) = merged.add(p) {
            if !matches!(e, Error::Mismatch(_)) {
                return Err(format!("merge error that is no Mismatch: {e}"));
            }
        }
    }
    // The report with the mutant's own counters (the merged ones mostly
    // keep the original's); the merged ones are looked up.
    let _ = alone.warnings();
    report(&original.mapping, &alone, false);
    for f in &original.mapping.functions {
        let _ = merged.lookup(f.name_ref, f.hash);
    }
    Ok(Outcome::Accepted)
}

#[test]
fn truncated_profiles_never_panic() {
    let all = profiles();
    // Every truncation of every fixture profile (they are small).
    let cases: Vec<(usize, usize)> = all
        .iter()
        .enumerate()
        .flat_map(|(p, profile)| (0..profile.data.len()).map(move |at| (p, at)))
        .collect();
    run_cases("truncated profiles", cases.len(), move |i| {
        let (p, at) = cases[i];
        let profile = &all[p];
        Case::new(
            format!("{} truncated to {at} bytes", profile.name),
            profile.data[..at].to_vec(),
            move |data| check_profile(profile, data),
        )
    });
}

#[test]
fn mutated_profiles_never_panic() {
    let all = profiles();
    const PER_PROFILE: usize = 400;
    run_cases("mutated profiles", all.len() * PER_PROFILE, move |i| {
        let profile = &all[i / PER_PROFILE];
        let mut rng = Rng::new(0xf00d_0000 + i as u64);
        let len = profile.data.len();
        // The header and data records come first: weigh them more.
        let region = if rng.next().is_multiple_of(2) {
            0..len.min(256)
        } else {
            0..len
        };
        let mut mutations = vec![match rng.in_range(0..6) {
            0 => random_any(&mut rng, len),
            _ => random_in_place(&mut rng, region),
        }];
        let mut data = profile.data.clone();
        mutations[0].apply(&mut data);
        // Sometimes a second one.
        if rng.next().is_multiple_of(4) && !data.is_empty() {
            mutations.push(random_in_place(&mut rng, 0..data.len()));
            mutations[1].apply(&mut data);
        }
        Case::new(
            format!("{} {mutations:?}", profile.name),
            data,
            move |data| check_profile(profile, data),
        )
    });
}

#[test]
fn extreme_profile_fields_never_panic() {
    // Every field of the header and of the first data records.
    let all = profiles();
    let cases: Vec<(usize, Mutation)> = all
        .iter()
        .enumerate()
        .flat_map(|(p, profile)| {
            word_mutations(0..profile.data.len().min(256), &FEW_EXTREMES)
                .into_iter()
                .map(move |m| (p, m))
        })
        .collect();
    run_cases("extreme profile fields", cases.len(), move |i| {
        let (p, ref mutation) = cases[i];
        let profile = &all[p];
        let mut data = profile.data.clone();
        mutation.apply(&mut data);
        Case::new(
            format!("{} {mutation:?}", profile.name),
            data,
            move |data| check_profile(profile, data),
        )
    });
}

#[test]
fn concatenated_and_padded_profiles_never_panic() {
    // Several profiles in one file, with padding, garbage or a second
    // profile of another fixture (and so of another version) after the first.
    let all = profiles();
    let mut inputs: Vec<(String, Vec<u8>, &'static Profile)> = Vec::new();
    for a in all {
        for b in all {
            inputs.push((
                format!("{} + {}", a.name, b.name),
                [&a.data[..], &b.data[..]].concat(),
                a,
            ));
        }
        let half = &a.data[..a.data.len() / 2];
        for pad in [1usize, 7, 8, 9, 64] {
            let zeros = vec![0; pad];
            let ones = vec![0xff; pad];
            inputs.push((
                format!("{} + {pad} zero bytes", a.name),
                [&a.data[..], &zeros].concat(),
                a,
            ));
            inputs.push((
                format!("{} + {pad} 0xff bytes", a.name),
                [&a.data[..], &ones].concat(),
                a,
            ));
            inputs.push((
                format!("{} + {pad} zero bytes + its first half", a.name),
                [&a.data[..], &zeros, half].concat(),
                a,
            ));
        }
    }
    run_cases("concatenated profiles", inputs.len(), move |i| {
        let (name, data, profile) = inputs[i].clone();
        Case::new(name, data, move |data| check_profile(profile, data))
    });
}

// ---------------------------------------------------------------------------
// Files of the wrong kind

fn profdata_of(f: &Fixture) -> Vec<u8> {
    let dir = scratch_dir();
    let path = dir.join(format!("{}.profdata", f.name));
    livecov_tests::merge_profdata(f, &f.runs[0], &path);
    std::fs::read(&path).expect("read the indexed profile")
}

#[test]
fn files_of_the_wrong_kind_give_clear_errors() {
    let f = fixture("c-clang19");
    let binary = std::fs::read(&f.binary).unwrap();
    let profraw = std::fs::read(&f.runs[0].profraws[0]).unwrap();
    let profdata = profdata_of(f);
    let text = b"SF:/src/main.c\nDA:1,1\nend_of_record\n".to_vec();
    let source = std::fs::read(f.source_dir.join("main.c")).unwrap();

    // Given as the binary.
    for (what, bytes) in [
        ("a raw profile", &profraw),
        ("an indexed profile", &profdata),
        ("an empty file", &Vec::new()),
        ("LCOV text", &text),
        ("C source", &source),
    ] {
        let err = CoverageMapping::new()
            .add_object(bytes)
            .expect_err(&format!("{what} given as the binary must be refused"));
        let msg = err.to_string();
        assert!(
            matches!(err, Error::Malformed { offset: 0, .. })
                && msg.contains("not a readable object file"),
            "{what} given as the binary: unclear error {msg:?}"
        );
    }
    // A binary that is a fine object file without coverage: no mapping.
    let plain = std::fs::read(livecov_bin()).unwrap();
    assert!(CoverageMapping::new().add_object(&plain).unwrap().is_none());

    // Given as the raw profile.
    for (what, bytes, says) in [
        ("the instrumented binary", &binary, "not a raw LLVM profile"),
        (
            "an indexed profile",
            &profdata,
            "indexed profile (.profdata)",
        ),
        ("LCOV text", &text, "text"),
        ("C source", &source, "text"),
        ("7 bytes", &profraw[..7].to_vec(), "too short"),
    ] {
        let err = read_raw_profiles(bytes)
            .expect_err(&format!("{what} given as a raw profile must be refused"));
        let msg = err.to_string();
        assert!(
            matches!(err, Error::Malformed { .. }) && msg.contains(says) && msg.contains("offset"),
            "{what} given as a raw profile: expected an error saying {says:?} at an offset, got {msg:?}"
        );
    }
    // An empty raw profile holds no profiles (llvm-profdata skips it silently).
    assert!(read_raw_profiles(&[]).unwrap().is_empty());
}

// ---------------------------------------------------------------------------
// The `livecov convert` command

/// This process's folder for files the tests write,
/// `target/malformed-tests/<pid>`; those of finished processes are removed.
fn scratch_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let parent = workspace_root().join("target/malformed-tests");
        for entry in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.parse::<u32>().is_ok() && !Path::new("/proc").join(&name).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let dir = parent.join(std::process::id().to_string());
        std::fs::create_dir_all(&dir).unwrap();
        dir
    })
    .clone()
}

fn write_scratch(name: &str, bytes: &[u8]) -> PathBuf {
    let path = scratch_dir().join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Runs `livecov convert --binary BINARY --profraw PROFRAWS...`; returns
/// whether it succeeded and its stderr.
fn convert(binary: &Path, profraws: &[&Path]) -> (bool, String) {
    let out = Command::new(livecov_bin())
        .arg("convert")
        .arg("--binary")
        .arg(binary)
        .arg("--profraw")
        .args(profraws)
        .output()
        .expect("run livecov convert");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
        "livecov convert {} {profraws:?} panicked:\n{stderr}",
        binary.display()
    );
    (out.status.success(), stderr)
}

fn assert_fails(binary: &Path, profraws: &[&Path], names: &Path, says: &[&str]) {
    let (ok, stderr) = convert(binary, profraws);
    assert!(
        !ok,
        "livecov convert {} {profraws:?} must fail; stderr:\n{stderr}",
        binary.display()
    );
    assert!(
        stderr.contains(&*names.to_string_lossy()),
        "the error must name {}:\n{stderr}",
        names.display()
    );
    for s in says {
        assert!(stderr.contains(s), "the error must say {s:?}:\n{stderr}");
    }
}

#[test]
fn convert_command_reports_bad_inputs() {
    let f = fixture("c-clang19");
    let binary = f.binary.as_path();
    let profraw = f.runs[0].profraws[0].as_path();
    let data = std::fs::read(profraw).unwrap();

    // Well-formed inputs convert.
    assert!(convert(binary, &[profraw]).0);

    // A raw profile given as the binary, and the binary as a raw profile.
    assert_fails(
        profraw,
        &[profraw],
        profraw,
        &["not a readable object file"],
    );
    assert_fails(binary, &[binary], binary, &["not a raw LLVM profile"]);

    // A truncated raw profile, after a good one.
    let truncated = write_scratch("truncated.profraw", &data[..data.len() - 13]);
    assert_fails(
        binary,
        &[profraw, &truncated],
        &truncated,
        &["malformed", "offset 0x"],
    );

    // Text where a raw profile is expected.
    let text = write_scratch("notes.profraw", b"these are not counters\n");
    assert_fails(binary, &[&text], &text, &["text"]);

    // An indexed profile among the raw ones is read as one (its magic says
    // so); a truncated one is refused, naming it.
    let indexed = profdata_of(f);
    let profdata = write_scratch("merged.profdata", &indexed);
    assert!(convert(binary, &[&profdata]).0, "an indexed profile is read");
    let cut = write_scratch("cut.profdata", &indexed[..indexed.len() / 2]);
    assert_fails(binary, &[&cut], &cut, &["indexed profile"]);

    // A file that does not exist.
    let missing = scratch_dir().join("missing.profraw");
    assert_fails(binary, &[&missing], &missing, &["cannot read"]);

    // A binary without coverage mapping.
    assert_fails(
        livecov_bin(),
        &[profraw],
        livecov_bin(),
        &["no coverage mapping"],
    );

    // A binary whose first function record claims more mapping bytes than
    // __llvm_covfun holds.
    let mut image = std::fs::read(binary).unwrap();
    let covfun = {
        let file = object::File::parse(&*image).unwrap();
        let (start, _) = file
            .section_by_name("__llvm_covfun")
            .unwrap()
            .file_range()
            .unwrap();
        start as usize
    };
    image[covfun + 8..covfun + 12].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
    let broken = write_scratch("broken-covfun", &image);
    assert_fails(
        &broken,
        &[profraw],
        &broken,
        &["__llvm_covfun", "offset 0x"],
    );

    // An empty raw profile is skipped (as llvm-profdata does); never a panic.
    let empty = write_scratch("empty.profraw", &[]);
    convert(binary, &[&empty]);
}
