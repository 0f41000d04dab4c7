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

use hyper::body::Bytes;
use rustc_hash::{FxHashMap, FxHashSet};

use super::{defined_names, function_summary, placed_branches, push_line, write_fn_lines, write_fnda_lines};
use super::{write_lines, write_placed_branches};
use super::{write_summed_branches, PlacedBranch, SummedBranch, Summary};
use crate::coverage::{segments_of, CombinedRegions, Coverage, CoverageData, Span};
use crate::mapping::FileName;

/// One file's record, in parts, and its text. Functions are named by their
/// index in the mapping.
#[derive(Debug)]
pub struct LiveFile {
    file: FileName,
    /// The record as last computed (without `TN:`), shared with the reports
    /// that carry it. Always made from a `String`: see [`Self::render`].
    text: Bytes,
    /// `SF:` (its path rewritten) and the `FN:` lines: which functions a
    /// file has does not change while the modules do not.
    head: String,
    /// The display names of the functions defined in the file, in `FN`
    /// order (`names[ends[i-1]..ends[i]]`), and their counts.
    names: String,
    ends: Vec<usize>,
    executions: Vec<u64>,
    /// By line.
    stretches: Vec<Stretch>,
    groups: Vec<Group>,
    /// Of each function: its slot in `defined`, its group, its stretches.
    defined_at: FxHashMap<usize, usize>,
    group_of: FxHashMap<usize, usize>,
    /// (function, stretch), sorted.
    stretches_of: Vec<(usize, usize)>,
}


#[derive(Debug, Default)]
struct Stretch {
    /// Its first and last line.
    lines: (u32, u32),
    /// The functions with regions in it, in load order.
    functions: Vec<usize>,
    /// For a stretch of several functions, their parts and those combined:
    /// a dump updates them by the difference of the functions that ran
    /// (from the first dump after the first that reaches it).
    kept: Option<Box<Kept>>,
    /// Where its `DA` and `BRDA` lines are in the record's text.
    da: std::ops::Range<usize>,
    brda: std::ops::Range<usize>,
    /// Its lines computed again, not yet in the text.
    fresh: Option<(String, String)>,
}

/// A function's regions and branches in one stretch, with their counts.
#[derive(Debug, Default)]
struct Part {
    spans: Vec<Span>,
    branches: Vec<PlacedBranch>,
}

/// The parts of a stretch's functions (as its `functions`), combined.
#[derive(Debug, Default)]
struct Kept {
    parts: Vec<Part>,
    regions: CombinedRegions,
    branches: CombinedBranches,
}

#[derive(Debug)]
struct Group {
    /// In load order, each with its own summary and count.
    functions: Vec<(usize, Summary, u64)>,
    /// Its functions' summaries merged, and the sum of their counts.
    summary: Summary,
    executions: u64,
}

impl LiveFile {
    /// The record of `file`, from `coverage`, which loaded every function
    /// touching it. `sf` is its `SF:` line as reports show it.
    pub fn new(coverage: &Coverage<'_>, file: FileName, sf: String, no_demangle: bool) -> LiveFile {
        let mut head = sf;
        let (names, ends) = defined_names(coverage, file, no_demangle);
        write_fn_lines(&mut head, coverage, file, &names, &ends);
        let executions = coverage.functions_in(file).map(|f| f.execution_count).collect();
        let defined_at = coverage.functions_in(file).enumerate().map(|(slot, f)| (f.mapping_index, slot)).collect();

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
        let mut live = LiveFile {
            file,
            text: Bytes::new(),
            head,
            names,
            ends,
            executions,
            stretches: Vec::with_capacity(stretches.len()),
            groups: Vec::new(),
            defined_at,
            group_of: FxHashMap::default(),
            stretches_of: Vec::new(),
        };
        let mut data = CoverageData::default();
        let n = stretches.len();
        for (k, (lo, hi, mut functions)) in stretches.into_iter().enumerate() {
            functions.sort_unstable();
            functions.dedup();
            let all: Vec<(usize, usize)> = functions.iter().map(|&at| (coverage.functions[at].mapping_index, at)).collect();
            let mut stretch = Stretch {
                lines: (lo, hi),
                functions: functions.iter().map(|&at| coverage.functions[at].mapping_index).collect(),
                ..Stretch::default()
            };
            stretch.compute(coverage, file, &all, k + 1 < n, false, &mut data);
            for &i in &stretch.functions {
                live.stretches_of.push((i, k));
            }
            live.stretches.push(stretch);
        }
        for (g, members) in coverage.instantiation_groups(file).into_iter().enumerate() {
            let mut group = Group {
                functions: members.iter().map(|&at| (coverage.functions[at].mapping_index, Summary::default(), 0)).collect(),
                summary: Summary::default(),
                executions: 0,
            };
            let mut all: Vec<(usize, usize)> = members.iter().map(|&at| (coverage.functions[at].mapping_index, at)).collect();
            all.sort_unstable();
            group.compute(coverage, &all, &mut data);
            for (i, ..) in &group.functions {
                live.group_of.insert(*i, g);
            }
            live.groups.push(group);
        }
        live.stretches_of.sort_unstable();
        live.render();
        live
    }

    /// The record's text (without `TN:`).
    pub fn text(&self) -> &Bytes {
        &self.text
    }

    /// Adds to `out` the functions a dump must load, besides the `changed`
    /// ones, to update this record after they ran: all those of their
    /// stretches of several functions that keep no parts yet.
    pub fn needs(&self, changed: &[usize], out: &mut Vec<usize>) {
        for k in self.reached(changed).0 {
            if self.stretches[k].kept.is_none() {
                out.extend(&self.stretches[k].functions);
            }
        }
    }

    /// Computes again what `changed` reach, from `coverage`, which loaded
    /// them and what [`Self::needs`] named; `index_of` maps a function to
    /// its place in `coverage`.
    pub fn update(&mut self, coverage: &Coverage<'_>, index_of: &FxHashMap<usize, usize>, changed: &[usize]) {
        let (stretches, groups) = self.reached(changed);
        let mut wanted = changed.to_vec();
        self.needs(changed, &mut wanted);
        // (mapping index, place in `coverage`), by mapping index.
        let mut loaded: Vec<(usize, usize)> = wanted.iter().filter_map(|&i| Some((i, *index_of.get(&i)?))).collect();
        loaded.sort_unstable();
        loaded.dedup();
        for &(i, at) in &loaded {
            if let Some(&slot) = self.defined_at.get(&i) {
                self.executions[slot] = coverage.functions[at].execution_count;
            }
        }
        let mut data = CoverageData::default();
        let n = self.stretches.len();
        for k in stretches {
            self.stretches[k].compute(coverage, self.file, &loaded, k + 1 < n, true, &mut data);
        }
        for g in groups {
            self.groups[g].compute(coverage, &loaded, &mut data);
        }
        self.render();
    }

    /// The stretches and groups of `changed`.
    fn reached(&self, changed: &[usize]) -> (Vec<usize>, Vec<usize>) {
        let mut stretches = FxHashSet::default();
        let mut groups = FxHashSet::default();
        for i in changed {
            let from = self.stretches_of.partition_point(|&(f, _)| f < *i);
            stretches.extend(self.stretches_of[from..].iter().take_while(|&&(f, _)| f == *i).map(|&(_, k)| k));
            groups.extend(self.group_of.get(i).copied());
        }
        (stretches.into_iter().collect(), groups.into_iter().collect())
    }

    /// The text (as [`super::write_file`] writes a record, without `TN:`)
    /// again: the counts, totals and fresh stretches new, the other
    /// stretches' lines copied from the last text.
    fn render(&mut self) {
        let last = &self.text;
        let copy = |out: &mut String, range: &std::ops::Range<usize>| {
            let bytes = last.get(range.clone()).unwrap_or_default();
            // Safety: `last` is only ever set below, from a `String`, and a
            // stretch's range holds whole `DA`/`BRDA` lines of it (ASCII).
            // Checking it again would cost as much as copying it.
            out.push_str(unsafe { std::str::from_utf8_unchecked(bytes) });
        };
        let mut out = String::with_capacity(last.len().max(self.head.len() * 2));
        out.push_str(&self.head);
        write_fnda_lines(&mut out, self.executions.iter().copied(), &self.names, &self.ends);
        let mut total = Summary::default();
        for g in &self.groups {
            total.add(g.summary);
        }
        push_line(&mut out, "FNF:", self.groups.len());
        push_line(&mut out, "FNH:", self.groups.iter().filter(|g| g.executions > 0).count());
        for s in &mut self.stretches {
            let at = out.len();
            match &s.fresh {
                Some((da, _)) => out.push_str(da),
                None => copy(&mut out, &s.da),
            }
            s.da = at..out.len();
        }
        for s in &mut self.stretches {
            let at = out.len();
            match s.fresh.take() {
                Some((_, brda)) => out.push_str(&brda),
                None => copy(&mut out, &s.brda),
            }
            s.brda = at..out.len();
        }
        push_line(&mut out, "BRF:", total.branches);
        push_line(&mut out, "BRH:", total.branches_hit);
        push_line(&mut out, "LF:", total.lines);
        push_line(&mut out, "LH:", total.lines_hit);
        out.push_str("end_of_record\n");
        self.text = Bytes::from(out);
    }
}

impl Stretch {
    /// Its lines and branches, with the parts of the `loaded` functions
    /// ((mapping index, place in `coverage`), by mapping index) computed
    /// again and the others as they were; `followed`: stretches come after
    /// it; `keep`: a stretch of several functions is to keep their parts.
    fn compute<'m>(
        &mut self,
        coverage: &Coverage<'m>,
        file: FileName,
        loaded: &[(usize, usize)],
        followed: bool,
        keep: bool,
        data: &mut CoverageData<'m>,
    ) {
        // Kept from the first dump after the first: the first one computes
        // every stretch once and should cost no more than that.
        if keep && self.kept.is_none() && self.functions.len() > 1 {
            // Every function of the stretch is in `loaded` this time.
            self.kept = Some(Box::new(Kept { parts: self.functions.iter().map(|_| Part::default()).collect(), ..Kept::default() }));
        }
        let mut brda = String::new();
        match &mut self.kept {
            Some(kept) => {
                for &(i, at) in loaded {
                    // `functions` is in load order, which is mapping order.
                    let Ok(k) = self.functions.binary_search(&i) else { continue };
                    let old = &mut kept.parts[k];
                    kept.regions.remove(&old.spans);
                    kept.branches.remove(&old.branches);
                    old.spans.clear();
                    coverage.part_in_file_into(at, file, self.lines, &mut old.spans, data);
                    old.branches.clear();
                    placed_branches(coverage, data, &mut old.branches);
                    kept.regions.add(&old.spans);
                    kept.branches.add(&old.branches);
                }
                kept.regions.segments(followed, &mut data.segments);
                kept.branches.write(&mut brda);
            }
            None => {
                // Every function of the stretch is in `loaded`.
                let (mut spans, mut branches) = (Vec::new(), Vec::new());
                for &(i, at) in loaded {
                    if self.functions.binary_search(&i).is_ok() {
                        coverage.part_in_file_into(at, file, self.lines, &mut spans, data);
                        placed_branches(coverage, data, &mut branches);
                    }
                }
                segments_of(spans, followed, &mut data.segments);
                write_placed_branches(&mut brda, branches.iter().collect());
            }
        }
        let mut da = String::new();
        write_lines(&mut da, &data.segments);
        self.fresh = Some((da, brda));
    }
}

impl Group {
    /// Its summary, as [`super::file_summary`] computes a group's, with the
    /// `loaded` functions (as for [`Stretch::compute`]) computed again and
    /// the others as they were.
    fn compute<'m>(&mut self, coverage: &Coverage<'m>, loaded: &[(usize, usize)], data: &mut CoverageData<'m>) {
        let mut group: Option<Summary> = None;
        self.executions = 0;
        for (i, summary, executions) in &mut self.functions {
            if let Ok(k) = loaded.binary_search_by_key(i, |l| l.0) {
                let at = loaded[k].1;
                *summary = function_summary(coverage, at, data);
                *executions = coverage.functions[at].execution_count;
            }
            self.executions = self.executions.wrapping_add(*executions);
            match &mut group {
                None => group = Some(*summary),
                Some(g) => g.merge_max(*summary),
            }
        }
        self.summary = group.unwrap_or_default();
    }
}

/// The branches of one stretch of a file, of all its functions, summed by
/// place as a record shows them, kept up to date as functions' branches
/// come and go.
#[derive(Debug, Default)]
struct CombinedBranches {
    /// By place: the sums of the counts (wrapping) and how many.
    places: std::collections::BTreeMap<Vec<(u32, u32)>, (u64, u64, u32)>,
}

impl CombinedBranches {
    fn add(&mut self, branches: &[PlacedBranch]) {
        for b in branches {
            let e = self.places.entry(b.path.clone()).or_insert((0, 0, 0));
            e.0 = e.0.wrapping_add(b.count);
            e.1 = e.1.wrapping_add(b.false_count);
            e.2 += 1;
        }
    }

    fn remove(&mut self, branches: &[PlacedBranch]) {
        for b in branches {
            if let Some(e) = self.places.get_mut(&b.path) {
                e.0 = e.0.wrapping_sub(b.count);
                e.1 = e.1.wrapping_sub(b.false_count);
                e.2 -= 1;
                if e.2 == 0 {
                    self.places.remove(&b.path);
                }
            }
        }
    }

    /// The `BRDA` lines.
    fn write(&self, out: &mut String) {
        let summed: Vec<SummedBranch<'_>> = self.places.iter().map(|(p, &(c, f, _))| (p.as_slice(), c, f)).collect();
        write_summed_branches(out, &summed);
    }
}
