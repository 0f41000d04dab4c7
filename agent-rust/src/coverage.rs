//! Coverage computed from a mapping and counters, as llvm-cov computes it.
//!
//! [`Coverage::new`] joins each function's mapping with its counters (from
//! any [`CounterSource`]: a merged set of raw profiles, or live memory) into
//! counted regions, applying llvm-cov's rules for hash mismatches, unused
//! functions and duplicate records. The queries below (per file, per
//! function, per expansion; segments and line statistics) follow
//! `CoverageMapping.cpp` of LLVM 22 step by step, because LCOV numbers are
//! only identical to llvm-cov's when every tie is broken the same way.

use std::collections::hash_map::Entry;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::mapping::{Counter, CounterRef, CountingBody, CoverageMapping, Expression, ExpressionKind, FileName, FunctionMapping, Region, RegionKind};
use crate::prefetch;
use crate::profile::Lookup;

/// Where counter values come from. The mapping refers to a function by the
/// MD5 of its name and its structural hash.
pub trait CounterSource {
    /// The counts of mapping function `function`, whose key is `name_ref`
    /// and `hash` (a source may index its counts by function).
    fn lookup(&self, function: usize, name_ref: u64, hash: u64) -> Lookup<'_>;
}

impl CounterSource for crate::profile::Counters {
    fn lookup(&self, _: usize, name_ref: u64, hash: u64) -> Lookup<'_> {
        crate::profile::Counters::lookup(self, name_ref, hash)
    }
}

/// A region of the mapping with its evaluated counts.
#[derive(Debug, Clone, Copy)]
pub struct CountedRegion<'m> {
    pub region: &'m Region,
    pub count: u64,
    pub false_count: u64,
}

impl CountedRegion<'_> {
    /// A branch side whose counter is the constant zero (folded away). Not
    /// kept beside the counts: a report counts hundreds of thousands of
    /// regions, and this is the region's own.
    pub fn true_folded(&self) -> bool {
        self.region.count == Counter::ZERO
    }

    pub fn false_folded(&self) -> bool {
        self.region.false_count == Counter::ZERO
    }

    fn start(&self) -> (u32, u32) {
        self.region.start()
    }
    fn end(&self) -> (u32, u32) {
        self.region.end()
    }
    fn kind(&self) -> RegionKind {
        self.region.kind
    }
}

/// One function with counts, as llvm-cov's `FunctionRecord`.
#[derive(Debug, Clone)]
pub struct FunctionRecord<'m> {
    /// Its index in the mapping's functions.
    pub mapping_index: usize,
    pub filenames: &'m [FileName],
    /// Non-branch regions and branch regions, each in mapping order: file
    /// id by file id (see [`Self::regions_in`]).
    pub regions: Vec<CountedRegion<'m>>,
    pub branches: Vec<CountedRegion<'m>>,
    /// Where each file id's regions end in `regions`, then where each
    /// one's branches end in `branches`: a report looks up the regions of
    /// a file id about twenty times a function, and a search (through each
    /// region's pointer) was a twentieth of a cold dump.
    file_ends: Vec<u32>,
    /// Its MC/DC decisions (none unless built with `-fcoverage-mcdc`).
    pub mcdc_records: Vec<crate::mcdc::McdcRecord<'m>>,
    /// The count of the function's first region.
    pub execution_count: u64,
    /// The file id of the function's own body: the first one no expansion
    /// region expands to.
    pub main_file: Option<u32>,
}

impl<'m> FunctionRecord<'m> {
    /// The regions of file id `file_id`.
    pub fn regions_in(&self, file_id: u32) -> &[CountedRegion<'m>] {
        self.regions.get(self.file_run(0, file_id)).unwrap_or(&[])
    }

    /// The branches of file id `file_id`.
    pub fn branches_in(&self, file_id: u32) -> &[CountedRegion<'m>] {
        self.branches.get(self.file_run(1, file_id)).unwrap_or(&[])
    }

    /// Where the branches of file id `file_id` start in `branches`.
    fn branches_from(&self, file_id: u32) -> usize {
        self.file_run(1, file_id).start
    }

    /// Where file id `file_id`'s regions (`kind` 0) or branches (1) are.
    fn file_run(&self, kind: usize, file_id: u32) -> std::ops::Range<usize> {
        let ends = self.file_ends.chunks((self.file_ends.len() / 2).max(1)).nth(kind).unwrap_or(&[]);
        let Some(&to) = ends.get(file_id as usize) else { return 0..0 };
        let from = match file_id {
            0 => 0,
            id => ends[id as usize - 1],
        };
        from as usize..to as usize
    }
}

/// A point where the count changes, as llvm-cov's `CoverageSegment`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub line: u32,
    pub col: u32,
    pub count: u64,
    pub has_count: bool,
    pub is_region_entry: bool,
    pub is_gap: bool,
}

/// An expansion region of a function: the macro or include it expands to.
#[derive(Debug, Clone, Copy)]
pub struct Expansion<'m> {
    pub function: usize,
    /// The expansion region itself (its `expanded_file_id` is the file).
    pub region: CountedRegion<'m>,
}

/// Segments, expansions and branches of one file, function or expansion.
/// Filling one again (the `*_into` queries) reuses its buffers.
#[derive(Debug, Default)]
pub struct CoverageData<'m> {
    pub segments: Vec<Segment>,
    pub expansions: Vec<Expansion<'m>>,
    pub branches: Vec<CountedRegion<'m>>,
    /// Of a function's part (see [`Coverage::part_in_file_into`]): where
    /// each of its regions and of `branches` is in its record (`regions`,
    /// `branches`).
    pub region_positions: Vec<u32>,
    pub branch_positions: Vec<u32>,
    scratch: Scratch,
}

impl CoverageData<'_> {
    fn clear(&mut self) {
        self.segments.clear();
        self.expansions.clear();
        self.branches.clear();
        self.region_positions.clear();
        self.branch_positions.clear();
        self.scratch.spans.clear();
    }
}

/// The branches and nested expansions of an expansion (see
/// [`Coverage::for_expansion`]).
#[derive(Debug, Default)]
pub struct Expanded<'m> {
    pub expansions: Vec<Expansion<'m>>,
    pub branches: Vec<CountedRegion<'m>>,
    /// Where the first of `branches` is in the function's record.
    pub branches_from: usize,
}

/// Line coverage of one source line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineStats {
    pub line: u32,
    pub count: u64,
    pub mapped: bool,
}

/// Functions with counts, and the per-file index llvm-cov keeps.
#[derive(Debug)]
pub struct Coverage<'m> {
    pub mapping: &'m CoverageMapping,
    pub functions: Vec<FunctionRecord<'m>>,
    /// Functions whose structural hash differs from the profile's: dropped.
    pub mismatched: Vec<(String, u64)>,
    /// Indices of `functions` by file, made when first asked for: a live
    /// dump updates its records by function, and never asks.
    by_file: std::sync::OnceLock<FxHashMap<FileName, Vec<usize>>>,
}

impl<'m> Coverage<'m> {
    /// Every function's coverage, with all that llvm-cov's JSON export
    /// shows (its MC/DC records too).
    pub fn new(mapping: &'m CoverageMapping, counters: &dyn CounterSource) -> Self {
        Self::load(mapping, counters, 0..mapping.functions.len(), true, None)
    }

    /// [`new`](Self::new) without the MC/DC records, which LCOV does not
    /// show: finding a decision's test vectors walks every path through
    /// its conditions.
    pub fn for_lcov(mapping: &'m CoverageMapping, counters: &dyn CounterSource) -> Self {
        Self::load(mapping, counters, 0..mapping.functions.len(), false, None)
    }

    /// [`for_lcov`](Self::for_lcov) of some of the mapping's functions
    /// (indices ascending). For the records of a file it suffices to load
    /// the functions that touch it: duplicates of a function have the same
    /// files.
    pub fn of_functions(
        mapping: &'m CoverageMapping,
        counters: &dyn CounterSource,
        indices: impl Iterator<Item = usize>,
    ) -> Self {
        Self::load(mapping, counters, indices, false, None)
    }

    /// Where each function is in `functions`, by its index in the mapping.
    pub fn places(&self) -> FxHashMap<usize, usize> {
        self.functions.iter().enumerate().map(|(at, f)| (f.mapping_index, at)).collect()
    }

    /// [`of_functions`](Self::of_functions) for the records of `files`
    /// (ascending) alone: of a function defined in none of them, only its
    /// regions in them are kept. A header's record needs nearly every
    /// function of a C program (each that expands one of its macros), and
    /// the regions of their bodies were most of the memory a first dump
    /// took.
    pub fn of_functions_for(
        mapping: &'m CoverageMapping,
        counters: &dyn CounterSource,
        indices: impl Iterator<Item = usize>,
        files: &[FileName],
    ) -> Self {
        Self::load(mapping, counters, indices, false, Some(files))
    }

    /// [`for_lcov`](Self::for_lcov), or [`new`](Self::new) with `mcdc`,
    /// counting the functions on up to `threads` threads: a whole program
    /// has tens of thousands, each counted apart from the others.
    pub fn load_on(mapping: &'m CoverageMapping, counters: &(dyn CounterSource + Sync), mcdc: bool, threads: usize) -> Self {
        // Below some thousands of functions a thread costs more than it saves.
        let n = mapping.functions.len();
        let threads = threads.clamp(1, n / 4096 + 1);
        if threads == 1 {
            return Self::load(mapping, counters, 0..n, mcdc, None);
        }
        let chunk = n.div_ceil(threads);
        let parts: Vec<Counted<'m>> = std::thread::scope(|scope| {
            let others: Vec<_> = (1..threads)
                .map(|t| {
                    let part = t * chunk..((t + 1) * chunk).min(n);
                    scope.spawn(move || Counted::of(mapping, counters, part, mcdc, None))
                })
                .collect();
            let mut parts = vec![Counted::of(mapping, counters, 0..chunk.min(n), mcdc, None)];
            parts.extend(others.into_iter().map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))));
            parts
        });
        Self::from_parts(mapping, parts)
    }

    fn load(
        mapping: &'m CoverageMapping,
        counters: &dyn CounterSource,
        indices: impl Iterator<Item = usize>,
        mcdc: bool,
        files: Option<&[FileName]>,
    ) -> Self {
        let indices = indices.filter(|&i| i < mapping.functions.len());
        Self::from_parts(mapping, vec![Counted::of(mapping, counters, indices, mcdc, files)])
    }

    /// The coverage of the functions counted in `parts`, in order.
    fn from_parts(mapping: &'m CoverageMapping, parts: Vec<Counted<'m>>) -> Self {
        let mut parts = parts.into_iter();
        let Counted { records: mut functions, mut mismatched } = parts.next().unwrap_or_default();
        for part in parts {
            functions.extend(part.records);
            mismatched.extend(part.mismatched);
        }
        if mapping.objects() > 1 {
            // A later record of a function (same files, same name) from
            // another object is a duplicate. The name as its reference (its
            // MD5), as llvm-cov keeps a hash of it: names of programs run
            // long, and hashing each again cost more than counting. Within
            // one object a name has one record (see the mapping's reader).
            let mut provenance: FxHashSet<(&'m [FileName], u64)> =
                FxHashSet::with_capacity_and_hasher(functions.len(), Default::default());
            functions.retain(|f| provenance.insert((f.filenames, mapping.functions[f.mapping_index].name_ref)));
        }
        let mismatched = mismatched
            .into_iter()
            .map(|i| {
                let f = &mapping.functions[i];
                (mapping.name(f).to_owned(), f.hash)
            })
            .collect();
        Coverage { mapping, functions, mismatched, by_file: std::sync::OnceLock::new() }
    }

    /// Every file any loaded function refers to, sorted by name.
    pub fn source_files(&self) -> Vec<FileName> {
        let mut files: Vec<FileName> =
            self.functions.iter().flat_map(|f| f.filenames.iter().copied()).collect();
        files.sort_unstable();
        files.dedup();
        files.sort_by(|a, b| self.mapping.file_name(*a).cmp(self.mapping.file_name(*b)));
        files
    }

    /// The name llvm-cov shows of a loaded function. Found when asked: a
    /// live dump counts hundreds of functions whose names it has already.
    pub fn name_of(&self, f: &FunctionRecord<'m>) -> &'m str {
        self.mapping.functions[f.mapping_index].name_without_prefix(self.mapping)
    }

    /// Indices into `functions` of the functions with regions in `file`,
    /// in load order.
    pub fn functions_touching(&self, file: FileName) -> &[usize] {
        let by_file = self.by_file.get_or_init(|| {
            let mut by_file: FxHashMap<FileName, Vec<usize>> = FxHashMap::default();
            for (index, f) in self.functions.iter().enumerate() {
                for &file in f.filenames {
                    let indices = by_file.entry(file).or_default();
                    if indices.last() != Some(&index) {
                        indices.push(index);
                    }
                }
            }
            by_file
        });
        by_file.get(&file).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Functions defined in `file` (their first file), in load order.
    pub fn functions_in(&self, file: FileName) -> impl Iterator<Item = &FunctionRecord<'m>> {
        self.functions_touching(file)
            .iter()
            .map(|&i| &self.functions[i])
            .filter(move |f| f.filenames.first() == Some(&file))
    }

    /// Coverage of every region of every function that maps into `file`,
    /// into `data`.
    pub fn for_file_into(&self, file: FileName, data: &mut CoverageData<'m>) {
        self.collect_in_file(file, self.functions_touching(file), None, data);
        data.scratch.build_segments(&mut data.segments, false);
    }

    /// Function `at`'s part of one stretch of `file` (the regions that
    /// start on `lines`, first and last), for a live report that keeps each
    /// function's part of each stretch: its regions, appended to `spans`
    /// (see [`CoverageData::segments_of`]), and its branches and expansions,
    /// in `data`.
    pub fn part_in_file_into(&self, at: usize, file: FileName, lines: (u32, u32), spans: &mut Vec<Span>, data: &mut CoverageData<'m>) {
        self.collect_in_file(file, &[at], Some(lines), data);
        spans.extend_from_slice(&data.scratch.spans);
    }

    /// The regions (as spans), expansions and branches in `file` of the
    /// functions `of`, on `lines` only when given.
    ///
    /// Of a whole file, a function whose regions there have the extents
    /// and kinds of an earlier one's (an instantiation of the same generic
    /// function) adds its counts to that one's spans rather than its own:
    /// the builder would sum them anyway (see [`combine_regions`]), and the
    /// sort has a copy fewer to order.
    fn collect_in_file(&self, file: FileName, of: &[usize], lines: Option<(u32, u32)>, data: &mut CoverageData<'m>) {
        data.clear();
        let spans = &mut data.scratch.spans;
        let (first, last) = lines.unwrap_or((0, u32::MAX));
        // Where the spans of each function kept whole start, by their first
        // start and their number.
        let mut runs: FxHashMap<(u64, usize), usize> = FxHashMap::default();
        for &index in of {
            let from = spans.len();
            let f = &self.functions[index];
            let main = f.main_file.filter(|&m| f.filenames[m as usize] == file);
            let ids = || (0..f.filenames.len() as u32).filter(|&id| f.filenames[id as usize] == file);
            let on_lines = |(r, _): &(&CountedRegion, usize)| (first..=last).contains(&r.region.line_start);
            for kind in [0, 1] {
                for id in ids() {
                    let run = f.file_run(kind, id);
                    let all = if kind == 0 { &f.regions } else { &f.branches };
                    for (r, at) in all.get(run.clone()).unwrap_or(&[]).iter().zip(run).filter(on_lines) {
                        if kind == 1 {
                            data.branches.push(*r);
                            data.branch_positions.push(at as u32);
                            continue;
                        }
                        spans.push(Span::of(r));
                        data.region_positions.push(at as u32);
                        if main.is_some_and(|m| is_expansion_in(r, m)) {
                            data.expansions.push(Expansion { function: index, region: *r });
                        }
                    }
                }
            }
            let Some(start) = spans.get(from).map(|s| s.start).filter(|_| lines.is_none()) else { continue };
            let n = spans.len() - from;
            match runs.entry((start, n)) {
                Entry::Vacant(entry) => {
                    entry.insert(from);
                }
                Entry::Occupied(entry) => {
                    let (kept, copy) = spans.split_at_mut(from);
                    let kept = &mut kept[*entry.get()..][..n];
                    if kept.iter().zip(&*copy).all(|(k, c)| (k.start, k.end, k.kind) == (c.start, c.end, c.kind)) {
                        for (k, c) in kept.iter_mut().zip(&*copy) {
                            k.count = k.count.wrapping_add(c.count);
                        }
                        spans.truncate(from);
                        data.region_positions.truncate(from);
                    }
                }
            }
        }
    }

    /// Coverage of a function's own file (macro expansions excluded), into
    /// `data`.
    pub fn for_function_into(&self, index: usize, data: &mut CoverageData<'m>) {
        match self.functions[index].main_file {
            Some(main) => self.for_file_id_into(index, main, data),
            None => data.clear(),
        }
    }

    /// What an expansion region expands to, as reports read it: its
    /// branches and the expansions nested in it (its lines are its file's,
    /// so no segments are built).
    pub fn for_expansion(&self, expansion: &Expansion<'m>) -> Expanded<'m> {
        let (index, file_id) = (expansion.function, expansion.region.region.expanded_file_id);
        let f = &self.functions[index];
        Expanded {
            expansions: f
                .regions_in(file_id)
                .iter()
                .filter(|r| is_expansion_in(r, file_id))
                .map(|r| Expansion { function: index, region: *r })
                .collect(),
            branches: f.branches_in(file_id).to_vec(),
            branches_from: f.branches_from(file_id),
        }
    }

    fn for_file_id_into(&self, index: usize, file_id: u32, data: &mut CoverageData<'m>) {
        let f = &self.functions[index];
        data.clear();
        let spans = &mut data.scratch.spans;
        for r in f.regions_in(file_id) {
            spans.push(Span::of(r));
            if is_expansion_in(r, file_id) {
                data.expansions.push(Expansion { function: index, region: *r });
            }
        }
        data.branches.extend_from_slice(f.branches_in(file_id));
        data.scratch.build_segments(&mut data.segments, false);
    }

    /// The branches a summary of function `index` counts, in runs: those
    /// of its body's file and of the files its expansions expand, nested.
    pub fn summary_branches(&self, index: usize) -> impl Iterator<Item = &[CountedRegion<'m>]> {
        let f = &self.functions[index];
        let files = f.main_file.map_or_else(Vec::new, |main| summary_branch_files(f, main));
        files.into_iter().map(move |id| f.branches_in(id))
    }

    /// Whether functions `a` and `b` have the same regions and branches
    /// with the same counts, so that any summary of one is the other's: the
    /// instantiations of a generic function that never ran, or ran alike.
    pub fn same_counts(&self, a: usize, b: usize) -> bool {
        let (f, g) = (&self.functions[a], &self.functions[b]);
        let same = |x: &[CountedRegion<'m>], y: &[CountedRegion<'m>]| {
            x.len() == y.len()
                && x.iter().zip(y).all(|(x, y)| x.count == y.count && x.false_count == y.false_count && x.region == y.region)
        };
        f.main_file == g.main_file && same(&f.regions, &g.regions) && same(&f.branches, &g.branches)
    }

    /// Functions of `file` grouped by where their body starts: the
    /// instantiations of one generic function form one group.
    pub fn instantiation_groups(&self, file: FileName) -> Vec<Vec<usize>> {
        let mut starts: Vec<((u32, u32), usize)> = Vec::new();
        for &index in self.functions_touching(file) {
            let f = &self.functions[index];
            let Some(main) = f.main_file else { continue };
            if f.filenames[main as usize] != file {
                continue;
            }
            if let Some(first) = f.regions.iter().find(|r| r.region.file_id == main) {
                starts.push((first.start(), index));
            }
        }
        // Stable: a group lists its functions in load order.
        starts.sort_by_key(|&(start, _)| start);
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut last_start = None;
        for (start, index) in starts {
            match groups.last_mut() {
                Some(group) if last_start == Some(start) => group.push(index),
                _ => groups.push(vec![index]),
            }
            last_start = Some(start);
        }
        groups
    }
}

/// Functions of a mapping with their counts, in mapping order: what one
/// thread of [`Coverage::load_on`] counts.
#[derive(Default)]
struct Counted<'m> {
    records: Vec<FunctionRecord<'m>>,
    /// The mapping's indices of functions whose profile record has another
    /// structural hash.
    mismatched: Vec<usize>,
}

impl<'m> Counted<'m> {
    /// `files`: see [`Coverage::of_functions_for`].
    fn of(
        mapping: &'m CoverageMapping,
        counters: &dyn CounterSource,
        indices: impl Iterator<Item = usize>,
        mcdc: bool,
        files: Option<&[FileName]>,
    ) -> Self {
        // At most as many records as indices: a filtered iterator tells
        // only its upper bound, and a vector of hundreds of records grown by
        // doubling is moved each time past the allocator's smaller blocks.
        let (least, most) = indices.size_hint();
        let mut counted = Counted { records: Vec::with_capacity(most.unwrap_or(least)), mismatched: Vec::new() };
        let mut memo = Vec::new();
        for i in indices {
            match count_function(mapping, counters, i, mcdc, files, &mut memo) {
                Some(Ok(record)) => counted.records.push(record),
                Some(Err(Mismatch)) => counted.mismatched.push(i),
                None => {}
            }
        }
        counted
    }
}

/// The counts of some functions, as a live dump reads them to update the
/// records it keeps: of each function, the count of each of its regions and
/// the two of each of its branches, in the order of its
/// [`FunctionRecord`]'s `regions` and `branches`. Counted from their
/// [`CountingBody`]s alone, by the rules of [`Coverage::of_functions`]: a
/// function it leaves out has no tally.
#[derive(Default)]
pub struct Tallies {
    /// By mapping index: (mapping index, where its counts begin, how many
    /// regions it has, how many branches).
    functions: Vec<(u32, u32, u32, u32)>,
    counts: Vec<u64>,
}

/// One function's counts in [`Tallies`].
#[derive(Clone, Copy)]
pub struct Tally<'a> {
    regions: &'a [u64],
    /// Two a branch.
    branches: &'a [u64],
}

impl Tallies {
    /// Of the mapping's `functions` (ascending) that have a counting body
    /// in `bodies` (by mapping index).
    pub fn count<'b>(
        mapping: &CoverageMapping,
        counters: &dyn CounterSource,
        functions: &[usize],
        bodies: impl Fn(usize) -> Option<&'b CountingBody>,
    ) -> Tallies {
        // Sized at once: grown by doubling, its block was moved to a new
        // mapping three times a dump on redis (16 to 128 KiB), each time
        // with the TLBs of the program's threads flushed.
        let counts = functions.iter().filter_map(|&i| bodies(i)).map(|body| body.counters.len()).sum();
        let mut tallies = Tallies { functions: Vec::with_capacity(functions.len()), counts: Vec::with_capacity(counts) };
        let mut provenance: FxHashSet<(&[FileName], u64)> = FxHashSet::default();
        let mut memo = Vec::new();
        // Found first, all of them, and what they read asked for (see
        // `crate::prefetch`).
        let found: Vec<(usize, &FunctionMapping, &CountingBody, &[u64])> = functions
            .iter()
            .filter_map(|&i| {
                let (f, body) = (mapping.functions.get(i)?, bodies(i)?);
                let counts = match counters.lookup(i, f.name_ref, f.hash) {
                    Lookup::Found { counters, .. } => counters,
                    Lookup::HashMismatch => return None,
                    Lookup::Unknown => &[],
                };
                prefetch::slice(&body.expressions);
                prefetch::slice(&body.counters);
                prefetch::slice(counts);
                Some((i, f, body, counts))
            })
            .collect();
        for (i, f, body, counts) in found {
            if body.empty || body.stub && counts.first().is_some_and(|&c| c > 0) {
                continue;
            }
            // As `Coverage::from_parts` leaves out duplicates.
            if mapping.objects() > 1 && !provenance.insert((mapping.filenames(f), f.name_ref)) {
                continue;
            }
            let from = tallies.counts.len();
            let mut eval = Evaluator::new(&body.expressions, counts, counts.is_empty(), &mut memo);
            let counted = body.counters.iter().all(|&c| match eval.eval(c) {
                Some(count) => {
                    tallies.counts.push(count as u64);
                    true
                }
                None => false,
            });
            if !counted {
                tallies.counts.truncate(from);
                continue;
            }
            let branches = (body.counters.len() - body.regions as usize) / 2;
            tallies.functions.push((i as u32, from as u32, body.regions, branches as u32));
        }
        tallies
    }

    /// Where function `i` (by mapping index) is among them.
    pub fn position(&self, i: usize) -> Option<usize> {
        self.functions.binary_search_by_key(&i, |f| f.0 as usize).ok()
    }

    /// The function at `position`.
    pub fn at(&self, position: usize) -> Tally<'_> {
        let Some(&(_, from, regions, branches)) = self.functions.get(position) else {
            return Tally { regions: &[], branches: &[] };
        };
        let (from, regions, branches) = (from as usize, regions as usize, 2 * branches as usize);
        let counts = self.counts.get(from..from + regions + branches).unwrap_or_default();
        let (regions, branches) = counts.split_at(regions.min(counts.len()));
        Tally { regions, branches }
    }
}

impl Tally<'_> {
    /// The count of its first region, as [`FunctionRecord::execution_count`].
    pub fn execution_count(&self) -> u64 {
        self.regions.first().copied().unwrap_or(0)
    }

    /// The count of its region `at` (0 past them).
    pub fn region(&self, at: usize) -> u64 {
        self.regions.get(at).copied().unwrap_or(0)
    }

    /// The two counts of its branch `at` (0 past them).
    pub fn branch(&self, at: usize) -> [u64; 2] {
        match self.branches.get(2 * at..2 * at + 2) {
            Some(&[count, false_count]) => [count, false_count],
            _ => [0, 0],
        }
    }

    /// How many regions and branches it has.
    pub fn regions_and_branches(&self) -> usize {
        self.regions.len() + self.branches.len() / 2
    }

    /// Its regions' counts, then its branches' two each.
    pub fn counts(&self) -> impl Iterator<Item = u64> + '_ {
        self.regions.iter().chain(self.branches).copied()
    }
}

/// The profile's record of a function has another structural hash.
struct Mismatch;

/// Function `i` of `mapping` (which must be one of its) with its counts;
/// `None` when it is left out of reports.
fn count_function<'m>(
    mapping: &'m CoverageMapping,
    counters: &dyn CounterSource,
    i: usize,
    mcdc: bool,
    files: Option<&[FileName]>,
    memo: &mut Vec<Memo>,
) -> Option<Result<FunctionRecord<'m>, Mismatch>> {
    let f = &mapping.functions[i];
    let (counts, bitmap): (&[u64], &[u8]) = match counters.lookup(i, f.name_ref, f.hash) {
        Lookup::Found { counters, bitmap } => (counters, bitmap),
        Lookup::HashMismatch => return Some(Err(Mismatch)),
        // Never ran (or not in this profile): every counter is zero.
        Lookup::Unknown => (&[], &[]),
    };
    let first = f.regions().first()?;
    // A zero-region stub from a unit where the function is unused, while
    // another unit's record carries the real counts.
    if f.regions().len() == 1 && first.count == Counter::ZERO && counts.first().is_some_and(|&c| c > 0) {
        return None;
    }
    count_regions(mapping, i, counts, mcdc.then_some(bitmap), files, memo).map(Ok)
}

impl crate::mapping::FunctionMapping {
    /// The name llvm-cov shows: without the `\x01` marker and without the
    /// `file:` prefix clang gives local symbols, when the prefix is exactly
    /// the function's first file name.
    fn name_without_prefix<'a>(&self, mapping: &'a CoverageMapping) -> &'a str {
        let name = mapping.name(self);
        let name = name.strip_prefix('\u{1}').unwrap_or(name);
        if let Some(&file) = mapping.filenames(self).first() {
            if let Some(rest) = name.strip_prefix(mapping.file_name(file)) {
                return rest.get(1..).unwrap_or("");
            }
        }
        name
    }
}

/// The file ids of the branches a function's summary counts: its body's
/// (`main`), each one an expansion in it expands, and so on (an id twice if
/// two expansions expand it). Malformed expansions could form a cycle: the
/// walk takes at most one step per region.
fn summary_branch_files(f: &FunctionRecord<'_>, main: u32) -> Vec<u32> {
    let mut files = vec![main];
    let mut next = 0;
    while next < files.len() && files.len() <= f.regions.len() {
        let id = files[next];
        let expanded = f.regions_in(id).iter().filter(|r| is_expansion_in(r, id));
        files.extend(expanded.map(|r| r.region.expanded_file_id));
        next += 1;
    }
    files
}

fn is_expansion_in(r: &CountedRegion, file_id: u32) -> bool {
    r.kind() == RegionKind::Expansion && r.region.file_id == file_id
}

/// Evaluates counter expressions of one function, memoized, in i64 as LLVM
/// does (a negative result later reads as a huge unsigned count).
struct Evaluator<'a> {
    expressions: &'a [Expression],
    counts: &'a [u64],
    /// Counts of a function the profile does not know are all zero, and
    /// no counter id is out of range.
    all_zero: bool,
    /// A memo per expression, in a vector the functions of a load reuse
    /// (a dump counts hundreds).
    memo: &'a mut Vec<Memo>,
}

#[derive(Clone, Copy)]
enum Memo {
    Unknown,
    InProgress,
    Done(Option<i64>),
}

impl<'a> Evaluator<'a> {
    fn new(expressions: &'a [Expression], counts: &'a [u64], all_zero: bool, memo: &'a mut Vec<Memo>) -> Self {
        memo.clear();
        memo.resize(expressions.len(), Memo::Unknown);
        Evaluator { expressions, counts, all_zero, memo }
    }

    /// `None` when a counter id is out of range (or expressions form a
    /// cycle, which only malformed input can): llvm-cov then drops the
    /// function without a word. Inlined into the loop over a function's
    /// regions, whose counters are mostly the constant zero (a code
    /// region's "false" one) or a counter: only an expression is a call.
    #[inline]
    fn eval(&mut self, c: Counter) -> Option<i64> {
        match c.get() {
            CounterRef::Zero => Some(0),
            CounterRef::Counter(_) if self.all_zero => Some(0),
            CounterRef::Counter(id) => self.counts.get(id as usize).map(|&v| v as i64),
            CounterRef::Expression(id) => self.expression(id as usize),
        }
    }

    #[inline(never)]
    fn expression(&mut self, id: usize) -> Option<i64> {
        match *self.memo.get(id)? {
            Memo::Done(v) => return v,
            Memo::InProgress => return None,
            Memo::Unknown => {}
        }
        self.memo[id] = Memo::InProgress;
        let e = self.expressions[id];
        let value = (|| {
            let lhs = self.eval(e.lhs)?;
            let rhs = self.eval(e.rhs)?;
            Some(match e.kind {
                ExpressionKind::Add => lhs.wrapping_add(rhs),
                ExpressionKind::Subtract => lhs.wrapping_sub(rhs),
            })
        })();
        self.memo[id] = Memo::Done(value);
        value
    }
}

fn count_regions<'m>(
    mapping: &'m CoverageMapping,
    mapping_index: usize,
    counts: &[u64],
    mcdc_bitmap: Option<&[u8]>,
    files: Option<&[FileName]>,
    memo: &mut Vec<Memo>,
) -> Option<FunctionRecord<'m>> {
    let f = &mapping.functions[mapping_index];
    let mut eval = Evaluator::new(f.expressions(), counts, counts.is_empty(), memo);
    let main_file = f.main_file();
    let filenames = mapping.filenames(f);
    let named = |files: &[FileName], id: u32| {
        filenames.get(id as usize).is_some_and(|name| files.binary_search(name).is_ok())
    };
    // Only the regions in `files`, unless the function is defined in one:
    // its summary reads its regions in every file.
    let files = files.filter(|files| !main_file.is_some_and(|m| named(files, m)));
    // Which of the first 64 file ids are in `files`, looked up once:
    // searched for each region, they took a third of the samples of
    // counting in a cold dump of redis.
    let named_ids = files.map_or(0, |files| {
        (0..filenames.len().min(64) as u32).filter(|&id| named(files, id)).fold(0u64, |m, id| m | 1 << id)
    });
    let kept = |r: &Region| match files {
        None => true,
        Some(_) if r.file_id < 64 => named_ids >> r.file_id & 1 == 1,
        Some(files) => named(files, r.file_id),
    };
    let (regions, branches) = match files {
        None => (f.regions().len() - f.branches(), f.branches()),
        Some(_) => {
            let branches = f.regions().iter().filter(|r| r.is_branch() && kept(r)).count();
            (f.regions().iter().filter(|r| !r.is_branch() && kept(r)).count(), branches)
        }
    };
    let mut record = FunctionRecord {
        mapping_index,
        filenames,
        regions: Vec::with_capacity(regions),
        branches: Vec::with_capacity(branches),
        mcdc_records: Vec::new(),
        execution_count: 0,
        main_file,
        // One per file id up to the last region's: regions come file id by
        // file id (see `mapping::decode_body`).
        file_ends: vec![0; 2 * f.regions().last().map_or(0, |r| r.file_id as usize + 1)],
    };
    let mut first = true;
    for r in f.regions() {
        if r.kind == RegionKind::McdcDecision {
            continue;
        }
        // Every count is evaluated, kept or not: one out of range drops
        // the function, as llvm-cov drops it.
        let counted = CountedRegion {
            region: r,
            count: eval.eval(r.count)? as u64,
            false_count: eval.eval(r.false_count)? as u64,
        };
        if !r.is_branch() && std::mem::take(&mut first) {
            record.execution_count = counted.count;
        }
        if !kept(r) {
            continue;
        }
        let kind = usize::from(r.is_branch());
        let at = r.file_id as usize + kind * record.file_ends.len() / 2;
        if let Some(end) = record.file_ends.get_mut(at) {
            *end += 1;
        }
        if r.is_branch() {
            record.branches.push(counted);
        } else {
            record.regions.push(counted);
        }
    }
    let mut sum = 0;
    let files = record.file_ends.len() / 2;
    for (k, end) in record.file_ends.iter_mut().enumerate() {
        sum = if k == files { 0 } else { sum } + *end;
        *end = sum;
    }
    if let Some(bitmap) = mcdc_bitmap {
        record.mcdc_records = crate::mcdc::records(f, bitmap);
    }
    Some(record)
}

/// Turns nested regions of one file into a sorted list of segments, exactly
/// as llvm-cov's `SegmentBuilder`.
pub fn build_segments(regions: Vec<CountedRegion<'_>>) -> Vec<Segment> {
    let mut scratch = Scratch { spans: regions.iter().map(Span::of).collect(), ..Scratch::default() };
    let mut segments = Vec::new();
    scratch.build_segments(&mut segments, false);
    segments
}

impl CoverageData<'_> {
    /// The segments of a stretch of a file from its functions' parts (see
    /// [`Coverage::part_in_file_into`]), as [`Coverage::for_file_into`]
    /// builds those of a whole file, into `self.segments`; `followed`:
    /// other regions of the file come after.
    pub fn segments_of(&mut self, spans: &[Span], followed: bool) {
        self.scratch.spans.clear();
        self.scratch.spans.extend_from_slice(spans);
        self.scratch.build_segments(&mut self.segments, followed);
    }
}

/// The segments of some regions with their counts left out, for regions
/// whose counts change while they do not (a live agent's dumps): which of
/// them combine into which *slot* (regions of one extent: the counts of the
/// first kind, in code, expansion, skipped order, added up), and the
/// segments the builder builds from the slots. The builder reads counts
/// only to leave out a segment that repeats the last one: given the slots'
/// counts, [`ShapeWords::segments`] does that as it goes, and so gives the
/// segments the builder would of the regions with those counts. A header's
/// macro expanded by a thousand functions is a handful of slots here.
///
/// Kept as words, in one block with the counts of the regions it was
/// made of (see `lcov::live::Kept`): three per segment (its line, column
/// and slot), then a byte of flags per segment, four to a word (13 bytes a
/// segment, where the segment itself is 16).
#[derive(Debug, Default)]
pub struct Shape {
    words: Vec<u32>,
}

/// A [`Shape`]'s words, wherever they are kept.
#[derive(Debug, Clone, Copy)]
pub struct ShapeWords<'a>(pub &'a [u32]);

/// A segment of a [`Shape`]: its count is that of `slot` (the count of the
/// region it takes its count from); its `flags` say whether it has a count,
/// enters a region, is a gap, and is `SKIPPABLE`: left out by the builder
/// after a segment with the same count.
#[derive(Debug, Clone, Copy)]
struct ShapedSegment {
    line: u32,
    col: u32,
    slot: u32,
    flags: u8,
}

/// No slot: a region of an extent whose first region is of another kind.
pub const NO_SLOT: u32 = u32::MAX;

/// A shaped segment's flags, in its byte.
const HAS_COUNT: u8 = 1;
const IS_REGION_ENTRY: u8 = 2;
const IS_GAP: u8 = 4;
const SKIPPABLE: u8 = 8;

impl Shape {
    /// The shape of `spans` (their counts unread), and the slot each adds
    /// its count to; `followed`: other regions of the file come after.
    pub fn new(spans: &[Span], followed: bool) -> (Shape, Vec<u32>) {
        let mut order: Vec<usize> = (0..spans.len()).collect();
        order.sort_unstable_by(|&a, &b| builder_order(&spans[a], &spans[b]));
        let mut slot_of = vec![NO_SLOT; spans.len()];
        let mut scratch = Scratch::default();
        let combined = &mut scratch.spans;
        for i in order {
            let s = spans[i];
            match combined.last() {
                Some(first) if first.start == s.start && first.end == s.end => {
                    if first.kind == s.kind {
                        slot_of[i] = (combined.len() - 1) as u32;
                    }
                }
                _ => {
                    slot_of[i] = combined.len() as u32;
                    // The builder copies a region's count into its segments:
                    // here, the slot.
                    combined.push(Span { count: combined.len() as u64, ..s });
                }
            }
        }
        let mut segments = Vec::new();
        let mut unused = Vec::new();
        let mut builder = SegmentBuilder {
            regions: &scratch.spans,
            segments: &mut unused,
            shape: Some(&mut segments),
            active: &mut scratch.active,
            completed: &mut scratch.completed,
            followed,
        };
        builder.build();
        let mut words = Vec::with_capacity(3 * segments.len() + segments.len().div_ceil(4));
        words.extend(segments.iter().flat_map(|s| [s.line, s.col, s.slot]));
        words.extend(segments.chunks(4).map(|four| {
            four.iter().enumerate().fold(0u32, |word, (i, s)| word | u32::from(s.flags) << (8 * i))
        }));
        (Shape { words }, slot_of)
    }

    pub fn words(&self) -> &[u32] {
        &self.words
    }
}

impl<'a> ShapeWords<'a> {
    /// Its segments, with their slots.
    fn shaped(self) -> impl Iterator<Item = ShapedSegment> + 'a {
        // 3 words a segment and a quarter: `4 * len / 13` segments, exactly
        // (`13 n <= 4 * len <= 13 n + 3`).
        let n = self.0.len() * 4 / 13;
        let (positions, flags) = self.0.split_at(3 * n);
        positions.chunks_exact(3).enumerate().map(move |(k, s)| {
            let flags = flags.get(k / 4).map_or(0, |word| (word >> (8 * (k % 4))) as u8);
            ShapedSegment { line: s[0], col: s[1], slot: s[2], flags }
        })
    }

    /// The segments with the slots' `counts`, into `out`.
    pub fn segments(self, counts: &[u64], out: &mut Vec<Segment>) {
        out.clear();
        out.reserve(self.0.len() * 4 / 13);
        for s in self.shaped() {
            let count = counts.get(s.slot as usize).copied().unwrap_or(0);
            if s.flags & SKIPPABLE != 0 {
                // As the builder's `start_segment`, which compares the
                // region's count even where the segment has none.
                if let Some(last) = out.last() {
                    if last.has_count == s.has_count() && last.count == count && !last.is_region_entry {
                        continue;
                    }
                }
            }
            out.push(Segment {
                line: s.line,
                col: s.col,
                count: if s.has_count() { count } else { 0 },
                has_count: s.has_count(),
                is_region_entry: s.is_region_entry(),
                is_gap: s.flags & IS_GAP != 0,
            });
        }
    }

    /// The shape's [`LinePlan`], into `out` (cleared first): whether it
    /// has one.
    pub fn line_plan(self, out: &mut Vec<u32>) -> bool {
        out.clear();
        let mut segments: Vec<ShapedSegment> = self.shaped().collect();
        // The lines end at the last segment the builder keeps: one it
        // always leaves out is not there, and one it may leave out must not
        // move that end past lines that read a count.
        while segments.len() > 1 && left_out(&segments, segments.len() - 1) == LeftOut::Always {
            segments.pop();
        }
        if let Some(kept) = (0..segments.len()).rev().find(|&k| left_out(&segments, k) == LeftOut::Never) {
            let last = segments[kept];
            if last.has_count() && segments[kept + 1..].iter().any(|s| s.line > last.line) {
                return false;
            }
        }
        // As `line_stats`, with slots for counts.
        let mut wrapped: Option<ShapedSegment> = None;
        let (mut next, mut line) = (0, 1u32);
        let mut on_line = 0..0;
        while next < segments.len() {
            if let Some(last) = on_line.clone().last() {
                wrapped = Some(segments[last]);
            }
            let first = next;
            while next < segments.len() && segments[next].line <= line {
                next += 1;
            }
            on_line = first..next;
            let wrapped_slot = wrapped.filter(|w| w.has_count()).map(|w| w.slot);
            if on_line.is_empty() {
                let next_line = segments[next].line;
                if let Some(slot) = wrapped_slot {
                    push_run(out, line, next_line - line, &[slot]);
                }
                line = next_line;
                continue;
            }
            let Some(starts_skipped) = starts_skipped(&segments, on_line.clone()) else { return false };
            let on = &segments[on_line.clone()];
            let starts = on.iter().filter(|s| s.starts_region()).map(|s| s.slot);
            let mut mapped = !starts_skipped && (wrapped_slot.is_some() || starts.clone().next().is_some());
            mapped |= on.iter().any(|s| s.is_region_entry() && s.has_count());
            if mapped {
                let slots: Vec<u32> = wrapped_slot.into_iter().chain(starts).collect();
                if slots.len() > usize::from(u16::MAX) {
                    return false;
                }
                push_run(out, line, 1, &slots);
            }
            line = match line.checked_add(1) {
                Some(l) => l,
                None => break,
            };
        }
        true
    }
}

/// The mapped lines of a [`Shape`]'s segments as llvm-cov reads them (see
/// [`line_stats`]), with their counts left out: runs of lines, each with
/// the slots whose largest count is its count (a line's count is the
/// largest of the regions starting on it and of the one wrapping it). A
/// live agent's dump writes a stretch's `DA` lines from it, without
/// building its segments, and writes over the counts in the last text
/// that changed.
///
/// Which segments the builder leaves out depends on counts (see
/// [`ShapeWords::segments`]), but one left out enters no region and
/// repeats the count of the one before it: the lines read the same with
/// or without it, except where it is the first of its line and a skipped
/// region starts next on that line. A shape where that depends on its
/// counts has no plan.
///
/// Words: of each run, its first line, its number of lines and of slots
/// (16 bits each), then its slots.
#[derive(Debug, Clone, Copy)]
pub struct LinePlan<'a>(pub &'a [u32]);

impl<'a> LinePlan<'a> {
    /// Its runs with the slots' `counts`: (first line, lines, count).
    pub fn runs(self, counts: &'a [u64]) -> impl Iterator<Item = (u32, u32, u64)> + 'a {
        self.runs_by(move |slots| largest(counts, slots))
    }

    /// Its runs with the slots' `counts` and their counts `before`: (first
    /// line, lines, count, count before), in one pass over the plan.
    pub fn runs_with_before(self, counts: &'a [u64], before: &'a [u64]) -> impl Iterator<Item = (u32, u32, u64, u64)> + 'a {
        self.runs_by(move |slots| (largest(counts, slots), largest(before, slots)))
            .map(|(line, lines, (count, before))| (line, lines, count, before))
    }

    /// Its runs: (first line, lines, `count` of the run's slots).
    fn runs_by<T>(self, count: impl Fn(&[u32]) -> T + 'a) -> impl Iterator<Item = (u32, u32, T)> + 'a {
        let mut words = self.0;
        std::iter::from_fn(move || {
            let [line, sizes, rest @ ..] = words else { return None };
            let (lines, n) = (sizes & 0xffff, (sizes >> 16) as usize);
            let (slots, rest) = rest.split_at(n.min(rest.len()));
            words = rest;
            Some((*line, lines, count(slots)))
        })
    }
}

/// The largest of the `counts` of `slots` (0 for none).
fn largest(counts: &[u64], slots: &[u32]) -> u64 {
    slots.iter().map(|&s| counts.get(s as usize).copied().unwrap_or(0)).max().unwrap_or(0)
}

/// Adds a run of `lines` lines from `line` with these `slots` (at most
/// 2^16) to a [`LinePlan`]'s words, in runs of at most 2^16 lines.
fn push_run(out: &mut Vec<u32>, mut line: u32, mut lines: u32, slots: &[u32]) {
    while lines > 0 {
        let run = lines.min(u32::from(u16::MAX));
        out.extend([line, run | (slots.len() as u32) << 16]);
        out.extend_from_slice(slots);
        (line, lines) = (line + run, lines - run);
    }
}

/// Whether the builder leaves out segment `k` of `segments` (see
/// [`ShapeWords::segments`]): it compares it with the last one it kept,
/// which is the one before, or one with the same count and flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeftOut {
    Never,
    Always,
    /// When its count is the one before's.
    Maybe,
}

fn left_out(segments: &[ShapedSegment], k: usize) -> LeftOut {
    let s = segments[k];
    let Some(before) = k.checked_sub(1).map(|b| segments[b]) else { return LeftOut::Never };
    if s.flags & SKIPPABLE == 0 || before.is_region_entry() || before.has_count() != s.has_count() {
        LeftOut::Never
    } else if s.has_count() && before.slot == s.slot {
        LeftOut::Always
    } else {
        LeftOut::Maybe
    }
}

/// Whether the first segment the builder keeps of those `on_line` starts
/// a skipped region (as `stats_for_line` reads it); `None` when that
/// depends on counts.
fn starts_skipped(segments: &[ShapedSegment], on_line: std::ops::Range<usize>) -> Option<bool> {
    for k in on_line.clone() {
        let s = segments[k];
        match left_out(segments, k) {
            LeftOut::Never => return Some(!s.has_count() && s.is_region_entry()),
            LeftOut::Always => {}
            // Kept, it is the first, and it enters no region.
            LeftOut::Maybe => return starts_skipped(segments, k + 1..on_line.end).filter(|&skipped| !skipped),
        }
    }
    Some(false)
}

impl ShapedSegment {
    fn has_count(&self) -> bool {
        self.flags & HAS_COUNT != 0
    }

    fn is_region_entry(&self) -> bool {
        self.flags & IS_REGION_ENTRY != 0
    }

    /// As `stats_for_line`'s `starts_region`.
    fn starts_region(&self) -> bool {
        self.flags & IS_GAP == 0 && self.has_count() && self.is_region_entry()
    }
}

/// What the segment builder needs of a region, positions packed as
/// `line << 32 | column` (which orders them as (line, column) pairs do):
/// half the size of a [`CountedRegion`], for the sort.
#[derive(Debug, Clone, Copy)]
pub struct Span {
    start: u64,
    end: u64,
    count: u64,
    kind: RegionKind,
}

impl Span {
    pub fn count(&self) -> u64 {
        self.count
    }

    fn of(r: &CountedRegion<'_>) -> Span {
        let at = |(line, col): (u32, u32)| u64::from(line) << 32 | u64::from(col);
        Span { start: at(r.start()), end: at(r.end()), count: r.count, kind: r.kind() }
    }
}

/// The segment builder's buffers: the regions to build from (filled by the
/// caller), and its stacks.
#[derive(Debug, Default)]
struct Scratch {
    spans: Vec<Span>,
    /// Indices into `spans` of the regions still open, outermost first.
    active: Vec<usize>,
    /// The regions completed at one step.
    completed: Vec<usize>,
}

impl Scratch {
    /// Builds the segments of `self.spans` into `segments` (cleared first);
    /// `followed`: more regions of the file come after these.
    fn build_segments(&mut self, segments: &mut Vec<Segment>, followed: bool) {
        // Ties (same extent and kind) are summed below, so the sort need not
        // be stable.
        self.spans.sort_unstable_by(builder_order);
        combine_regions(&mut self.spans);
        self.build_combined(segments, followed);
    }

    /// [`Self::build_segments`] of spans sorted and combined already.
    fn build_combined(&mut self, segments: &mut Vec<Segment>, followed: bool) {
        segments.clear();
        self.active.clear();
        self.completed.clear();
        let mut builder = SegmentBuilder {
            regions: &self.spans,
            segments,
            shape: None,
            active: &mut self.active,
            completed: &mut self.completed,
            followed,
        };
        builder.build();
    }
}

/// Outer regions first; among equal extents code before expansion before
/// skipped, so the right region becomes active when they are combined.
fn builder_order(a: &Span, b: &Span) -> std::cmp::Ordering {
    a.start.cmp(&b.start).then_with(|| b.end.cmp(&a.end)).then_with(|| a.kind.cmp(&b.kind))
}

/// Regions with the same extent become one; counts of the same kind as the
/// first add up (a macro expanded in a macro must not count twice).
fn combine_regions(regions: &mut Vec<Span>) {
    regions.dedup_by(|r, active| {
        let same = active.start == r.start && active.end == r.end;
        if same && active.kind == r.kind {
            active.count = active.count.wrapping_add(r.count);
        }
        same
    });
}

struct SegmentBuilder<'a> {
    regions: &'a [Span],
    segments: &'a mut Vec<Segment>,
    /// Building a [`Shape`] (region counts are slots): every segment goes
    /// here instead.
    shape: Option<&'a mut Vec<ShapedSegment>>,
    /// Indices into `regions` of the regions still open, outermost first.
    active: &'a mut Vec<usize>,
    /// Scratch space for the regions completed at one step.
    completed: &'a mut Vec<usize>,
    /// More regions of the file come after `regions`.
    followed: bool,
}

impl SegmentBuilder<'_> {
    fn start_segment(&mut self, region: usize, at: u64, is_region_entry: bool, emit_skipped: bool) {
        let r = &self.regions[region];
        let has_count = !emit_skipped && r.kind != RegionKind::Skipped;
        let (line, col) = ((at >> 32) as u32, at as u32);
        if let Some(shape) = &mut self.shape {
            let flag = |on: bool, flag: u8| if on { flag } else { 0 };
            let flags = flag(has_count, HAS_COUNT)
                | flag(is_region_entry, IS_REGION_ENTRY)
                | flag(has_count && r.kind == RegionKind::Gap, IS_GAP)
                | flag(!is_region_entry && !emit_skipped, SKIPPABLE);
            shape.push(ShapedSegment { line, col, slot: r.count as u32, flags });
            return;
        }
        if !is_region_entry && !emit_skipped {
            if let Some(last) = self.segments.last() {
                if last.has_count == has_count && last.count == r.count && !last.is_region_entry {
                    return;
                }
            }
        }
        self.segments.push(if has_count {
            Segment { line, col, count: r.count, has_count: true, is_region_entry, is_gap: r.kind == RegionKind::Gap }
        } else {
            Segment { line, col, count: 0, has_count: false, is_region_entry, is_gap: false }
        });
    }

    /// Emits the segments where active regions from `first_completed` on
    /// end, before `next` (the start of the next region; `None` at the end).
    fn complete_regions_until(&mut self, next: Option<u64>, first_completed: usize) {
        let regions = self.regions;
        let end = |i: usize| regions[i].end;
        self.active[first_completed..].sort_by_key(|&i| end(i));

        for i in first_completed + 1..self.active.len() {
            let mut completed = self.active[i];
            let segment_at = end(self.active[i - 1]);
            if next == Some(segment_at) {
                break;
            }
            if segment_at == end(completed) {
                continue;
            }
            // Use the count of the last completed region ending here.
            for &later in &self.active[i + 1..] {
                if end(completed) == end(later) {
                    completed = later;
                }
            }
            self.start_segment(completed, segment_at, false, false);
        }

        let last = *self.active.last().expect("called with active regions");
        if first_completed > 0 && Some(end(last)) != next {
            // The enclosing region's count resumes after the completed ones.
            self.start_segment(self.active[first_completed - 1], end(last), false, false);
        } else if first_completed == 0 && next != Some(end(last)) {
            // Nothing is active any more: mark the gap between functions.
            self.start_segment(last, end(last), false, true);
        }
        self.active.truncate(first_completed);
    }

    fn build(&mut self) {
        let regions = self.regions;
        for (index, region) in regions.iter().enumerate() {
            let start = region.start;
            // Active regions that end before this one starts are completed:
            // moved after the others, both keeping their order.
            if self.active.iter().any(|&i| regions[i].end <= start) {
                self.completed.clear();
                self.completed.extend(self.active.iter().copied().filter(|&i| regions[i].end <= start));
                self.active.retain(|&i| regions[i].end > start);
                let first_completed = self.active.len();
                self.active.extend_from_slice(self.completed);
                self.complete_regions_until(Some(start), first_completed);
            }

            let is_gap = region.kind == RegionKind::Gap;
            if start == region.end {
                // An empty region never becomes active: the last region, or a
                // skipped one, leaves a skipped segment; otherwise it takes
                // its predecessor's count.
                let skipped = (index + 1 == regions.len() && !self.followed) || region.kind == RegionKind::Skipped;
                let source = self.active.last().copied().unwrap_or(index);
                self.start_segment(source, start, !is_gap, skipped);
                if skipped {
                    if let Some(&last) = self.active.last() {
                        self.start_segment(last, start, false, false);
                    }
                }
                continue;
            }
            if index + 1 == regions.len() || start != regions[index + 1].start {
                self.start_segment(index, start, !is_gap, false);
            }
            self.active.push(index);
        }
        if !self.active.is_empty() {
            self.complete_regions_until(None, 0);
        }
    }
}

/// Line statistics for every line from 1 to the last segment's line, as
/// llvm-cov's `LineCoverageIterator`, in runs: `visit(stats, n)` stands for
/// lines `stats.line .. stats.line + n`, which all read the same. Lines
/// between segments have the same statistics, so the walk costs one step
/// per segment, not per line.
pub fn line_stats(segments: &[Segment], mut visit: impl FnMut(LineStats, u32)) {
    let mut wrapped: Option<&Segment> = None;
    let mut next = 0;
    let mut line: u32 = 1;
    // The segments of the line being visited: consecutive ones.
    let mut on_line: &[Segment] = &[];
    while next < segments.len() {
        if let Some(last) = on_line.last() {
            wrapped = Some(last);
        }
        // Segments before `line` only occur in malformed input; taking them
        // here keeps the walk finite.
        let first = next;
        while next < segments.len() && segments[next].line <= line {
            next += 1;
        }
        on_line = &segments[first..next];
        if on_line.is_empty() {
            // Up to the next segment's line, every line is wrapped by the
            // same segment: mapped when it has a count.
            let next_line = segments[next].line;
            if wrapped.is_some_and(|w| w.has_count) {
                visit(stats_for_line(on_line, wrapped, line), next_line - line);
            }
            line = next_line;
            continue;
        }
        visit(stats_for_line(on_line, wrapped, line), 1);
        line = match line.checked_add(1) {
            Some(l) => l,
            None => break,
        };
    }
}

fn stats_for_line(on_line: &[Segment], wrapped: Option<&Segment>, line: u32) -> LineStats {
    let starts_region = |s: &Segment| !s.is_gap && s.has_count && s.is_region_entry;
    let region_starts = on_line.iter().filter(|s| starts_region(s)).count();
    let starts_skipped = on_line.first().is_some_and(|s| !s.has_count && s.is_region_entry);
    let mut mapped = !starts_skipped && (wrapped.is_some_and(|w| w.has_count) || region_starts > 0);
    mapped |= on_line.iter().any(|s| s.is_region_entry && s.has_count);
    if !mapped {
        return LineStats { line, count: 0, mapped: false };
    }
    let mut count = wrapped.map_or(0, |w| w.count);
    if region_starts > 0 {
        for s in on_line.iter().filter(|s| starts_region(s)) {
            count = count.max(s.count);
        }
    }
    LineStats { line, count, mapped: true }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts by function index, as a profile gives them.
    struct Source(Vec<Lookup<'static>>);

    impl CounterSource for Source {
        fn lookup(&self, function: usize, _: u64, _: u64) -> Lookup<'_> {
            match self.0.get(function) {
                Some(Lookup::Found { counters, bitmap }) => Lookup::Found { counters, bitmap },
                Some(Lookup::HashMismatch) => Lookup::HashMismatch,
                _ => Lookup::Unknown,
            }
        }
    }

    #[test]
    fn tallies_count_the_functions_a_load_counts_as_it_counts_them() {
        let at = |kind: RegionKind, count: Counter, false_count: Counter, line: u32| Region {
            kind,
            count,
            false_count,
            file_id: 0,
            expanded_file_id: 0,
            line_start: line,
            column_start: 1,
            line_end: line,
            column_end: 9,
        };
        let (c, e) = (Counter::counter, Counter::expression);
        let code = |count: Counter| at(RegionKind::Code, count, Counter::ZERO, 1);
        let minus = Expression { kind: ExpressionKind::Subtract, lhs: c(0), rhs: c(1) };
        let function = |expressions: Vec<Expression>, regions: Vec<Region>| {
            crate::mapping::FunctionMapping::decoded(crate::mapping::Body::new(expressions, regions, Vec::new(), 1))
        };
        let decision = at(RegionKind::McdcDecision, Counter::ZERO, Counter::ZERO, 2);
        let mut mapping = CoverageMapping::default();
        mapping.functions = vec![
            // A region, a decision (not counted) and a branch on an expression.
            function(vec![minus], vec![code(c(0)), decision, at(RegionKind::Branch, e(0), c(1), 3)]),
            // A zero-region stub: left out when the profile has counts for it.
            function(Vec::new(), vec![code(Counter::ZERO)]),
            function(Vec::new(), vec![code(Counter::ZERO)]),
            // A counter out of range: dropped.
            function(Vec::new(), vec![code(c(5))]),
            // Another structural hash in the profile: dropped.
            function(Vec::new(), vec![code(c(0))]),
            // No regions: left out.
            function(Vec::new(), Vec::new()),
            // Never ran: zeros.
            function(vec![minus], vec![code(c(0)), at(RegionKind::Branch, e(0), c(1), 3)]),
        ];
        let found = |counters: &'static [u64]| Lookup::Found { counters, bitmap: &[] };
        let source = Source(vec![found(&[10, 3]), found(&[5]), Lookup::Unknown, found(&[1]), Lookup::HashMismatch, found(&[1])]);
        let bodies: Vec<_> = mapping.functions.iter().map(|f| f.counting_body()).collect();
        let every: Vec<usize> = (0..mapping.functions.len()).collect();
        let tallies = Tallies::count(&mapping, &source, &every, |i| bodies.get(i));
        let coverage = Coverage::of_functions(&mapping, &source, every.iter().copied());
        let loaded: Vec<usize> = coverage.functions.iter().map(|f| f.mapping_index).collect();
        assert_eq!(loaded, [0, 2, 6]);
        assert_eq!(every.iter().copied().filter(|&i| tallies.position(i).is_some()).collect::<Vec<_>>(), loaded);
        for f in &coverage.functions {
            let tally = tallies.at(tallies.position(f.mapping_index).unwrap());
            let counts = f.regions.iter().map(|r| r.count).chain(f.branches.iter().flat_map(|b| [b.count, b.false_count]));
            assert_eq!(tally.counts().collect::<Vec<_>>(), counts.collect::<Vec<_>>(), "function {}", f.mapping_index);
            assert_eq!(tally.execution_count(), f.execution_count);
        }
        let first = tallies.at(tallies.position(0).unwrap());
        assert_eq!((first.region(0), first.branch(0), first.branch(1)), (10, [7, 3], [0, 0]));
    }

    fn region(kind: RegionKind, start: (u32, u32), end: (u32, u32), count: u64) -> CountedRegion<'static> {
        CountedRegion {
            // A mapping region lives as long as the mapping: here, the test.
            region: Box::leak(Box::new(Region {
                kind,
                count: Counter::counter(0),
                false_count: Counter::ZERO,
                file_id: 0,
                expanded_file_id: 0,
                line_start: start.0,
                column_start: start.1,
                line_end: end.0,
                column_end: end.1,
            })),
            count,
            false_count: 0,
        }
    }

    fn lines(segments: &[Segment]) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        line_stats(segments, |s, run| {
            if s.mapped {
                out.extend((s.line..s.line + run).map(|l| (l, s.count)))
            }
        });
        out
    }

    #[test]
    fn nested_region_and_gap() {
        // fn f() {            line 1, count 5
        //   if x {            line 2, body count 2 (lines 2..4)
        //   }
        // }                   line 5
        let segments = build_segments(vec![
            region(RegionKind::Code, (1, 10), (5, 2), 5),
            region(RegionKind::Code, (2, 10), (4, 6), 2),
        ]);
        assert_eq!(
            segments.iter().map(|s| (s.line, s.col, s.count, s.has_count, s.is_region_entry)).collect::<Vec<_>>(),
            vec![(1, 10, 5, true, true), (2, 10, 2, true, true), (4, 6, 5, true, false), (5, 2, 0, false, false)]
        );
        // Line 4 is wrapped by the inner region (the closing segment at 4:6
        // is no region entry), so it reads 2, as llvm-cov reports it.
        assert_eq!(lines(&segments), vec![(1, 5), (2, 5), (3, 2), (4, 2), (5, 5)]);
    }

    #[test]
    fn skipped_region_unmaps_its_lines() {
        let segments = build_segments(vec![
            region(RegionKind::Code, (1, 1), (10, 2), 1),
            region(RegionKind::Skipped, (3, 1), (6, 1), 0),
        ]);
        // Line 6 starts inside the skipped region and has no region entry.
        assert_eq!(lines(&segments), vec![(1, 1), (2, 1), (7, 1), (8, 1), (9, 1), (10, 1)]);
    }

    #[test]
    fn same_extent_regions_of_one_kind_add_up() {
        let segments = build_segments(vec![
            region(RegionKind::Code, (1, 1), (2, 1), 3),
            region(RegionKind::Code, (1, 1), (2, 1), 4),
            region(RegionKind::Expansion, (1, 1), (2, 1), 100),
        ]);
        assert_eq!(segments[0].count, 7);
    }

    #[test]
    fn unsorted_segments_do_not_hang() {
        let seg = |line, count| Segment { line, col: 1, count, has_count: true, is_region_entry: true, is_gap: false };
        assert_eq!(lines(&[seg(5, 1), seg(2, 3)]), vec![(5, 3)]);
    }

    /// Regions nested, overlapping, of one extent, empty, of every kind,
    /// from a small deterministic generator.
    struct RandomRegions(u64);

    impl RandomRegions {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }

        /// A few regions, with counts below `counts`.
        fn regions(&mut self, counts: u64) -> Vec<CountedRegion<'static>> {
            let kinds = [RegionKind::Code, RegionKind::Code, RegionKind::Gap, RegionKind::Skipped, RegionKind::Expansion];
            let mut regions = Vec::new();
            for _ in 0..1 + self.below(8) {
                let start = (1 + self.below(6) as u32, 1 + self.below(4) as u32);
                let end = if self.below(5) == 0 { start } else { (start.0 + self.below(4) as u32, 1 + self.below(4) as u32) };
                let end = end.max(start);
                let kind = kinds[self.below(kinds.len() as u64) as usize];
                regions.push(region(kind, start, end, self.below(counts)));
            }
            regions
        }
    }

    #[test]
    fn a_shape_given_counts_is_the_segments_built_with_them() {
        // Counts from a few values, so that segments repeat their
        // predecessor's count, which the builder leaves out.
        let mut random = RandomRegions(0x2545_f491_4f6c_dd1d);
        for _ in 0..2000 {
            let regions = random.regions(3);
            let spans: Vec<Span> = regions.iter().map(Span::of).collect();
            for followed in [false, true] {
                let (shape, slot_of) = Shape::new(&spans, followed);
                let mut slots = vec![0u64; spans.len()];
                for (s, &slot) in spans.iter().zip(&slot_of) {
                    if slot != NO_SLOT {
                        slots[slot as usize] += s.count;
                    }
                }
                let mut shaped = Vec::new();
                ShapeWords(shape.words()).segments(&slots, &mut shaped);
                let mut scratch = Scratch { spans: spans.clone(), ..Scratch::default() };
                let mut built = Vec::new();
                scratch.build_segments(&mut built, followed);
                assert_eq!(shaped, built, "{regions:?}, followed: {followed}");
            }
        }
    }

    #[test]
    fn a_line_plan_given_counts_reads_as_the_segments_built_with_them() {
        // Counts from two values: segments the builder leaves out or keeps
        // by their counts are frequent.
        let mut random = RandomRegions(0x9e37_79b9_7f4a_7c15);
        let (mut planned, mut shapes) = (0, 0);
        for _ in 0..4000 {
            let regions = random.regions(1);
            let spans: Vec<Span> = regions.iter().map(Span::of).collect();
            for followed in [false, true] {
                let (shape, slot_of) = Shape::new(&spans, followed);
                let mut plan = Vec::new();
                shapes += 1;
                if !ShapeWords(shape.words()).line_plan(&mut plan) {
                    continue;
                }
                planned += 1;
                for _ in 0..4 {
                    let counts: Vec<u64> = (0..spans.len()).map(|_| random.below(2)).collect();
                    let mut slots = vec![0u64; spans.len()];
                    let mut regions = regions.clone();
                    for ((r, &count), &slot) in regions.iter_mut().zip(&counts).zip(&slot_of) {
                        r.count = count;
                        if slot != NO_SLOT {
                            slots[slot as usize] += count;
                        }
                    }
                    let spans: Vec<Span> = regions.iter().map(Span::of).collect();
                    let mut scratch = Scratch { spans, ..Scratch::default() };
                    let mut built = Vec::new();
                    scratch.build_segments(&mut built, followed);
                    let mut read = Vec::new();
                    line_stats(&built, |s, run| read.extend((s.line..s.line + run).filter(|_| s.mapped).map(|l| (l, s.count))));
                    let runs = LinePlan(&plan).runs(&slots);
                    let planned_lines: Vec<(u32, u64)> = runs.flat_map(|(line, n, count)| (line..line + n).map(move |l| (l, count))).collect();
                    assert_eq!(planned_lines, read, "{regions:?}, followed: {followed}");
                }
            }
        }
        // A shape has no plan only where the segments the builder leaves
        // out change which lines read which counts.
        assert!(planned * 10 > shapes * 9, "{planned} of {shapes} shapes planned");
    }
}
