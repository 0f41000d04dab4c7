//! LCOV output, record for record as `llvm-cov export -format=lcov` (LLVM 22).
//!
//! Per file: `SF`, `FN`/`FNDA` per function record, `FNF`/`FNH` per
//! instantiation group, `DA` from the file's segments, `BRDA` from branch
//! regions (nested through macro expansions, instantiations summed),
//! `BRF`/`BRH`, then `LF`/`LH`, which llvm-cov takes from per-function
//! summaries rather than from the `DA` lines (see `docs/formats.md`).

#[cfg(feature = "agent")]
mod live;
mod v0;

#[cfg(feature = "agent")]
pub use live::{LiveFile, Parts, Reach, Records, Work};

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};

use regex_lite::Regex;

use crate::coverage::{line_stats, CountedRegion, Coverage, CoverageData, Expansion};
use crate::mapping::FileName;

/// What to include, named after llvm-cov's options.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Files whose name matches any of these are left out
    /// (`-ignore-filename-regex`, an unanchored search).
    pub ignore_filename_regex: Vec<Regex>,
    /// Function names as the compiler wrote them (`--no-demangle`).
    pub no_demangle: bool,
    pub skip_functions: bool,
    pub skip_branches: bool,
    pub summary_only: bool,
    /// Written as `TN:` before each record when set.
    pub test_name: Option<String>,
    /// Threads to write file records on (0 or 1: the calling thread only).
    pub threads: usize,
}

/// Counts of one function (or an instantiation group, or a file).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Summary {
    lines: u64,
    lines_hit: u64,
    branches: u64,
    branches_hit: u64,
}

impl Summary {
    fn add(&mut self, other: Summary) {
        self.lines += other.lines;
        self.lines_hit += other.lines_hit;
        self.branches += other.branches;
        self.branches_hit += other.branches_hit;
    }

    /// Takes back what [`Self::add`] added.
    fn sub(&mut self, other: Summary) {
        self.lines -= other.lines;
        self.lines_hit -= other.lines_hit;
        self.branches -= other.branches;
        self.branches_hit -= other.branches_hit;
    }

    /// Instantiations of one group merge by taking the largest numbers.
    fn merge_max(&mut self, other: Summary) {
        self.lines = self.lines.max(other.lines);
        self.lines_hit = self.lines_hit.max(other.lines_hit);
        self.branches = self.branches.max(other.branches);
        self.branches_hit = self.branches_hit.max(other.branches_hit);
    }

    fn add_branches(&mut self, branches: &[CountedRegion<'_>]) {
        for b in branches {
            if !b.true_folded() {
                self.branches += 1;
                self.branches_hit += u64::from(b.count > 0);
            }
            if !b.false_folded() {
                self.branches += 1;
                self.branches_hit += u64::from(b.false_count > 0);
            }
        }
    }
}

/// Writes the LCOV report of `coverage`.
pub fn write(coverage: &Coverage<'_>, options: &Options) -> String {
    let mut out = String::new();
    for_each_record(coverage, options, |record| out.push_str(record));
    out
}

/// Writes the LCOV report to `out` record by record, so the whole report
/// is never held in memory at once.
pub fn write_to(coverage: &Coverage<'_>, options: &Options, out: &mut impl std::io::Write) -> std::io::Result<()> {
    let mut result = Ok(());
    for_each_record(coverage, options, |record| {
        if result.is_ok() {
            result = out.write_all(record.as_bytes());
        }
    });
    result
}

/// Hands each file's record to `emit`, in file order.
fn for_each_record(coverage: &Coverage<'_>, options: &Options, mut emit: impl FnMut(&str)) {
    let files = reported_files(coverage, options);
    let threads = options.threads.clamp(1, files.len().max(1));
    if threads == 1 {
        let mut out = String::new();
        for file in files {
            out.clear();
            write_file(&mut out, coverage, file, options);
            emit(&out);
        }
        return;
    }
    // Files take very different times: threads take the next file from a
    // shared index. This thread emits the records in file order as they
    // come, so that only those finished ahead of their turn are held.
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let (done, finished) = std::sync::mpsc::channel::<(usize, String)>();
        for _ in 0..threads {
            let (done, next, files) = (done.clone(), &next, &files);
            scope.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&file) = files.get(i) else { break };
                let mut out = String::new();
                write_file(&mut out, coverage, file, options);
                if done.send((i, out)).is_err() {
                    break;
                }
            });
        }
        drop(done);
        let mut ahead: BTreeMap<usize, String> = BTreeMap::new();
        let mut turn = 0;
        for (i, record) in finished {
            ahead.insert(i, record);
            while let Some(record) = ahead.remove(&turn) {
                emit(&record);
                turn += 1;
            }
        }
    });
}

/// The source files of `coverage` that `options` leave in reports.
pub fn reported_files(coverage: &Coverage<'_>, options: &Options) -> Vec<FileName> {
    let files = coverage.source_files();
    let names = files.iter().map(|&file| coverage.mapping.file_name(file));
    let ignored = crate::file_pattern::matching(&options.ignore_filename_regex, names);
    files.into_iter().zip(ignored).filter(|&(_, ignored)| !ignored).map(|(file, _)| file).collect()
}

/// Appends the record of one file (which must be one of
/// `coverage.source_files()`).
pub fn write_file(out: &mut String, coverage: &Coverage<'_>, file: FileName, options: &Options) {
    if let Some(test) = &options.test_name {
        let _ = writeln!(out, "TN:{test}");
    }
    out.push_str("SF:");
    out.push_str(coverage.mapping.file_name(file));
    out.push('\n');
    if !options.summary_only && !options.skip_functions {
        let (names, ends) = defined_names(coverage, file, options.no_demangle);
        write_fn_lines(out, coverage, file, &names, &ends);
        write_fnda_lines(out, coverage.functions_in(file).map(|f| f.execution_count), &names, &ends);
    }

    let mut data = CoverageData::default();
    let (summary, functions, functions_hit) = file_summary(coverage, file, &mut data);
    push_line(out, "FNF:", functions);
    push_line(out, "FNH:", functions_hit);

    if !options.summary_only {
        coverage.for_file_into(file, &mut data);
        write_lines(out, &data.segments);
        if !options.skip_branches {
            write_branches(out, coverage, &data);
        }
    }
    if !options.skip_branches {
        push_line(out, "BRF:", summary.branches);
        push_line(out, "BRH:", summary.branches_hit);
    }
    push_line(out, "LF:", summary.lines);
    push_line(out, "LH:", summary.lines_hit);
    out.push_str("end_of_record\n");
}

/// A file's record (as [`write_file`] writes it, without `TN:`) as it reads
/// when every count is zero: `DA` and `FNDA` counts 0, `BRDA` counts `-`
/// (neither branch of a pair ran), `FNH`, `BRH` and `LH` 0, the rest as it
/// is. Which lines, branches and functions a record has does not depend on
/// the counts, only which of them ran (but for a zero-region stub, which
/// llvm-cov loads only when its function has no counts: the caller sees to
/// those). `None` for a line it does not know.
#[cfg(feature = "agent")]
pub fn with_zero_counts(record: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(record.len());
    let mut from = 0;
    for end in memchr::memchr_iter(b'\n', record) {
        let line = &record[from..=end];
        from = end + 1;
        if line.starts_with(b"DA:") || line.starts_with(b"BRDA:") {
            // The count ends the line, after the last comma.
            let comma = memchr::memrchr(b',', line)?;
            out.extend_from_slice(&line[..=comma]);
            out.extend_from_slice(if line[0] == b'D' { b"0\n" } else { b"-\n" });
        } else if let Some(rest) = line.strip_prefix(b"FNDA:") {
            // The count comes first; the name, which may hold commas, after.
            let comma = memchr::memchr(b',', rest)?;
            out.extend_from_slice(b"FNDA:0");
            out.extend_from_slice(&rest[comma..]);
        } else if let Some(tag) = [&b"FNH:"[..], b"BRH:", b"LH:"].into_iter().find(|tag| line.starts_with(tag)) {
            out.extend_from_slice(tag);
            out.extend_from_slice(b"0\n");
        } else if [&b"SF:"[..], b"FN:", b"FNF:", b"BRF:", b"LF:", b"end_of_record\n"].iter().any(|tag| line.starts_with(tag)) {
            out.extend_from_slice(line);
        } else {
            return None;
        }
    }
    (from == record.len()).then_some(out)
}

/// The display names of the functions defined in `file`, each demangled
/// once for both of its records: the i-th is `names[ends[i-1]..ends[i]]`.
fn defined_names(coverage: &Coverage<'_>, file: FileName, no_demangle: bool) -> (String, Vec<usize>) {
    let (mut names, mut ends) = (String::new(), Vec::new());
    for f in coverage.functions_in(file) {
        write_display_name(&mut names, coverage.name_of(f), no_demangle);
        ends.push(names.len());
    }
    (names, ends)
}

/// The `FN` lines of the functions defined in `file`, named by
/// [`defined_names`].
fn write_fn_lines(out: &mut String, coverage: &Coverage<'_>, file: FileName, names: &str, ends: &[usize]) {
    let mut start = 0;
    for (f, &end) in coverage.functions_in(file).zip(ends) {
        out.push_str("FN:");
        push_int(out, f.regions.first().map_or(0, |r| r.region.line_start));
        out.push(',');
        out.push_str(&names[start..end]);
        out.push('\n');
        start = end;
    }
}

/// The `FNDA` lines: each function's count and name (see [`defined_names`]).
fn write_fnda_lines(out: &mut String, counts: impl Iterator<Item = u64>, names: &str, ends: &[usize]) {
    let mut start = 0;
    for (count, &end) in counts.zip(ends) {
        out.push_str("FNDA:");
        push_int(out, count);
        out.push(',');
        out.push_str(&names[start..end]);
        out.push('\n');
        start = end;
    }
}

/// The `DA` lines of `segments`: every mapped line with its count.
fn write_lines(out: &mut String, segments: &[crate::coverage::Segment]) {
    line_stats(segments, |s, run| {
        if s.mapped {
            push_da_lines(out, s.line, run, s.count);
        }
    });
}

/// The `DA` lines of `lines` lines from `line`, all with `count`.
fn push_da_lines(out: &mut String, line: u32, lines: u32, count: u64) {
    let mut count_text = itoa::Buffer::new();
    let count = count_text.format(count);
    for line in line..line + lines {
        out.push_str("DA:");
        push_int(out, line);
        out.push(',');
        out.push_str(count);
        out.push('\n');
    }
}

/// Appends a number without the formatting machinery: reports have
/// millions of them.
fn push_int(out: &mut String, n: impl itoa::Integer) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Appends a record of one number: `tag`, `n` and a newline.
fn push_line(out: &mut String, tag: &str, n: impl itoa::Integer) {
    out.push_str(tag);
    push_int(out, n);
    out.push('\n');
}

/// The file's line and branch totals, its number of functions (groups) and
/// of functions executed. `data` is a buffer.
fn file_summary<'m>(coverage: &Coverage<'m>, file: FileName, data: &mut CoverageData<'m>) -> (Summary, u64, u64) {
    let mut total = Summary::default();
    let (mut functions, mut hit) = (0, 0);
    for group in coverage.instantiation_groups(file) {
        let mut group_summary: Option<Summary> = None;
        let mut executions = 0u64;
        for (&index, s) in group.iter().zip(member_summaries(coverage, &group, data)) {
            executions = executions.wrapping_add(coverage.functions[index].execution_count);
            match &mut group_summary {
                None => group_summary = Some(s),
                Some(g) => g.merge_max(s),
            }
        }
        if let Some(g) = group_summary {
            total.add(g);
            functions += 1;
            hit += u64::from(executions > 0);
        }
    }
    (total, functions, hit)
}

/// The summary of each function of an instantiation group, in order. A
/// member counted as an earlier one was (most instantiations never run)
/// takes that one's summary rather than building its segments again.
fn member_summaries<'m>(coverage: &Coverage<'m>, group: &[usize], data: &mut CoverageData<'m>) -> Vec<Summary> {
    // The members compared with: the last few of distinct counts, which
    // bounds the work on a group of thousands that all ran differently.
    const COMPARED: usize = 4;
    let mut distinct: Vec<(usize, Summary)> = Vec::new();
    group
        .iter()
        .map(|&index| {
            let earlier = distinct.iter().rev().take(COMPARED).find(|&&(d, _)| coverage.same_counts(d, index));
            match earlier {
                Some(&(_, s)) => s,
                None => {
                    let s = function_summary(coverage, index, data);
                    distinct.push((index, s));
                    s
                }
            }
        })
        .collect()
}

fn function_summary<'m>(coverage: &Coverage<'m>, index: usize, data: &mut CoverageData<'m>) -> Summary {
    coverage.for_function_into(index, data);
    let mut s = lines_summary(&data.segments);
    for branches in coverage.summary_branches(index) {
        s.add_branches(branches);
    }
    s
}

/// The lines of a function's summary: mapped, and hit.
fn lines_summary(segments: &[crate::coverage::Segment]) -> Summary {
    let mut s = Summary::default();
    line_stats(segments, |l, run| {
        if l.mapped {
            s.lines += u64::from(run);
            s.lines_hit += if l.count > 0 { u64::from(run) } else { 0 };
        }
    });
    s
}

/// A branch as a record shows it: the chain of expansion starts that leads
/// to it (its own start for a branch in the file itself), and its counts.
/// Branches at one place are summed, so a record depends on its branches'
/// places and counts only, in whatever order they come.
#[derive(Debug, Clone)]
pub(crate) struct PlacedBranch {
    path: BranchPath,
    count: u64,
    false_count: u64,
}

/// A branch's chain of places, kept as its first and the others: most
/// branches are in the file itself, with a chain of one, which then needs
/// no allocation of its own. Ordered as the chain is (place by place).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct BranchPath {
    first: (u32, u32),
    rest: Vec<(u32, u32)>,
}

impl BranchPath {
    fn of(chain: &[(u32, u32)]) -> Option<BranchPath> {
        let (&first, rest) = chain.split_first()?;
        Some(BranchPath { first, rest: rest.to_vec() })
    }

    fn line(&self) -> u32 {
        self.first.0
    }
}

fn is_unfolded(b: &CountedRegion<'_>) -> bool {
    !b.true_folded() || !b.false_folded()
}

fn placed(b: &CountedRegion<'_>, path: BranchPath) -> PlacedBranch {
    PlacedBranch { path, count: b.count, false_count: b.false_count }
}

fn collect_nested_branches<'m>(
    coverage: &Coverage<'m>,
    expansions: &[Expansion<'m>],
    path: &mut Vec<(u32, u32)>,
    out: &mut Vec<PlacedBranch>,
    mut positions: Option<&mut Vec<u32>>,
) {
    for e in expansions {
        let inner = coverage.for_expansion(e);
        path.push(e.region.region.start());
        collect_nested_branches(coverage, &inner.expansions, path, out, positions.as_deref_mut());
        for (j, b) in inner.branches.iter().enumerate() {
            if b.region.file_id == e.region.region.expanded_file_id && is_unfolded(b) {
                if let Some(path) = BranchPath::of(path) {
                    out.push(placed(b, path));
                    if let Some(positions) = positions.as_deref_mut() {
                        positions.push((inner.branches_from + j) as u32);
                    }
                }
            }
        }
        path.pop();
    }
}

/// The branches of `data` (and of the expansions in it), unfolded ones;
/// with `positions`, where each is in its function's record (`data` of
/// one function's part, see [`CoverageData::branch_positions`]).
pub(crate) fn placed_branches<'m>(
    coverage: &Coverage<'m>,
    data: &CoverageData<'m>,
    out: &mut Vec<PlacedBranch>,
    mut positions: Option<&mut Vec<u32>>,
) {
    let own = |b: &CountedRegion<'_>| BranchPath { first: b.region.start(), rest: Vec::new() };
    for (j, b) in data.branches.iter().enumerate().filter(|(_, b)| is_unfolded(b)) {
        out.push(placed(b, own(b)));
        if let Some(positions) = positions.as_deref_mut() {
            positions.extend(data.branch_positions.get(j));
        }
    }
    collect_nested_branches(coverage, &data.expansions, &mut Vec::new(), out, positions);
}

fn write_branches<'m>(out: &mut String, coverage: &Coverage<'m>, data: &CoverageData<'m>) {
    let mut branches = Vec::new();
    placed_branches(coverage, data, &mut branches, None);
    write_placed_branches(out, branches.iter().collect());
}

/// The `BRDA` lines of `branches`.
pub(crate) fn write_placed_branches(out: &mut String, mut branches: Vec<&PlacedBranch>) {
    branches.sort_by(|a, b| a.path.cmp(&b.path));
    // Instantiations of one generic function have branches at one place:
    // they are reported once, summed.
    let mut summed: Vec<(u32, u64, u64)> = Vec::with_capacity(branches.len());
    let mut last: Option<&BranchPath> = None;
    for b in branches {
        match summed.last_mut() {
            Some(sum) if last == Some(&b.path) => {
                sum.1 = sum.1.wrapping_add(b.count);
                sum.2 = sum.2.wrapping_add(b.false_count);
            }
            _ => summed.push((b.path.line(), b.count, b.false_count)),
        }
        last = Some(&b.path);
    }
    write_summed_branches(out, summed.into_iter());
}

/// The `BRDA` lines of branches summed by place, in place order: each
/// place's line and its branches' counts summed.
fn write_summed_branches(out: &mut String, summed: impl Iterator<Item = (u32, u64, u64)>) {
    let summed = summed.map(|(line, count, false_count)| (line, [[count, false_count]]));
    for (line, pair, index, [count]) in summed_branch_lines(summed) {
        out.push_str("BRDA:");
        push_int(out, line);
        out.push(',');
        push_int(out, pair);
        out.push(',');
        push_int(out, index);
        out.push(',');
        match count {
            Some(count) => push_int(out, count),
            None => out.push('-'),
        }
        out.push('\n');
    }
}

/// What each `BRDA` line of branches summed by place says (see
/// [`write_summed_branches`]): its line, pair and index, and its count by
/// each of the `N` sums a place has (`None` when neither branch of its
/// pair ran: `-`). A dump that writes over a record's last text reads its
/// places' sums as they are and as they were in one pass.
fn summed_branch_lines<const N: usize>(
    summed: impl Iterator<Item = (u32, [[u64; 2]; N])>,
) -> impl Iterator<Item = (u32, u32, u32, [Option<u32>; N])> {
    // The places of a line are its pairs, numbered from 0, and their
    // branches, two each, numbered on from 0 too.
    let (mut last_line, mut pair, mut index) = (None, 0u32, 0u32);
    summed.flat_map(move |(line, sums)| {
        if last_line != Some(line) {
            (last_line, pair, index) = (Some(line), 0, 0);
        }
        // llvm-cov prints these counts as 32-bit unsigned values.
        let counts = sums.map(|[count, false_count]| [count as u32, false_count as u32]);
        let branch = |b: usize| counts.map(|counts| (counts != [0, 0]).then_some(counts[b]));
        let lines = [(line, pair, index, branch(0)), (line, pair, index + 1, branch(1))];
        (pair, index) = (pair + 1, index + 2);
        lines
    })
}

/// A function name for people: Rust (v0 and legacy) and C++ (Itanium)
/// symbols demangled, anything else as it is.
pub fn display_name(name: &str, no_demangle: bool) -> std::borrow::Cow<'_, str> {
    if no_demangle {
        return name.into();
    }
    demangle(name).map_or(name.into(), Into::into)
}

/// Appends [`display_name`] to `out`, Rust v0 symbols by the fast path.
fn write_display_name(out: &mut String, name: &str, no_demangle: bool) {
    if no_demangle {
        out.push_str(name);
    } else if v0::demangle_into(name, out).is_none() {
        out.push_str(&display_name(name, false));
    }
}

/// Demangles a Rust or C++ symbol; `None` when it is neither. A function
/// with internal linkage (C++ `static`, an anonymous namespace, a lambda)
/// is named by its file and its symbol (`app.cpp:_ZL4stepi`): the file
/// stays, the symbol is demangled (`app.cpp:step(int)`).
pub fn demangle(name: &str) -> Option<String> {
    if let Some((file, symbol)) = name.rsplit_once(':') {
        if symbol.starts_with("_Z") || symbol.starts_with("_R") {
            return demangle_symbol(symbol).map(|d| format!("{file}:{d}"));
        }
    }
    demangle_symbol(name)
}

fn demangle_symbol(name: &str) -> Option<String> {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return Some(format!("{d:#}"));
    }
    if name.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(name) {
            if let Ok(d) = sym.demangle(&cpp_demangle::DemangleOptions::default()) {
                return Some(d);
            }
        }
    }
    None
}

/// Applies `from=to` prefix rewrites to `SF:` lines.
pub fn map_paths(report: String, map: &[(String, String)]) -> String {
    if map.is_empty() {
        return report;
    }
    let mut out = String::with_capacity(report.len());
    for line in report.split_inclusive('\n') {
        let rewritten = line.strip_prefix("SF:").and_then(|path| {
            map.iter().find_map(|(from, to)| path.strip_prefix(from.as_str()).map(|rest| format!("SF:{to}{rest}")))
        });
        out.push_str(rewritten.as_deref().unwrap_or(line));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{demangle, map_paths};

    #[test]
    fn path_map_rewrites_only_source_lines() {
        let report = "SF:/build/src/a.rs\nFN:1,/build/x\nSF:/other/b.rs\n".to_owned();
        let map = vec![("/build".to_owned(), "/src".to_owned())];
        assert_eq!(map_paths(report, &map), "SF:/src/src/a.rs\nFN:1,/build/x\nSF:/other/b.rs\n");
    }

    #[cfg(feature = "agent")]
    #[test]
    fn a_record_with_zero_counts_keeps_its_lines() {
        let record = "SF:/src/a,b.c\nFN:3,7,f\nFN:9,12,g,h\nFNDA:12,f\nFNDA:0,g,h\nFNF:2\nFNH:1\nDA:3,12\nDA:4,0\n\
                      DA:10,1234567\nBRDA:4,0,0,5\nBRDA:4,0,1,-\nBRDA:4,0,2,0\nBRF:3\nBRH:1\nLF:3\nLH:2\nend_of_record\n";
        let zero = "SF:/src/a,b.c\nFN:3,7,f\nFN:9,12,g,h\nFNDA:0,f\nFNDA:0,g,h\nFNF:2\nFNH:0\nDA:3,0\nDA:4,0\n\
                    DA:10,0\nBRDA:4,0,0,-\nBRDA:4,0,1,-\nBRDA:4,0,2,-\nBRF:3\nBRH:0\nLF:3\nLH:0\nend_of_record\n";
        assert_eq!(super::with_zero_counts(record.as_bytes()).as_deref(), Some(zero.as_bytes()));
        for unknown in ["TN:x\n", "DA:3\n", "FNDA:3\n", "LH:2", "MCDC:1,2,t,0\n"] {
            assert_eq!(super::with_zero_counts(unknown.as_bytes()), None, "{unknown:?}");
        }
    }

    #[test]
    fn internal_linkage_names_keep_their_file() {
        assert_eq!(demangle("_ZL4stepi").as_deref(), Some("step(int)"));
        assert_eq!(demangle("app.cpp:_ZL4stepi").as_deref(), Some("app.cpp:step(int)"));
        assert_eq!(demangle("src/x.c:helper"), None, "a C static function is not mangled");
        assert_eq!(demangle("app.cpp:_Znot-a-symbol"), None);
    }
}
