//! Live counters to reports: the engine of `crate::coverage` fed from the
//! process's own memory.
//!
//! The set of instrumented modules is looked up on every snapshot (cheap);
//! their mappings are decoded when the set changes (start-up costs nothing,
//! the first dump reads the files). A reset does not touch the program's
//! counters: it records a baseline that later snapshots subtract, so the
//! program's own exit profile stays whole.

use regex_lite::Regex;
use rustc_hash::{FxHashMap, FxHashSet};

use hyper::body::Bytes;

use super::modules::{self, CounterRange, DataFrom, Module, ModuleId, Pin, Snapshot};
use super::server::Chunks;
use crate::coverage::{CounterSource, Coverage, Tallies};
use crate::error::{Error, Result};
use crate::fleet::{self, ReportSettings};
use crate::lcov;
use crate::mapping::{CountingBody, CoverageMapping, FileName};
use crate::profile::{self, Counters, FunctionCounters, Lookup, ModuleImage, NameTable, RecordLayout};
use std::sync::Arc;

/// Everything derived from the loaded modules, and the reset baseline.
#[derive(Default)]
pub struct Engine {
    ids: Vec<ModuleId>,
    /// The loader's counts of loads and unloads when `ids` was last found
    /// the modules loaded (see [`modules::load_events`]).
    ids_at: Option<(u64, u64)>,
    modules: Vec<Module>,
    /// Regions and expressions released between reports: the mapping is
    /// several times the size of the sections it is decoded from, which
    /// stay mapped in `objects`.
    mapping: CoverageMapping,
    /// The mapping's objects (numbered as `mapping::Stored::object`): their
    /// files mapped, and where their `__llvm_covfun` is.
    objects: Vec<(memmap2::Mmap, Option<std::ops::Range<usize>>)>,
    /// Per module: counter bytes at the last reset.
    baseline: Vec<Option<Vec<u8>>>,
    /// Every file of the mapping, sorted by name (report order).
    files: Vec<FileName>,
    /// Reused from dump to dump: it keeps the modules' name indices.
    counters: Counters,
    last: Incremental,
    /// The id of the modules' build mapping (see `crate::fleet`), once
    /// computed; forgotten when the modules change.
    mapping_id: Option<String>,
    decoded: Decoded,
    /// The ignore patterns of the first report: the mapping is read without
    /// the functions they leave out of every report.
    leave_out: Option<Vec<Regex>>,
    /// See `Config::scratch`; set by the agent.
    pub scratch: Option<fn(bool)>,
    /// Whether the last LCOV report was computed from the one before (a
    /// warm dump); false after other work. Cleared by the agent.
    pub warm: bool,
    /// Whether the counts restarted from zero since the last report: a
    /// forked child's (see [`Self::count_from_zero`]).
    zero_due: bool,
}

/// What [`Engine::snapshot`] reads of the modules' data sections (see
/// `modules::DataFrom`): a report decodes their records from the files, a
/// raw profile carries them as in memory, counters and resets need none.
#[derive(Clone, Copy)]
enum Data {
    None,
    FromFiles,
    InMemory,
}

/// Scratch memory on while it lives (see `Config::scratch`).
struct Scratch(Option<fn(bool)>);

impl Scratch {
    fn on(hook: Option<fn(bool)>) -> Scratch {
        if let Some(set) = hook {
            set(true);
        }
        Scratch(hook)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(set) = self.0 {
            set(false);
        }
    }
}

/// What counting reads of the functions that ran last (in the last
/// [`STAY_DUMPS`]), their [`CountingBody`]s, kept between dumps within a
/// budget of the size of the objects' `__llvm_covfun`: between dumps of a
/// service the same functions run again (its timers, its requests), and a
/// dump that finds theirs counts them without decoding them. Kept decoded
/// whole instead, they took 724 KB on redis under traffic after 100 dumps,
/// and the agent's memory was 0.6 MB more; a whole function is only
/// needed where counts do not tell enough (see
/// `LiveFile::records_needed`): decoded for that, it is released when the
/// dump is done with it.
#[derive(Default)]
struct Decoded {
    /// Per mapping function: the dump in which its counters last changed.
    ran_at: Vec<u32>,
    /// By mapping index.
    bodies: FxHashMap<u32, CountingBody>,
    dump: u32,
    budget: usize,
    /// The functions decoded whole since the last dump's end (every
    /// function of the mapping, until a first dump's end): a dump's end
    /// releases those left.
    decoded: Option<Vec<usize>>,
    /// A dump's end ([`Self::finish`]) is still to be done: it prepares
    /// the next dump, and an answer need not wait for it (see
    /// [`Engine::tidy`]).
    due: bool,
}

impl Decoded {
    /// A dump begins, in which the `changed` functions ran.
    fn start(&mut self, functions: usize, budget: usize, changed: &[usize]) {
        if self.ran_at.len() != functions {
            *self = Decoded { ran_at: vec![0; functions], ..Decoded::default() };
        }
        self.dump += 1;
        for &i in changed {
            self.ran_at[i] = self.dump;
        }
        self.budget = budget;
    }

    /// The counting body of function `i`, when kept.
    fn body(&self, i: usize) -> Option<&CountingBody> {
        self.bodies.get(&(i as u32))
    }

    /// Those of `functions` without a counting body.
    fn missing(&self, functions: &[usize]) -> Vec<usize> {
        functions.iter().copied().filter(|&i| self.body(i).is_none()).collect()
    }

    /// Keeps the counting bodies of `functions`, decoded whole in `mapping`.
    fn add(&mut self, mapping: &CoverageMapping, functions: &[usize]) {
        for &i in functions {
            if let Some(f) = mapping.functions.get(i) {
                self.bodies.insert(i as u32, f.counting_body());
            }
        }
    }

    /// `functions` are decoded whole (or were already).
    fn decoding(&mut self, functions: &[usize]) {
        if let Some(decoded) = &mut self.decoded {
            decoded.extend_from_slice(functions);
        }
    }

    /// At the end of a dump: every function decoded whole is released,
    /// and of the counting bodies, those of the functions that ran last
    /// stay while the budget lasts.
    fn finish(&mut self, mapping: &mut CoverageMapping) {
        match self.decoded.replace(Vec::new()) {
            Some(decoded) => mapping.release_some(&decoded),
            None => mapping.release_some(&(0..mapping.functions.len()).collect::<Vec<_>>()),
        }
        let mut by_age: Vec<(u32, u32, usize)> =
            self.bodies.iter().map(|(&i, body)| (self.ran_at[i as usize], i, body.bytes())).collect();
        by_age.sort_unstable_by(|a, b| b.cmp(a));
        let mut bytes = 0;
        for (ran_at, i, size) in by_age {
            if self.dump - ran_at <= STAY_DUMPS && bytes + size <= self.budget {
                bytes += size;
            } else {
                self.bodies.remove(&i);
            }
        }
    }
}

/// How many dumps a counting body stays after its function last ran (see
/// [`Decoded`]): a service's timers and requests run theirs at every dump
/// or every few, and what ran once (a start, an error) is let go, not kept
/// until the budget is full (on redis under traffic, the functions kept
/// decoded whole grew from 647 KB after 30 dumps to 836 KB after 300, of a
/// budget of 1.8 MB; with this, 664 to 684 KB).
const STAY_DUMPS: u32 = 20;

/// A function's identity in the counters: name reference and hash.
type Key = (u64, u64);

/// A record a dump updates: its file, and what the functions that ran
/// reach of it.
type Touched = (FileName, lcov::Reach);

/// The functions whose counters changed since the last dump. Those of a
/// key with one record (most) are merged already: the merge of one record
/// is its counters as they are (`merged`: the key, where its counts are in
/// `counts`, one vector for all: hundreds change in a dump, and the words
/// of its record when they are those counts). The others
/// (a key in several modules) by their keys, and per module their records,
/// decoded again.
struct Changed {
    merged: Vec<(u32, std::ops::Range<usize>, Option<Merged>)>,
    counts: Vec<u64>,
    keys: FxHashSet<Key>,
    records: Vec<Vec<FunctionCounters>>,
}

impl Changed {
    fn is_empty(&self) -> bool {
        self.merged.is_empty() && self.keys.is_empty()
    }
}

/// The records a report merges: every one (a whole report), or those whose
/// counters changed since the last.
enum Merge {
    Whole(Vec<Vec<FunctionCounters>>),
    Changed(Changed),
}

/// What the last report was made from, so that the next one recomputes
/// only the stretches of source the functions that ran since reach (see
/// `crate::lcov::LiveFile`): between two dumps of a service most code did
/// not run, and the agent's own code (which does run) is never reported.
#[derive(Default)]
struct Incremental {
    /// The options of the last report (test name, demangling).
    written_with: Option<(Option<String>, bool)>,
    /// Per module, its records as of the last snapshot.
    modules: Vec<ModuleRecords>,
    /// The keys of the modules' records, sorted, once each: the hashes
    /// each name reference has.
    keys: Vec<Key>,
    /// The merged counts of each of `keys`: its record's words, or in
    /// `counts`, one vector for all, not one each in a map. A key whose
    /// number of counts changes (a mismatch of records) has them appended
    /// again there; the next whole merge starts a new one.
    merged: Vec<Merged>,
    counts: Vec<u64>,
    /// The functions of each of `keys`: the functions of `keys[k]` are
    /// `key_functions[key_starts[k]..key_starts[k + 1]]`, and `key_of` has
    /// each function's key (or [`NO_KEY`]). A dump finds the functions of
    /// the keys that changed, and the counts of the functions it loads,
    /// hundreds of each: searched in these sorted vectors of every
    /// function, each was a run of cache misses.
    key_starts: Vec<u32>,
    key_functions: Vec<u32>,
    key_of: Vec<u32>,
    /// The mapping functions of each file (`file_functions[file_starts[file]
    /// ..file_starts[file + 1]]`), ascending: a dump recomputes the files
    /// whose functions ran without looking at every function of the program.
    file_functions: Vec<u32>,
    file_starts: Vec<u32>,
    /// Per file (indexed by `FileName`): its record.
    files: Vec<FileRecord>,
    /// The last report: the texts of `files`, shared with the answers
    /// that carry it.
    report: Chunks,
    /// Set when the last whole merge had no warnings (names all resolved,
    /// counter counts agree): only then are merged counts updated key by key.
    exact: bool,
    /// The indices in `keys` of the keys with several records (a function
    /// in the program and in a shared object, or in two), ascending: when
    /// one of them changes, the merge takes them all again.
    shared: Vec<u32>,
    /// Which functions are zero-region stubs, of those decoded since the
    /// last whole report (which decodes every function of the report).
    stubs: Stubs,
}

/// Whether each function (by mapping index) is a zero-region stub, once
/// known: two bits a function. A dump needs it of every function that ran
/// (a stub's files are computed whole), and a forked child's first report
/// has its parent's among those, most in files it takes with every count
/// zero: told here, it decodes only those in the files it updates (a
/// redis `BGSAVE` child: 437 of 867; its report took 16.3 ms against 17.8,
/// medians of 21 children).
#[derive(Default)]
struct Stubs {
    known: Vec<u64>,
    stub: Vec<u64>,
}

impl Stubs {
    fn note(&mut self, i: usize, stub: bool) {
        let (word, bit) = (i / 64, 1u64 << (i % 64));
        if self.known.len() <= word {
            self.known.resize(word + 1, 0);
            self.stub.resize(word + 1, 0);
        }
        self.known[word] |= bit;
        if stub {
            self.stub[word] |= bit;
        } else {
            self.stub[word] &= !bit;
        }
    }

    fn get(&self, i: usize) -> Option<bool> {
        let (word, bit) = (i / 64, 1u64 << (i % 64));
        let known = self.known.get(word).is_some_and(|w| w & bit != 0);
        known.then(|| self.stub[word] & bit != 0)
    }
}

/// A file's record as of the last report.
#[derive(Default)]
enum FileRecord {
    /// Not in the report.
    #[default]
    None,
    /// Its text alone: none of its functions ran since a whole report
    /// computed it. A whole report (the first) parks every record, and a
    /// dump that reaches one computes it whole again, in parts: most files
    /// of a service never run between dumps (on redis under traffic, 72 of
    /// 201 ran in 30 dumps), and the parts of the others were 0.45 MB.
    Parked(Bytes),
    /// In parts, with its text (boxed: a Rust program's mapping names
    /// thousands of files, of the standard library and dependencies, and a
    /// record is hundreds of bytes before its parts).
    Live(Box<lcov::LiveFile>),
}

impl FileRecord {
    fn text(&self) -> Option<&Bytes> {
        match self {
            FileRecord::None => None,
            FileRecord::Parked(text) => Some(text),
            FileRecord::Live(live) => Some(live.text()),
        }
    }

    fn live(&self) -> Option<&lcov::LiveFile> {
        match self {
            FileRecord::Live(live) => Some(live),
            _ => None,
        }
    }

    fn live_mut(&mut self) -> Option<&mut lcov::LiveFile> {
        match self {
            FileRecord::Live(live) => Some(live),
            _ => None,
        }
    }
}

/// A module's records that matter for the report (those of functions with
/// a reported file: the agent's own code, which runs at every dump, has
/// none), and their counter bytes as last read, one record's after the
/// other (not the whole section: most of a Rust program's records are of
/// functions no report shows). A dump compares them with the module's and
/// decodes again the records that changed.
struct ModuleRecords {
    records: Vec<Record>,
    /// The records' counter bytes, each record's from a word boundary: the
    /// merged counts of a key with one record of 64-bit counters (nearly
    /// every key) are its words here, not a copy (see [`Merged::Record`]).
    words: Vec<u64>,
    /// Whether the module's counters are 64-bit counts as they are (not
    /// single bytes, nor after a timestamp).
    plain: bool,
    /// Runs of records (`records[from..to]`) whose counters follow one
    /// another both in the module and in `words`, of [`RUN_BYTES`] at
    /// most: a dump compares a run at once, and its records one by one
    /// only when it changed. Between two dumps of a service most records
    /// did not change, and comparing them one by one cost more than
    /// reading their counters (on redis, 4518 records in 248 KB).
    runs: Vec<(u32, u32)>,
}

/// The most counter bytes of a run (see [`ModuleRecords::runs`]): a
/// service's code that runs is in a few of its files, whose records are
/// side by side, and a run that changed is compared again record by
/// record.
const RUN_BYTES: usize = 512;

/// The bytes of `words`.
fn bytes_of(words: &[u64]) -> &[u8] {
    // Safety: the bytes of initialized `u64`s, borrowed with them.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast(), std::mem::size_of_val(words)) }
}

/// The bytes of `words`, to write.
fn bytes_of_mut(words: &mut [u64]) -> &mut [u8] {
    // Safety: as `bytes_of`; every pattern of 8 bytes is a `u64`.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), std::mem::size_of_val(words)) }
}

impl ModuleRecords {
    /// Appends a record's counter `bytes` (from a word boundary); where.
    fn push(&mut self, bytes: &[u8]) -> usize {
        let at = self.words.len() * 8;
        self.words.resize(self.words.len() + bytes.len().div_ceil(8), 0);
        bytes_of_mut(&mut self.words)[at..at + bytes.len()].copy_from_slice(bytes);
        at
    }

    /// The runs of `records` (see [`Self::runs`]).
    fn find_runs(&mut self) {
        let records = &self.records;
        self.runs.clear();
        let mut from = 0;
        for j in 1..=records.len() {
            let cut = records.get(j).is_none_or(|r| {
                let last = &records[j - 1];
                r.counters.0 != last.counters.1
                    || r.kept_at as usize != last.kept().end
                    || (r.counters.1 - records[from].counters.0) as usize > RUN_BYTES
            });
            if cut {
                self.runs.push((from as u32, j as u32));
                from = j;
            }
        }
        self.runs.shrink_to_fit();
    }

    /// The merged counts of `record`, when it is its key's only one: its
    /// words, if the module's counters are plain counts.
    fn merged(&self, module: usize, record: &Record) -> Option<Merged> {
        let (at, len) = (record.kept_at / 8, record.span().len() as u32 / 8);
        self.plain.then(|| Merged::Record { module: module as u32, words: at..at + len })
    }
}

/// The merged counts of a key.
#[derive(Clone, Default)]
enum Merged {
    /// The merge found none.
    #[default]
    None,
    /// In `Incremental::counts`.
    Counts(std::ops::Range<u32>),
    /// The words of its one record in module `module` (see
    /// [`ModuleRecords::words`]).
    Record { module: u32, words: std::ops::Range<u32> },
}

/// A record of a module: its index there, its key's in `Incremental::keys`,
/// where its counters are in the module's counter section, and where their
/// bytes are in `ModuleRecords::counters`.
struct Record {
    index: u32,
    key: u32,
    counters: (u32, u32),
    kept_at: u32,
}

impl Record {
    fn span(&self) -> std::ops::Range<usize> {
        self.counters.0 as usize..self.counters.1 as usize
    }

    fn kept(&self) -> std::ops::Range<usize> {
        let at = self.kept_at as usize;
        at..at + self.span().len()
    }
}

/// Counts for the coverage engine from the incremental state: the same
/// answers `Counters::lookup` gives when every name resolves.
struct MergedCounts<'a>(&'a Incremental);

impl CounterSource for MergedCounts<'_> {
    fn lookup(&self, function: usize, name_ref: u64, hash: u64) -> Lookup<'_> {
        let last = self.0;
        let k = last.key_of.get(function).map_or(NO_KEY, |&k| k as usize);
        let merged = last.merged.get(k).filter(|_| last.keys.get(k) == Some(&(name_ref, hash)));
        if let Some(counters) = merged.and_then(|m| last.counts_of(m)) {
            return Lookup::Found { counters, bitmap: &[] };
        }
        let from = last.keys.partition_point(|k| k.0 < name_ref);
        let of_name = &last.keys[from..from + last.keys[from..].partition_point(|k| k.0 == name_ref)];
        if let Some(k) = of_name.iter().position(|k| k.1 == hash) {
            if let Some(counters) = last.counts_of(&last.merged[from + k]) {
                return Lookup::Found { counters, bitmap: &[] };
            }
        }
        let cs = |h: u64| (h >> profile::CS_FLAG_IN_HASH) & 1;
        match of_name.iter().any(|k| cs(k.1) == cs(hash)) {
            true => Lookup::HashMismatch,
            false => Lookup::Unknown,
        }
    }
}

const NO_KEY: usize = u32::MAX as usize;

impl Incremental {
    fn forget(&mut self) {
        *self = Incremental::default();
    }

    /// Indexes the functions of each of `keys` (see `key_functions`),
    /// found `by_key`.
    fn index_keys(&mut self, mapping: &CoverageMapping, by_key: &ByKey) {
        let mut starts = Vec::with_capacity(self.keys.len() + 1);
        let mut all = Vec::new();
        let mut key_of = vec![NO_KEY as u32; mapping.functions.len()];
        for (k, &key) in self.keys.iter().enumerate() {
            starts.push(all.len() as u32);
            let functions = by_key.functions_with(mapping, key);
            for &i in functions {
                key_of[i as usize] = k as u32;
            }
            all.extend_from_slice(functions);
        }
        starts.push(all.len() as u32);
        all.shrink_to_fit();
        (self.key_starts, self.key_functions, self.key_of) = (starts, all, key_of);
    }

    /// The mapping functions of `keys[k]`.
    fn functions_of_key(&self, k: usize) -> &[u32] {
        let at = |k: usize| self.key_starts.get(k).map_or(0, |&s| s as usize);
        self.key_functions.get(at(k)..at(k + 1)).unwrap_or_default()
    }

    /// Whether each function of the `mapping` counts now: a count of its
    /// key's merged counts is not zero.
    fn counted(&self, mapping: &CoverageMapping) -> Vec<bool> {
        let mut counted = vec![false; mapping.functions.len()];
        for (k, merged) in self.merged.iter().enumerate() {
            if self.counts_of(merged).is_some_and(|counts| counts.iter().any(|&c| c != 0)) {
                for &i in self.functions_of_key(k) {
                    if let Some(c) = counted.get_mut(i as usize) {
                        *c = true;
                    }
                }
            }
        }
        counted
    }

    /// Sets the merged counts of `keys[k]`: the words of its one `record`
    /// when they are those counts, a copy in `counts` otherwise.
    fn set_merged(&mut self, k: usize, counts: Option<&[u64]>, record: Option<&Merged>) {
        if let Some(words) = record.filter(|words| self.counts_of(words) == counts) {
            self.merged[k] = words.clone();
            return;
        }
        let Some(counts) = counts else {
            self.merged[k] = Merged::None;
            return;
        };
        match &self.merged[k] {
            Merged::Counts(r) if r.len() == counts.len() => {
                self.counts[r.start as usize..r.end as usize].copy_from_slice(counts)
            }
            _ => {
                let start = self.counts.len() as u32;
                self.counts.extend_from_slice(counts);
                self.merged[k] = Merged::Counts(start..self.counts.len() as u32);
            }
        }
    }

    /// The counts `merged` stands for.
    fn counts_of(&self, merged: &Merged) -> Option<&[u64]> {
        let range = |r: &std::ops::Range<u32>| r.start as usize..r.end as usize;
        match merged {
            Merged::None => None,
            Merged::Counts(r) => self.counts.get(range(r)),
            Merged::Record { module, words } => self.modules.get(*module as usize)?.words.get(range(words)),
        }
    }
}

/// The indices of the mapping's functions, by key (then index): the
/// functions of a key are a run of them. Made for a dump that reads every
/// record (a first one, one after a reset), in a few hundred microseconds:
/// kept, it took 12 bytes a function of the program.
struct ByKey {
    functions: Vec<u32>,
    /// The name reference of each of `functions`: searched instead of the
    /// functions themselves, which are large and far apart in memory.
    names: Vec<u64>,
}

impl ByKey {
    fn of(mapping: &CoverageMapping) -> ByKey {
        let all = &mapping.functions;
        let mut functions: Vec<u32> = (0..all.len() as u32).collect();
        functions.sort_unstable_by_key(|&i| (all[i as usize].name_ref, all[i as usize].hash, i));
        let names = functions.iter().map(|&i| all[i as usize].name_ref).collect();
        ByKey { functions, names }
    }

    /// The mapping functions with `key`.
    fn functions_with(&self, mapping: &CoverageMapping, key: Key) -> &[u32] {
        let from = self.names.partition_point(|&n| n < key.0);
        let of_name = &self.functions[from..from + self.names[from..].partition_point(|&n| n == key.0)];
        // A name has one hash but for the rare function of several builds.
        let hash = |i: &u32| mapping.functions[*i as usize].hash;
        let from = of_name.partition_point(|i| hash(i) < key.1);
        &of_name[from..from + of_name[from..].partition_point(|i| hash(i) == key.1)]
    }
}

/// The functions of each file, from (file, function) pairs listed function
/// by function, ascending: file `f`'s are `functions[starts[f]..starts[f +
/// 1]]`, ascending, each once. Placed by file in one pass, not sorted: a
/// function of a C program expands the macros of tens of headers, and
/// sorting the thousands of pairs of a dump's functions cost 0.1 ms.
fn functions_by_file(files: usize, pairs: &[(FileName, u32)]) -> (Vec<u32>, Vec<u32>) {
    // Room for each file's pairs, then each function placed in its file's
    // room: a function's file ids of one file come side by side, and it
    // counts once.
    let mut room = vec![0u32; files + 1];
    for &(file, _) in pairs {
        room[file as usize + 1] += 1;
    }
    for f in 1..room.len() {
        room[f] += room[f - 1];
    }
    let mut end = room.clone();
    let mut placed = vec![0u32; pairs.len()];
    for &(file, i) in pairs {
        let (from, at) = (room[file as usize], &mut end[file as usize]);
        if *at > from && placed[*at as usize - 1] == i {
            continue;
        }
        placed[*at as usize] = i;
        *at += 1;
    }
    let mut starts = Vec::with_capacity(files + 1);
    let mut functions = Vec::with_capacity(pairs.len());
    for f in 0..files {
        starts.push(functions.len() as u32);
        functions.extend_from_slice(&placed[room[f] as usize..end[f] as usize]);
    }
    starts.push(functions.len() as u32);
    (starts, functions)
}

/// What a report includes.
pub struct ReportOptions<'a> {
    pub ignore: &'a [Regex],
    pub demangle: bool,
    pub test_name: Option<&'a str>,
    pub path_map: &'a [(String, String)],
}

impl Engine {
    /// Looks the modules up again; decodes what is new.
    fn refresh(&mut self) -> Result<()> {
        // Read before the list: a module loaded in between makes them
        // differ at the next look, which lists again.
        let events = modules::load_events();
        if events.is_some() && events == self.ids_at {
            return Ok(());
        }
        let ids = modules::loaded_modules();
        if ids == self.ids {
            self.ids_at = events;
            return Ok(());
        }
        self.ids_at = None;
        let mut modules = Vec::new();
        let mut baseline = Vec::new();
        let mut mapping = CoverageMapping::without_regions().leaving_out(self.leave_out.as_deref().unwrap_or_default());
        let mut objects = Vec::new();
        for id in &ids {
            if modules::known_without_counters(&id.path) {
                continue;
            }
            let old = self.modules.iter().position(|m| m.id == *id);
            let image = map_file(id, ids.first() == Some(id))?;
            let module = match old {
                Some(i) => Some(self.modules.swap_remove(i)).map(|m| (m, self.baseline.swap_remove(i))),
                None => modules::open_module(id, &image)?.map(|m| (m, None)),
            };
            let Some((module, base)) = module else { continue };
            if mapping
                .add_object_with_names(&image, |section| shared_names(&module.names, section))
                .map_err(|e| e.context(&id.path.display().to_string()))?
                .is_some()
            {
                let covfun = CoverageMapping::covfun_range(&image);
                objects.push((image, covfun));
            }
            modules.push(module);
            baseline.push(base);
        }
        // The names have named the mapping; merges only need to know which
        // references are a module's.
        for m in &mut modules {
            if m.names.has_names() {
                m.names = Arc::new(m.names.references_only());
            }
        }
        modules::publish_counter_ranges(&ids, modules.iter().map(Module::counter_range).collect::<Vec<CounterRange>>());
        let mut files: Vec<FileName> = (0..mapping.files.len() as FileName).collect();
        files.sort_by(|a, b| mapping.file_name(*a).cmp(mapping.file_name(*b)));
        self.files = files;
        // It holds the tables of the modules' names as they were.
        self.counters = Counters::new();
        self.last.forget();
        self.mapping_id = None;
        self.decoded = Decoded::default();
        self.ids = ids;
        self.ids_at = events;
        self.modules = modules;
        self.baseline = baseline;
        self.mapping = mapping;
        self.objects = objects;
        Ok(())
    }

    /// Whether function `i` is a zero-region stub, when known (see
    /// [`Stubs`]) or decoded.
    fn is_stub(&self, i: usize) -> Option<bool> {
        self.last.stubs.get(i).or_else(|| self.decoded.body(i).map(|body| body.stub))
    }

    /// Keeps the counting bodies of those of `functions` without one,
    /// decoded a batch at a time.
    fn load(&mut self, functions: &[usize]) -> Result<()> {
        for some in self.decoded.missing(functions).chunks(BATCH_FUNCTIONS) {
            self.restore(some)?;
            self.decoded.add(&self.mapping, some);
            self.release_done(some);
        }
        Ok(())
    }

    /// Decodes again the released regions of `functions`.
    fn restore(&mut self, functions: &[usize]) -> Result<()> {
        self.decoded.decoding(functions);
        let objects = &self.objects;
        self.mapping.restore(functions, |object| {
            let (image, range) = objects.get(object as usize)?;
            image.get(range.clone()?)
        })?;
        for &i in functions {
            if let Some(stub) = self.mapping.functions.get(i).and_then(|f| f.is_stub()) {
                self.last.stubs.note(i, stub);
            }
        }
        Ok(())
    }

    /// The executable never unloads; shared objects may.
    fn is_main(&self, m: &Module) -> bool {
        self.ids.first() == Some(&m.id)
    }

    /// The instrumented modules, as last looked up.
    pub fn modules(&self) -> &[Module] {
        &self.modules
    }

    /// Counters of every module now, minus the baseline, and the data
    /// sections as `data` says.
    fn snapshot(&mut self, data: Data) -> Result<Vec<Snapshot>> {
        self.refresh()?;
        if self.modules.is_empty() {
            return Err(Error::Unsupported(
                "no instrumented module is loaded: build with -C instrument-coverage (Rust) or \
                 -fprofile-instr-generate -fcoverage-mapping (clang)"
                    .into(),
            ));
        }
        let mut out = Vec::with_capacity(self.modules.len());
        for (i, m) in self.modules.iter().enumerate() {
            let Some(_pin) = Pin::new(&m.id, self.is_main(m)) else {
                return Err(Error::Mismatch(format!("{} was unloaded during the snapshot", m.id.path.display())));
            };
            let file = matches!(data, Data::FromFiles).then(|| map_file(&m.id, self.is_main(m)).ok()).flatten();
            let from = match (data, file.as_deref()) {
                (Data::None, _) => DataFrom::Nowhere,
                (Data::FromFiles, Some(file)) => DataFrom::File(file),
                _ => DataFrom::Memory,
            };
            // Safety: pinned above.
            let mut snap = unsafe { m.snapshot(from) };
            if let Some(base) = &self.baseline[i] {
                subtract(&mut snap.counters, base);
            }
            out.push(snap);
        }
        Ok(out)
    }

    /// Makes the current counts the zero of later snapshots.
    fn rebase(&mut self, snapshots: &[Snapshot]) {
        for (i, snap) in snapshots.iter().enumerate() {
            let m = &self.modules[i];
            if m.layout.variant.byte_coverage {
                // A covered byte cannot be told apart from one covered again:
                // clear them in memory, as the runtime's reset does.
                if let Some(_pin) = Pin::new(&m.id, self.is_main(m)) {
                    // Safety: pinned.
                    unsafe { m.zero() };
                }
                continue;
            }
            let mut absolute = snap.counters.clone();
            if let Some(base) = &self.baseline[i] {
                add(&mut absolute, base);
            }
            self.baseline[i] = Some(absolute);
        }
    }

    /// What the work left to do once its answer is sent: the end of a
    /// dump (on redis under traffic, 20-30 µs a dump, most of it finding
    /// the counting bodies to let go), and the pages of the files it read
    /// ([`Self::release_file_pages`]). A dump that finds its end not done
    /// does it first.
    pub fn tidy(&mut self) {
        self.finish_dump();
        self.release_file_pages();
    }

    /// The end of the last dump ([`Decoded::finish`]), if not done yet.
    fn finish_dump(&mut self) {
        if std::mem::take(&mut self.decoded.due) {
            self.decoded.finish(&mut self.mapping);
        }
    }

    /// Gives the pages of the objects' files that the work read back to
    /// the kernel (called once it is done). They are the files' own
    /// (read-only, shared with the page cache): the next report reads again
    /// the few it needs (of the functions that ran), where they would
    /// otherwise stay resident in the process, most of `__llvm_covfun`
    /// after the first report.
    fn release_file_pages(&self) {
        for (image, _) in &self.objects {
            // Safety: a read-only shared mapping of a file: a page given
            // back is read again from the file when touched, so what is
            // borrowed from it reads the same.
            let _ = unsafe { image.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
        }
    }

    /// The LCOV report of the counts since start (or the last reset).
    pub fn lcov(&mut self, options: &ReportOptions<'_>, reset: bool) -> Result<Chunks> {
        if self.leave_out.is_none() {
            self.leave_out = Some(options.ignore.to_vec());
            // A mapping read before (for a raw profile) has every function.
            self.ids.clear();
            self.ids_at = None;
        }
        self.refresh()?;
        let written_with = Some((options.test_name.map(str::to_owned), options.demangle));
        if self.last.file_starts.is_empty() {
            drop_unreported(&mut self.mapping, options.ignore);
            let mut pairs: Vec<(FileName, u32)> = Vec::new();
            for (i, f) in self.mapping.functions.iter().enumerate() {
                pairs.extend(self.mapping.filenames(f).iter().map(|&file| (file, i as u32)));
            }
            (self.last.file_starts, self.last.file_functions) = functions_by_file(self.mapping.files.len(), &pairs);
        }
        let incremental = !reset
            && self.last.exact
            && self.last.written_with.as_ref().map(|w| w.1) == Some(options.demangle)
            && self.last.modules.len() == self.modules.len();
        self.warm = incremental;
        if incremental {
            let changed = self.changed_since_last()?;
            if changed.is_empty() && self.last.written_with == written_with {
                return Ok(self.last.report.clone());
            }
            return self.report_or_forget(options, Merge::Changed(changed));
        }

        // Everything again: decode every record of a full snapshot.
        let snapshots = self.snapshot(Data::FromFiles)?;
        if reset {
            self.rebase(&snapshots);
        }
        // Of the records, those of names the mapping has, and those of no
        // name (llvm-profdata files them under the empty one, where a name
        // it lacks is looked up): no other changes a count of a report.
        // They are most of a Rust program's (the standard library's, its
        // dependencies').
        let by_key = ByKey::of(&self.mapping);
        let in_mapping = |name_ref: u64| by_key.names.binary_search(&name_ref).is_ok();
        let mut decoded = Vec::with_capacity(self.modules.len());
        for (m, snap) in self.modules.iter().zip(snapshots) {
            let keep = |name_ref| in_mapping(name_ref) || m.names.index_of(name_ref).is_none();
            decoded.push((m.records_with_spans(&snap, keep)?, snap.counters));
        }
        let mut keys: Vec<Key> =
            decoded.iter().flat_map(|(records, _)| records.iter().map(|(_, r, _)| (r.name_ref, r.hash))).collect();
        keys.sort_unstable();
        keys.dedup();
        keys.shrink_to_fit();
        let ignored = ignored_files(&self.mapping, options.ignore);
        let relevant: Vec<bool> = keys.iter().map(|&key| self.is_reported(&by_key, key, &ignored)).collect();
        let too_large = || Error::Unsupported("counter sections of 4 GiB or more".into());
        let mut states = Vec::with_capacity(self.modules.len());
        let mut whole = Vec::with_capacity(self.modules.len());
        for ((records, counters), m) in decoded.into_iter().zip(&self.modules) {
            let plain = !m.layout.variant.byte_coverage && !m.layout.variant.temporal;
            let mut kept = ModuleRecords { records: Vec::new(), words: Vec::new(), plain, runs: Vec::new() };
            for (j, r, span) in &records {
                let Ok(k) = keys.binary_search(&(r.name_ref, r.hash)) else { continue };
                let Some(bytes) = counters.get(span.clone()).filter(|_| relevant[k]) else { continue };
                let at = |n: usize| u32::try_from(n).map_err(|_| too_large());
                let kept_at = at(kept.push(bytes))?;
                kept.records.push(Record { index: at(*j)?, key: at(k)?, counters: (at(span.start)?, at(span.end)?), kept_at });
            }
            kept.records.shrink_to_fit();
            kept.find_runs();
            kept.words.shrink_to_fit();
            states.push(kept);
            whole.push(records.into_iter().map(|(_, r, _)| r).collect());
        }
        let mut records_of = vec![0u8; keys.len()];
        for r in states.iter().flat_map(|state| &state.records) {
            records_of[r.key as usize] = records_of[r.key as usize].saturating_add(1);
        }
        let shared: Vec<u32> = (0..keys.len() as u32).filter(|&k| records_of[k as usize] > 1).collect();
        let file_functions = std::mem::take(&mut self.last.file_functions);
        let file_starts = std::mem::take(&mut self.last.file_starts);
        self.last.forget();
        self.last.file_functions = file_functions;
        self.last.file_starts = file_starts;
        self.last.keys = keys;
        self.last.index_keys(&self.mapping, &by_key);
        self.last.modules = states;
        self.last.shared = shared;
        self.report_or_forget(options, Merge::Whole(whole))
    }

    /// A report that failed half way leaves the incremental state behind
    /// the counters: the next one is computed whole.
    fn report_or_forget(&mut self, options: &ReportOptions<'_>, changed: Merge) -> Result<Chunks> {
        let report = self.report(options, changed);
        if report.is_err() {
            self.last.forget();
        }
        report
    }

    /// Whether the function with `key` (found `by_key`) has a file in
    /// reports (the agent's own code, and the `ignored` files, have none).
    fn is_reported(&self, by_key: &ByKey, key: Key, ignored: &[bool]) -> bool {
        let functions = by_key.functions_with(&self.mapping, key);
        let mut files = functions.iter().flat_map(|&i| self.mapping.filenames(&self.mapping.functions[i as usize]));
        files.any(|&file| !ignored[file as usize])
    }

    /// Reads the counters of reported functions from memory and compares
    /// them with the last dump's; decodes and keeps those that changed.
    fn changed_since_last(&mut self) -> Result<Changed> {
        let mut changed = Changed {
            merged: Vec::new(),
            counts: Vec::new(),
            keys: FxHashSet::default(),
            records: vec![Vec::new(); self.modules.len()],
        };
        let mut bytes = Vec::new();
        let keys = &self.last.keys;
        // Keys with several records that changed, and the records changed.
        let mut shared_changed: Vec<u32> = Vec::new();
        let mut changed_records: Vec<(usize, usize)> = Vec::new();
        for (i, (m, state)) in self.modules.iter().zip(&mut self.last.modules).enumerate() {
            let Some(_pin) = Pin::new(&m.id, self.ids.first() == Some(&m.id)) else {
                return Err(Error::Mismatch(format!("{} was unloaded during the snapshot", m.id.path.display())));
            };
            let base = self.baseline[i].as_deref();
            let base_of = |span: std::ops::Range<usize>| base.map(|b| b.get(span).unwrap_or(&[]));
            // The runs that changed: their records are compared one by one.
            let changed_runs: Vec<(u32, u32)> = state
                .runs
                .iter()
                .copied()
                .filter(|&(from, to)| {
                    let (first, last) = (&state.records[from as usize], &state.records[to as usize - 1]);
                    let span = first.counters.0 as usize..last.counters.1 as usize;
                    let kept = bytes_of(&state.words).get(first.kept_at as usize..last.kept().end);
                    // Safety: pinned above; spans were decoded from this module.
                    !kept.is_some_and(|kept| unsafe { m.counters_are(span.clone(), kept, base_of(span)) })
                })
                .collect();
            for j in changed_runs.iter().flat_map(|&(from, to)| from as usize..to as usize) {
                let r = &state.records[j];
                let span = r.span();
                let Some(last) = bytes_of_mut(&mut state.words).get_mut(r.kept()) else { continue };
                let base = base_of(span.clone());
                // Safety (both): pinned above; spans were decoded from this module.
                if unsafe { m.counters_are(span.clone(), last, base) } {
                    continue;
                }
                unsafe { m.read_counters(span.clone(), &mut bytes) };
                if let Some(base) = base {
                    subtract(&mut bytes, base);
                }
                if *last != *bytes {
                    last.copy_from_slice(&bytes);
                    if self.last.shared.binary_search(&r.key).is_err() {
                        let from = changed.counts.len();
                        profile::decode_counters_into(&m.layout, &bytes, r.index as usize, &mut changed.counts)?;
                        changed.merged.push((r.key, from..changed.counts.len(), state.merged(i, r)));
                        continue;
                    }
                    // Looked up here, not for every changed record: the
                    // keys are read far apart, a cache miss each (on redis
                    // under traffic, 230 records changed a dump, and this
                    // comparison took 100-115 µs against 125-155 µs).
                    let Some(&(name_ref, hash)) = keys.get(r.key as usize) else { continue };
                    let counters = profile::decode_counters(&m.layout, &bytes, r.index as usize)?;
                    changed.keys.insert((name_ref, hash));
                    // The bitmap is left out: LCOV reports do not read it
                    // (see `MergedCounts`), and it changes no merged count.
                    changed.records[i].push(FunctionCounters { name_ref, hash, counters, bitmap: Vec::new() });
                    shared_changed.push(r.key);
                    changed_records.push((i, j));
                }
            }
        }
        if !shared_changed.is_empty() {
            // The other records of those keys, as the last dump read them:
            // a merge of some records of a key would leave the others out.
            shared_changed.sort_unstable();
            changed_records.sort_unstable();
            for (i, (m, state)) in self.modules.iter().zip(&self.last.modules).enumerate() {
                for (j, r) in state.records.iter().enumerate() {
                    if shared_changed.binary_search(&r.key).is_err() || changed_records.binary_search(&(i, j)).is_ok() {
                        continue;
                    }
                    let Some(bytes) = bytes_of(&state.words).get(r.kept()) else { continue };
                    let Some(&(name_ref, hash)) = keys.get(r.key as usize) else { continue };
                    let counters = profile::decode_counters(&m.layout, bytes, r.index as usize)?;
                    changed.records[i].push(FunctionCounters { name_ref, hash, counters, bitmap: Vec::new() });
                }
            }
        }
        Ok(changed)
    }

    /// Merges the records of `merge` as llvm-profdata would, and recomputes
    /// what of the report they reach.
    fn report(&mut self, options: &ReportOptions<'_>, merge: Merge) -> Result<Chunks> {
        let last = &mut self.last;
        last.written_with = Some((options.test_name.map(str::to_owned), options.demangle));
        let mut counters = std::mem::take(&mut self.counters);
        counters.clear();
        let (selected, changed) = match merge {
            Merge::Whole(records) => (records, None),
            Merge::Changed(mut changed) => (std::mem::take(&mut changed.records), Some(changed)),
        };
        for (m, records) in self.modules.iter().zip(selected) {
            counters.add_module(m.layout.variant, m.names.clone(), records)?;
        }
        let whole = changed.is_none();
        let (changed_functions, mut rebuild): (Vec<usize>, Vec<FileName>) = match &changed {
            None => {
                last.exact = counters.warnings().is_empty();
                last.merged = vec![Merged::None; last.keys.len()];
                last.counts.clear();
                // A key of one record: its words, when the merge found them.
                let mut single: Vec<Option<Merged>> = vec![None; last.keys.len()];
                for (i, state) in last.modules.iter().enumerate() {
                    for r in &state.records {
                        if last.shared.binary_search(&r.key).is_err() {
                            single[r.key as usize] = state.merged(i, r);
                        }
                    }
                }
                for (k, words) in single.into_iter().enumerate() {
                    let (name_ref, hash) = last.keys[k];
                    if let Lookup::Found { counters: c, .. } = counters.lookup(name_ref, hash) {
                        last.set_merged(k, Some(c), words.as_ref());
                    }
                }
                last.counts.shrink_to_fit();
                (Vec::new(), self.files.clone())
            }
            Some(changed) => {
                let mut functions = Vec::new();
                for (k, counts, words) in &changed.merged {
                    let k = *k as usize;
                    last.set_merged(k, changed.counts.get(counts.clone()), words.as_ref());
                    functions.extend(last.functions_of_key(k).iter().map(|&i| i as usize));
                }
                for key in &changed.keys {
                    // A changed key is a record's: it is in `keys`.
                    if let Ok(k) = last.keys.binary_search(key) {
                        match counters.lookup(key.0, key.1) {
                            Lookup::Found { counters: c, .. } => last.set_merged(k, Some(c), None),
                            _ => last.set_merged(k, None, None),
                        }
                        functions.extend(last.functions_of_key(k).iter().map(|&i| i as usize));
                    }
                }
                functions.sort_unstable();
                functions.dedup();
                (functions, Vec::new())
            }
        };
        // What the merge holds is in `merged` now: only its name index is
        // kept for the next one.
        counters.clear();
        self.counters = counters;
        let covfun = self.objects.iter().filter_map(|(_, range)| range.as_ref().map(|r| r.len())).sum();
        self.finish_dump();
        self.decoded.start(self.mapping.functions.len(), covfun, &changed_functions);
        let unknown: Vec<usize> = changed_functions.iter().copied().filter(|&i| self.is_stub(i).is_none()).collect();
        self.load(&unknown)?;
        for &i in &changed_functions {
            // Whether llvm-cov loads a zero-region stub depends on its
            // counts: its files are computed whole again.
            if self.is_stub(i) == Some(true) {
                rebuild.extend(self.mapping.filenames(&self.mapping.functions[i]).iter().copied());
            }
        }
        rebuild.sort_unstable();
        rebuild.dedup();

        let ignored = ignored_files(&self.mapping, options.ignore);
        rebuild.retain(|&f| !ignored[f as usize]);
        self.last.files.resize_with(self.mapping.files.len(), FileRecord::default);
        // In a forked child's first report, the functions that count now.
        let counted = (std::mem::take(&mut self.zero_due) && !whole).then(|| self.last.counted(&self.mapping));
        let zeroed = match &counted {
            Some(counted) => self.zero_uncounted(counted, &changed_functions, &rebuild),
            None => Vec::new(),
        };
        // The functions a record updates from their counts: those with a
        // file not taken with every count zero.
        let updating: Vec<usize> = match zeroed.is_empty() {
            true => changed_functions.clone(),
            false => {
                let mapping = &self.mapping;
                let files_of = |i: usize| mapping.filenames(&mapping.functions[i]);
                let unzeroed = |&i: &usize| files_of(i).iter().any(|f| zeroed.binary_search(f).is_err());
                changed_functions.iter().copied().filter(unzeroed).collect()
            }
        };
        self.load(&updating)?;
        let last = &mut self.last;
        // The files with a record in parts that changed functions touch,
        // and which: (file, function) pairs; the parked records they touch
        // are computed whole.
        let files_of = |i: usize| self.mapping.filenames(&self.mapping.functions[i]);
        let files_of_changed = changed_functions.iter().map(|&i| files_of(i).len()).sum();
        let mut pairs: Vec<(FileName, u32)> = Vec::with_capacity(files_of_changed);
        let mut unparked = Vec::new();
        for &i in &changed_functions {
            for &file in files_of(i).iter().filter(|file| zeroed.binary_search(file).is_err()) {
                match last.files[file as usize] {
                    FileRecord::Live(_) if rebuild.binary_search(&file).is_err() => pairs.push((file, i as u32)),
                    FileRecord::Parked(_) => unparked.push(file),
                    _ => {}
                }
            }
        }
        rebuild.extend(unparked);
        rebuild.sort_unstable();
        rebuild.dedup();
        let (starts, functions) = functions_by_file(last.files.len(), &pairs);
        // Each record's indices asked for two records ahead of its reach
        // (see `LiveFile::prefetch_index`).
        const INDEX_AHEAD: usize = 2;
        let files_reached: Vec<usize> = (0..last.files.len()).filter(|&f| starts[f] < starts[f + 1]).collect();
        let prefetch_index = |at: usize| {
            if let Some(live) = files_reached.get(at).and_then(|&f| last.files[f].live()) {
                live.prefetch_index();
            }
        };
        (0..INDEX_AHEAD).for_each(prefetch_index);
        let reached: Vec<Touched> = files_reached
            .iter()
            .enumerate()
            .filter_map(|(at, &f)| {
                prefetch_index(at + INDEX_AHEAD);
                let changed = functions[starts[f] as usize..starts[f + 1] as usize].iter().map(|&i| i as usize);
                let live = last.files[f].live()?;
                let mut reach = live.reach(changed.collect());
                if let Some(counted) = &counted {
                    live.zero_uncounted(&mut reach, |i| counted.get(i as usize).is_none_or(|&c| c));
                }
                Some((f as FileName, reach))
            })
            .collect();
        self.keep_parts(&reached)?;
        // The records' last texts are then theirs alone: each is freed as
        // its next is made, and its memory serves the next record's.
        self.last.report = Chunks::default();
        let tallies = Tallies::count(&self.mapping, &MergedCounts(&self.last), &updating, |i| self.decoded.body(i));
        // The largest records first: each new text then fits in the memory
        // of the last text of the record before it, freed as that one was
        // replaced, and not in pages mapped and zeroed afresh (on redis
        // under load, 5 new mappings a dump against 2).
        let mut touched = reached;
        let text_len = |file: FileName| self.last.files[file as usize].text().map_or(0, |t| t.len());
        touched.sort_by_key(|(file, _)| std::cmp::Reverse(text_len(*file)));
        // Most records update from the counts alone; the others need some
        // functions decoded whole (see `LiveFile::records_needed`): with
        // several objects, whose duplicates are one only within one load
        // (see `Coverage::of_functions`), the changed ones and all those of
        // their stretches that keep no parts.
        for (file, reach) in &touched {
            if let Some(live) = self.last.files[*file as usize].live() {
                live.prefetch(reach);
            }
        }
        let mut work = lcov::Work::default();
        let mut mask = Vec::new();
        let mut decode = Vec::new();
        for touched in touched {
            let (file, reach) = &touched;
            let Some(live) = self.last.files[*file as usize].live_mut() else { continue };
            let needed = live.records_needed(reach, &tallies, &mut mask);
            if needed.is_empty() {
                live.update(&tallies, None, reach, &mut work);
            } else if self.mapping.objects() > 1 {
                let functions = reach.changed().iter().copied().chain(live.needs(reach)).collect();
                decode.push((touched, functions));
            } else {
                decode.push((touched, needed));
            }
        }
        drop(work);
        for (files, functions, done) in batches(decode) {
            self.restore(&functions)?;
            let coverage = Coverage::of_functions(&self.mapping, &MergedCounts(&self.last), functions.into_iter());
            let index_of = coverage.places();
            let records = lcov::Records { coverage: &coverage, index_of: &index_of };
            let mut work = lcov::Work::default();
            for (file, reach) in &files {
                if let Some(live) = self.last.files[*file as usize].live_mut() {
                    live.update(&tallies, Some(&records), reach, &mut work);
                }
            }
            drop(work);
            drop(coverage);
            self.release_done(&done);
        }
        self.compute_whole(&rebuild, options, whole)?;
        self.decoded.due = true;
        let last = &mut self.last;
        let test_name = options.test_name.map(|test| Bytes::from(format!("TN:{test}\n")));
        let mut report = Chunks::default();
        for &f in &self.files {
            if let Some(text) = last.files[f as usize].text() {
                if let Some(test_name) = &test_name {
                    report.push(test_name.clone());
                }
                report.push(text.clone());
            }
        }
        last.report = report;
        Ok(last.report.clone())
    }

    /// In a forked child's first report, where its parent's last dump left
    /// the engine: makes the records of the files that the `changed`
    /// functions reach and where no function is `counted` (see
    /// [`Incremental::counted`]) read with every count zero (see
    /// [`lcov::with_zero_counts`]), and returns those files (ascending),
    /// for the report to leave as they are. Updated, every function that
    /// ran in the parent would be computed again, most of them in files the
    /// child never reaches (a redis `BGSAVE` child counts in 21 files of
    /// 202).
    ///
    /// Not the files to compute whole (`rebuild`, ascending): a
    /// zero-region stub there, which llvm-cov loads only when its function
    /// has no counts, may come or go.
    fn zero_uncounted(&mut self, counted: &[bool], changed: &[usize], rebuild: &[FileName]) -> Vec<FileName> {
        let last = &mut self.last;
        let files_of = |i: usize| self.mapping.filenames(&self.mapping.functions[i]);
        let mut counted_files: Vec<FileName> =
            (0..counted.len()).filter(|&i| counted[i]).flat_map(files_of).copied().collect();
        counted_files.sort_unstable();
        counted_files.dedup();
        let mut zeroed: Vec<FileName> = changed.iter().flat_map(|&i| files_of(i)).copied().collect();
        zeroed.sort_unstable();
        zeroed.dedup();
        zeroed.retain(|file| {
            if counted_files.binary_search(file).is_ok() || rebuild.binary_search(file).is_ok() {
                return false;
            }
            let Some(record) = last.files.get_mut(*file as usize) else { return false };
            match record.text().and_then(|text| lcov::with_zero_counts(text)) {
                Some(zero) => {
                    *record = FileRecord::Parked(Bytes::from(zero));
                    true
                }
                None => false,
            }
        });
        zeroed
    }

    /// Keeps the parts of the stretches of several functions that the
    /// `reached` records have and that keep none yet (see
    /// `LiveFile::unkept`), reading the functions of them all
    /// [`PART_FUNCTIONS`] at a time (each once: a function of a C program
    /// expands the macros of several headers).
    fn keep_parts(&mut self, reached: &[Touched]) -> Result<()> {
        let mut unkept: Vec<(FileName, usize, Vec<usize>, lcov::Parts)> = Vec::new();
        for (file, reach) in reached {
            if let Some(live) = self.last.files[*file as usize].live() {
                let stretches = live.unkept(reach).into_iter();
                unkept.extend(stretches.map(|(k, functions)| (*file, k, functions, lcov::Parts::default())));
            }
        }
        let mut all: Vec<usize> = unkept.iter().flat_map(|(_, _, functions, _)| functions.iter().copied()).collect();
        all.sort_unstable();
        all.dedup();
        // Duplicates of a function in two objects are one only within one
        // load: with several objects, the functions load at once.
        let chunk = if self.mapping.objects() > 1 { all.len().max(1) } else { PART_FUNCTIONS };
        for some in all.chunks(chunk) {
            self.restore(some)?;
            // The functions counted and the parts read from them come from
            // scratch memory: all of it is dropped once the stretches keep
            // their parts, made after them. From the arena, it left the
            // holes of a peak around the parts kept (redis under traffic:
            // the arena at 4.35 MB from the third dump on, against 4.09 MB
            // after 100 dumps this way). Not the decoded regions: those of
            // the functions that ran stay decoded for the next dumps.
            let scratch = Scratch::on(self.scratch);
            let counts = MergedCounts(&self.last);
            let coverage = Coverage::of_functions(&self.mapping, &counts, some.iter().copied());
            let index_of = coverage.places();
            let (first, last) = (some[0], some[some.len() - 1]);
            let mut work = lcov::Work::default();
            for (file, k, functions, parts) in &mut unkept {
                let from = functions.partition_point(|&i| i < first);
                let to = functions.partition_point(|&i| i <= last);
                if let (Some(live), true) = (self.last.files[*file as usize].live(), from < to) {
                    live.read_parts(*k, &coverage, &index_of, &functions[from..to], parts, &mut work);
                }
            }
            drop(work);
            drop(coverage);
            drop(scratch);
            self.release_done(some);
        }
        for (file, k, _, parts) in unkept {
            if let Some(live) = self.last.files[file as usize].live_mut() {
                live.keep_parts(k, parts);
            }
        }
        Ok(())
    }

    /// Computes the records of `files` whole, in [`batches`], and `park`s
    /// them (see [`FileRecord::Parked`]).
    fn compute_whole(&mut self, files: &[FileName], options: &ReportOptions<'_>, park: bool) -> Result<()> {
        // A file's record needs the functions that touch it, and no other
        // (see `Coverage::of_functions`).
        let last = &self.last;
        let of_file = |file: FileName| {
            let at = |f: usize| last.file_starts.get(f).map_or(0, |&s| s as usize);
            last.file_functions[at(file as usize)..at(file as usize + 1)].iter().map(|&i| i as usize).collect()
        };
        let files = files.iter().map(|&file| (file, of_file(file))).collect();
        for (batch, functions, done) in batches(files) {
            let mut files = batch.clone();
            files.sort_unstable();
            // The batch's decoded and counted functions, apart from the
            // records that stay. Only here, where a dump reads every file:
            // the few a warm dump loads reuse the arena's free blocks, and
            // from scratch memory each page would be faulted in again (on
            // redis under traffic, 500 faults a dump against 70).
            let scratch = Scratch::on(self.scratch);
            self.restore(&functions)?;
            let counts = MergedCounts(&self.last);
            let coverage = Coverage::of_functions_for(&self.mapping, &counts, functions.into_iter(), &files);
            drop(scratch);
            let present: FxHashSet<FileName> = coverage.functions.iter().flat_map(|f| f.filenames.iter().copied()).collect();
            for file in batch {
                if !present.contains(&file) {
                    self.last.files[file as usize] = FileRecord::None;
                    continue;
                }
                // Parked, its parts are made in scratch memory, and its
                // text copied out of it (to its size: a first text grows by
                // doubling).
                let scratch = park.then(|| Scratch::on(self.scratch));
                let sf = lcov::map_paths(format!("SF:{}\n", self.mapping.file_name(file)), options.path_map);
                let live = lcov::LiveFile::new(&coverage, file, sf, !options.demangle);
                drop(scratch);
                self.last.files[file as usize] = match park {
                    true => FileRecord::Parked(Bytes::copy_from_slice(live.text())),
                    false => FileRecord::Live(Box::new(live)),
                };
            }
            drop(coverage);
            self.release_done(&done);
        }
        Ok(())
    }

    /// Releases the regions of the `done` functions (see [`Decoded`]).
    fn release_done(&mut self, done: &[usize]) {
        self.mapping.release_some(done);
    }

    /// llvm-cov's JSON export (`llvm-cov export -format=text`) of the
    /// counts since start (or the last reset), files matched by `options`'
    /// ignore patterns left out as `-ignore-filename-regex` leaves them out,
    /// and functions with no other file left out of `functions` too (there
    /// llvm-cov lists every function: the agent's own, which run at every
    /// dump, would make no two answers alike). Computed whole each time.
    pub fn llvm_json(&mut self, options: &ReportOptions<'_>, reset: bool) -> Result<Vec<u8>> {
        let snapshots = self.snapshot(Data::FromFiles)?;
        let mut mapping = CoverageMapping::new().leaving_out(options.ignore);
        let mut counters = Counters::new();
        for (m, snap) in self.modules.iter().zip(&snapshots) {
            let image = map_file(&m.id, self.is_main(m))?;
            mapping
                .add_object_with_names(&image, |section| shared_names(&m.names, section))
                .map_err(|e| e.context(&m.id.path.display().to_string()))?;
            let records = m.records_with_spans(snap, |_| true)?.into_iter().map(|(_, r, _)| r).collect();
            counters.add_module(m.layout.variant, m.names.clone(), records)?;
        }
        drop_unreported(&mut mapping, options.ignore);
        let lcov_options = lcov::Options { ignore_filename_regex: options.ignore.to_vec(), ..lcov::Options::default() };
        let mut out = Vec::new();
        crate::json_export::write_to(&Coverage::new(&mapping, &counters), &lcov_options, &mut out)
            .map_err(|source| Error::Io { path: "the JSON export".into(), source })?;
        if reset {
            self.rebase(&snapshots);
        }
        Ok(out)
    }

    /// A raw profile per module, concatenated, as the runtime would write
    /// them now (counts since the last reset).
    pub fn profraw(&mut self, reset: bool) -> Result<Vec<u8>> {
        self.refresh()?;
        // Checked before the snapshot: a refused dump-and-reset resets nothing.
        for m in &self.modules {
            if !m.layout.is_64 || m.layout.endian != crate::Endian::Little || m.layout.version < 8 {
                return Err(Error::Unsupported(format!(
                    "{}: raw profile version {} modules cannot be written as profraw by livecov (64-bit \
                     little-endian, version 8 to 10 only); use format=lcov",
                    m.id.path.display(),
                    m.layout.version
                )));
            }
        }
        let snapshots = self.snapshot(Data::InMemory)?;
        if reset {
            self.rebase(&snapshots);
        }
        let mut out = Vec::new();
        for (m, snap) in self.modules.iter().zip(&snapshots) {
            let binary_ids: Vec<Vec<u8>> = m.build_id.iter().cloned().collect();
            let image = map_file(&m.id, self.is_main(m))?;
            let names = modules::names_section(&image).map_err(|e| e.context(&m.id.path.display().to_string()))?;
            profile::write_raw_profile(
                &ModuleImage {
                    layout: &m.layout,
                    binary_ids: &binary_ids,
                    data: &snap.data,
                    counters: &snap.counters,
                    bitmap: &snap.bitmap,
                    names: &names,
                },
                &mut out,
            );
        }
        Ok(out)
    }

    /// The counters of every module now (since the last reset), gzipped
    /// (see `crate::fleet`), and the id of the build mapping they go with.
    pub fn counters(&mut self, reset: bool, settings: &ReportSettings<'_>) -> Result<(Vec<u8>, String)> {
        let snapshots = self.snapshot(Data::None)?;
        if reset {
            self.rebase(&snapshots);
        }
        let document = fleet::encode_counters(snapshots.iter().map(|s| (&s.counters[..], &s.bitmap[..])));
        Ok((fleet::gzip(&document), self.mapping_id(settings)?))
    }

    /// The id of the build mapping (see `crate::fleet`), kept once made:
    /// the document is made for it, not compressed (the larger part of its
    /// cost; the collector asks for it once per build).
    pub fn mapping_id(&mut self, settings: &ReportSettings<'_>) -> Result<String> {
        match &self.mapping_id {
            Some(id) => Ok(id.clone()),
            None => self.mapping_document(settings).map(|(_, id)| id),
        }
    }

    /// Whether a report made the records that the next one updates.
    pub fn has_records(&self) -> bool {
        self.last.written_with.is_some()
    }

    /// The build mapping of the loaded modules (see `crate::fleet`),
    /// gzipped, and its id. Reads the modules' files again: the mapping
    /// sections are not loaded, and are not kept in memory between calls.
    pub fn mapping(&mut self, settings: &ReportSettings<'_>) -> Result<(Vec<u8>, String)> {
        let (document, id) = self.mapping_document(settings)?;
        Ok((fleet::gzip(&document), id))
    }

    /// The build mapping, uncompressed, and its id (kept for `counters`).
    fn mapping_document(&mut self, settings: &ReportSettings<'_>) -> Result<(Vec<u8>, String)> {
        let snapshots = self.snapshot(Data::FromFiles)?;
        let images = self
            .modules
            .iter()
            .map(|m| map_file(&m.id, self.is_main(m)))
            .collect::<Result<Vec<_>>>()?;
        let paths: Vec<String> = self.modules.iter().map(|m| m.id.path.display().to_string()).collect();
        // Without a bitmap section the bitmap delta is that of address 0,
        // which differs from process to process, and is never used.
        let layouts: Vec<RecordLayout> = self
            .modules
            .iter()
            .zip(&snapshots)
            .map(|(m, snap)| RecordLayout { bitmap_delta: if snap.bitmap.is_empty() { 0 } else { m.layout.bitmap_delta }, ..m.layout })
            .collect();
        let names = images
            .iter()
            .zip(&paths)
            .map(|(image, path)| modules::names_section(image).map_err(|e| e.context(path)))
            .collect::<Result<Vec<_>>>()?;
        let parts: Vec<fleet::ModuleParts<'_>> = self
            .modules
            .iter()
            .zip(&snapshots)
            .zip(images.iter().zip(&names))
            .zip(paths.iter().zip(&layouts))
            .map(|(((m, snap), (image, names)), (path, layout))| fleet::ModuleParts {
                path,
                build_id: m.build_id.as_deref(),
                layout,
                data: &snap.data,
                names,
                object: image,
            })
            .collect();
        let (document, id) = fleet::encode_mapping(&parts, settings)?;
        self.mapping_id = Some(id.clone());
        Ok((document, id))
    }

    /// Forgets the last reset: in a forked child, whose counters were
    /// zeroed, reports count from there, and the next one finds most of
    /// its records at zero (see [`Self::zero_uncounted`]).
    pub fn count_from_zero(&mut self) {
        self.baseline.iter_mut().for_each(|base| *base = None);
        self.zero_due = true;
    }

    /// Records the current counts as the new zero.
    pub fn reset(&mut self) -> Result<()> {
        let snapshots = self.snapshot(Data::None)?;
        self.rebase(&snapshots);
        Ok(())
    }
}

/// How many functions a dump decodes at a time to keep the parts of a
/// stretch (see `Engine::keep_parts`).
const PART_FUNCTIONS: usize = 128;

/// About how many functions a dump decodes at a time.
const BATCH_FUNCTIONS: usize = 1024;

/// Records to compute (each with the functions it needs) in batches of
/// about [`BATCH_FUNCTIONS`] functions: the regions of a batch's functions
/// are decoded for it alone, so that a dump never holds the whole decoded
/// mapping (several times the size of `__llvm_covfun`), and what it leaves
/// behind is not scattered over the memory of a peak that size. With each
/// batch, its records, its functions, and those of them that no later
/// batch needs (a header's function, whose records are in several batches,
/// stays decoded until the last of them).
fn batches<T>(records: Vec<(T, Vec<usize>)>) -> Vec<(Vec<T>, Vec<usize>, Vec<usize>)> {
    let mut batches: Vec<(Vec<T>, Vec<usize>)> = Vec::new();
    for (record, needs) in records {
        match batches.last_mut() {
            Some((records, functions)) if functions.len() < BATCH_FUNCTIONS => {
                records.push(record);
                functions.extend(needs);
            }
            _ => batches.push((vec![record], needs)),
        }
    }
    for (_, functions) in &mut batches {
        functions.sort_unstable();
        functions.dedup();
    }
    let mut last_batch: FxHashMap<usize, usize> = FxHashMap::default();
    for (b, (_, functions)) in batches.iter().enumerate() {
        last_batch.extend(functions.iter().map(|&i| (i, b)));
    }
    batches
        .into_iter()
        .enumerate()
        .map(|(b, (records, functions))| {
            let done = functions.iter().copied().filter(|i| last_batch.get(i) == Some(&b)).collect();
            (records, functions, done)
        })
        .collect()
}

/// Drops the functions with no file in reports (the standard library's, a
/// dependency's, what LIVECOV_IGNORE matches): they change no byte of one,
/// and they are most of a Rust service's mapping.
fn drop_unreported(mapping: &mut CoverageMapping, ignore: &[Regex]) {
    let ignored = ignored_files(mapping, ignore).into_owned();
    mapping.retain_functions(|files| files.iter().any(|&file| !ignored[file as usize]));
    mapping.functions.shrink_to_fit();
    mapping.keep_names_of_functions();
}

/// Per file of the mapping (by `FileName`), whether `ignore` leaves it out
/// of reports: matched once per file, not once per function that has it,
/// and not again when the mapping was read leaving the same out (a
/// dependency of a program built without optimizations matches a name in
/// 20 us: 4 passes over mini-redis's 835 files took 40% of a first dump).
fn ignored_files<'m>(mapping: &'m CoverageMapping, ignore: &[Regex]) -> std::borrow::Cow<'m, [bool]> {
    match mapping.files_matching(ignore) {
        Some(matching) => matching.into(),
        None => crate::file_pattern::matching(ignore, mapping.files.iter().map(String::as_str)).into(),
    }
}

/// The module's table of names for its coverage mapping: the module's own,
/// decoded from the same section, or one decoded from `section` (for a file
/// that is not what was loaded, or a module that keeps the references of
/// its names only).
fn shared_names(names: &Arc<NameTable>, section: &[u8]) -> Result<Arc<NameTable>> {
    if names.has_names() && names.is_section(section) {
        Ok(names.clone())
    } else {
        NameTable::decode(section).map(Arc::new)
    }
}

/// Maps a module's file. The executable is opened through
/// `/proc/self/exe`, which still reaches the running program's file when a
/// rebuild or deploy replaced it on disk.
fn map_file(id: &ModuleId, is_main: bool) -> Result<memmap2::Mmap> {
    modules::map_module(id, is_main).map_err(|source| Error::Io { path: id.path.display().to_string(), source })
}

fn words(bytes: &mut [u8]) -> impl Iterator<Item = &mut [u8]> {
    bytes.chunks_exact_mut(8)
}

fn subtract(counters: &mut [u8], base: &[u8]) {
    for (c, b) in words(counters).zip(base.chunks_exact(8)) {
        let v = u64::from_ne_bytes((&*c).try_into().unwrap_or([0; 8]))
            .wrapping_sub(u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])));
        c.copy_from_slice(&v.to_ne_bytes());
    }
}

fn add(counters: &mut [u8], base: &[u8]) {
    for (c, b) in words(counters).zip(base.chunks_exact(8)) {
        let v = u64::from_ne_bytes((&*c).try_into().unwrap_or([0; 8]))
            .wrapping_add(u64::from_ne_bytes(b.try_into().unwrap_or([0; 8])));
        c.copy_from_slice(&v.to_ne_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::{Body, Counter, FunctionMapping, Region, RegionKind};

    /// A decoded function of one region.
    fn decoded_function() -> FunctionMapping {
        let region = Region {
            kind: RegionKind::Code,
            count: Counter::counter(0),
            false_count: Counter::ZERO,
            file_id: 0,
            expanded_file_id: 0,
            line_start: 1,
            column_start: 1,
            line_end: 2,
            column_end: 1,
        };
        FunctionMapping::decoded(Body::new(Vec::new(), vec![region], Vec::new(), 1))
    }

    /// One dump as `Engine::report` drives `Decoded`: the `ran` functions
    /// are counted, those without a counting body decoded whole for it.
    fn dump(decoded: &mut Decoded, mapping: &mut CoverageMapping, ran: &[usize]) {
        decoded.start(mapping.functions.len(), 1 << 20, ran);
        let missing = decoded.missing(ran);
        for &i in &missing {
            mapping.functions[i] = decoded_function();
        }
        decoded.decoding(&missing);
        decoded.add(mapping, &missing);
        decoded.finish(mapping);
    }

    #[test]
    fn a_counting_body_stays_while_its_function_runs_again_and_goes_some_dumps_after() {
        let mut mapping = CoverageMapping::default();
        mapping.functions = vec![decoded_function(), decoded_function()];
        let mut decoded = Decoded::default();
        dump(&mut decoded, &mut mapping, &[0, 1]);
        assert!(mapping.functions.iter().all(|f| f.regions().is_empty()), "a function decoded whole stayed so");
        let body = decoded.body(1).expect("no counting body of a function that ran");
        assert_eq!((body.regions, body.counters.len(), body.stub), (1, 1, false));
        for _ in 0..STAY_DUMPS {
            dump(&mut decoded, &mut mapping, &[0]);
        }
        assert!(decoded.body(1).is_some(), "let go before it stayed {STAY_DUMPS} dumps");
        dump(&mut decoded, &mut mapping, &[0]);
        assert!(decoded.body(1).is_none(), "kept {} dumps after it ran", STAY_DUMPS + 1);
        assert!(decoded.body(0).is_some(), "let go while its function runs at every dump");
        assert_eq!(decoded.missing(&[0, 1]), [1]);
    }

    #[test]
    fn baseline_arithmetic_round_trips() {
        let mut c: Vec<u8> = [10u64, 5].iter().flat_map(|v| v.to_ne_bytes()).collect();
        let base: Vec<u8> = [4u64, 5].iter().flat_map(|v| v.to_ne_bytes()).collect();
        subtract(&mut c, &base);
        assert_eq!(c[..8], 6u64.to_ne_bytes());
        assert_eq!(c[8..], 0u64.to_ne_bytes());
        add(&mut c, &base);
        assert_eq!(c[..8], 10u64.to_ne_bytes());
    }

    /// A function's stub bit is known once noted, and as last noted; the
    /// others, past the words noted too, are unknown.
    #[test]
    fn stubs_tell_what_was_noted_and_nothing_else() {
        let mut stubs = Stubs::default();
        assert_eq!(stubs.get(0), None);
        stubs.note(3, true);
        stubs.note(130, false);
        assert_eq!([stubs.get(3), stubs.get(130), stubs.get(4), stubs.get(129), stubs.get(10_000)], [
            Some(true),
            Some(false),
            None,
            None,
            None
        ]);
        stubs.note(3, false);
        stubs.note(130, true);
        assert_eq!((stubs.get(3), stubs.get(130)), (Some(false), Some(true)));
    }

    #[test]
    fn functions_by_file_lists_each_file_s_functions_once_ascending() {
        // Function by function, as their file ids name files: function 1
        // expands two macros of file 2, function 3 has no file of its own.
        let filenames: [&[FileName]; 5] = [&[0, 2], &[1, 2, 0, 2], &[3], &[], &[2, 3, 3]];
        let pairs: Vec<(FileName, u32)> =
            filenames.iter().enumerate().flat_map(|(i, files)| files.iter().map(move |&f| (f, i as u32))).collect();
        let (starts, functions) = functions_by_file(5, &pairs);
        let of = |f: usize| &functions[starts[f] as usize..starts[f + 1] as usize];
        assert_eq!(starts.len(), 6);
        assert_eq!([of(0), of(1), of(2), of(3), of(4)], [&[0, 1][..], &[1], &[0, 1, 4], &[2, 4], &[]]);
        assert_eq!(functions_by_file(2, &[]), (vec![0, 0, 0], vec![]));
    }

    /// A run ends where the next record's counters do not follow in the
    /// module or in the kept words, or would make it longer than
    /// `RUN_BYTES`.
    #[test]
    fn runs_are_records_whose_counters_follow_one_another() {
        let mut kept = ModuleRecords { records: Vec::new(), words: Vec::new(), plain: true, runs: Vec::new() };
        // (module offset, bytes): 0-2 follow one another; 3 leaves a gap in
        // the module; 4 is kept apart from 3 in the words; then records of
        // 128 bytes, four to a run.
        let spans = [(0, 16), (16, 8), (24, 24), (64, 8), (72, 8)].into_iter().chain((0..6).map(|k| (80 + 128 * k, 128)));
        for (k, (at, len)) in spans.enumerate() {
            if k == 4 {
                kept.push(&[0; 8]);
            }
            let kept_at = kept.push(&vec![0; len as usize]) as u32;
            kept.records.push(Record { index: k as u32, key: k as u32, counters: (at, at + len), kept_at });
        }
        kept.find_runs();
        assert_eq!(RUN_BYTES, 512);
        assert_eq!(kept.runs, [(0, 3), (3, 4), (4, 8), (8, 11)]);
    }
}
