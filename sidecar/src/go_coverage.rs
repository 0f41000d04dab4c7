//! Go coverage data to LCOV, with no Go tool: what `livecov convert
//! --go-coverdir` reads.
//!
//! A Go program built with `-cover` writes into `GOCOVERDIR` a meta-data
//! file per build (`covmeta.<hash>`: every covered package's functions and
//! their blocks) and a counter data file per run or snapshot
//! (`covcounters.<hash>.<pid>.<time>`: the counters of the functions that
//! ran). The formats are those of Go's `internal/coverage` (`decodemeta`,
//! `decodecounter`); the Go hook (`hooks/go`) serves the same two files as
//! `?format=covdata`, and computes the same LCOV in the process by the
//! rules of docs/formats.md ("Go"). Counter files of one build add up,
//! counter by counter, as `go tool covdata merge` adds them; the reports of
//! different builds in one folder add up as LCOV.
//!
//! Every length and index is checked against the data: a malformed file is
//! an error naming the file and what is wrong, never a panic.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};

const META_MAGIC: [u8; 4] = [0x00, 0x63, 0x76, 0x6d];
const COUNTER_MAGIC: [u8; 4] = [0x00, 0x63, 0x77, 0x6d];
const COUNTER_FOOTER_SIZE: usize = 16;
const MODE_NAMES: [&str; 6] = ["invalid", "set", "count", "atomic", "regonly", "testmain"];
/// The Go hook's own package: never in its reports, so never in these.
const HOOK_PACKAGE: &str = "livecov.dev/hooks/go";

/// A decoded meta-data file.
#[derive(Debug)]
pub struct Meta {
    pub hash: [u8; 16],
    /// `set`, `count`, `atomic`...
    pub mode: &'static str,
    pub packages: Vec<Package>,
}

#[derive(Debug)]
pub struct Package {
    pub path: String,
    pub functions: Vec<Function>,
}

#[derive(Debug)]
pub struct Function {
    pub name: String,
    pub file: String,
    pub blocks: Vec<Block>,
}

/// A coverable block: where it starts and ends, and its statements.
#[derive(Debug, Clone, Copy)]
pub struct Block {
    pub start_line: u32,
    pub start_col: u32,
    pub end_line: u32,
    pub end_col: u32,
    pub statements: u32,
}

/// Counters by (package index, function index).
pub type FunctionCounters = HashMap<(u32, u32), Vec<u32>>;

/// The counters of a counter data file, its segments added up.
#[derive(Debug)]
pub struct Counters {
    pub meta_hash: [u8; 16],
    pub functions: FunctionCounters,
}

/// Reads little-endian values and ULEB128 numbers, checking every length.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(data: &'a [u8]) -> Self {
        Reader { data, at: 0 }
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.data.len());
        let end = end.ok_or_else(|| anyhow!("truncated: {n} bytes wanted at offset {} of {}", self.at, self.data.len()))?;
        let b = &self.data[self.at..end];
        self.at = end;
        Ok(b)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.bytes(1)?[0])
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn uleb(&mut self) -> Result<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        bail!("a ULEB128 number longer than 64 bits at offset {}", self.at)
    }

    fn uleb32(&mut self) -> Result<u32> {
        let v = self.uleb()?;
        u32::try_from(v).map_err(|_| anyhow!("number {v} does not fit 32 bits at offset {}", self.at))
    }

    /// A count that must not exceed the bytes left (each item takes at least one).
    fn count(&mut self, what: &str) -> Result<usize> {
        let n = self.uleb()?;
        let left = self.data.len() - self.at;
        usize::try_from(n).ok().filter(|&n| n <= left).ok_or_else(|| anyhow!("{n} {what} in {left} bytes"))
    }

    fn seek(&mut self, at: u64) -> Result<()> {
        match usize::try_from(at) {
            Ok(at) if at <= self.data.len() => {
                self.at = at;
                Ok(())
            }
            _ => bail!("offset {at} past the end ({} bytes)", self.data.len()),
        }
    }

    /// A string table: a count, then each string's length and bytes.
    fn strings(&mut self) -> Result<Vec<String>> {
        let n = self.count("strings")?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let len = self.count("string bytes")?;
            let s = self.bytes(len)?;
            out.push(std::str::from_utf8(s).map_err(|_| anyhow!("a string that is not UTF-8 at offset {}", self.at))?.to_owned());
        }
        Ok(out)
    }
}

fn string(table: &[String], index: u32) -> Result<String> {
    table.get(index as usize).cloned().ok_or_else(|| anyhow!("string index {index} out of range ({} strings)", table.len()))
}

/// Decodes a meta-data file (`covmeta.<hash>`).
pub fn decode_meta(data: &[u8]) -> Result<Meta> {
    let mut r = Reader::new(data);
    if r.array::<4>()? != META_MAGIC {
        bail!("not a Go coverage meta-data file (wrong magic)");
    }
    let version = r.u32()?;
    if version != 1 {
        bail!("meta-data file version {version} (this reader knows 1)");
    }
    let _total_length = r.u64()?;
    let entries = r.u64()?;
    let hash = r.array::<16>()?;
    let _string_table = (r.u32()?, r.u32()?); // the file-level table holds nothing a report needs
    let mode = r.u8()?;
    let mode = MODE_NAMES.get(usize::from(mode)).copied().ok_or_else(|| anyhow!("unknown counter mode {mode}"))?;
    r.bytes(7)?;
    if entries > (data.len() / 16) as u64 {
        bail!("{entries} packages in a file of {} bytes", data.len());
    }
    let offsets = (0..entries).map(|_| r.u64()).collect::<Result<Vec<_>>>()?;
    let lengths = (0..entries).map(|_| r.u64()).collect::<Result<Vec<_>>>()?;
    let mut packages = Vec::with_capacity(offsets.len());
    for (i, (&off, &len)) in offsets.iter().zip(&lengths).enumerate() {
        let payload = usize::try_from(off)
            .ok()
            .zip(usize::try_from(len).ok())
            .and_then(|(off, len)| data.get(off..off.checked_add(len)?))
            .ok_or_else(|| anyhow!("package {i}: {len} bytes at offset {off}, past the end of the file ({} bytes)", data.len()))?;
        packages.push(decode_package(payload).with_context(|| format!("package {i}"))?);
    }
    Ok(Meta { hash, mode, packages })
}

fn decode_package(data: &[u8]) -> Result<Package> {
    let mut r = Reader::new(data);
    let _length = r.u32()?;
    let _name = r.u32()?;
    let path = r.u32()?;
    let _module_path = r.u32()?;
    r.bytes(16 + 4)?; // hash, padding
    let _files = r.u32()?;
    let nfuncs = r.u32()? as usize;
    if nfuncs > data.len() / 4 {
        bail!("{nfuncs} functions in {} bytes", data.len());
    }
    let offsets = (0..nfuncs).map(|_| r.u32()).collect::<Result<Vec<_>>>()?;
    let table = r.strings().context("string table")?;
    let path = string(&table, path)?;
    let mut functions = Vec::with_capacity(nfuncs);
    // A report visits every line of every block: a build's blocks span a
    // few lines each, so their lines are bounded by the meta-data's size.
    let mut line_budget = 64 * data.len() as u64 + 65536;
    for (i, &off) in offsets.iter().enumerate() {
        let f = (|| {
            r.seek(u64::from(off))?;
            let n = r.count("blocks")?;
            let name = string(&table, r.uleb32()?)?;
            let file = string(&table, r.uleb32()?)?;
            let blocks = (0..n)
                .map(|_| {
                    Ok(Block {
                        start_line: r.uleb32()?,
                        start_col: r.uleb32()?,
                        end_line: r.uleb32()?,
                        end_col: r.uleb32()?,
                        statements: r.uleb32()?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let _literal = r.uleb()?;
            for b in &blocks {
                let lines = u64::from(b.end_line.saturating_sub(b.start_line)) + 1;
                line_budget = line_budget
                    .checked_sub(lines)
                    .ok_or_else(|| anyhow!("blocks over more lines than {} bytes of meta-data can describe (lines {} to {})", data.len(), b.start_line, b.end_line))?;
            }
            Ok::<_, anyhow::Error>(Function { name, file, blocks })
        })()
        .with_context(|| format!("function {i}"))?;
        functions.push(f);
    }
    Ok(Package { path, functions })
}

/// Decodes a counter data file (`covcounters.<hash>.<pid>.<time>`).
pub fn decode_counters(data: &[u8]) -> Result<Counters> {
    let mut r = Reader::new(data);
    if r.array::<4>()? != COUNTER_MAGIC {
        bail!("not a Go coverage counter data file (wrong magic)");
    }
    let version = r.u32()?;
    if version != 1 {
        bail!("counter data file version {version} (this reader knows 1)");
    }
    let meta_hash = r.array::<16>()?;
    let flavor = r.u8()?;
    let big_endian = r.u8()? != 0;
    r.bytes(6)?;
    if flavor != 1 && flavor != 2 {
        bail!("counter flavor {flavor} (known: 1 raw, 2 ULEB128)");
    }
    let footer_at = data.len().checked_sub(COUNTER_FOOTER_SIZE).filter(|&at| at >= r.at);
    let footer_at = footer_at.ok_or_else(|| anyhow!("too short for its footer ({} bytes)", data.len()))?;
    let mut footer = Reader::new(&data[footer_at..]);
    if footer.array::<4>()? != COUNTER_MAGIC {
        bail!("no footer at the end of the file (wrong magic)");
    }
    footer.u32()?;
    let segments = footer.u32()?;
    if segments == 0 {
        bail!("a counter data file with no segments");
    }
    let mut functions = FunctionCounters::new();
    for s in 0..segments {
        let segment = (|| {
            let entries = r.u64()?;
            let strings = r.u32()? as usize;
            let args = r.u32()? as usize;
            r.bytes(strings)?;
            r.bytes(args)?;
            if r.at % 4 != 0 {
                r.bytes(4 - r.at % 4)?;
            }
            if entries > data.len() as u64 {
                bail!("{entries} functions in {} bytes", data.len());
            }
            for i in 0..entries {
                let mut value = || -> Result<u32> {
                    if flavor == 2 {
                        r.uleb32()
                    } else if big_endian {
                        Ok(u32::from_be_bytes(r.array()?))
                    } else {
                        r.u32()
                    }
                };
                let n = value()?;
                let key = (value()?, value()?);
                if n as usize > data.len() {
                    bail!("function {i}: {n} counters in {} bytes", data.len());
                }
                let values = (0..n).map(|_| value()).collect::<Result<Vec<_>>>()?;
                let sum = functions.entry(key).or_insert_with(|| vec![0; values.len()]);
                if sum.len() != values.len() {
                    bail!("package {} function {} has {} counters, {} in an earlier segment", key.0, key.1, values.len(), sum.len());
                }
                for (total, v) in sum.iter_mut().zip(values) {
                    *total = total.saturating_add(v);
                }
            }
            if r.array::<4>()? != COUNTER_MAGIC {
                bail!("no footer after its counters");
            }
            r.bytes(COUNTER_FOOTER_SIZE - 4)?;
            Ok(())
        })();
        segment.with_context(|| format!("segment {s}"))?;
    }
    if r.at != data.len() {
        bail!("{} bytes after the last segment", data.len() - r.at);
    }
    Ok(Counters { meta_hash, functions })
}

/// How to turn Go coverage into a report.
#[derive(Default)]
pub struct Options {
    /// Source files left out (matched against the path the meta-data names).
    pub ignore: Vec<regex_lite::Regex>,
}

/// One file of a report: DA counts by line, functions by (line, name) order
/// with their count.
#[derive(Default)]
struct FileRecord {
    lines: BTreeMap<u32, u64>,
    functions: Vec<(u32, String, u64)>,
}

/// The records of one build: `counters` (every counter file of the build,
/// added up) over `meta`.
fn build_records(meta: &Meta, counters: &FunctionCounters, options: &Options) -> Result<BTreeMap<String, FileRecord>> {
    for &(pkg, func) in counters.keys() {
        let blocks = meta.packages.get(pkg as usize).and_then(|p| p.functions.get(func as usize)).map(|f| f.blocks.len());
        match blocks {
            None => bail!("counters of package {pkg} function {func}, which the meta-data does not have"),
            Some(n) if n != counters[&(pkg, func)].len() => {
                bail!("package {pkg} function {func}: {} counters for {n} blocks", counters[&(pkg, func)].len())
            }
            Some(_) => {}
        }
    }
    // Per file: its functions as (line, name, count, blocks with counts).
    type Entry<'a> = (u32, &'a str, u64, Vec<(Block, u64)>);
    let mut by_file: BTreeMap<&str, Vec<Entry>> = BTreeMap::new();
    for (pi, package) in meta.packages.iter().enumerate() {
        if package.path == HOOK_PACKAGE || package.path.starts_with(&format!("{HOOK_PACKAGE}/")) {
            continue;
        }
        for (fi, function) in package.functions.iter().enumerate() {
            if function.blocks.is_empty() || options.ignore.iter().any(|re| re.is_match(&function.file)) {
                continue;
            }
            let values = counters.get(&(pi as u32, fi as u32));
            let count = |i: usize| values.and_then(|v| v.get(i)).map_or(0, |&c| u64::from(c));
            // The function's count is its first block's: the calls since start.
            let entry = (0..function.blocks.len())
                .min_by_key(|&i| (function.blocks[i].start_line, function.blocks[i].start_col))
                .unwrap_or(0);
            let line = function.blocks.iter().map(|b| b.start_line).min().unwrap_or(0);
            let blocks = function.blocks.iter().enumerate().map(|(i, b)| (*b, count(i))).collect();
            by_file.entry(&function.file).or_default().push((line, &function.name, count(entry), blocks));
        }
    }
    let mut records = BTreeMap::new();
    for (file, mut functions) in by_file {
        let mut record = FileRecord::default();
        for (_, _, _, blocks) in &functions {
            for (b, c) in blocks {
                for line in b.start_line..=b.end_line.max(b.start_line) {
                    let da = record.lines.entry(line).or_insert(0);
                    *da = (*da).max(*c);
                }
            }
        }
        functions.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        let names = unique_names(&functions.iter().map(|f| (f.0, f.1)).collect::<Vec<_>>());
        record.functions = functions.iter().zip(names).map(|(f, name)| (f.0, name, f.2)).collect();
        records.insert(file.to_owned(), record);
    }
    Ok(records)
}

/// Names unique in a file, as the Go hook makes them: a repeated name gets
/// ` (line N)`, and ` #2`, ` #3`... if that is not enough.
fn unique_names(functions: &[(u32, &str)]) -> Vec<String> {
    let mut count: HashMap<&str, usize> = HashMap::new();
    for (_, name) in functions {
        *count.entry(name).or_default() += 1;
    }
    let mut used = std::collections::HashSet::new();
    functions
        .iter()
        .map(|&(line, name)| {
            let base = if count[name] > 1 { format!("{name} (line {line})") } else { name.to_owned() };
            let mut unique = base.clone();
            let mut n = 2;
            while used.contains(&unique) {
                unique = format!("{base} #{n}");
                n += 1;
            }
            used.insert(unique.clone());
            unique
        })
        .collect()
}

/// The files of a GOCOVERDIR, by name: meta-data and counter files.
pub fn lcov_from_files(files: &[(String, Vec<u8>)], options: &Options) -> Result<String> {
    let mut metas: BTreeMap<[u8; 16], (String, Meta)> = BTreeMap::new();
    for (name, data) in files.iter().filter(|(name, _)| name.starts_with("covmeta.")) {
        let meta = decode_meta(data).with_context(|| format!("{name} is not a valid Go coverage meta-data file"))?;
        metas.insert(meta.hash, (name.clone(), meta));
    }
    if metas.is_empty() {
        bail!("no covmeta.* file: not a GOCOVERDIR (a Go program built with -cover writes one there at start)");
    }
    let mut sums: BTreeMap<[u8; 16], FunctionCounters> = BTreeMap::new();
    for (name, data) in files.iter().filter(|(name, _)| name.starts_with("covcounters.")) {
        let counters = decode_counters(data).with_context(|| format!("{name} is not a valid Go coverage counter data file"))?;
        if !metas.contains_key(&counters.meta_hash) {
            bail!("{name}: no covmeta.{} beside it (its build's meta-data file)", hex(&counters.meta_hash));
        }
        let sum = sums.entry(counters.meta_hash).or_default();
        for (key, values) in counters.functions {
            let total = sum.entry(key).or_insert_with(|| vec![0; values.len()]);
            if total.len() != values.len() {
                bail!("{name}: package {} function {} has {} counters, {} in another counter file", key.0, key.1, values.len(), total.len());
            }
            for (t, v) in total.iter_mut().zip(values) {
                *t = t.saturating_add(v);
            }
        }
    }
    let none = HashMap::new();
    let mut merged: BTreeMap<String, FileRecord> = BTreeMap::new();
    for (hash, (name, meta)) in &metas {
        let records = build_records(meta, sums.get(hash).unwrap_or(&none), options).with_context(|| name.clone())?;
        if metas.len() == 1 {
            merged = records;
            break;
        }
        for (file, record) in records {
            let into = merged.entry(file).or_default();
            for (line, c) in record.lines {
                *into.lines.entry(line).or_insert(0) += c;
            }
            for (line, name, c) in record.functions {
                match into.functions.iter_mut().find(|f| f.1 == name) {
                    Some(f) => f.2 += c,
                    None => into.functions.push((line, name, c)),
                }
            }
            into.functions.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        }
    }
    Ok(render(&merged))
}

/// The files of a GOCOVERDIR folder as LCOV.
pub fn lcov_from_dir(dir: &Path, options: &Options) -> Result<String> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("cannot read the folder {}", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot read the folder {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("covmeta.") || name.starts_with("covcounters.") {
            let data = std::fs::read(entry.path()).with_context(|| format!("cannot read {}", entry.path().display()))?;
            files.push((name, data));
        }
    }
    files.sort();
    lcov_from_files(&files, options).with_context(|| format!("in {}", dir.display()))
}

fn render(records: &BTreeMap<String, FileRecord>) -> String {
    let mut out = String::new();
    for (file, record) in records {
        let _ = writeln!(out, "SF:{file}");
        for (line, name, _) in &record.functions {
            let _ = writeln!(out, "FN:{line},{name}");
        }
        for (_, name, count) in &record.functions {
            let _ = writeln!(out, "FNDA:{count},{name}");
        }
        let hit = record.functions.iter().filter(|f| f.2 > 0).count();
        let _ = writeln!(out, "FNF:{}\nFNH:{hit}", record.functions.len());
        for (line, count) in &record.lines {
            let _ = writeln!(out, "DA:{line},{count}");
        }
        let lines_hit = record.lines.values().filter(|&&c| c > 0).count();
        let _ = writeln!(out, "BRF:0\nBRH:0\nLF:{}\nLH:{lines_hit}\nend_of_record", record.lines.len());
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uleb(out: &mut Vec<u8>, mut v: u64) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    /// A meta-data file of one package `p` with functions (name, blocks as
    /// (start line, end line)) in file `p/a.go`.
    fn meta_file(functions: &[(&str, &[(u32, u32)])]) -> Vec<u8> {
        let mut strings = vec!["p".to_owned(), "p/a.go".to_owned()];
        strings.extend(functions.iter().map(|f| f.0.to_owned()));
        let mut table = Vec::new();
        uleb(&mut table, strings.len() as u64);
        for s in &strings {
            uleb(&mut table, s.len() as u64);
            table.extend_from_slice(s.as_bytes());
        }
        let header = 44 + 4 * functions.len();
        let mut bodies = Vec::new();
        let mut offsets = Vec::new();
        for (i, (_, blocks)) in functions.iter().enumerate() {
            offsets.push((header + table.len() + bodies.len()) as u32);
            uleb(&mut bodies, blocks.len() as u64);
            uleb(&mut bodies, 2 + i as u64);
            uleb(&mut bodies, 1);
            for &(start, end) in blocks.iter() {
                for v in [start, 2, end, 10, 1] {
                    uleb(&mut bodies, u64::from(v));
                }
            }
            uleb(&mut bodies, 0);
        }
        let mut package = Vec::new();
        let length = (header + table.len() + bodies.len()) as u32;
        for v in [length, 0, 0, 0] {
            package.extend_from_slice(&v.to_le_bytes());
        }
        package.extend_from_slice(&[0; 20]);
        package.extend_from_slice(&1u32.to_le_bytes());
        package.extend_from_slice(&(functions.len() as u32).to_le_bytes());
        for o in offsets {
            package.extend_from_slice(&o.to_le_bytes());
        }
        package.extend_from_slice(&table);
        package.extend_from_slice(&bodies);

        let mut file = META_MAGIC.to_vec();
        file.extend_from_slice(&1u32.to_le_bytes());
        let start = 56 + 16;
        file.extend_from_slice(&((start + package.len()) as u64).to_le_bytes());
        file.extend_from_slice(&1u64.to_le_bytes());
        file.extend_from_slice(&[7; 16]);
        file.extend_from_slice(&[0; 8]);
        file.extend_from_slice(&[3, 1, 0, 0, 0, 0, 0, 0]);
        file.extend_from_slice(&(start as u64).to_le_bytes());
        file.extend_from_slice(&(package.len() as u64).to_le_bytes());
        file.extend_from_slice(&package);
        file
    }

    /// A counter data file (ULEB128) of one segment with `functions`
    /// (function index, counters) of package 0.
    fn counter_file(functions: &[(u32, &[u32])]) -> Vec<u8> {
        let mut file = COUNTER_MAGIC.to_vec();
        file.extend_from_slice(&1u32.to_le_bytes());
        file.extend_from_slice(&[7; 16]);
        file.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0, 0]);
        file.extend_from_slice(&(functions.len() as u64).to_le_bytes());
        file.extend_from_slice(&1u32.to_le_bytes()); // string table: no strings
        file.extend_from_slice(&3u32.to_le_bytes()); // args: none, padded
        file.extend_from_slice(&[0, 0, 0, 0]);
        for (f, counters) in functions {
            for v in [counters.len() as u32, 0, *f].iter().chain(counters.iter()) {
                uleb(&mut file, u64::from(*v));
            }
        }
        file.extend_from_slice(&COUNTER_MAGIC);
        file.extend_from_slice(&[0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        file
    }

    fn files(meta: Vec<u8>, counters: &[Vec<u8>]) -> Vec<(String, Vec<u8>)> {
        let mut out = vec![("covmeta.07".to_owned(), meta)];
        out.extend(counters.iter().enumerate().map(|(i, c)| (format!("covcounters.07.1.{i}"), c.clone())));
        out
    }

    #[test]
    fn lines_take_the_largest_count_of_their_blocks_and_files_add_up() {
        let meta = meta_file(&[("F", &[(3, 5), (5, 6)]), ("G", &[(9, 9)])]);
        let one = counter_file(&[(0, &[2, 7])]);
        let two = counter_file(&[(0, &[1, 0])]);
        let lcov = lcov_from_files(&files(meta, &[one, two]), &Options::default()).expect("valid files");
        assert_eq!(
            lcov,
            "SF:p/a.go\nFN:3,F\nFN:9,G\nFNDA:3,F\nFNDA:0,G\nFNF:2\nFNH:1\n\
             DA:3,3\nDA:4,3\nDA:5,7\nDA:6,7\nDA:9,0\nBRF:0\nBRH:0\nLF:5\nLH:4\nend_of_record\n"
        );
    }

    #[test]
    fn repeated_names_are_made_unique() {
        let meta = meta_file(&[("init", &[(3, 4)]), ("init", &[(8, 9)])]);
        let lcov = lcov_from_files(&files(meta, &[]), &Options::default()).expect("valid files");
        assert!(lcov.contains("FN:3,init (line 3)\nFN:8,init (line 8)\n"), "{lcov}");
    }

    #[test]
    fn malformed_files_are_refused_with_what_is_wrong() {
        let meta = meta_file(&[("F", &[(3, 5)])]);
        let counters = counter_file(&[(0, &[2])]);
        for cut in [0, 3, 10, 60, meta.len() - 1] {
            let err = lcov_from_files(&files(meta[..cut].to_vec(), &[]), &Options::default()).expect_err("truncated meta");
            assert!(format!("{err:#}").contains("covmeta.07 is not a valid Go coverage meta-data file"), "{err:#}");
        }
        for cut in [0, 20, 40, counters.len() - 1] {
            let err =
                lcov_from_files(&files(meta.clone(), &[counters[..cut].to_vec()]), &Options::default()).expect_err("truncated counters");
            assert!(format!("{err:#}").contains("is not a valid Go coverage counter data file"), "{err:#}");
        }
        let wrong_function = counter_file(&[(5, &[2])]);
        let err = lcov_from_files(&files(meta.clone(), &[wrong_function]), &Options::default()).expect_err("unknown function");
        assert!(format!("{err:#}").contains("which the meta-data does not have"), "{err:#}");
        let wrong_count = counter_file(&[(0, &[2, 3])]);
        let err = lcov_from_files(&files(meta.clone(), &[wrong_count]), &Options::default()).expect_err("too many counters");
        assert!(format!("{err:#}").contains("2 counters for 1 blocks"), "{err:#}");
        let err = lcov_from_files(&[], &Options::default()).expect_err("empty folder");
        assert!(format!("{err:#}").contains("not a GOCOVERDIR"), "{err:#}");
    }
}
