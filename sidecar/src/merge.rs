//! Merging LCOV reports.
//!
//! Reads the LCOV of every livecov agent, of `llvm-cov export -format=lcov`
//! and of the usual other tools (lcov/geninfo 1.x and 2.x, c8/istanbul,
//! coverage.py), and writes one report:
//!
//! - records are keyed by (test name, source file): `TN:` applies to the
//!   records after it, up to the next `TN:` of the same input, and an input
//!   starts with no test name;
//! - `DA` counts are summed per line (the first checksum seen is kept);
//! - functions are keyed by name: the first line (`FN:line,name` or
//!   `FN:start,end,name`) seen for a name is kept, `FNDA` counts are summed;
//!   lcov 2.2's `FNL:index,start[,end]` / `FNA:index,count,name` are read
//!   as the same;
//! - `BRDA:line,block,branch,taken` counts are summed per (line, block,
//!   branch), `-` (never reached) being neutral: `-` + n = n, `-` + `-` = `-`;
//! - `FNF`/`FNH`, `LF`/`LH` and `BRF`/`BRH` of the inputs are checked to be
//!   numbers and then ignored: the output's are computed from the merged
//!   entries (`FNF` distinct functions, `FNH` those with a count > 0; `LF`
//!   `DA` lines, `LH` those with a count > 0; `BRF` branch entries, `BRH`
//!   those with a count > 0); a record read from one input, once, keeps
//!   that input's values beside them ([`RecordView::summary`]): llvm-cov
//!   computes them from function summaries, which LCOV does not carry;
//! - sums saturate at `u64::MAX`;
//! - other lines (`VER:`, `MCDC:`, comments, blank lines...) are ignored.
//!
//! Output: records sorted by test name, then source file; per record `TN:`
//! (when the record has a test name), `SF`, `FN`, `FNDA` (functions in the
//! order first seen), `FNF`, `FNH`, `DA` (lines ascending), `BRDA` (by line,
//! block, branch), `BRF`, `BRH`, `LF`, `LH`, `end_of_record` — the layout of
//! `llvm-cov export -format=lcov`.
//!
//! A malformed line (a bad number, a `DA` outside an `SF` record...) is an
//! [`Error`] naming the input and the line number, and [`Merger::add`]
//! leaves the merger as it was: an input is merged whole or not at all.
//!
//! ```
//! use livecov_cli::merge::Merger;
//!
//! let mut merger = Merger::new();
//! merger.add("a.lcov", "SF:src/lib.rs\nDA:1,2\nend_of_record\n")?;
//! merger.add("b.lcov", "SF:src/lib.rs\nDA:1,3\nDA:2,0\nend_of_record\n")?;
//! assert_eq!(
//!     merger.finish(),
//!     "SF:src/lib.rs\nFNF:0\nFNH:0\nDA:1,5\nDA:2,0\nBRF:0\nBRH:0\nLF:2\nLH:1\nend_of_record\n"
//! );
//! # Ok::<(), livecov_cli::merge::Error>(())
//! ```

use std::collections::hash_map::Entry;
use std::fmt;
use std::io::Read;

/// The size of the blocks [`Merger::add_reader`] reads.
const BLOCK: usize = 1 << 18;

use rustc_hash::FxHashMap;

/// A malformed input: which one, where, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The name the input was added under (a file name, `<stdin>`, a target).
    pub source_name: String,
    /// The 1-based line number, or `None` when the input could not be read.
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.source_name, self.message),
            None => write!(f, "{}: {}", self.source_name, self.message),
        }
    }
}

impl std::error::Error for Error {}

/// Totals over a merged report: its records and their summaries added up,
/// as its `LF`/`LH`, `FNF`/`FNH` and `BRF`/`BRH` lines are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Records, i.e. distinct (test name, source file) pairs.
    pub records: usize,
    pub summary: Summary,
}

/// Merges LCOV reports; see the [module documentation](self) for the rules.
///
/// Add inputs with [`add`](Merger::add) or [`add_reader`](Merger::add_reader),
/// combine mergers filled on other threads with [`absorb`](Merger::absorb),
/// and write the result with [`finish`](Merger::finish) or
/// [`write_to`](Merger::write_to). Merging is associative and commutative
/// (but for the order of functions, which is the order first seen, and the
/// first line kept for a function, which matter only when inputs disagree).
#[derive(Debug, Clone, Default)]
pub struct Merger {
    /// test name -> source file -> index in `records`.
    index: FxHashMap<Box<str>, FxHashMap<Box<str>, usize>>,
    records: Vec<Record>,
}

#[derive(Debug, Clone, Default)]
struct Record {
    test: Box<str>,
    file: Box<str>,
    /// Sorted by line, one entry per line.
    lines: Vec<Line>,
    /// The first checksum seen per line (geninfo's and coverage.py's
    /// `DA:line,count,checksum`; rare, so kept apart).
    checksums: FxHashMap<u32, Box<str>>,
    /// In the order first seen.
    functions: Vec<Function>,
    function_index: FxHashMap<Box<str>, usize>,
    /// Sorted by (line, block, branch), one entry per key.
    branches: Vec<Branch>,
    /// How many `SF:` ... `end_of_record` sections were merged into it.
    sections: u32,
    /// The summary records of its one section (meaningful when `sections`
    /// is 1).
    given: Given,
}

/// The summary records a section gave (`None`: it had none of that kind).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Given {
    functions: [Option<u64>; 2],
    lines: [Option<u64>; 2],
    branches: [Option<u64>; 2],
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Line {
    line: u32,
    count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Function {
    name: Box<str>,
    /// The first line, and the last one when the input gave it.
    location: Option<(u32, Option<u32>)>,
    count: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Branch {
    line: u32,
    block: Id,
    branch: Id,
    /// `None`: `-`, the branch was never reached.
    taken: Option<u64>,
}

/// A `BRDA` block or branch: a number for most tools; lcov 2 writes `e0`
/// for exception blocks and coverage.py a description for branches.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Id {
    Num(u64),
    Text(Box<str>),
}

impl Id {
    fn parse(s: &str) -> Id {
        // Numbers as numbers so that 10 sorts after 9; a leading zero keeps
        // the text as written.
        match parse_u64_exact(s) {
            Some(n) if !(s.len() > 1 && s.starts_with('0')) => Id::Num(n),
            _ => Id::Text(s.into()),
        }
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Id::Num(n) => write!(f, "{n}"),
            Id::Text(s) => f.write_str(s),
        }
    }
}

impl Merger {
    pub fn new() -> Merger {
        Merger::default()
    }

    /// True when nothing has been merged (no record).
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Merges one LCOV report. `source_name` names it in errors. On error
    /// the merger is left as it was.
    pub fn add(&mut self, source_name: &str, text: &str) -> Result<(), Error> {
        let mut staging = Merger::new();
        {
            let mut parser = Parser::new(&mut staging, source_name);
            for line in text.split('\n') {
                parser.line(line)?;
            }
            parser.end();
        }
        self.absorb(staging);
        Ok(())
    }

    /// Merges one LCOV report read from `reader` block by block (the text
    /// is never held whole; no need for a `BufReader`). `source_name`
    /// names it in errors. On error (malformed input,
    /// a read error, text that is not UTF-8) the merger is left as it was.
    pub fn add_reader(&mut self, source_name: &str, mut reader: impl Read) -> Result<(), Error> {
        let mut staging = Merger::new();
        {
            let mut parser = Parser::new(&mut staging, source_name);
            // Read in blocks; the complete lines of each are checked as
            // UTF-8 at once and parsed, the rest is kept for the next.
            let mut buf: Vec<u8> = Vec::with_capacity(BLOCK);
            let mut eof = false;
            while !eof {
                let start = buf.len();
                buf.resize(start + BLOCK, 0);
                let n = loop {
                    match reader.read(&mut buf[start..]) {
                        Ok(n) => break n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            return Err(Error {
                                source_name: source_name.to_owned(),
                                line: None,
                                message: format!("cannot read: {e}"),
                            })
                        }
                    }
                };
                buf.truncate(start + n);
                eof = n == 0;
                let complete = if eof {
                    buf.len()
                } else {
                    match buf[start..].iter().rposition(|&b| b == b'\n') {
                        Some(i) => start + i + 1,
                        None => continue,
                    }
                };
                let text = match std::str::from_utf8(&buf[..complete]) {
                    Ok(text) => text,
                    Err(e) => {
                        let line = parser.line_no + 1 + buf[..e.valid_up_to()].iter().filter(|&&b| b == b'\n').count();
                        return Err(Error {
                            source_name: source_name.to_owned(),
                            line: Some(line),
                            message: "not UTF-8 text: LCOV is UTF-8".to_owned(),
                        });
                    }
                };
                let text = text.strip_suffix('\n').unwrap_or(text);
                if complete > 0 {
                    for line in text.split('\n') {
                        parser.line(line)?;
                    }
                }
                buf.drain(..complete);
            }
            parser.end();
        }
        self.absorb(staging);
        Ok(())
    }

    /// Merges everything `other` holds into `self`, as if the inputs added
    /// to `other` had been added to `self` after its own (in particular,
    /// functions first seen in `other` come after those of `self`).
    pub fn absorb(&mut self, other: Merger) {
        if self.records.is_empty() {
            *self = other;
            return;
        }
        for record in other.records {
            self.absorb_record(record);
        }
    }

    /// Merges one record into the record of its key.
    fn absorb_record(&mut self, record: Record) {
        let index = self.record_index(&record.test, &record.file);
        let mine = &mut self.records[index];
        if mine.sections == 0 && mine.is_empty() {
            *mine = record;
        } else {
            mine.merge_lines(record.lines);
            for (line, sum) in record.checksums {
                mine.checksums.entry(line).or_insert(sum);
            }
            mine.merge_branches(record.branches);
            for f in record.functions {
                mine.merge_function(f.name, f.location, f.count);
            }
            // Two sections: what each gave cannot be added up.
            mine.sections = mine.sections.saturating_add(record.sections).max(2);
        }
    }

    /// The records, sorted by test name then source file.
    pub fn records(&self) -> impl Iterator<Item = RecordView<'_>> {
        self.sorted().into_iter().map(RecordView)
    }

    /// The records re-keyed by `key(test, file)`, which gives the new test
    /// name and source file, or `None` to leave the record out. Records
    /// given the same key are merged (in the order of [`records`](Merger::records)),
    /// as two inputs with those keys would be.
    pub fn rekey(self, mut key: impl FnMut(&str, &str) -> Option<(String, String)>) -> Merger {
        let mut records = self.records;
        records.sort_unstable_by(|a, b| (&a.test, &a.file).cmp(&(&b.test, &b.file)));
        let mut out = Merger::new();
        for mut record in records {
            if let Some((test, file)) = key(&record.test, &record.file) {
                record.test = test.into();
                record.file = file.into();
                out.absorb_record(record);
            }
        }
        out
    }

    /// The totals the merged report's summary records add up to.
    pub fn totals(&self) -> Totals {
        let mut s = Summary::default();
        for r in &self.records {
            s.add(r.summary());
        }
        Totals { records: self.records.len(), summary: s }
    }

    /// The merged report.
    pub fn finish(self) -> String {
        let mut out = String::new();
        self.write_into(&mut out);
        out
    }

    /// Writes the merged report to `w` (buffer it: this writes many small pieces).
    pub fn write_to(&self, w: &mut (impl std::io::Write + ?Sized)) -> std::io::Result<()> {
        // Records are formatted a few at a time into one buffer.
        let mut buf = String::with_capacity(64 * 1024);
        for record in self.sorted() {
            record.write(&mut buf);
            if buf.len() >= 60 * 1024 {
                w.write_all(buf.as_bytes())?;
                buf.clear();
            }
        }
        w.write_all(buf.as_bytes())
    }

    fn write_into(&self, out: &mut String) {
        for record in self.sorted() {
            record.write(out);
        }
    }

    fn sorted(&self) -> Vec<&Record> {
        let mut records: Vec<&Record> = self.records.iter().collect();
        records.sort_unstable_by(|a, b| (&a.test, &a.file).cmp(&(&b.test, &b.file)));
        records
    }

    fn record_index(&mut self, test: &str, file: &str) -> usize {
        let files = match self.index.get_mut(test) {
            Some(files) => files,
            None => self.index.entry(test.into()).or_default(),
        };
        if let Some(&i) = files.get(file) {
            return i;
        }
        let i = self.records.len();
        files.insert(file.into(), i);
        self.records.push(Record { test: test.into(), file: file.into(), ..Record::default() });
        i
    }
}

/// Merges LCOV reports given as (name, text) pairs, in order.
pub fn merge<'a>(inputs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<String, Error> {
    let mut merger = Merger::new();
    for (name, text) in inputs {
        merger.add(name, text)?;
    }
    Ok(merger.finish())
}

// ---------------------------------------------------------------- records

/// A record's numbers: lines, functions and branches found and hit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    pub lines: u64,
    pub lines_hit: u64,
    pub functions: u64,
    pub functions_hit: u64,
    pub branches: u64,
    pub branches_hit: u64,
}

/// As the command line prints it: `lines 3/6, functions 1/2, branches 1/4`.
impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "lines {}/{}, functions {}/{}, branches {}/{}",
            self.lines_hit, self.lines, self.functions_hit, self.functions, self.branches_hit, self.branches
        )
    }
}

impl Summary {
    pub fn add(&mut self, other: Summary) {
        self.lines += other.lines;
        self.lines_hit += other.lines_hit;
        self.functions += other.functions;
        self.functions_hit += other.functions_hit;
        self.branches += other.branches;
        self.branches_hit += other.branches_hit;
    }
}

/// One merged record, read-only: what reports are made of.
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a>(&'a Record);

impl<'a> RecordView<'a> {
    /// The test name (`TN:`), empty when there was none.
    pub fn test(&self) -> &'a str {
        &self.0.test
    }

    /// The source file (`SF:`).
    pub fn file(&self) -> &'a str {
        &self.0.file
    }

    /// `(line, count)` per `DA` line, lines ascending.
    pub fn lines(&self) -> impl Iterator<Item = (u32, u64)> + 'a {
        self.0.lines.iter().map(|l| (l.line, l.count))
    }

    /// `(line, taken)` per `BRDA` entry, by line (`None`: `-`, never reached).
    pub fn branches(&self) -> impl Iterator<Item = (u32, Option<u64>)> + 'a {
        self.0.branches.iter().map(|b| (b.line, b.taken))
    }

    /// `(name, first line, count)` per function, in the order first seen.
    pub fn functions(&self) -> impl Iterator<Item = (&'a str, Option<u32>, u64)> + 'a {
        self.0.functions.iter().map(|f| (&*f.name, f.location.map(|(start, _)| start), f.count))
    }

    /// The numbers the merged report's summary records say: counted from
    /// the entries.
    pub fn counted(&self) -> Summary {
        self.0.summary()
    }

    /// The record's numbers as its producer counted them: per kind, the
    /// summary records of its input when it was read from one input, once,
    /// that gave them (and hit no more than found); else counted from the
    /// entries. llvm-cov counts `LF`/`LH` and `BRF`/`BRH` from function
    /// summaries (so they equal `llvm-cov report`'s), which the entries
    /// alone do not give back.
    pub fn summary(&self) -> Summary {
        let mut s = self.0.summary();
        if self.0.sections != 1 {
            return s;
        }
        let g = &self.0.given;
        for (given, (found, hit)) in [
            (g.lines, (&mut s.lines, &mut s.lines_hit)),
            (g.functions, (&mut s.functions, &mut s.functions_hit)),
            (g.branches, (&mut s.branches, &mut s.branches_hit)),
        ] {
            if let [Some(f), Some(h)] = given {
                if h <= f {
                    (*found, *hit) = (f, h);
                }
            }
        }
        s
    }
}

impl Record {
    fn is_empty(&self) -> bool {
        self.lines.is_empty() && self.functions.is_empty() && self.branches.is_empty()
    }

    fn summary(&self) -> Summary {
        Summary {
            lines: self.lines.len() as u64,
            lines_hit: self.lines.iter().filter(|l| l.count > 0).count() as u64,
            functions: self.functions.len() as u64,
            functions_hit: self.functions.iter().filter(|f| f.count > 0).count() as u64,
            branches: self.branches.len() as u64,
            branches_hit: self.branches.iter().filter(|b| b.taken.is_some_and(|t| t > 0)).count() as u64,
        }
    }

    fn merge_function(&mut self, name: Box<str>, location: Option<(u32, Option<u32>)>, count: u64) {
        match self.function_index.entry(name) {
            Entry::Occupied(e) => {
                let f = &mut self.functions[*e.get()];
                f.count = f.count.saturating_add(count);
                if f.location.is_none() {
                    f.location = location;
                }
            }
            Entry::Vacant(e) => {
                let name = e.key().clone();
                e.insert(self.functions.len());
                self.functions.push(Function { name, location, count });
            }
        }
    }

    /// Merges lines sorted by line number, one per line.
    fn merge_lines(&mut self, new: Vec<Line>) {
        self.lines = merge_sorted(
            std::mem::take(&mut self.lines),
            new,
            |a, b| a.line.cmp(&b.line),
            |a, b| a.count = a.count.saturating_add(b.count),
        );
    }

    /// Merges branches sorted by key, one per key.
    fn merge_branches(&mut self, new: Vec<Branch>) {
        self.branches = merge_sorted(
            std::mem::take(&mut self.branches),
            new,
            |a, b| (a.line, &a.block, &a.branch).cmp(&(b.line, &b.block, &b.branch)),
            |a, b| a.taken = add_taken(a.taken, b.taken),
        );
    }

    fn write(&self, out: &mut String) {
        let mut n = itoa::Buffer::new();
        if !self.test.is_empty() {
            out.push_str("TN:");
            out.push_str(&self.test);
            out.push('\n');
        }
        out.push_str("SF:");
        out.push_str(&self.file);
        out.push('\n');
        for f in &self.functions {
            if let Some((start, end)) = f.location {
                out.push_str("FN:");
                out.push_str(n.format(start));
                if let Some(end) = end {
                    out.push(',');
                    out.push_str(n.format(end));
                }
                out.push(',');
                out.push_str(&f.name);
                out.push('\n');
            }
        }
        // Those with a location first, in the order of their `FN` lines:
        // read again, a merge's output then lists its functions as it did.
        let located = self.functions.iter().filter(|f| f.location.is_some());
        for f in located.chain(self.functions.iter().filter(|f| f.location.is_none())) {
            out.push_str("FNDA:");
            out.push_str(n.format(f.count));
            out.push(',');
            out.push_str(&f.name);
            out.push('\n');
        }
        let s = self.summary();
        push_record(out, &mut n, "FNF:", s.functions);
        push_record(out, &mut n, "FNH:", s.functions_hit);
        for l in &self.lines {
            out.push_str("DA:");
            out.push_str(n.format(l.line));
            out.push(',');
            out.push_str(n.format(l.count));
            if !self.checksums.is_empty() {
                if let Some(c) = self.checksums.get(&l.line) {
                    out.push(',');
                    out.push_str(c);
                }
            }
            out.push('\n');
        }
        for b in &self.branches {
            out.push_str("BRDA:");
            out.push_str(n.format(b.line));
            out.push(',');
            push_id(out, &mut n, &b.block);
            out.push(',');
            push_id(out, &mut n, &b.branch);
            out.push(',');
            match b.taken {
                Some(t) => out.push_str(n.format(t)),
                None => out.push('-'),
            }
            out.push('\n');
        }
        push_record(out, &mut n, "BRF:", s.branches);
        push_record(out, &mut n, "BRH:", s.branches_hit);
        push_record(out, &mut n, "LF:", s.lines);
        push_record(out, &mut n, "LH:", s.lines_hit);
        out.push_str("end_of_record\n");
    }
}

fn push_record(out: &mut String, n: &mut itoa::Buffer, tag: &str, value: u64) {
    out.push_str(tag);
    out.push_str(n.format(value));
    out.push('\n');
}

fn push_id(out: &mut String, n: &mut itoa::Buffer, id: &Id) {
    match id {
        Id::Num(v) => out.push_str(n.format(*v)),
        Id::Text(t) => out.push_str(t),
    }
}

fn add_taken(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.saturating_add(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// Merges two vectors sorted by `cmp` (each without duplicates), combining
/// equal elements with `combine`.
fn merge_sorted<T>(
    old: Vec<T>,
    new: Vec<T>,
    cmp: impl Fn(&T, &T) -> std::cmp::Ordering,
    combine: impl Fn(&mut T, T),
) -> Vec<T> {
    if old.is_empty() {
        return new;
    }
    if new.is_empty() {
        return old;
    }
    // Reports of one build usually list the same keys: sum in place.
    if old.len() == new.len() && old.iter().zip(&new).all(|(a, b)| cmp(a, b).is_eq()) {
        let mut old = old;
        for (a, b) in old.iter_mut().zip(new) {
            combine(a, b);
        }
        return old;
    }
    let mut out = Vec::with_capacity(old.len().max(new.len()));
    let mut a = old.into_iter().peekable();
    let mut b = new.into_iter().peekable();
    loop {
        let order = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => cmp(x, y),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => break,
        };
        match order {
            std::cmp::Ordering::Less => out.push(a.next().expect("peeked")),
            std::cmp::Ordering::Greater => out.push(b.next().expect("peeked")),
            std::cmp::Ordering::Equal => {
                let mut x = a.next().expect("peeked");
                combine(&mut x, b.next().expect("peeked"));
                out.push(x);
            }
        }
    }
    out
}

/// Sorts `v` by `cmp` (stably: it is usually sorted already) and combines
/// equal neighbours.
fn normalize<T>(v: &mut Vec<T>, cmp: impl Fn(&T, &T) -> std::cmp::Ordering, combine: impl Fn(&mut T, T)) {
    if !v.windows(2).all(|w| cmp(&w[0], &w[1]).is_lt()) {
        v.sort_by(&cmp);
        let mut out: Vec<T> = Vec::with_capacity(v.len());
        for x in v.drain(..) {
            match out.last_mut() {
                Some(last) if cmp(last, &x).is_eq() => combine(last, x),
                _ => out.push(x),
            }
        }
        *v = out;
    }
}

// ---------------------------------------------------------------- parsing

/// Reads one input into a merger, line by line.
struct Parser<'a> {
    merger: &'a mut Merger,
    source_name: &'a str,
    line_no: usize,
    test: String,
    /// The record being read: its index, and its lines and branches so far
    /// (merged into it at `end_of_record`).
    current: Option<usize>,
    lines: Vec<Line>,
    branches: Vec<Branch>,
    /// lcov 2.2's `FNL:index,start[,end]` of the current record.
    fnl: FxHashMap<u64, (u32, Option<u32>)>,
    /// The summary records of the current record.
    given: Given,
}

impl<'a> Parser<'a> {
    fn new(merger: &'a mut Merger, source_name: &'a str) -> Parser<'a> {
        Parser {
            merger,
            source_name,
            line_no: 0,
            test: String::new(),
            current: None,
            lines: Vec::new(),
            branches: Vec::new(),
            fnl: FxHashMap::default(),
            given: Given::default(),
        }
    }

    fn error(&self, message: impl Into<String>) -> Error {
        Error { source_name: self.source_name.to_owned(), line: Some(self.line_no), message: message.into() }
    }

    fn line(&mut self, line: &str) -> Result<(), Error> {
        self.line_no += 1;
        // Every CR that ends it: one left in a name would be written, and
        // read as a line end by the next reader.
        let line = line.trim_end_matches('\r');
        // Most lines are DA lines.
        if let Some(rest) = line.strip_prefix("DA:") {
            return self.da(rest);
        }
        let Some((tag, rest)) = line.split_once(':') else {
            if line.trim_end() == "end_of_record" {
                self.close();
            }
            return Ok(());
        };
        match tag {
            "TN" => self.test = rest.to_owned(),
            "SF" => {
                if rest.is_empty() {
                    return Err(self.error("SF: without a file name"));
                }
                self.close();
                self.current = Some(self.merger.record_index(&self.test, rest));
            }
            "FN" => {
                let (start, rest) = rest.split_once(',').ok_or_else(|| self.error("expected FN:line,name"))?;
                let start = self.line_number(start, "FN")?;
                // FN:start,end,name (lcov 2) or FN:start,name; a name may
                // hold commas but does not start with a digit.
                let (end, name) = match rest.split_once(',') {
                    Some((end, name)) if is_digits(end) => (Some(self.line_number(end, "FN")?), name),
                    _ => (None, rest),
                };
                if name.is_empty() {
                    return Err(self.error("FN: without a function name"));
                }
                let index = self.record("FN")?;
                self.merger.records[index].merge_function(name.into(), Some((start, end)), 0);
            }
            "FNDA" => {
                let (count, name) = rest.split_once(',').ok_or_else(|| self.error("expected FNDA:count,name"))?;
                let count = self.count(count, "FNDA")?;
                if name.is_empty() {
                    return Err(self.error("FNDA: without a function name"));
                }
                let index = self.record("FNDA")?;
                self.merger.records[index].merge_function(name.into(), None, count);
            }
            "FNL" => {
                let mut fields = rest.split(',');
                let (Some(index), Some(start)) = (fields.next(), fields.next()) else {
                    return Err(self.error("expected FNL:index,start[,end]"));
                };
                let index = self.count(index, "FNL")?;
                let start = self.line_number(start, "FNL")?;
                let end = fields.next().map(|e| self.line_number(e, "FNL")).transpose()?;
                self.record("FNL")?;
                self.fnl.insert(index, (start, end));
            }
            "FNA" => {
                let mut fields = rest.splitn(3, ',');
                let (Some(index), Some(count), Some(name)) = (fields.next(), fields.next(), fields.next()) else {
                    return Err(self.error("expected FNA:index,count,name"));
                };
                let index = self.count(index, "FNA")?;
                let count = self.count(count, "FNA")?;
                if name.is_empty() {
                    return Err(self.error("FNA: without a function name"));
                }
                let record = self.record("FNA")?;
                let location = self.fnl.get(&index).copied();
                self.merger.records[record].merge_function(name.into(), location, count);
            }
            "BRDA" => {
                // BRDA:line,block,branch,taken; coverage.py's branch may be
                // a description, so it is whatever lies between.
                let bad = || self.error("expected BRDA:line,block,branch,taken");
                let (line, rest) = rest.split_once(',').ok_or_else(bad)?;
                let (block, rest) = rest.split_once(',').ok_or_else(bad)?;
                let (branch, taken) = rest.rsplit_once(',').ok_or_else(bad)?;
                let line = self.line_number(line, "BRDA")?;
                if block.is_empty() || branch.is_empty() {
                    return Err(bad());
                }
                let taken = match taken {
                    "-" => None,
                    t => Some(self.count(t, "BRDA taken")?),
                };
                self.record("BRDA")?;
                self.branches.push(Branch { line, block: Id::parse(block), branch: Id::parse(branch), taken });
            }
            "FNF" | "FNH" | "LF" | "LH" | "BRF" | "BRH" => {
                let n = self.count(rest, tag)?;
                if self.current.is_some() {
                    let g = &mut self.given;
                    let slot = match tag {
                        "FNF" => &mut g.functions[0],
                        "FNH" => &mut g.functions[1],
                        "LF" => &mut g.lines[0],
                        "LH" => &mut g.lines[1],
                        "BRF" => &mut g.branches[0],
                        _ => &mut g.branches[1],
                    };
                    *slot = Some(n);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// `DA:line,count[,checksum]`
    fn da(&mut self, rest: &str) -> Result<(), Error> {
        let (line, rest) = rest.split_once(',').ok_or_else(|| self.error("expected DA:line,count"))?;
        let (count, checksum) = match rest.split_once(',') {
            Some((c, sum)) => (c, Some(sum)),
            None => (rest, None),
        };
        let line = self.line_number(line, "DA")?;
        let count = self.count(count, "DA")?;
        let record = self.record("DA")?;
        if let Some(sum) = checksum.filter(|s| !s.is_empty()) {
            self.merger.records[record].checksums.entry(line).or_insert_with(|| sum.into());
        }
        self.lines.push(Line { line, count });
        Ok(())
    }

    /// The current record, or an error naming the record type that came outside one.
    fn record(&self, what: &str) -> Result<usize, Error> {
        self.current.ok_or_else(|| self.error(format!("{what}: outside a record (no SF: line before it)")))
    }

    fn line_number(&self, s: &str, what: &str) -> Result<u32, Error> {
        parse_u64_exact(s)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| self.error(format!("{what}: bad line number {s:?}")))
    }

    /// A count: decimal digits, saturating at u64::MAX.
    fn count(&self, s: &str, what: &str) -> Result<u64, Error> {
        if !is_digits(s) {
            return Err(self.error(format!("{what}: bad number {s:?}")));
        }
        Ok(s.bytes().fold(0u64, |n, d| n.saturating_mul(10).saturating_add(u64::from(d - b'0'))))
    }

    /// Ends the current record: its lines and branches are merged into it.
    fn close(&mut self) {
        self.fnl.clear();
        let given = std::mem::take(&mut self.given);
        let Some(index) = self.current.take() else { return };
        let record = &mut self.merger.records[index];
        record.sections = record.sections.saturating_add(1);
        record.given = given;
        let mut lines = std::mem::take(&mut self.lines);
        normalize(&mut lines, |a, b| a.line.cmp(&b.line), |a, b| a.count = a.count.saturating_add(b.count));
        record.merge_lines(lines);
        let mut branches = std::mem::take(&mut self.branches);
        normalize(
            &mut branches,
            |a, b| (a.line, &a.block, &a.branch).cmp(&(b.line, &b.block, &b.branch)),
            |a, b| a.taken = add_taken(a.taken, b.taken),
        );
        record.merge_branches(branches);
    }

    /// The end of the input: a record left open is closed (a report cut
    /// short after its last complete line is merged as far as it goes).
    fn end(&mut self) {
        self.close();
    }
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// Decimal digits that fit a u64.
fn parse_u64_exact(s: &str) -> Option<u64> {
    if !is_digits(s) {
        return None;
    }
    s.bytes().try_fold(0u64, |n, d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
}

#[cfg(test)]
mod tests;
