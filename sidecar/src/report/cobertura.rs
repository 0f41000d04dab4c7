//! Cobertura XML (coverage-04.dtd), as GitLab, Jenkins' Cobertura plugin,
//! pycobertura and diff-cover read it, in the layout coverage.py writes:
//! one `<source>`, the folder every file is in; a package per folder
//! (dotted, `.` for the top); a class per file, its `filename` relative to
//! the source; a line per `DA` line with its hits and, where `BRDA`
//! entries are, `branch="true"` and `condition-coverage="50% (1/2)"`.
//!
//! Every rate and total is counted from the lines and branches the
//! document lists, as its readers count them again: a document agrees
//! with itself. (For llvm-cov's LCOV these counts can differ a little from
//! its `LF`/`BRF`, which the tables show: see docs/formats.md.)
//!
//! Written by hand: the document has a fixed shape, and its only variable
//! parts are attribute values, whose escaping is below; an XML writer
//! crate would add a dependency for that alone, and would still leave the
//! characters XML 1.0 cannot hold at all to us.

use std::collections::BTreeMap;
use std::fmt::Write;

use anyhow::{Context, Result};

use super::{common_folder, File};

/// Milliseconds since the epoch, as Cobertura's `timestamp` (coverage.py's
/// too); `SOURCE_DATE_EPOCH` (seconds), when set, for reproducible output.
pub(super) fn timestamp_ms() -> Result<u128> {
    if let Some(epoch) = std::env::var_os("SOURCE_DATE_EPOCH") {
        let secs: u128 = epoch
            .to_str()
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("SOURCE_DATE_EPOCH={epoch:?} is not a number of seconds: unset it or fix it"))?;
        return Ok(secs * 1000);
    }
    Ok(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis()))
}

/// Lines and branches found and hit.
#[derive(Default, Clone, Copy)]
struct Counts {
    lines: u64,
    lines_hit: u64,
    branches: u64,
    branches_hit: u64,
}

impl Counts {
    fn add(&mut self, other: Counts) {
        self.lines += other.lines;
        self.lines_hit += other.lines_hit;
        self.branches += other.branches;
        self.branches_hit += other.branches_hit;
    }

    fn rates(&self) -> String {
        format!(r#"line-rate="{}" branch-rate="{}""#, rate(self.lines, self.lines_hit), rate(self.branches, self.branches_hit))
    }
}

/// One `<line>`: hits, and branches found and taken.
#[derive(Default)]
struct Line {
    hits: Option<u64>,
    branches: u64,
    taken: u64,
    most_taken: u64,
}

/// A class's `<lines>` and its counts.
fn class_lines(file: &File) -> (String, Counts) {
    let mut lines: BTreeMap<u32, Line> = BTreeMap::new();
    for (n, hits) in file.record.lines() {
        lines.entry(n).or_default().hits = Some(hits);
    }
    for (n, taken) in file.record.branches() {
        let line = lines.entry(n).or_default();
        let taken = taken.unwrap_or(0);
        line.branches += 1;
        line.taken += u64::from(taken > 0);
        line.most_taken = line.most_taken.max(taken);
    }
    let mut out = String::new();
    let mut counts = Counts::default();
    for (n, line) in &lines {
        // A branch on a line with no DA entry: the line ran at least as
        // often as its most taken branch.
        let hits = line.hits.unwrap_or(line.most_taken);
        counts.lines += 1;
        counts.lines_hit += u64::from(hits > 0);
        let _ = write!(out, r#"          <line number="{n}" hits="{hits}""#);
        if line.branches > 0 {
            counts.branches += line.branches;
            counts.branches_hit += line.taken;
            let pct = line.taken * 100 / line.branches;
            let _ = write!(out, r#" branch="true" condition-coverage="{pct}% ({}/{})""#, line.taken, line.branches);
        } else {
            out.push_str(r#" branch="false""#);
        }
        out.push_str("/>\n");
    }
    (out, counts)
}

/// The document for `files` (sorted by path), stamped `timestamp` (ms).
pub(super) fn xml(files: &[File], timestamp: u128) -> String {
    let paths: Vec<&str> = files.iter().map(|f| f.record.file()).collect();
    // The source is the folder of every file when all paths are absolute;
    // relative paths stay as they are, under `.`.
    let root = if !paths.is_empty() && paths.iter().all(|p| p.starts_with('/')) { common_folder(&paths) } else { 0 };
    let source = match &paths.first().map(|p| &p[..root]) {
        Some("") | None => ".",
        Some("/") => "/",
        Some(folder) => folder.trim_end_matches('/'),
    };

    // package (folder) -> classes, in path order.
    let mut packages: BTreeMap<String, (String, Counts)> = BTreeMap::new();
    for file in files {
        let relative = &file.record.file()[root..];
        let (folder, name) = relative.rsplit_once('/').unwrap_or(("", relative));
        let package = if folder.is_empty() { ".".to_owned() } else { folder.replace('/', ".") };
        let (lines, counts) = class_lines(file);
        let (classes, total) = packages.entry(package).or_default();
        total.add(counts);
        let _ = write!(
            classes,
            "        <class name=\"{}\" filename=\"{}\" complexity=\"0\" {}>\n          <methods/>\n          <lines>\n{lines}          </lines>\n        </class>\n",
            escape(name),
            escape(relative),
            counts.rates(),
        );
    }
    let mut total = Counts::default();
    for (_, counts) in packages.values() {
        total.add(*counts);
    }

    let mut out = String::with_capacity(1024);
    out.push_str("<?xml version=\"1.0\" ?>\n");
    out.push_str("<!DOCTYPE coverage SYSTEM \"http://cobertura.sourceforge.net/xml/coverage-04.dtd\">\n");
    let _ = writeln!(
        out,
        r#"<coverage version="livecov {}" timestamp="{timestamp}" lines-valid="{}" lines-covered="{}" {} branches-valid="{}" branches-covered="{}" complexity="0">"#,
        env!("CARGO_PKG_VERSION"),
        total.lines,
        total.lines_hit,
        total.rates(),
        total.branches,
        total.branches_hit,
    );
    let _ = writeln!(out, "  <sources>\n    <source>{}</source>\n  </sources>\n  <packages>", escape(source));
    for (name, (classes, counts)) in &packages {
        let _ = writeln!(out, "    <package name=\"{}\" {} complexity=\"0\">\n      <classes>", escape(name), counts.rates());
        out.push_str(classes);
        out.push_str("      </classes>\n    </package>\n");
    }
    out.push_str("  </packages>\n</coverage>\n");
    out
}

/// `hit / found` with four decimals, rounded down; 1 when nothing was
/// found (nothing was missed), as coverage.py writes it.
fn rate(found: u64, hit: u64) -> String {
    if found == 0 {
        return "1".to_owned();
    }
    let q = u128::from(hit.min(found)) * 10_000 / u128::from(found);
    format!("{}.{:04}", q / 10_000, q % 10_000)
}

/// Text for an attribute value or an element: markup characters as
/// entities, tabs and line ends as character references (a parser would
/// turn them into spaces in an attribute), and the characters XML 1.0 does
/// not allow at all (other control characters, U+FFFE, U+FFFF) as U+FFFD.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' => out.push_str("&#9;"),
            '\n' => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            c if c < ' ' || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge::Merger;

    #[test]
    fn escapes_what_xml_cannot_hold() {
        assert_eq!(escape("a<b>&\"c'\td\u{1}\u{FFFF}é"), "a&lt;b&gt;&amp;&quot;c&apos;&#9;d\u{FFFD}\u{FFFD}é");
    }

    #[test]
    fn rates_round_down() {
        assert_eq!(rate(3, 2), "0.6666");
        assert_eq!(rate(3, 3), "1.0000");
        assert_eq!(rate(0, 0), "1");
    }

    #[test]
    fn packages_per_folder_classes_per_file() {
        let mut m = Merger::new();
        m.add(
            "a",
            "SF:/r/src/a.c\nDA:1,1\nDA:2,0\nBRDA:2,0,0,1\nBRDA:2,0,1,-\nBRDA:3,0,0,2\nend_of_record\n\
             SF:/r/b.c\nDA:1,0\nend_of_record\n",
        )
        .unwrap();
        let report = super::super::Report::new(&m);
        let xml = xml(&report.files, 1000);
        assert!(xml.contains(r#"lines-valid="4" lines-covered="2" line-rate="0.5000" branch-rate="0.6666" branches-valid="3" branches-covered="2""#), "{xml}");
        assert!(xml.contains("<source>/r</source>"), "{xml}");
        assert!(xml.contains(r#"<package name="." line-rate="0.0000" branch-rate="1""#), "{xml}");
        assert!(xml.contains(r#"<package name="src" "#), "{xml}");
        assert!(xml.contains(r#"<class name="a.c" filename="src/a.c" "#), "{xml}");
        assert!(xml.contains(r#"<line number="2" hits="0" branch="true" condition-coverage="50% (1/2)"/>"#), "{xml}");
        // A branch line without DA: hits from its branch.
        assert!(xml.contains(r#"<line number="3" hits="2" branch="true" condition-coverage="100% (1/1)"/>"#), "{xml}");
    }
}
