//! A live agent's LCOV records, kept in parts so that a dump recomputes
//! only what the functions that ran since the last one reach.
//!
//! A file's record splits into parts that do not depend on each other:
//! - *stretches*: the regions of the file whose lines overlap, of whichever
//!   functions (a function, and the macros of the file it expands, are one
//!   stretch or a few; a macro of a header, with every function that
//!   expands it, is one). A stretch's `DA` and `BRDA` lines depend on its
//!   regions alone, because llvm-cov's segments restart where no region is
//!   open, and a line reads only the segments on it and the last one before
//!   it, which between stretches has no count;
//! - *instantiation groups* (functions that start at one place): the
//!   `FNF`/`FNH` and `LF`/`LH`/`BRF`/`BRH` totals are sums of their
//!   summaries, each the largest of its functions' own;
//! - each defined function's `FNDA` count.
//!
//! When functions run, a dump loads them alone, computes their stretches
//! and their summaries again (each group keeps its functions'), and copies
//! the lines of every other stretch from the last record. A stretch of
//! several functions (a header's inline function, compiled into every unit
//! that calls it; a macro expanded all over the program) keeps each
//! function's part of it (regions with counts, branches) and their
//! combination (regions by extent, branches by place, counts summed),
//! updated by the difference of the functions that ran. A service's timers
//! run a few functions of its largest files: the record of such a file is
//! mostly what it was.
//!
//! A record stays from dump to dump, for every file of the program: its
//! parts are small (indices as `u32`, in flat vectors with ranges, not a
//! vector or a map each; the file's totals kept, a group's taken out and
//! added again when its functions ran),
//! and its `SF` and `FN` lines are kept once, in its text, where the next
//! text and its `FNDA` lines take them (and the functions' names) from.

use ::bytes::{Bytes, BytesMut};
use rustc_hash::FxHashMap;

use super::{defined_names, function_summary, member_summaries, placed_branches, push_da_lines, push_int, push_line};
use super::{summed_branch_lines, write_fn_lines, write_lines, write_placed_branches};
use super::{write_summed_branches, BranchPath, PlacedBranch, Summary};
use crate::coverage::{Coverage, CoverageData, LinePlan, Segment, Shape, ShapeWords, Span, Tallies, Tally, NO_SLOT};
use crate::mapping::FileName;
use crate::prefetch;

/// One file's record, in parts, and its text. Functions are named by their
/// index in the mapping.
#[derive(Debug)]
pub struct LiveFile {
    file: FileName,
    /// The record as last computed (without `TN:`), shared with the reports
    /// that carry it. Always made from a `String`: see [`Self::render`].
    text: Bytes,
    /// How long its head is: `SF:` (its path rewritten) and the `FN:`
    /// lines, which begin the text. Which functions a file has does not
    /// change while the modules do not.
    head: usize,
    /// Where the display names of the functions defined in the file are in
    /// the head (in `FN` order), their counts, and where their `FNDA` lines
    /// end in the text.
    names: Vec<(u32, u32)>,
    executions: Vec<u64>,
    fnda_ends: Vec<u32>,
    /// By line.
    stretches: Vec<Stretch>,
    /// The functions of each stretch (see [`Stretch::functions`]).
    stretch_functions: Vec<u32>,
    /// The functions of each instantiation group, in load order, each
    /// with its own summary and count: `members[groups[g].0..groups[g].1]`.
    groups: Vec<(u32, u32)>,
    members: Vec<Member>,
    /// The members' zero masks (see [`Member::mask`]), a run of words each.
    masks: Vec<u64>,
    /// The sum of the groups' summaries, and how many of them ran: the
    /// `LF`/`LH`/`BRF`/`BRH` and `FNH` lines.
    total: Summary,
    hit: u32,
    /// Of each function: its slot in `names`, its group, its stretches;
    /// (function, slot or group or stretch), sorted.
    defined_at: Vec<(u32, u32)>,
    group_of: Vec<(u32, u32)>,
    stretches_of: Vec<(u32, u32)>,
    /// Where the first stretch's `DA` lines begin in the text; its
    /// `BRDA` lines begin where the last stretch's `DA` lines end.
    lines_at: u32,
}

#[derive(Debug, Default)]
struct Stretch {
    /// Its first and last line.
    lines: (u32, u32),
    /// The functions with regions in it, in load order (which is mapping
    /// order): `stretch_functions[functions.0..functions.1]`.
    functions: (u32, u32),
    /// For a stretch of several functions, their parts and those combined:
    /// a dump updates them by the difference of the functions that ran
    /// (from the first dump after the first that reaches it).
    kept: Option<Kept>,
    /// Where its `DA` and `BRDA` lines end in the record's text: each
    /// stretch's begin where the last one's end (see `LiveFile::lines_at`).
    da_end: u32,
    brda_end: u32,
}

/// Stretches' lines computed again, not yet in the text: all their `DA`
/// lines in one string and all their `BRDA` lines in another (a dump
/// computes hundreds of small stretches), and per stretch its index and
/// where its lines are in them.
#[derive(Default)]
struct Fresh {
    da: String,
    brda: String,
    stretches: Vec<(usize, TextRange, TextRange)>,
    /// The slots of the functions whose `FNDA` counts changed, in order.
    names: Vec<usize>,
    /// The record's own lines written over its last text, and where they
    /// go (see [`LiveFile::write_over`]).
    lines: String,
    own: Vec<(TextRange, TextRange)>,
    /// Every line written over, when some are longer than the lines they
    /// replace (see [`LiveFile::write_over`]).
    edits: Vec<Edit>,
}

/// Lines written over a record's text: where (`at`), and from which of the
/// [`Fresh`] strings (`lines`, `da` or `brda`), where in it.
#[derive(Clone, Copy)]
struct Edit {
    at: TextRange,
    source: Source,
    new: TextRange,
}

#[derive(Clone, Copy)]
enum Source {
    Lines,
    Da,
    Brda,
}

impl Edit {
    /// How much longer its lines are than those they replace.
    fn growth(&self) -> i64 {
        let len = |(from, to): TextRange| i64::from(to) - i64::from(from);
        len(self.new) - len(self.at)
    }
}

/// The functions of a record that changed since the last dump (by mapping
/// index, ascending), and its stretches and groups they reach (ascending):
/// found once for [`LiveFile::needs`] and [`LiveFile::update`]. In one
/// vector, one after the other: a dump reaches tens of records, and three
/// vectors each were a sixth of its allocations.
pub struct Reach {
    found: Vec<usize>,
    stretches_at: usize,
    groups_at: usize,
    /// Of its stretches, those whose lines are taken as they were with
    /// every count zero (see [`LiveFile::zero_uncounted`]), ascending, each
    /// with where those lines are in `zero_lines`: its `DA` lines, then
    /// its `BRDA` lines.
    zero: Vec<(usize, TextRange, TextRange)>,
    zero_lines: String,
}

impl Reach {
    pub fn changed(&self) -> &[usize] {
        &self.found[..self.stretches_at]
    }

    fn stretches(&self) -> &[usize] {
        &self.found[self.stretches_at..self.groups_at]
    }

    fn groups(&self) -> &[usize] {
        &self.found[self.groups_at..]
    }

    /// The lines of stretch `k`, when they are taken with every count
    /// zero: its `DA` lines and its `BRDA` lines.
    fn zero(&self, k: usize) -> Option<(&str, &str)> {
        let at = self.zero.binary_search_by_key(&k, |z| z.0).ok()?;
        let (_, da, brda) = self.zero[at];
        Some((self.zero_lines.get(range(da))?, self.zero_lines.get(range(brda))?))
    }
}

/// The records of the functions a dump loaded whole (see
/// [`LiveFile::update`]).
pub struct Records<'a, 'm> {
    pub coverage: &'a Coverage<'m>,
    /// Maps a function (by mapping index) to its place in `coverage`.
    pub index_of: &'a FxHashMap<usize, usize>,
}

/// Where some lines are in a text: (from, to) byte offsets.
type TextRange = (u32, u32);

/// A stretch's `DA` and `BRDA` lines in its record's text.
struct StretchText<'t> {
    da: &'t mut [u8],
    brda: &'t mut [u8],
}

impl<'t> StretchText<'t> {
    /// Those `da` and `brda` of `text` (`da` first).
    fn of(text: &'t mut [u8], da: TextRange, brda: TextRange) -> Option<StretchText<'t>> {
        let (before, after) = text.split_at_mut_checked(brda.0 as usize)?;
        let da = before.get_mut(range(da))?;
        let brda = after.get_mut(..brda.1.checked_sub(brda.0)? as usize)?;
        Some(StretchText { da, brda })
    }
}

/// The buffers of computing records, reused from one stretch to the
/// next, and from one record to the next: a dump updates tens of records,
/// and buffers made for each would be allocated and given back each time
/// (the larger ones mapped from the kernel and unmapped).
#[derive(Default)]
pub struct Work<'m> {
    data: CoverageData<'m>,
    spans: Vec<Span>,
    branches: Vec<PlacedBranch>,
    mask: Vec<u64>,
    fresh: Fresh,
    parts: Parts,
    /// A kept stretch's sums before a dump updates them (see
    /// [`Kept::write_over`]).
    before: Vec<u64>,
    /// The bits of the functions a record's update counted (see
    /// [`Loaded`]), all clear between two records.
    loaded: Vec<u64>,
}

/// A stretch computed again by a dump (from the second dump that reaches
/// it on), with its counts left out: the [`Shape`] of all its functions'
/// regions, the places of their branches, and each function's part (as its
/// `functions`): where each of its regions and branches is in its record,
/// the slot or place it adds to, and its counts as last computed. A dump
/// reads the new counts of the functions that ran from their records and
/// adds the difference to the slots and places, whose sums the lines are
/// written from.
///
/// All of it is one block of words, exactly as long as it: a stretch has
/// a function or a few with a few regions each, and its shape, numbers,
/// counts and places each in a block of its own took as much again in the
/// allocator's headers and rounding (redis under traffic, after 100 dumps:
/// the agent's arena 3.94 MB, 3.48 MB in use, against 3.74 and 3.24 MB in
/// one block, with shapes of 13 bytes a segment for 16).
///
/// Its [`KeptHeader`] comes first, in the block too: a dump reads it first
/// of every stretch it reaches, and in a box of its own it was one more
/// allocation and one more first read each (on redis under traffic, a
/// tenth of the samples in `LiveFile::update` were on that read). Then the
/// `u64`s: each slot's sum, the counts of each function
/// (those of its regions, then the two of each of its branches), and each
/// place's two sums (wrapping, as a record sums them). A function that had
/// never run when the stretch was kept has no counts until it runs (see
/// [`Kept::wake`]): on redis under traffic, more than half the kept
/// regions were of such functions, which share a header's stretch with
/// those that run. Then the `u32`s, two to a word: of each region, its
/// position in its function's `regions` (or, when each function's are
/// consecutive, the first of each function's: 87% of redis's kept parts
/// have consecutive positions, and the stretches all of whose parts do held
/// 45 KB of them after 100 dumps), then of each the slot it adds to
/// (or [`NO_SLOT`]); of each branch, its position in its function's
/// `branches`, then of each its place; of each function, where its regions
/// end, where its branches end, and where its counts end; of each place,
/// its line; and the words of the shape's [`LinePlan`], or of the shape
/// when it has none (rare: see [`LinePlan`]).
#[derive(Debug)]
struct Kept(Box<[u64]>);

/// How many words a [`KeptHeader`] takes.
const HEADER: usize = 4;

/// The sizes of a [`Kept`] stretch's arrays, and how to read them.
#[derive(Debug, Clone, Copy)]
struct KeptHeader {
    functions: u32,
    regions: u32,
    branches: u32,
    slots: u32,
    places: u32,
    /// How many counts it has: its functions' that ran.
    counts: u32,
    /// The regions' positions are each function's first.
    consecutive: bool,
    /// Its last words are a [`LinePlan`]'s, not a [`Shape`]'s.
    planned: bool,
    /// Its parts were kept by this dump, ahead of computing its stretch
    /// (see [`LiveFile::unkept`]): its lines are to be written again.
    kept_now: bool,
}

impl KeptHeader {
    fn words(self) -> [u64; HEADER] {
        let pair = |low: u32, high: u32| u64::from(low) | u64::from(high) << 32;
        let flags = u64::from(self.consecutive) | u64::from(self.planned) << 1 | u64::from(self.kept_now) << 2;
        [pair(self.functions, self.regions), pair(self.branches, self.slots), pair(self.places, self.counts), flags]
    }

    fn of(words: &[u64]) -> KeptHeader {
        let word = |k: usize| words.get(k).copied().unwrap_or(0);
        let low = |k: usize| word(k) as u32;
        let high = |k: usize| (word(k) >> 32) as u32;
        KeptHeader {
            functions: low(0),
            regions: high(0),
            branches: low(1),
            slots: high(1),
            places: low(2),
            counts: high(2),
            consecutive: word(3) & 1 != 0,
            planned: word(3) & 2 != 0,
            kept_now: word(3) & 4 != 0,
        }
    }

    /// Whether each of its functions has its counts (one a region, two a
    /// branch).
    fn has_all_counts(&self) -> bool {
        self.counts as usize == self.regions as usize + 2 * self.branches as usize
    }

    /// How many of its words are `u64`s, past the header.
    fn wide(&self) -> usize {
        (self.slots + self.counts + 2 * self.places) as usize
    }

    /// Where its functions' count ends are among its `u32`s.
    fn count_ends_at(&self) -> std::ops::Range<usize> {
        let (regions, branches, functions) = (self.regions as usize, self.branches as usize, self.functions as usize);
        let at = if self.consecutive { functions } else { regions } + regions + 2 * branches + 2 * functions;
        at..at + functions
    }
}

/// A [`Kept`] stretch's arrays, borrowed from its block (the counts to
/// write).
struct KeptArrays<'a> {
    slots: &'a mut [u64],
    counts: &'a mut [u64],
    place_sums: &'a mut [u64],
    /// Of each region, or each function's first (see `Kept::consecutive`).
    region_positions: &'a [u32],
    consecutive: bool,
    region_slots: &'a [u32],
    branch_positions: &'a [u32],
    branch_places: &'a [u32],
    region_ends: &'a [u32],
    branch_ends: &'a [u32],
    count_ends: &'a [u32],
    place_lines: &'a [u32],
    /// A [`LinePlan`]'s words, or a shape's (see `Kept::planned`).
    lines: &'a [u32],
    planned: bool,
}

/// The parts of a stretch's functions, one after another, as [`Kept::new`]
/// reads them: their regions and branches, where each is in its function's
/// record, and where each function's end. Read a few functions at a time
/// (see [`LiveFile::unkept`]), or all at once into a dump's [`Work`].
#[derive(Default)]
pub struct Parts {
    spans: Vec<Span>,
    region_positions: Vec<u32>,
    branches: Vec<PlacedBranch>,
    branch_positions: Vec<u32>,
    /// Per function: where its regions end, and where its branches end.
    ends: Vec<(u32, u32)>,
    /// Per function: whether it never ran (see [`Kept`]).
    idle: Vec<bool>,
}

impl Parts {
    /// Adds the part in `lines` of `file` of the function at `at` in
    /// `coverage` (none when it was not loaded: left out of reports).
    fn push<'m>(
        &mut self,
        coverage: &Coverage<'m>,
        at: Option<usize>,
        file: FileName,
        lines: (u32, u32),
        data: &mut CoverageData<'m>,
    ) {
        let (spans_from, branches_from) = (self.spans.len(), self.branches.len());
        if let Some(at) = at {
            coverage.part_in_file_into(at, file, lines, &mut self.spans, data);
            self.region_positions.extend_from_slice(&data.region_positions);
            placed_branches(coverage, data, &mut self.branches, Some(&mut self.branch_positions));
        }
        let idle = at.is_some_and(|at| coverage.functions[at].execution_count == 0)
            && self.spans[spans_from..].iter().all(|s| s.count() == 0)
            && self.branches[branches_from..].iter().all(|b| b.count == 0 && b.false_count == 0);
        self.ends.push((self.spans.len() as u32, self.branches.len() as u32));
        self.idle.push(idle);
    }

    fn clear(&mut self) {
        self.spans.clear();
        self.region_positions.clear();
        self.branches.clear();
        self.branch_positions.clear();
        self.ends.clear();
        self.idle.clear();
    }
}

impl Kept {
    /// Of the functions' `parts`.
    fn new(parts: &Parts, followed: bool) -> Kept {
        let spans = &parts.spans;
        let (shape, slot_of) = Shape::new(spans, followed);
        let mut plan = Vec::new();
        let planned = ShapeWords(shape.words()).line_plan(&mut plan);
        let lines = if planned { &plan[..] } else { shape.words() };
        let mut branches: Vec<(&BranchPath, usize)> = parts.branches.iter().enumerate().map(|(at, b)| (&b.path, at)).collect();
        branches.sort();
        let mut place_of = vec![0u32; branches.len()];
        let mut place_lines: Vec<u32> = Vec::new();
        let mut last: Option<&BranchPath> = None;
        for &(path, at) in &branches {
            if last != Some(path) {
                place_lines.push(path.line());
                last = Some(path);
            }
            place_of[at] = (place_lines.len() - 1) as u32;
        }
        let slots = slot_of.iter().filter(|&&s| s != NO_SLOT).max().map_or(0, |&s| s as usize + 1);
        let region_ends: Vec<u32> = parts.ends.iter().map(|e| e.0).collect();
        let branch_ends: Vec<u32> = parts.ends.iter().map(|e| e.1).collect();
        let runs = || (0..region_ends.len()).map(|k| &parts.region_positions[run(&region_ends, k)]);
        let consecutive = runs().all(|positions| positions.windows(2).all(|p| p[0].checked_add(1) == Some(p[1])));
        let positions: Vec<u32> = match consecutive {
            true => runs().map(|positions| positions.first().copied().unwrap_or(0)).collect(),
            false => parts.region_positions.clone(),
        };
        let counts = (0..region_ends.len()).map(|k| if parts.idle[k] { 0 } else { counts_of(&region_ends, &branch_ends, k) });
        let count_ends: Vec<u32> = ends(counts).collect();
        let header = KeptHeader {
            functions: parts.ends.len() as u32,
            regions: spans.len() as u32,
            branches: branches.len() as u32,
            slots: slots as u32,
            places: place_lines.len() as u32,
            counts: count_ends.last().copied().unwrap_or(0),
            consecutive,
            planned,
            kept_now: false,
        };
        let small = positions.len() + (header.regions + 2 * header.branches + 3 * header.functions) as usize
            + place_lines.len()
            + lines.len();
        let mut kept = Kept::with(header, small.div_ceil(2));
        let a = kept.arrays();
        for (k, &idle) in parts.idle.iter().enumerate() {
            let (regions, branches) = (run(&region_ends, k), run(&branch_ends, k));
            if !idle {
                let counts = &mut a.counts[run(&count_ends, k)];
                let (region_counts, branch_counts) = counts.split_at_mut(regions.len());
                for (s, count) in spans[regions.clone()].iter().zip(region_counts) {
                    *count = s.count();
                }
                for (b, counts) in parts.branches[branches.clone()].iter().zip(branch_counts.chunks_exact_mut(2)) {
                    counts.copy_from_slice(&[b.count, b.false_count]);
                }
            }
        }
        for (s, &slot) in spans.iter().zip(&slot_of) {
            // A region of no slot has NO_SLOT, past the slots.
            if let Some(sum) = a.slots.get_mut(slot as usize) {
                *sum = sum.wrapping_add(s.count());
            }
        }
        for (b, &place) in parts.branches.iter().zip(&place_of) {
            let sums = &mut a.place_sums[2 * place as usize..][..2];
            sums[0] = sums[0].wrapping_add(b.count);
            sums[1] = sums[1].wrapping_add(b.false_count);
        }
        let small = halves_mut(&mut kept.0[HEADER + header.wide()..]).iter_mut();
        let all = positions.into_iter().chain(slot_of).chain(parts.branch_positions.iter().copied());
        let all = all.chain(place_of).chain(region_ends).chain(branch_ends).chain(count_ends);
        let all = all.chain(place_lines).chain(lines.iter().copied());
        for (word, value) in small.zip(all) {
            *word = value;
        }
        kept
    }

    /// A block of `header`'s, its arrays zeros, `small` words of `u32`s.
    fn with(header: KeptHeader, small: usize) -> Kept {
        let mut words = vec![0u64; HEADER + header.wide() + small].into_boxed_slice();
        words[..HEADER].copy_from_slice(&header.words());
        Kept(words)
    }

    fn header(&self) -> KeptHeader {
        KeptHeader::of(&self.0)
    }

    fn set_kept_now(&mut self, now: bool) {
        self.0[HEADER - 1] = KeptHeader { kept_now: now, ..self.header() }.words()[HEADER - 1];
    }

    /// Whether its parts were kept by this dump, no longer.
    fn take_kept_now(&mut self) -> bool {
        let now = self.header().kept_now;
        if now {
            self.set_kept_now(false);
        }
        now
    }

    /// Gives counts (zeros, as they were) to the functions of the stretch
    /// that had none (see [`Kept`]) and that ran: those of its `own` (see
    /// [`Stretch::functions`]) in `ran` (by mapping index, ascending).
    fn wake(&mut self, own: &[u32], ran: &[usize]) {
        let header = self.header();
        let a = self.arrays();
        let counts: Vec<usize> = (0..a.count_ends.len())
            .map(|k| if a.wakes(k, own, ran) { counts_of(a.region_ends, a.branch_ends, k) } else { a.counts_at(k).len() })
            .collect();
        let next_header = KeptHeader { counts: counts.iter().sum::<usize>() as u32, ..header };
        let (small, next_small) = (HEADER + header.wide(), HEADER + next_header.wide());
        let mut next = Kept::with(next_header, self.0.len() - small);
        next.0[next_small..].copy_from_slice(&self.0[small..]);
        let old = self.arrays();
        let new = next.arrays();
        new.slots.copy_from_slice(old.slots);
        new.place_sums.copy_from_slice(old.place_sums);
        let mut at = 0;
        for (k, &n) in counts.iter().enumerate() {
            let had = run(old.count_ends, k);
            if had.len() == n {
                new.counts[at..at + n].copy_from_slice(&old.counts[had]);
            }
            at += n;
        }
        let count_ends = next_header.count_ends_at();
        for (word, end) in halves_mut(&mut next.0[next_small..])[count_ends].iter_mut().zip(ends(counts.into_iter())) {
            *word = end;
        }
        *self = next;
    }

    fn arrays(&mut self) -> KeptArrays<'_> {
        let h = self.header();
        let (regions, branches, functions) = (h.regions as usize, h.branches as usize, h.functions as usize);
        let (wide, small) = self.0[HEADER..].split_at_mut(h.wide());
        let (slots, rest) = wide.split_at_mut(h.slots as usize);
        let (counts, place_sums) = rest.split_at_mut(h.counts as usize);
        let small = halves(small);
        let (region_positions, rest) = small.split_at(if h.consecutive { functions } else { regions });
        let (region_slots, rest) = rest.split_at(regions);
        let (branch_positions, rest) = rest.split_at(branches);
        let (branch_places, rest) = rest.split_at(branches);
        let (region_ends, rest) = rest.split_at(functions);
        let (branch_ends, rest) = rest.split_at(functions);
        let (count_ends, rest) = rest.split_at(functions);
        // With a last half word of padding when their number is odd: it
        // adds no run to a plan (see `LinePlan::runs`); to a shape, no
        // segment (see `ShapeWords::segments`), and no flag is read from it.
        let (place_lines, lines) = rest.split_at(h.places as usize);
        KeptArrays {
            slots,
            counts,
            place_sums,
            region_positions,
            consecutive: h.consecutive,
            region_slots,
            branch_positions,
            branch_places,
            region_ends,
            branch_ends,
            count_ends,
            place_lines,
            lines,
            planned: h.planned,
        }
    }

    /// The parts of the stretch's `functions` that are `loaded` ((mapping
    /// index, position in `tallies`), both by mapping index) read again,
    /// those of the ones that `ran` (ascending) given counts first if they
    /// had none (see [`Self::wake`]): whether a count of them changed.
    /// Its sums as they were go to `before`: its slots', then its places'.
    fn update_loaded(
        &mut self,
        tallies: &Tallies,
        functions: &[u32],
        loaded: Loaded<'_>,
        ran: &[usize],
        before: &mut Vec<u64>,
    ) -> bool {
        let a = self.arrays();
        before.clear();
        before.extend_from_slice(a.slots);
        before.extend_from_slice(a.place_sums);
        // Most stretches have every function's counts: none can wake.
        if !self.header().has_all_counts() {
            let mut woke = false;
            let a = self.arrays();
            for_loaded(functions, loaded, |k, _| woke |= a.wakes(k, functions, ran));
            if woke {
                self.wake(functions, ran);
            }
        }
        let mut changed = false;
        let mut a = self.arrays();
        for_loaded(functions, loaded, |k, at| changed |= a.update(k, tallies.at(at)));
        changed
    }

    /// The stretch's `DA` lines, to `da` (from its segments, built into
    /// `segments`, when it has no plan), and its `BRDA` lines, to `brda`.
    fn write(&mut self, segments: &mut Vec<Segment>, da: &mut String, brda: &mut String) {
        let a = self.arrays();
        if a.planned {
            for (line, lines, count) in LinePlan(a.lines).runs(a.slots) {
                push_da_lines(da, line, lines, count);
            }
        } else {
            ShapeWords(a.lines).segments(a.slots, segments);
            write_lines(da, segments);
        }
        write_summed_branches(brda, a.places());
    }

    /// Writes the counts of the stretch's lines over those in its last
    /// text, `da` and `brda` (its `DA` and `BRDA` lines, as `write` wrote
    /// them from its sums as they were `before`: see
    /// [`Self::update_loaded`]), where they changed: whether each was as
    /// long as the last (else the lines are to be written again). Only
    /// with a plan: it names each line's count without building segments.
    ///
    /// Where each line is follows from the counts it was written with: a
    /// line whose count is the same is not read. Of a warm dump's lines
    /// (redis under traffic) half keep their count, and their text is out
    /// of the caches.
    fn write_over(&mut self, da: &mut [u8], brda: &mut [u8], before: &[u64]) -> bool {
        let a = self.arrays();
        let Some((slots_before, places_before)) = before.split_at_checked(a.slots.len()) else { return false };
        if !a.planned || places_before.len() != a.place_sums.len() {
            return false;
        }
        let mut over = Overwrite { text: da, at: 0 };
        for (line, lines, count, last) in LinePlan(a.lines).runs_with_before(a.slots, slots_before) {
            let mut count_text = itoa::Buffer::new();
            let (count, last_len) = ((count != last).then(|| count_text.format(count).as_bytes()), decimal_len(last));
            // "DA:<line>,"
            if !(line..line + lines).all(|line| over.number(4 + decimal_len(line.into()), count, last_len)) {
                return false;
            }
        }
        if !over.done() {
            return false;
        }
        let mut over = Overwrite { text: brda, at: 0 };
        let sums = a.place_sums.chunks_exact(2).zip(places_before.chunks_exact(2));
        let places = a.place_lines.iter().zip(sums).map(|(&line, (now, was))| (line, [[now[0], now[1]], [was[0], was[1]]]));
        for (line, pair, index, [count, last]) in summed_branch_lines(places) {
            let mut count_text = itoa::Buffer::new();
            let last_len = last.map_or(1, |last| decimal_len(last.into()));
            let count = (count != last).then(|| count.map_or(&b"-"[..], |count| count_text.format(count).as_bytes()));
            // "BRDA:<line>,<pair>,<index>,"
            let prefix = 8 + decimal_len(line.into()) + decimal_len(pair.into()) + decimal_len(index.into());
            if !over.number(prefix, count, last_len) {
                return false;
            }
        }
        over.done()
    }
}

/// Numbers written over those that end the lines of a text, line after
/// line, where each new one is as long as the one it replaces.
struct Overwrite<'t> {
    text: &'t mut [u8],
    /// Where the next line begins.
    at: usize,
}

impl Overwrite<'_> {
    /// Writes `number` (none when it did not change) over the next line's,
    /// of `last_len` bytes, which follows `prefix` bytes (the last of them
    /// a comma): whether it fit. The line is only read (to check it is
    /// where it should be) when the number changed.
    fn number(&mut self, prefix: usize, number: Option<&[u8]>, last_len: usize) -> bool {
        let from = self.at + prefix;
        let end = from + last_len;
        if let Some(number) = number {
            let Some(line) = self.text.get_mut(from.wrapping_sub(1)..=end) else { return false };
            if number.len() != last_len || line[0] != b',' || line[line.len() - 1] != b'\n' {
                return false;
            }
            line[1..=number.len()].copy_from_slice(number);
        }
        self.at = end + 1;
        true
    }

    /// Whether every line of the text was passed over.
    fn done(&self) -> bool {
        self.at == self.text.len()
    }
}

/// How many decimal digits `n` has.
fn decimal_len(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |log| log as usize + 1)
}

impl KeptArrays<'_> {
    /// Its places' lines and counts, for [`write_summed_branches`].
    fn places(&self) -> impl Iterator<Item = (u32, u64, u64)> + '_ {
        self.place_lines.iter().zip(self.place_sums.chunks_exact(2)).map(|(&line, sums)| (line, sums[0], sums[1]))
    }

    /// Where function `k`'s counts are.
    fn counts_at(&self, k: usize) -> std::ops::Range<usize> {
        run(self.count_ends, k)
    }

    /// Whether function `k` has no counts but a part in the stretch, and
    /// is one of the functions that `ran` (ascending), by its mapping
    /// index in `own` (see [`Kept::wake`]).
    fn wakes(&self, k: usize, own: &[u32], ran: &[usize]) -> bool {
        self.counts_at(k).is_empty()
            && counts_of(self.region_ends, self.branch_ends, k) > 0
            && own.get(k).is_some_and(|&i| ran.binary_search(&(i as usize)).is_ok())
    }

    /// Function `k`'s part read again from its `tally`: whether a count of
    /// it changed.
    fn update(&mut self, k: usize, tally: Tally<'_>) -> bool {
        let mut changed = false;
        let regions = run(self.region_ends, k);
        let branches = run(self.branch_ends, k);
        // None when it never ran (see `Kept::wake`).
        let counts = &mut self.counts[run(self.count_ends, k)];
        if counts.is_empty() {
            return false;
        }
        let (region_counts, branch_counts) = counts.split_at_mut(regions.len());
        for (r, last) in regions.clone().zip(region_counts) {
            let position = match self.consecutive {
                true => self.region_positions[k] as usize + (r - regions.start),
                false => self.region_positions[r] as usize,
            };
            let count = tally.region(position);
            let last = std::mem::replace(last, count);
            changed |= count != last;
            if let Some(sum) = self.slots.get_mut(self.region_slots[r] as usize) {
                *sum = sum.wrapping_sub(last).wrapping_add(count);
            }
        }
        for (b, last) in branches.zip(branch_counts.chunks_exact_mut(2)) {
            let counts = tally.branch(self.branch_positions[b] as usize);
            changed |= counts[..] != last[..];
            if let Some(sums) = self.place_sums.get_mut(2 * self.branch_places[b] as usize..).and_then(|s| s.get_mut(..2)) {
                sums[0] = sums[0].wrapping_sub(last[0]).wrapping_add(counts[0]);
                sums[1] = sums[1].wrapping_sub(last[1]).wrapping_add(counts[1]);
            }
            last.copy_from_slice(&counts);
        }
        changed
    }
}

/// The `u32`s of `words`, two to a word.
fn halves(words: &[u64]) -> &[u32] {
    // Safety: a `u64` is aligned as two `u32`s, every pattern of 4 bytes is
    // a `u32`, and the halves are borrowed with the words.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast(), 2 * words.len()) }
}

/// The `u32`s of `words`, to write.
fn halves_mut(words: &mut [u64]) -> &mut [u32] {
    // Safety: as `halves`.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), 2 * words.len()) }
}

/// The functions of a record that a dump counted, each with its place in
/// the dump's `Tallies` ((mapping index, place), by mapping index), and a
/// bit set for each, by mapping index: the stretches of a header's macro
/// look up their functions, tens each, in the record's, tens too, and most
/// are not there (a bit is read where a search took several branches the
/// CPU could not foresee).
#[derive(Clone, Copy)]
struct Loaded<'a> {
    places: &'a [(usize, usize)],
    bits: &'a [u64],
}

impl Loaded<'_> {
    fn has(&self, i: usize) -> bool {
        self.bits.get(i / 64).is_some_and(|word| word >> (i % 64) & 1 != 0)
    }
}

/// Sets the bits of `loaded`'s functions in `bits`, or clears them.
fn set_bits(bits: &mut Vec<u64>, loaded: &[(usize, usize)], on: bool) {
    for &(i, _) in loaded {
        if bits.len() <= i / 64 {
            bits.resize(i / 64 + 1, 0);
        }
        match on {
            true => bits[i / 64] |= 1 << (i % 64),
            false => bits[i / 64] &= !(1 << (i % 64)),
        }
    }
}

/// Calls `each` with those of a stretch's `functions` that are `loaded`:
/// their position in `functions` and their place, in order. The shorter
/// one is walked: a stretch has a function or a few, a record's loaded
/// functions are tens, and a header's stretch has hundreds.
fn for_loaded(functions: &[u32], loaded: Loaded<'_>, mut each: impl FnMut(usize, usize)) {
    let places = loaded.places;
    if functions.len() <= places.len() {
        for (k, &f) in functions.iter().enumerate() {
            if !loaded.has(f as usize) {
                continue;
            }
            if let Ok(l) = places.binary_search_by_key(&(f as usize), |l| l.0) {
                each(k, places[l].1);
            }
        }
    } else {
        for &(i, at) in places {
            if let Ok(k) = functions.binary_search_by_key(&i, |&f| f as usize) {
                each(k, at);
            }
        }
    }
}

/// Where run `k` is, of runs that end at `ends` (as [`Kept`]'s).
fn run(ends: &[u32], k: usize) -> std::ops::Range<usize> {
    let from = k.checked_sub(1).map_or(0, |k| ends[k] as usize);
    let to = ends.get(k).map_or(from, |&end| end as usize);
    from..to
}

/// Where each of runs of these `lengths` ends, one after the other.
fn ends(lengths: impl Iterator<Item = usize>) -> impl Iterator<Item = u32> {
    lengths.scan(0u32, |end, n| {
        *end += n as u32;
        Some(*end)
    })
}

/// How many counts function `k` of a kept stretch has when it has them:
/// one a region, two a branch.
fn counts_of(region_ends: &[u32], branch_ends: &[u32], k: usize) -> usize {
    run(region_ends, k).len() + 2 * run(branch_ends, k).len()
}

/// A function of a group, with its own summary and count.
#[derive(Debug)]
struct Member {
    function: u32,
    /// Its lines and branches, found and hit, as [`Summary`]'s (`u32`: a
    /// function has fewer lines than 2^32, line numbers being `u32`, and
    /// fewer branches than regions).
    summary: [u32; 4],
    executions: u64,
    /// Where its [`zero_mask`] as of its summary is in `LiveFile::masks`,
    /// once it ran again, or [`NO_MASK`]. With [`WITH_OTHER`] set, the
    /// mask it had before follows, and then the summary it had with that
    /// one (two words): the counts of a function that is running while
    /// they are read (redis's event loop, the command it serves) can be
    /// one where they will be zero once it returns, and its summary then
    /// goes back and forth between two from dump to dump. A dump swaps
    /// them, rather than decode the function whole to compute it again (on
    /// redis under traffic, one to four functions a dump).
    mask: u32,
}

const NO_MASK: u32 = u32::MAX;
const WITH_OTHER: u32 = 1 << 31;

/// Which of a member's stored summaries holds for its new counts (see
/// [`Member::mask`]).
#[derive(Debug, PartialEq)]
enum Held {
    Current,
    Other,
    Neither,
    /// Neither, and every count is zero (a forked child's functions that
    /// ran in the parent, a reset's): its summary is its lines and
    /// branches, none hit. Which lines and branches a summary counts does
    /// not depend on the counts, only which of them were hit: its function
    /// need not be decoded again.
    NoneHit,
}

impl Member {
    fn new(function: u32, summary: Summary, executions: u64) -> Member {
        let mut member = Member { function, summary: [0; 4], executions, mask: NO_MASK };
        member.set_summary(summary);
        member
    }

    fn set_summary(&mut self, s: Summary) {
        let small = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        self.summary = [small(s.lines), small(s.lines_hit), small(s.branches), small(s.branches_hit)];
    }

    /// Its summary as two words, to keep in `LiveFile::masks`.
    fn summary_words(&self) -> [u64; 2] {
        let [a, b, c, d] = self.summary.map(u64::from);
        [a | b << 32, c | d << 32]
    }

    fn summary(&self) -> Summary {
        let [lines, lines_hit, branches, branches_hit] = self.summary.map(u64::from);
        Summary { lines, lines_hit, branches, branches_hit }
    }

    /// Whether it keeps a summary besides its current one (see
    /// [`Self::mask`]).
    fn keeps_other(&self) -> bool {
        self.mask != NO_MASK && self.mask & WITH_OTHER != 0
    }

    /// Where its current mask of `len` words is in `masks`, and the other
    /// one with its summary, when it keeps them (see [`Self::mask`]).
    fn stored(&self, len: usize) -> (Option<std::ops::Range<usize>>, Option<std::ops::Range<usize>>) {
        if self.mask == NO_MASK {
            return (None, None);
        }
        let at = (self.mask & !WITH_OTHER) as usize;
        let other = self.keeps_other().then(|| at + len..at + 2 * len + 2);
        (Some(at..at + len), other)
    }

    /// Which of its summaries holds for its new counts, its `tally`: the
    /// one whose [`zero_mask`] (read into `mask`, and trusted) is the same.
    fn held(&self, masks: &[u64], tally: Tally<'_>, mask: &mut Vec<u64>) -> Held {
        match zero_mask(tally, mask) {
            true => match self.held_for(masks, mask) {
                Held::Neither if mask.iter().all(|&word| word == 0) => Held::NoneHit,
                held => held,
            },
            false => Held::Neither,
        }
    }

    /// Which of its summaries is for the trusted zero `mask`.
    fn held_for(&self, masks: &[u64], mask: &[u64]) -> Held {
        let (current, other) = self.stored(mask.len());
        let is = |words: Option<&[u64]>| words.is_some_and(|words| words.starts_with(mask));
        if is(current.and_then(|r| masks.get(r))) {
            Held::Current
        } else if is(other.and_then(|r| masks.get(r))) {
            Held::Other
        } else {
            Held::Neither
        }
    }

    /// Takes its other summary (see [`Held::Other`]) and keeps the
    /// current one as the other, with its mask of `len` words.
    fn swap(&mut self, masks: &mut [u64], len: usize) {
        let (Some(current), Some(other)) = self.stored(len) else { return };
        let kept = self.summary_words();
        let Some(words) = masks.get_mut(current.start..other.end) else { return };
        let (now, before) = words.split_at_mut(len);
        now.swap_with_slice(&mut before[..len]);
        let [low, high] = [before[len], before[len + 1]];
        self.summary = [low as u32, (low >> 32) as u32, high as u32, (high >> 32) as u32];
        before[len..].copy_from_slice(&kept);
    }

    /// Sets its `summary` computed again, for its zero `mask`, and keeps
    /// the one it had (with its mask) as the other. The second time, its
    /// masks move to the end of `masks`, with room for the other: the
    /// words they had are left, a few for each function whose summary
    /// changes more than once.
    fn set_with_mask(&mut self, masks: &mut Vec<u64>, mask: &[u64], summary: Summary) {
        // Ranges past `masks` (none are) count as none.
        let within = |r: &std::ops::Range<usize>| r.end <= masks.len();
        let (current, other) = self.stored(mask.len());
        match (current.filter(within), other.filter(within)) {
            (None, _) => {
                self.mask = masks.len() as u32;
                masks.extend_from_slice(mask);
            }
            (Some(current), None) => {
                self.mask = masks.len() as u32 | WITH_OTHER;
                masks.extend_from_slice(mask);
                masks.extend_from_within(current);
                masks.extend(self.summary_words());
            }
            (Some(current), Some(other)) => {
                masks.copy_within(current.clone(), other.start);
                masks[other.end - 2..other.end].copy_from_slice(&self.summary_words());
                masks[current].copy_from_slice(mask);
            }
        }
        self.set_summary(summary);
    }
}

/// The summary of a group of `members` (the largest of theirs), and
/// whether one of them ran.
fn group_summary(members: &[Member]) -> (Summary, bool) {
    let mut summary: Option<Summary> = None;
    let mut executions = 0u64;
    for member in members {
        executions = executions.wrapping_add(member.executions);
        match &mut summary {
            None => summary = Some(member.summary()),
            Some(summary) => summary.merge_max(member.summary()),
        }
    }
    (summary.unwrap_or_default(), executions > 0)
}

/// Which of a function's counts are zero, into `mask` (a bit per region,
/// two per branch, a word more): whether its summary is a function of that
/// alone. A summary counts lines and branch sides with a count above zero,
/// and a line's count is the largest of its regions' (regions of one
/// extent summed): it is, unless a sum could wrap to zero. Counts read
/// while the program runs can be off (an expression of counters read at
/// different times, wrapped below zero), so it is only trusted for counts
/// below 2^48 and fewer than 2^16 regions. The last word tells: 0 when
/// it is, 1 when not, so that no mask read then is ever found equal to one
/// read later.
fn zero_mask(tally: Tally<'_>, mask: &mut Vec<u64>) -> bool {
    const SMALL: u64 = 1 << 48;
    mask.clear();
    let mut word = 0u64;
    let mut bits = 0;
    let mut small = tally.regions_and_branches() < 1 << 16;
    for count in tally.counts() {
        small &= count < SMALL;
        word |= u64::from(count != 0) << bits;
        bits += 1;
        if bits == 64 {
            mask.push(word);
            (word, bits) = (0, 0);
        }
    }
    if bits > 0 {
        mask.push(word);
    }
    mask.push(u64::from(!small));
    small
}

/// A range of `u32` indices as one of `usize`.
fn range((from, to): (u32, u32)) -> std::ops::Range<usize> {
    from as usize..to as usize
}

/// What `index` (sorted pairs) has for `i`.
fn find(index: &[(u32, u32)], i: usize) -> Option<usize> {
    let k = index.binary_search_by_key(&i, |&(f, _)| f as usize).ok()?;
    Some(index[k].1 as usize)
}

/// The first of `sorted` that is not `below`, as `partition_point`, but
/// searched from the start in steps that double: of the ascending
/// functions that ran, the next is most often near the last in a record's
/// indices, where a search of the whole index read memory far apart (a
/// dump reaches thousands of records' functions).
fn gallop<T>(sorted: &[T], below: impl Fn(&T) -> bool) -> usize {
    let mut end = 1;
    while end <= sorted.len() && below(&sorted[end - 1]) {
        end *= 2;
    }
    // Those before `end / 2` are below.
    let from = end / 2;
    from + sorted[from..end.min(sorted.len())].partition_point(below)
}

/// How many stretches ahead of the one it computes an update asks for (see
/// [`prefetch_stretch`]).
const PREFETCH_AHEAD: usize = 4;

/// Has the CPU fetch what an update first reads of stretch `k` (the header
/// of its kept parts, the first bytes of its lines in the record's `text`):
/// the program evicts them from the caches between dumps, and fetched one
/// after another as the update came to each, those first reads were most
/// of the update's time (a sixth of the agent's in a warm dump of redis
/// under traffic). Asked for a few stretches ahead, not for all of a
/// dump's at once, which overflowed the caches (on redis under traffic, the
/// update and its prefetching 540 µs a dump against 599, medians of 240
/// dumps).
fn prefetch_stretch(stretches: &[Stretch], lines_at: u32, text: std::ops::Range<*const u8>, k: usize) {
    let Some(stretch) = stretches.get(k) else { return };
    if let Some(kept) = &stretch.kept {
        prefetch::slice(&kept.0);
    }
    let (da, brda) = line_starts(stretches, lines_at, k);
    for (from, to) in [(da, stretch.da_end), (brda, stretch.brda_end)] {
        prefetch::bytes(text.start.wrapping_add(from as usize).min(text.end), to.saturating_sub(from) as usize);
    }
}

/// Where stretch `k` of `stretches` has its lines (see
/// [`LiveFile::line_starts`]).
fn line_starts(stretches: &[Stretch], lines_at: u32, k: usize) -> (u32, u32) {
    match k.checked_sub(1) {
        Some(before) => (stretches[before].da_end, stretches[before].brda_end),
        None => (lines_at, stretches.last().map_or(lines_at, |s| s.da_end)),
    }
}

/// Appends to `found` what `index` (sorted pairs) has for each of its
/// first `keys` values (ascending), sorted and each once. Each search
/// starts where the last one ended: the next key is most often near.
fn extend_from_index(found: &mut Vec<usize>, keys: usize, index: &[(u32, u32)]) {
    let start = found.len();
    let mut from = 0;
    for c in 0..keys {
        let key = found[c];
        from += gallop(&index[from..], |&(f, _)| (f as usize) < key);
        let of_key = index[from..].iter().take_while(|&&(f, _)| f as usize == key);
        found.extend(of_key.map(|&(_, v)| v as usize));
    }
    sort_dedup_from(found, start);
}

/// Sorts `values[from..]` and leaves each of its values once.
fn sort_dedup_from(values: &mut Vec<usize>, from: usize) {
    values[from..].sort_unstable();
    let mut end = from;
    for k in from..values.len() {
        if end == from || values[k] != values[end - 1] {
            values[end] = values[k];
            end += 1;
        }
    }
    values.truncate(end);
}

/// Pairs sorted into an index for [`find`]; of two for one function, the
/// later (as a map filled in that order keeps it).
fn index(mut pairs: Vec<(u32, u32)>) -> Vec<(u32, u32)> {
    pairs.sort_by_key(|&(f, _)| f);
    pairs.dedup_by(|later, earlier| {
        let same = later.0 == earlier.0;
        if same {
            *earlier = *later;
        }
        same
    });
    pairs.shrink_to_fit();
    pairs
}

impl LiveFile {
    /// The record of `file`, from `coverage`, which loaded every function
    /// touching it. `sf` is its `SF:` line as reports show it.
    pub fn new(coverage: &Coverage<'_>, file: FileName, sf: String, no_demangle: bool) -> LiveFile {
        let mut head = sf;
        let (names, ends) = defined_names(coverage, file, no_demangle);
        let mut at = head.len();
        write_fn_lines(&mut head, coverage, file, &names, &ends);
        // Each `FN` line is `FN:<line>,<name>`: its name follows the first
        // comma (a line number has none).
        let mut start = 0;
        let fn_names = ends
            .iter()
            .map(|&end| {
                let from = head[at..].find(',').map_or(at, |comma| at + comma + 1);
                let to = from + (end - start);
                debug_assert_eq!(head.get(from..to), names.get(start..end));
                (start, at) = (end, to + 1);
                (from as u32, to as u32)
            })
            .collect();
        let executions: Vec<u64> = coverage.functions_in(file).map(|f| f.execution_count).collect();
        let defined_at = index(coverage.functions_in(file).enumerate().map(|(slot, f)| (f.mapping_index as u32, slot as u32)).collect());

        // Stretches: the line spans of the regions in the file, merged where
        // they overlap. The regions of one file id (a function's body, one
        // macro expansion) are taken together: they are one span or nested
        // spans most often, and a stretch a little longer is still right.
        let mut spans: Vec<(u32, u32, usize)> = Vec::new();
        let mut hulls: Vec<Option<(u32, u32)>> = Vec::new();
        for &at in coverage.functions_touching(file) {
            let f = &coverage.functions[at];
            hulls.clear();
            hulls.resize(f.filenames.len(), None);
            for r in f.regions.iter().chain(&f.branches) {
                let id = r.region.file_id as usize;
                if f.filenames.get(id) == Some(&file) {
                    let (lo, hi) = (r.region.line_start, r.region.line_end.max(r.region.line_start));
                    let hull = &mut hulls[id];
                    *hull = Some(hull.map_or((lo, hi), |(a, b)| (a.min(lo), b.max(hi))));
                }
            }
            spans.extend(hulls.iter().flatten().map(|&(lo, hi)| (lo, hi, at)));
        }
        spans.sort_unstable();
        let mut stretches: Vec<(u32, u32, Vec<usize>)> = Vec::new();
        for (lo, hi, at) in spans {
            match stretches.last_mut() {
                Some((_, end, functions)) if lo <= *end => {
                    *end = (*end).max(hi);
                    functions.push(at);
                }
                _ => stretches.push((lo, hi, vec![at])),
            }
        }
        let fnda_ends = vec![head.len() as u32; executions.len()];
        let mut live = LiveFile {
            file,
            head: head.len(),
            text: Bytes::from(head),
            names: fn_names,
            executions,
            fnda_ends,
            stretches: Vec::with_capacity(stretches.len()),
            stretch_functions: Vec::new(),
            groups: Vec::new(),
            members: Vec::new(),
            masks: Vec::new(),
            total: Summary::default(),
            hit: 0,
            defined_at,
            group_of: Vec::new(),
            stretches_of: Vec::new(),
            lines_at: 0,
        };
        let mut work = Work::default();
        let n = stretches.len();
        for (k, (lo, hi, mut functions)) in stretches.into_iter().enumerate() {
            functions.sort_unstable();
            functions.dedup();
            let all: Vec<(usize, usize)> = functions.iter().map(|&at| (coverage.functions[at].mapping_index, at)).collect();
            let from = live.stretch_functions.len() as u32;
            live.stretch_functions.extend(all.iter().map(|&(i, _)| i as u32));
            let mut stretch =
                Stretch { lines: (lo, hi), functions: (from, live.stretch_functions.len() as u32), ..Stretch::default() };
            let functions = &live.stretch_functions[range(stretch.functions)];
            stretch.compute(k, coverage, file, functions, &all, k + 1 < n, false, &mut work);
            live.stretches_of.extend(all.iter().map(|&(i, _)| (i as u32, k as u32)));
            live.stretches.push(stretch);
        }
        let mut group_of = Vec::new();
        for (g, members) in coverage.instantiation_groups(file).into_iter().enumerate() {
            let from = live.members.len();
            let summaries = member_summaries(coverage, &members, &mut work.data);
            live.members.extend(members.iter().zip(summaries).map(|(&at, summary)| {
                let f = &coverage.functions[at];
                Member::new(f.mapping_index as u32, summary, f.execution_count)
            }));
            live.groups.push((from as u32, live.members.len() as u32));
            let (summary, ran) = group_summary(&live.members[from..]);
            live.total.add(summary);
            live.hit += u32::from(ran);
            group_of.extend(live.members[from..].iter().map(|m| (m.function, g as u32)));
        }
        live.group_of = index(group_of);
        live.groups.shrink_to_fit();
        live.members.shrink_to_fit();
        live.stretches_of.sort_unstable();
        live.stretch_functions.shrink_to_fit();
        live.stretches_of.shrink_to_fit();
        let all: Vec<usize> = (0..live.executions.len()).collect();
        live.render(&work.fresh, &all);
        live
    }

    /// The record's text (without `TN:`).
    pub fn text(&self) -> &Bytes {
        &self.text
    }

    /// The functions of stretch `k`.
    fn functions_of(&self, k: usize) -> &[u32] {
        &self.stretch_functions[range(self.stretches[k].functions)]
    }

    /// What the `changed` functions (ascending) reach of this record, to
    /// update it after they ran.
    pub fn reach(&self, changed: Vec<usize>) -> Reach {
        let mut found = changed;
        let stretches_at = found.len();
        // A function has a stretch or two and a group.
        found.reserve(3 * stretches_at);
        // In order: the stretches are computed, and their lines written, in
        // the order of the text.
        extend_from_index(&mut found, stretches_at, &self.stretches_of);
        let groups_at = found.len();
        extend_from_index(&mut found, stretches_at, &self.group_of);
        Reach { found, stretches_at, groups_at, zero: Vec::new(), zero_lines: String::new() }
    }

    /// Has the CPU fetch the indices [`Self::reach`] searches (a few KiB):
    /// a dump reaches tens of records, and searched where the program had
    /// evicted them, each search waited for memory at every step (on redis
    /// under traffic, the reach of 60 records 108 µs a dump against 129,
    /// asked for two records ahead; medians of 240 dumps).
    pub fn prefetch_index(&self) {
        for index in [&self.stretches_of, &self.group_of] {
            // `prefetch::slice` asks for the first KiB of a slice.
            for part in index.chunks(128) {
                prefetch::slice(part);
            }
        }
    }

    /// Takes the lines of the stretches `reach` has that keep no parts and
    /// none of whose functions is `counted` (by mapping index) as they
    /// were with every count zero (see [`super::with_zero_counts`]): for
    /// [`Self::update`] to write them without loading their functions. In
    /// a forked child's first report, where its parent's last dump left
    /// the record, the functions that changed are those that ran in either,
    /// and much of what they reach ran in the parent alone (a redis
    /// `BGSAVE` child: 183 of 662 stretches, and 3 ms of a 21 ms report).
    pub fn zero_uncounted(&self, reach: &mut Reach, counted: impl Fn(u32) -> bool) {
        for at in reach.stretches_at..reach.groups_at {
            let k = reach.found[at];
            let stretch = &self.stretches[k];
            if stretch.kept.is_some() || self.functions_of(k).iter().any(|&i| counted(i)) {
                continue;
            }
            let (da_from, brda_from) = self.line_starts(k);
            let lines = |from: u32, to: u32| {
                let zero = super::with_zero_counts(self.text.get(from as usize..to as usize)?)?;
                String::from_utf8(zero).ok()
            };
            let (Some(da), Some(brda)) = (lines(da_from, stretch.da_end), lines(brda_from, stretch.brda_end)) else {
                continue;
            };
            let from = reach.zero_lines.len() as u32;
            let middle = from + da.len() as u32;
            reach.zero_lines.push_str(&da);
            reach.zero_lines.push_str(&brda);
            reach.zero.push((k, (from, middle), (middle, reach.zero_lines.len() as u32)));
        }
    }

    /// The stretches `reach` has of several functions that keep no parts
    /// yet, each with its functions (by mapping index, ascending). A dump
    /// reads their parts a few functions at a time ([`Self::read_parts`])
    /// and keeps them ([`Self::keep_parts`]) before it computes the
    /// record: loaded at once with the others, the functions of a header's
    /// stretches (a macro, expanded by hundreds of functions) were most of
    /// the memory a dump took.
    pub fn unkept(&self, reach: &Reach) -> Vec<(usize, Vec<usize>)> {
        let functions = |k: usize| self.functions_of(k).iter().map(|&i| i as usize).collect();
        self.unkept_stretches(reach).filter(|&k| self.functions_of(k).len() > 1).map(|k| (k, functions(k))).collect()
    }

    /// The stretches `reach` has that keep no parts, but for those whose
    /// lines it takes at zero: each is computed from its functions.
    fn unkept_stretches<'a>(&'a self, reach: &'a Reach) -> impl Iterator<Item = usize> + 'a {
        let unkept = |k: usize| self.stretches[k].kept.is_none() && reach.zero(k).is_none();
        reach.stretches().iter().copied().filter(move |&k| unkept(k))
    }

    /// Adds to `parts` those of stretch `k`'s `functions` (the next of
    /// them, ascending), from `coverage`, which loaded them (`index_of`
    /// maps a function to its place there).
    pub fn read_parts<'m>(
        &self,
        k: usize,
        coverage: &Coverage<'m>,
        index_of: &FxHashMap<usize, usize>,
        functions: &[usize],
        parts: &mut Parts,
        work: &mut Work<'m>,
    ) {
        for i in functions {
            let at = index_of.get(i).copied();
            parts.push(coverage, at, self.file, self.stretches[k].lines, &mut work.data);
        }
    }

    /// Keeps `parts` (of all its functions) for stretch `k`.
    pub fn keep_parts(&mut self, k: usize, parts: Parts) {
        let followed = k + 1 < self.stretches.len();
        let stretch = &mut self.stretches[k];
        let mut kept = Kept::new(&parts, followed);
        kept.set_kept_now(true);
        stretch.kept = Some(kept);
    }

    /// The functions a dump must load, besides the changed ones, to update
    /// this record: all those of the stretches `reach` has of several
    /// functions that keep no parts yet.
    pub fn needs<'a>(&'a self, reach: &'a Reach) -> impl Iterator<Item = usize> + 'a {
        self.unkept_stretches(reach).flat_map(|k| self.functions_of(k).iter().map(|&i| i as usize))
    }

    /// The functions whose records [`Self::update`] needs, besides their
    /// tallies, to compute again what `reach` has (ascending): those of the
    /// stretches it reaches that keep no parts yet, and those (of the
    /// `tallies`) whose counts are zero where those of neither of their
    /// last two summaries were (see [`Member::mask`]), whose summary is
    /// computed again. Most often none: a service runs the same paths again
    /// and again, and most of its dumps decode no function whole.
    pub fn records_needed(&self, reach: &Reach, tallies: &Tallies, mask: &mut Vec<u64>) -> Vec<usize> {
        let mut needed: Vec<usize> = self.needs(reach).collect();
        for &g in reach.groups() {
            for member in &self.members[range(self.groups[g])] {
                let Some(at) = tallies.position(member.function as usize) else { continue };
                if member.held(&self.masks, tallies.at(at), mask) == Held::Neither {
                    needed.push(member.function as usize);
                }
            }
        }
        needed.sort_unstable();
        needed.dedup();
        needed
    }

    /// Has the CPU fetch what [`Self::update`] first reads of the first
    /// stretches `reach` has, ahead of it; [`Self::update`] asks for the
    /// next ones as it goes (see [`prefetch_stretch`]).
    pub fn prefetch(&self, reach: &Reach) {
        let text = self.text.as_ptr_range();
        for &k in reach.stretches().iter().take(PREFETCH_AHEAD) {
            prefetch_stretch(&self.stretches, self.lines_at, text.clone(), k);
        }
    }

    /// Computes again what `reach` has, from the `tallies` of its changed
    /// functions, and from the `records` of those [`Self::records_needed`]
    /// names (none when it names none).
    pub fn update<'m>(
        &mut self,
        tallies: &Tallies,
        records: Option<&Records<'_, 'm>>,
        reach: &Reach,
        work: &mut Work<'m>,
    ) {
        // (mapping index, position in `tallies`), by mapping index.
        let loaded: Vec<(usize, usize)> = reach.changed().iter().filter_map(|&i| Some((i, tallies.position(i)?))).collect();
        let fresh = &mut work.fresh;
        // The `FNDA` lines of the counts that changed.
        fresh.names.clear();
        for &(i, at) in &loaded {
            if let Some(slot) = find(&self.defined_at, i) {
                let count = tallies.at(at).execution_count();
                if self.executions[slot] != count {
                    self.executions[slot] = count;
                    fresh.names.push(slot);
                }
            }
        }
        fresh.names.sort_unstable();
        fresh.da.clear();
        fresh.brda.clear();
        fresh.stretches.clear();
        // The lines computed again take about as much room as they did.
        let mut lengths = (0, 0);
        for &k in reach.stretches() {
            let (da_from, brda_from) = self.line_starts(k);
            let s = &self.stretches[k];
            lengths.0 += s.da_end.saturating_sub(da_from) as usize + 16;
            lengths.1 += s.brda_end.saturating_sub(brda_from) as usize + 16;
        }
        fresh.da.reserve(lengths.0);
        fresh.brda.reserve(lengths.1);
        // The record is written over in its last text where no report holds
        // it any longer: of a warm dump's lines, two thirds read as they
        // did (the counts of kept stretches are written over as they are
        // computed; the rest by `write_over`).
        let mut text = self.text.is_unique().then(|| BytesMut::from(std::mem::take(&mut self.text)));
        let n = self.stretches.len();
        let mut bits = std::mem::take(&mut work.loaded);
        set_bits(&mut bits, &loaded, true);
        let text_at = text.as_deref().unwrap_or(&self.text).as_ptr_range();
        for (j, &k) in reach.stretches().iter().enumerate() {
            if let Some(&ahead) = reach.stretches().get(j + PREFETCH_AHEAD) {
                prefetch_stretch(&self.stretches, self.lines_at, text_at.clone(), ahead);
            }
            let (da_start, brda_start) = self.line_starts(k);
            let stretch = &mut self.stretches[k];
            let functions = &self.stretch_functions[range(stretch.functions)];
            if let Some((da, brda)) = reach.zero(k) {
                let fresh = &mut work.fresh;
                let (da_from, brda_from) = (fresh.da.len() as u32, fresh.brda.len() as u32);
                fresh.da.push_str(da);
                fresh.brda.push_str(brda);
                fresh.stretches.push((k, (da_from, fresh.da.len() as u32), (brda_from, fresh.brda.len() as u32)));
            } else if stretch.kept.is_some() {
                let (da_end, brda_end) = (stretch.da_end, stretch.brda_end);
                let at = text.as_deref_mut().and_then(|text| StretchText::of(text, (da_start, da_end), (brda_start, brda_end)));
                let loaded = Loaded { places: &loaded, bits: &bits };
                stretch.update_kept(k, tallies, functions, loaded, reach.changed(), at, work);
            } else if let Some(records) = records {
                let placed: Vec<(usize, usize)> =
                    functions.iter().filter_map(|&f| Some((f as usize, *records.index_of.get(&(f as usize))?))).collect();
                stretch.compute(k, records.coverage, self.file, functions, &placed, k + 1 < n, true, work);
            }
        }
        set_bits(&mut bits, &loaded, false);
        work.loaded = bits;
        // A group's summary taken out of the totals, its members' updated,
        // and it added back. A member's summary is computed again only when
        // its zero counts are new (see `Member::mask`): a service runs the
        // same paths again and again.
        let Work { data, mask, .. } = work;
        for &g in reach.groups() {
            let members = &mut self.members[range(self.groups[g])];
            let (before, ran) = group_summary(members);
            self.total.sub(before);
            self.hit -= u32::from(ran);
            for member in members.iter_mut() {
                let Ok(k) = loaded.binary_search_by_key(&(member.function as usize), |l| l.0) else { continue };
                let tally = tallies.at(loaded[k].1);
                // Without `records`, each summary holds (see
                // `records_needed`): only one kept as the other is looked
                // for, or none hit, which a function that ran cannot be.
                let held = match records.is_none() && !member.keeps_other() && tally.execution_count() != 0 {
                    true => Held::Current,
                    false => member.held(&self.masks, tally, mask),
                };
                match held {
                    Held::Current => {}
                    Held::Other => member.swap(&mut self.masks, mask.len()),
                    Held::NoneHit => {
                        let none_hit = Summary { lines_hit: 0, branches_hit: 0, ..member.summary() };
                        member.set_with_mask(&mut self.masks, mask, none_hit);
                    }
                    // In `records` (see `records_needed`).
                    Held::Neither => {
                        let record = records.and_then(|r| Some((r.coverage, *r.index_of.get(&(member.function as usize))?)));
                        if let Some((coverage, at)) = record {
                            member.set_with_mask(&mut self.masks, mask, function_summary(coverage, at, data));
                        }
                    }
                }
                member.executions = tally.execution_count();
            }
            let (after, ran) = group_summary(members);
            self.total.add(after);
            self.hit += u32::from(ran);
        }
        let written = text.as_mut().is_some_and(|text| self.write_over(text, &mut work.fresh));
        if let Some(text) = text {
            self.text = text.freeze();
        }
        if !written {
            self.render(&work.fresh, &work.fresh.names);
        }
    }

    /// The text (as [`super::write_file`] writes a record, without `TN:`)
    /// again: the totals, the `FNDA` lines of the `fresh_names` (slots, in
    /// order) and the `fresh` stretches (by index) new, the rest copied
    /// from the last text, in runs.
    fn render(&mut self, fresh: &Fresh, fresh_names: &[usize]) {
        let last = &self.text;
        // As `super::write_fnda_lines`, from the names in the head.
        let mut fnda = String::new();
        let mut fnda_at = Vec::with_capacity(fresh_names.len());
        for &slot in fresh_names {
            let from = fnda.len() as u32;
            self.push_fnda_line(&mut fnda, slot);
            fnda_at.push((slot, (from, fnda.len() as u32)));
        }
        // As long as the last text, or, for a record's first, its head,
        // lines and totals (at most 128 bytes); and a little longer:
        // counts only grow (see `write_over`). Grown by doubling, a first
        // text was copied again each time, and kept as much room unused.
        let len = last.len().max(self.head + fnda.len() + fresh.da.len() + fresh.brda.len() + 128);
        let mut out = String::with_capacity(len + len / 32);
        copy_from(&mut out, last, (0, self.head as u32));
        let fnda_lines = fnda_at.iter().map(|&(slot, at)| (slot, &fnda[range(at)]));
        splice(&mut out, last, self.head as u32, self.fnda_ends.iter_mut(), fnda_lines);
        self.push_function_totals(&mut out);
        let da_from = std::mem::replace(&mut self.lines_at, out.len() as u32);
        let da = fresh.stretches.iter().map(|&(k, da, _)| (k, &fresh.da[range(da)]));
        let brda_from = splice(&mut out, last, da_from, self.stretches.iter_mut().map(|s| &mut s.da_end), da);
        let brda = fresh.stretches.iter().map(|&(k, _, brda)| (k, &fresh.brda[range(brda)]));
        splice(&mut out, last, brda_from, self.stretches.iter_mut().map(|s| &mut s.brda_end), brda);
        self.push_file_totals(&mut out);
        self.text = Bytes::from(out);
    }

    /// The `FNDA` line of the function in `slot` (as
    /// `super::write_fnda_lines`), its name from the head of the text.
    fn push_fnda_line(&self, out: &mut String, slot: usize) {
        out.push_str("FNDA:");
        push_int(out, self.executions[slot]);
        out.push(',');
        copy_from(out, &self.text, self.names[slot]);
        out.push('\n');
    }

    /// The `FNF` and `FNH` lines, which follow the `FNDA` lines.
    fn push_function_totals(&self, out: &mut String) {
        push_line(out, "FNF:", self.groups.len());
        push_line(out, "FNH:", self.hit as usize);
    }

    /// The lines that end the record, after the `BRDA` lines.
    fn push_file_totals(&self, out: &mut String) {
        push_line(out, "BRF:", self.total.branches);
        push_line(out, "BRH:", self.total.branches_hit);
        push_line(out, "LF:", self.total.lines);
        push_line(out, "LH:", self.total.lines_hit);
        out.push_str("end_of_record\n");
    }

    /// Where stretch `k`'s `DA` and `BRDA` lines begin in the text: where
    /// the last stretch's end, the first's `DA` lines at `lines_at` and
    /// its `BRDA` lines where the last stretch's `DA` lines end.
    fn line_starts(&self, k: usize) -> (u32, u32) {
        line_starts(&self.stretches, self.lines_at, k)
    }

    /// Writes the lines computed again (of a function's `FNDA` line, its
    /// count) over those they replace in `text`, the record's last text
    /// that no report holds any longer: no copy of the record, and no new
    /// block of its size. Most often each is as long as its last (a service
    /// runs the same code with counts in the same decade). When some are
    /// longer (a count gained a digit: on redis under traffic, a record or
    /// a few in most dumps), the text grows in its block (made with room
    /// to grow, see [`Self::render`]) and what follows them moves. Whether
    /// it did; if not, `text` is as it was, for [`Self::render`].
    fn write_over(&mut self, text: &mut BytesMut, fresh: &mut Fresh) -> bool {
        // The `FNDA` counts, the function totals and the file totals, as
        // `render` writes them, and (where in the text, where in `lines`)
        // of each: the `FNDA` counts, the totals that follow them, and the
        // totals that end the record.
        let Fresh { da, brda, stretches, names, lines, own, edits } = fresh;
        lines.clear();
        own.clear();
        for &slot in names.iter() {
            // Between `FNDA:` and the comma that ends it (a count has none,
            // and 20 digits at most): the name after it stays.
            let start = slot.checked_sub(1).map_or(self.head as u32, |before| self.fnda_ends[before]) + 5;
            let count = text.get(start as usize..).unwrap_or_default();
            let Some(digits) = count.iter().take(21).position(|&b| b == b',') else { return false };
            let from = lines.len() as u32;
            push_int(lines, self.executions[slot]);
            own.push(((start, start + digits as u32), (from, lines.len() as u32)));
        }
        let from = lines.len() as u32;
        self.push_function_totals(lines);
        let fnda_end = self.fnda_ends.last().map_or(self.head as u32, |&end| end);
        own.push(((fnda_end, self.lines_at), (from, lines.len() as u32)));
        let from = lines.len() as u32;
        self.push_file_totals(lines);
        let brda_end = self.stretches.last().map_or(self.lines_at, |s| s.brda_end);
        own.push(((brda_end, text.len() as u32), (from, lines.len() as u32)));
        // Walked twice, to check and to write, rather than collected.
        let (parts, lines_at) = (&self.stretches, self.lines_at);
        let all = || {
            let fresh_lines = stretches.iter().flat_map(|&(k, da_at, brda_at)| {
                let (s, (da_start, brda_start)) = (&parts[k], line_starts(parts, lines_at, k));
                [Edit { at: (da_start, s.da_end), source: Source::Da, new: da_at }, Edit {
                    at: (brda_start, s.brda_end),
                    source: Source::Brda,
                    new: brda_at,
                }]
            });
            own.iter().map(|&(at, new)| Edit { at, source: Source::Lines, new }).chain(fresh_lines)
        };
        let source = |edit: &Edit| match edit.source {
            Source::Lines => &lines.as_bytes()[range(edit.new)],
            Source::Da => &da.as_bytes()[range(edit.new)],
            Source::Brda => &brda.as_bytes()[range(edit.new)],
        };
        let len = text.len();
        let within = |edit: &Edit| edit.at.0 <= edit.at.1 && edit.at.1 as usize <= len;
        if all().all(|edit| within(&edit) && edit.growth() == 0) {
            for edit in all() {
                text[range(edit.at)].copy_from_slice(source(&edit));
            }
            return true;
        }
        // Lines longer than the last (none shorter: counts only grow, and
        // an insertion at a part's end would be either part's), one after
        // the other, in the room the block has.
        edits.clear();
        edits.extend(all());
        edits.sort_unstable_by_key(|edit| edit.at);
        let ordered = edits.windows(2).all(|pair| pair[0].at.1 <= pair[1].at.0);
        let grows = |edit: &Edit| edit.growth() >= 0 && (edit.at.0 < edit.at.1 || edit.new.0 == edit.new.1);
        let growth: i64 = edits.iter().map(Edit::growth).sum();
        if !ordered || !edits.iter().all(|edit| within(edit) && grows(edit)) || len + growth as usize > text.capacity() {
            return false;
        }
        // From the end: each edit's new lines, and what follows it up to
        // the next, go where they are once those before it grew.
        text.resize(len + growth as usize, 0);
        let (mut end, mut shift) = (len, growth as usize);
        for edit in edits.iter().rev() {
            let (from, to) = (edit.at.0 as usize, edit.at.1 as usize);
            text.copy_within(to..end, to + shift);
            shift -= edit.growth() as usize;
            let new = source(edit);
            text[from + shift..from + shift + new.len()].copy_from_slice(new);
            end = from;
        }
        // A part ends where it did, moved by the growth of the edits that
        // end before it or with it: the parts' ends in the order of the
        // text, and the edits with them.
        let (mut next, mut shift) = (0, 0);
        let mut moved = |at: &mut u32| {
            while let Some(edit) = edits.get(next).filter(|edit| edit.at.1 <= *at) {
                (next, shift) = (next + 1, shift + edit.growth() as u32);
            }
            *at += shift;
        };
        self.fnda_ends.iter_mut().for_each(&mut moved);
        moved(&mut self.lines_at);
        self.stretches.iter_mut().for_each(|stretch| moved(&mut stretch.da_end));
        self.stretches.iter_mut().for_each(|stretch| moved(&mut stretch.brda_end));
        true
    }
}

/// Writes a run of parts of a record again into `out`: those of `fresh`
/// ((index, text), by index) new, the others copied from the `last` text
/// in runs. The parts end at `ends` in the last text (the first begins at
/// `from`), and are set to where they end in `out`; returns where the last
/// one ended in the last text.
fn splice<'e, 'f>(
    out: &mut String,
    last: &Bytes,
    from: u32,
    ends: impl Iterator<Item = &'e mut u32>,
    fresh: impl Iterator<Item = (usize, &'f str)>,
) -> u32 {
    // `run`: where the parts copied next begin in the last text; `from`:
    // where the current one does. A part's end moves by what the parts
    // before it grew.
    let (mut from, mut run) = (from, from);
    let mut fresh = fresh.peekable();
    for (k, end) in ends.enumerate() {
        if let Some((_, text)) = fresh.next_if(|f| f.0 == k) {
            copy_from(out, last, (run, from));
            out.push_str(text);
            run = *end;
        }
        from = *end;
        *end = (out.len() + (from - run) as usize) as u32;
    }
    copy_from(out, last, (run, from));
    from
}

/// Copies the bytes `at` of the `last` text of a record to `out`.
fn copy_from(out: &mut String, last: &Bytes, at: (u32, u32)) {
    let bytes = last.get(range(at)).unwrap_or_default();
    // Safety: a record's text is only ever set from a `String`, and a range
    // copied holds its head, a name in it (whole lines and what follows
    // their first comma), or whole `FNDA`, `DA` or `BRDA` lines (ASCII but
    // for the names, whole). Checking it again would cost as much as
    // copying it.
    out.push_str(unsafe { std::str::from_utf8_unchecked(bytes) });
}

impl Stretch {
    /// Its `DA` and `BRDA` lines, as stretch `k`, into `work.fresh`, from
    /// the records in `coverage` of its `functions` (see
    /// [`Stretch::functions`]) that are `placed` ((mapping index, place in
    /// `coverage`), by mapping index); `followed`: stretches come after
    /// it; `keep`: it is to keep its functions' parts (see [`Kept`]).
    #[allow(clippy::too_many_arguments)]
    fn compute<'m>(
        &mut self,
        k: usize,
        coverage: &Coverage<'m>,
        file: FileName,
        functions: &[u32],
        placed: &[(usize, usize)],
        followed: bool,
        keep: bool,
        work: &mut Work<'m>,
    ) {
        let Work { data, spans, branches, fresh, parts, .. } = work;
        let (da_from, brda_from) = (fresh.da.len() as u32, fresh.brda.len() as u32);
        if keep {
            // Kept from the first dump after the first: the first one
            // computes every stretch once and should cost no more than that.
            parts.clear();
            for &f in functions {
                let at = placed.binary_search_by_key(&(f as usize), |l| l.0).ok().map(|l| placed[l].1);
                parts.push(coverage, at, file, self.lines, data);
            }
            let mut kept = Kept::new(parts, followed);
            kept.write(&mut data.segments, &mut fresh.da, &mut fresh.brda);
            self.kept = Some(kept);
        } else {
            spans.clear();
            branches.clear();
            // Each placed function is one of the stretch's.
            for &(_, at) in placed {
                coverage.part_in_file_into(at, file, self.lines, spans, data);
                placed_branches(coverage, data, branches, None);
            }
            data.segments_of(spans, followed);
            write_lines(&mut fresh.da, &data.segments);
            write_placed_branches(&mut fresh.brda, branches.iter().collect());
        }
        fresh.stretches.push((k, (da_from, fresh.da.len() as u32), (brda_from, fresh.brda.len() as u32)));
    }

    /// As [`Self::compute`], of a stretch that keeps its parts, with those of
    /// its `functions` that are `loaded` ((mapping index, position in
    /// `tallies`), by mapping index) read again from `tallies`; `ran`: the
    /// functions that ran (by mapping index, ascending); `text`: its lines
    /// in the record's last text, when they can be written over there.
    /// Nothing is written when no count of it changed.
    #[allow(clippy::too_many_arguments)]
    fn update_kept(
        &mut self,
        k: usize,
        tallies: &Tallies,
        functions: &[u32],
        loaded: Loaded<'_>,
        ran: &[usize],
        text: Option<StretchText<'_>>,
        work: &mut Work<'_>,
    ) {
        let Some(kept) = &mut self.kept else { return };
        let Work { data, fresh, .. } = work;
        let (da_from, brda_from) = (fresh.da.len() as u32, fresh.brda.len() as u32);
        // Its parts kept by this dump (see `LiveFile::unkept`) are as new.
        if !kept.take_kept_now() {
            if !kept.update_loaded(tallies, functions, loaded, ran, &mut work.before) {
                // A function ran elsewhere: these lines are the last
                // text's.
                return;
            }
            if text.is_some_and(|text| kept.write_over(text.da, text.brda, &work.before)) {
                return;
            }
        }
        kept.write(&mut data.segments, &mut fresh.da, &mut fresh.brda);
        fresh.stretches.push((k, (da_from, fresh.da.len() as u32), (brda_from, fresh.brda.len() as u32)));
    }
}

#[cfg(test)]
mod tests {
    use super::{gallop, sort_dedup_from, Held, Member, Summary};

    #[test]
    fn a_member_keeps_its_last_two_summaries_by_their_zero_masks() {
        let summary = |lines_hit| Summary { lines: 9, lines_hit, branches: 4, branches_hit: 1 };
        let (a, b, c) = ([0b1011, 0], [0b1111, 0], [0b0011, 0]);
        // Another member's masks first: each member's are at its own place.
        let mut masks = vec![7, 7];
        let mut member = Member::new(3, summary(5), 10);
        assert_eq!(member.held_for(&masks, &a), Held::Neither);
        member.set_with_mask(&mut masks, &a, summary(5));
        assert_eq!(member.held_for(&masks, &a), Held::Current);
        assert_eq!(member.held_for(&masks, &b), Held::Neither);
        member.set_with_mask(&mut masks, &b, summary(6));
        assert_eq!((member.held_for(&masks, &b), member.held_for(&masks, &a)), (Held::Current, Held::Other));
        assert_eq!(member.summary(), summary(6));
        // Back and forth between two, as a function running while its
        // counts are read.
        for (now, before, hit) in [(a, b, 5), (b, a, 6), (a, b, 5)] {
            member.swap(&mut masks, 2);
            assert_eq!(member.summary(), summary(hit));
            assert_eq!((member.held_for(&masks, &now), member.held_for(&masks, &before)), (Held::Current, Held::Other));
        }
        // A third: the current one becomes the other, in place.
        let len = masks.len();
        member.set_with_mask(&mut masks, &c, summary(4));
        assert_eq!(masks.len(), len);
        assert_eq!((member.held_for(&masks, &c), member.held_for(&masks, &a)), (Held::Current, Held::Other));
        assert_eq!(member.held_for(&masks, &b), Held::Neither);
        member.swap(&mut masks, 2);
        assert_eq!(member.summary(), summary(5));
        assert_eq!(&masks[..2], [7, 7]);
        // An untrusted mask (last word 1) is never one of a trusted read.
        member.set_with_mask(&mut masks, &[0b1011, 1], summary(8));
        assert_eq!(member.held_for(&masks, &a), Held::Other);
    }

    #[test]
    fn sort_dedup_from_leaves_what_is_before_it() {
        let mut values = vec![9, 4, 7, 3, 7, 1, 3, 3];
        sort_dedup_from(&mut values, 2);
        assert_eq!(values, [9, 4, 1, 3, 7]);
        sort_dedup_from(&mut values, 5);
        assert_eq!(values, [9, 4, 1, 3, 7]);
        let mut values = vec![2, 2];
        sort_dedup_from(&mut values, 0);
        assert_eq!(values, [2]);
    }

    #[test]
    fn gallop_finds_what_partition_point_finds() {
        let sorted: Vec<u32> = (0..300).map(|k| k / 3 * 2).collect();
        for len in [0, 1, 2, 3, 7, 64, 65, 300] {
            let sorted = &sorted[..len];
            for key in 0..=210 {
                let below = |&v: &u32| v < key;
                assert_eq!(gallop(sorted, below), sorted.partition_point(below), "len {len}, key {key}");
            }
        }
    }
}
