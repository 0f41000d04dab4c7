//! `livecov report`: LCOV files in, a coverage report where people look:
//! a table for a terminal or a pull-request comment, Cobertura XML for
//! GitLab, Jenkins and diff-cover, JSON for scripts; and a CI gate that
//! fails under a threshold.
//!
//! The inputs are merged as `livecov merge` merges them ([`Merger`]), and
//! the records of one source file under several test names are merged
//! into one. A file's numbers are its summary records when one input gave
//! them, else counted from the merged entries ([`RecordView::summary`]):
//! for llvm-cov's LCOV, and livecov's, the TOTAL row is then `llvm-cov
//! report`'s. Paths are rewritten with `--path-equivalence` as llvm-cov
//! rewrites them ([`PathEquivalence`](crate::path_equivalence::PathEquivalence)).

mod cobertura;

use std::fmt;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use crate::merge::{Merger, RecordView, Summary};
use crate::merge_command::merge_files;
use crate::output::Output;
use crate::path_equivalence::PathEquivalence;

#[derive(clap::Args, Debug)]
#[command(
    about = "Report LCOV coverage as a table, Cobertura XML or JSON; fail under a threshold",
    long_about = "Report LCOV coverage: the files are merged as `livecov merge` merges them, then \
                  written as a per-file table with a TOTAL row (text, or Markdown for a \
                  pull-request comment), as Cobertura XML (GitLab, Jenkins, pycobertura, \
                  diff-cover) or as JSON. Reads the LCOV of livecov, llvm-cov, lcov/geninfo, c8 \
                  and coverage.py. For llvm-cov's LCOV (and livecov's) the TOTAL row's functions, \
                  lines and branches are those of `llvm-cov report`. With --fail-under-*, the command \
                  writes the report, then exits 1 when coverage is under a threshold.",
    after_help = "Examples:\n  \
                  livecov report coverage.lcov\n  \
                  livecov report out/merged.lcov --format cobertura -o coverage.xml\n  \
                  livecov report reports/*.lcov --format markdown --fail-under-lines 80 > comment.md\n  \
                  livecov report app.lcov --path-equivalence /build/src,$PWD/src --ignore-filename-regex '/vendor/'"
)]
pub struct Args {
    /// LCOV files to report on (merged); `-` reads standard input.
    #[arg(value_name = "LCOV", required = true)]
    files: Vec<PathBuf>,
    /// The report's format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Write the report here (atomically) instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    output: Option<PathBuf>,
    /// Exit 1, after writing the report, when line coverage is under N percent.
    #[arg(long, value_name = "N", value_parser = Threshold::parse)]
    fail_under_lines: Option<Threshold>,
    /// Exit 1, after writing the report, when function coverage is under N percent.
    #[arg(long, value_name = "N", value_parser = Threshold::parse)]
    fail_under_functions: Option<Threshold>,
    /// Exit 1, after writing the report, when branch coverage is under N percent.
    #[arg(long, value_name = "N", value_parser = Threshold::parse)]
    fail_under_branches: Option<Threshold>,
    /// Rewrite paths that start with the folder FROM to start with TO
    /// instead (paths inside the image to the checkout), as llvm-cov's
    /// -path-equivalence; repeatable, the first that applies wins.
    #[arg(long, value_name = "FROM,TO", value_parser = PathEquivalence::parse)]
    path_equivalence: Vec<PathEquivalence>,
    /// Leave out files whose path (as in the LCOV, before
    /// --path-equivalence) matches RE (unanchored); repeatable.
    #[arg(long, value_name = "RE")]
    ignore_filename_regex: Vec<String>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    /// A per-file table and a TOTAL row, for a terminal.
    Text,
    /// The same table in Markdown, for a pull-request comment.
    Markdown,
    /// Cobertura XML (coverage-04.dtd).
    Cobertura,
    /// Per-file and total counts and percentages.
    Json,
}

/// Coverage under one or more `--fail-under-*` thresholds, after the report
/// was written: one line per threshold, naming it and the figure.
#[derive(Debug)]
pub struct UnderThreshold(pub Vec<String>);

impl fmt::Display for UnderThreshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("; "))
    }
}

impl std::error::Error for UnderThreshold {}

pub fn run(args: Args) -> Result<()> {
    let ignore = args
        .ignore_filename_regex
        .iter()
        .map(|re| regex_lite::Regex::new(re).with_context(|| format!("--ignore-filename-regex {re:?} is not a valid regular expression")))
        .collect::<Result<Vec<_>>>()?;
    // Opened first: a report that cannot be written fails before the work.
    let output = Output::open_derived(args.output.as_deref())?;
    let merger = read(&args.files)?
        .rekey(|_test, file| {
            if ignore.iter().any(|re| re.is_match(file)) {
                return None;
            }
            Some((String::new(), PathEquivalence::rewrite(&args.path_equivalence, file)))
        });
    let report = Report::new(&merger);
    match args.format {
        Format::Text => output.commit(report.text().as_bytes())?,
        Format::Markdown => output.commit(report.markdown().as_bytes())?,
        Format::Json => output.commit(report.json().as_bytes())?,
        Format::Cobertura => output.commit(cobertura::xml(&report.files, cobertura::timestamp_ms()?).as_bytes())?,
    }
    let under: Vec<String> = [
        ("line", "--fail-under-lines", &args.fail_under_lines, report.total.lines, report.total.lines_hit),
        ("function", "--fail-under-functions", &args.fail_under_functions, report.total.functions, report.total.functions_hit),
        ("branch", "--fail-under-branches", &args.fail_under_branches, report.total.branches, report.total.branches_hit),
    ]
    .into_iter()
    .filter_map(|(what, flag, threshold, found, hit)| {
        let threshold = threshold.as_ref()?;
        threshold.fails(found, hit).then(|| {
            format!("{what} coverage {}% ({hit}/{found}) is under {flag} {}", percent(found, hit), threshold.text)
        })
    })
    .collect();
    if !under.is_empty() {
        return Err(UnderThreshold(under).into());
    }
    Ok(())
}

/// Reads and merges the inputs; an input with no record is not LCOV.
fn read(files: &[PathBuf]) -> Result<Merger> {
    let mut merger = Merger::new();
    for file in files {
        let one = merge_files(std::slice::from_ref(file))?;
        if one.is_empty() {
            bail!(
                "{}: no coverage record in it (no SF: line): is it LCOV? \
                 (`livecov dump`, `livecov collect`, `llvm-cov export -format=lcov`, c8 --reporter=lcov \
                 and `coverage lcov` write LCOV)",
                if file.as_os_str() == "-" { "<stdin>".into() } else { file.display().to_string() }
            );
        }
        merger.absorb(one);
    }
    Ok(merger)
}

// ---------------------------------------------------------------- the model

/// The report's rows: one per source file, sorted by path.
struct Report<'a> {
    files: Vec<File<'a>>,
    total: Summary,
    /// The length of the folder every path starts with, cut off in the
    /// tables as llvm-cov cuts it (only when there are several files).
    common: usize,
}

struct File<'a> {
    record: RecordView<'a>,
    summary: Summary,
}

impl<'a> Report<'a> {
    fn new(merger: &'a Merger) -> Report<'a> {
        let files: Vec<File> = merger.records().map(|record| File { record, summary: record.summary() }).collect();
        let mut total = Summary::default();
        for f in &files {
            total.add(f.summary);
        }
        let paths: Vec<&str> = files.iter().map(|f| f.record.file()).collect();
        let common = if paths.len() > 1 { common_folder(&paths) } else { 0 };
        Report { files, total, common }
    }

    /// The table's rows: the files (named without the common folder), then TOTAL.
    fn rows(&self) -> Vec<(&str, &Summary)> {
        let mut rows: Vec<(&str, &Summary)> = self.files.iter().map(|f| (&f.record.file()[self.common..], &f.summary)).collect();
        rows.push(("TOTAL", &self.total));
        rows
    }

    /// llvm-cov report's table, for functions, lines and branches.
    fn text(&self) -> String {
        let header = [
            "Filename",
            "Functions",
            "Missed Functions",
            "Executed",
            "Lines",
            "Missed Lines",
            "Cover",
            "Branches",
            "Missed Branches",
            "Cover",
        ];
        let rows: Vec<(&str, Vec<String>)> = self
            .rows()
            .into_iter()
            .map(|(name, s)| {
                let cells = [(s.functions, s.functions_hit), (s.lines, s.lines_hit), (s.branches, s.branches_hit)]
                    .into_iter()
                    .flat_map(|(found, hit)| [found.to_string(), (found - hit).to_string(), percent_cell(found, hit)]);
                (name, cells.collect())
            })
            .collect();
        let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
        for (name, cells) in &rows {
            widths[0] = widths[0].max(name.chars().count());
            for (w, c) in widths[1..].iter_mut().zip(cells) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |name: &str, cells: &[&str]| {
            let mut s = format!("{name:<width$}", width = widths[0]);
            for (c, w) in cells.iter().zip(&widths[1..]) {
                s.push_str(&format!("  {c:>w$}"));
            }
            s.push('\n');
            s
        };
        let divider = format!("{}\n", "-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
        let mut out = line(header[0], &header[1..]);
        out.push_str(&divider);
        let last = rows.len() - 1;
        for (i, (name, cells)) in rows.iter().enumerate() {
            if i == last {
                out.push_str(&divider);
            }
            out.push_str(&line(name, &cells.iter().map(String::as_str).collect::<Vec<_>>()));
        }
        out
    }

    /// A GitHub-flavoured Markdown table: per kind, the percentage and hit/found.
    fn markdown(&self) -> String {
        let cell = |found: u64, hit: u64| {
            if found == 0 {
                "-".to_owned()
            } else {
                format!("{}% ({hit}/{found})", percent(found, hit))
            }
        };
        let mut out = String::from("| File | Functions | Lines | Branches |\n|:---|---:|---:|---:|\n");
        for (name, s) in self.rows() {
            let cells = [cell(s.functions, s.functions_hit), cell(s.lines, s.lines_hit), cell(s.branches, s.branches_hit)];
            let row = if std::ptr::eq(s, &self.total) {
                format!("| **TOTAL** | **{}** | **{}** | **{}** |\n", cells[0], cells[1], cells[2])
            } else {
                format!("| {} | {} | {} | {} |\n", markdown_code(name), cells[0], cells[1], cells[2])
            };
            out.push_str(&row);
        }
        out
    }

    /// The shape of an agent's `GET /coverage?format=json` (full paths),
    /// with percentages (`null` when there is nothing of a kind).
    fn json(&self) -> String {
        let counts = |s: &Summary| {
            serde_json::json!({
                "lines": s.lines, "lines_hit": s.lines_hit, "lines_percent": percent_json(s.lines, s.lines_hit),
                "functions": s.functions, "functions_hit": s.functions_hit,
                "functions_percent": percent_json(s.functions, s.functions_hit),
                "branches": s.branches, "branches_hit": s.branches_hit,
                "branches_percent": percent_json(s.branches, s.branches_hit),
            })
        };
        let files: Vec<serde_json::Value> = self
            .files
            .iter()
            .map(|f| {
                let mut v = counts(&f.summary);
                v["file"] = f.record.file().into();
                v
            })
            .collect();
        let mut totals = counts(&self.total);
        totals["files"] = self.files.len().into();
        let mut text = serde_json::to_string_pretty(&serde_json::json!({ "files": files, "totals": totals }))
            .expect("JSON of numbers and strings");
        text.push('\n');
        text
    }
}

/// `hit` of `found` as a percentage with two decimals, computed and
/// rounded as llvm-cov computes and prints it. Nothing found is 100:
/// nothing was missed.
fn percent(found: u64, hit: u64) -> String {
    if found == 0 {
        return "100.00".to_owned();
    }
    format!("{:.2}", hit as f64 / found as f64 * 100.0)
}

/// A table cell: the percentage, or `-` when there is nothing of a kind (as llvm-cov).
pub(crate) fn percent_cell(found: u64, hit: u64) -> String {
    if found == 0 {
        "-".to_owned()
    } else {
        format!("{}%", percent(found, hit))
    }
}

fn percent_json(found: u64, hit: u64) -> serde_json::Value {
    if found == 0 {
        return serde_json::Value::Null;
    }
    // Two decimals, as the tables show it.
    percent(found, hit).parse::<f64>().map_or(serde_json::Value::Null, serde_json::Value::from)
}

/// `text` as a Markdown code span, with `|` escaped for a table cell.
fn markdown_code(text: &str) -> String {
    // The fence is one backtick longer than the longest run in the text.
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat(longest + 1);
    let pad = if longest > 0 { " " } else { "" };
    format!("{fence}{pad}{}{pad}{fence}", text.replace('|', "\\|"))
}

/// The byte length of the longest folder (ending in `/`) that every path
/// starts with; 0 when there is none.
fn common_folder(paths: &[&str]) -> usize {
    let folder = |p: &str| p.rfind('/').map_or(0, |i| i + 1);
    let Some(first) = paths.first() else { return 0 };
    let mut len = folder(first);
    for p in &paths[1..] {
        let other = &p.as_bytes()[..folder(p)];
        let same = first.as_bytes()[..len].iter().zip(other).take_while(|(a, b)| a == b).count();
        // Back to the last separator of the common part: a whole folder.
        len = first.as_bytes()[..same].iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    }
    len
}

// ---------------------------------------------------------------- thresholds

/// A `--fail-under-*` percentage, kept as a fraction so that the
/// comparison is exact: 80 is 80/1, 72.5 is 725/10.
#[derive(Debug, Clone)]
struct Threshold {
    numerator: u128,
    denominator: u128,
    text: String,
}

impl Threshold {
    fn parse(s: &str) -> Result<Threshold, String> {
        let bad = || format!("{s:?} is not a percentage: give a number from 0 to 100, such as 80 or 72.5");
        let (int, frac) = s.split_once('.').unwrap_or((s, ""));
        if int.is_empty() || int.len() > 3 || frac.len() > 6 || !(int.bytes().chain(frac.bytes())).all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        if s.ends_with('.') {
            return Err(bad());
        }
        let digits: u128 = format!("{int}{frac}").parse().map_err(|_| bad())?;
        let denominator = 10u128.pow(frac.len() as u32);
        if digits > 100 * denominator {
            return Err(format!("{s} is over 100: a coverage threshold is a percentage from 0 to 100"));
        }
        Ok(Threshold { numerator: digits, denominator, text: s.to_owned() })
    }

    /// Whether `hit` of `found` is under this percentage. Nothing found is
    /// never under: there is nothing to cover.
    fn fails(&self, found: u64, hit: u64) -> bool {
        found > 0 && u128::from(hit) * 100 * self.denominator < self.numerator * u128::from(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_compare_exactly() {
        let t = Threshold::parse("80").unwrap();
        assert!(!t.fails(10, 8));
        assert!(t.fails(10, 7));
        assert!(t.fails(1_000_000, 799_999));
        let t = Threshold::parse("72.5").unwrap();
        assert!(!t.fails(40, 29));
        assert!(t.fails(1000, 724));
        assert!(!Threshold::parse("100").unwrap().fails(3, 3));
        assert!(Threshold::parse("100").unwrap().fails(3, 2));
        assert!(!Threshold::parse("0").unwrap().fails(3, 0));
        assert!(!Threshold::parse("50").unwrap().fails(0, 0), "nothing to cover");
        for bad in ["", "abc", "-1", "100.1", "101", "80%", "1e2", ".5", "5.", "1.2.3"] {
            assert!(Threshold::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn percentages_are_llvm_covs() {
        assert_eq!(percent(3, 2), "66.67");
        assert_eq!(percent(94, 33), "35.11");
        // printf's rounding of the exact value: 3.125 is a tie, to even.
        assert_eq!(percent(32, 1), "3.12");
        assert_eq!(percent(4, 4), "100.00");
        assert_eq!(percent(0, 0), "100.00");
    }

    #[test]
    fn the_common_folder_is_whole_folders() {
        assert_eq!(common_folder(&["/a/b/c.c", "/a/b/d.c"]), "/a/b/".len());
        assert_eq!(common_folder(&["/a/bc/c.c", "/a/bd/d.c"]), "/a/".len());
        assert_eq!(common_folder(&["/a/b/c.c", "/a/b/e/d.c"]), "/a/b/".len());
        assert_eq!(common_folder(&["src/a.rs", "/x/b.rs"]), 0);
        assert_eq!(common_folder(&["a.rs", "b.rs"]), 0);
    }

    #[test]
    fn a_file_of_one_input_keeps_its_summary_records_and_a_merged_one_is_counted() {
        // LF/BRF as llvm-cov writes them: from function summaries, not the entries.
        let one = "SF:/r/a.c\nFNDA:1,f\nFNF:1\nFNH:1\nDA:1,1\nDA:2,0\nBRDA:1,0,0,1\nBRF:2\nBRH:1\nLF:3\nLH:1\nend_of_record\n";
        let mut m = Merger::new();
        m.add("one", one).unwrap();
        let s = m.records().next().unwrap().summary();
        assert_eq!((s.lines, s.lines_hit, s.branches, s.branches_hit, s.functions), (3, 1, 2, 1, 1));
        // Two inputs, or the same file under two test names: counted.
        m.add("two", one).unwrap();
        assert_eq!(m.records().next().unwrap().summary().lines, 2);
        let mut m = Merger::new();
        m.add("tests", &format!("TN:a\n{one}TN:b\n{one}")).unwrap();
        assert_eq!(m.records().map(|r| r.summary().lines).collect::<Vec<_>>(), [3, 3]);
        let m = m.rekey(|_, file| Some((String::new(), file.to_owned())));
        let s = m.records().next().unwrap().summary();
        assert_eq!((s.lines, s.lines_hit, s.branches), (2, 1, 1));
    }

    #[test]
    fn markdown_names_are_code_spans() {
        assert_eq!(markdown_code("src/a_b.rs"), "`src/a_b.rs`");
        assert_eq!(markdown_code("a|b`c"), "`` a\\|b`c ``");
    }
}
