//! llvm-cov's JSON export, byte for byte as `llvm-cov export -format=text`
//! (LLVM 22, format version 3.1.0) writes it.
//!
//! Tools that read coverage as JSON expect llvm-cov's document: its region,
//! segment and branch detail, which LCOV cannot carry, and its summaries
//! (lines, functions, instantiations, regions, branches, MC/DC). The text is
//! written by hand rather than with a JSON library because the bytes must be
//! llvm::json's: object keys sorted, no spaces, strings escaped its way, and
//! percentages printed as `%.17g` prints doubles.
//!
//! MC/DC records (`-fcoverage-mcdc` builds, see [`crate::mcdc`]) are
//! listed per function (all of its decisions) and per file (the decisions
//! in that file of every function that maps into it, macro expansions
//! included). Summaries count the conditions that are not constant-folded
//! of the decisions in each function's own file (not those in macros), a
//! condition covered when an independence pair covers it; instantiations
//! merge by the larger numbers, as for branches.

use std::io::Write;

use crate::coverage::{line_stats, CountedRegion, Coverage, CoverageData, Expansion, Segment};
use crate::lcov::{reported_files, Options};
use crate::mapping::{FileName, RegionKind};
use crate::mcdc::McdcRecord;

/// Writes the JSON export of `coverage` (from [`Coverage::new`], which
/// finds the MC/DC records) to `out`, file by file. Of
/// `options`, `ignore_filename_regex`, `skip_functions` and `summary_only`
/// apply, as llvm-cov applies them to this format (the function list is
/// never filtered by file name); the others are LCOV's.
pub fn write_to(coverage: &Coverage<'_>, options: &Options, out: &mut impl Write) -> std::io::Result<()> {
    let files = reported_files(coverage, options);
    let mut totals = Summary::default();
    let mut text = String::new();
    let mut data = CoverageData::default();
    out.write_all(b"{\"data\":[{\"files\":[")?;
    for (i, &file) in files.iter().enumerate() {
        text.clear();
        if i > 0 {
            text.push(',');
        }
        let summary = file_summary(coverage, file, &mut data);
        totals.add(&summary);
        write_file(&mut text, coverage, file, &summary, options, &mut data);
        out.write_all(text.as_bytes())?;
    }
    out.write_all(b"]")?;
    if !options.summary_only && !options.skip_functions {
        out.write_all(b",\"functions\":[")?;
        for (i, f) in coverage.functions.iter().enumerate() {
            text.clear();
            if i > 0 {
                text.push(',');
            }
            text.push_str("{\"branches\":");
            push_branches(&mut text, f.branches.iter().filter(|b| is_unfolded(b)));
            text.push_str(",\"count\":");
            push_count(&mut text, f.execution_count);
            text.push_str(",\"filenames\":");
            push_file_names(&mut text, coverage, f.filenames);
            text.push_str(",\"mcdc_records\":");
            push_mcdc_records(&mut text, f.mcdc_records.iter());
            text.push_str(",\"name\":");
            push_string(&mut text, coverage.name_of(f));
            text.push_str(",\"regions\":");
            push_regions(&mut text, &f.regions);
            text.push('}');
            out.write_all(text.as_bytes())?;
        }
        out.write_all(b"]")?;
    }
    text.clear();
    text.push_str(",\"totals\":");
    push_summary(&mut text, &totals);
    text.push_str("}],\"type\":\"llvm.coverage.json.export\",\"version\":\"3.1.0\"}");
    out.write_all(text.as_bytes())
}

/// One file's object: its detail (unless `summary_only`) and its summary.
fn write_file<'m>(
    out: &mut String,
    coverage: &Coverage<'m>,
    file: FileName,
    summary: &Summary,
    options: &Options,
    data: &mut CoverageData<'m>,
) {
    out.push('{');
    if !options.summary_only {
        coverage.for_file_into(file, data);
        // The file's own branches are all listed, folded ones too; those of
        // expansions and functions are not (llvm-cov's renderFileBranches
        // against renderBranchRegions).
        out.push_str("\"branches\":");
        push_branches(out, data.branches.iter());
        out.push_str(",\"expansions\":[");
        for (i, e) in data.expansions.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_expansion(out, coverage, e);
        }
        out.push_str("],");
    }
    out.push_str("\"filename\":");
    push_string(out, coverage.mapping.file_name(file));
    if !options.summary_only {
        out.push_str(",\"mcdc_records\":");
        let records = coverage.functions_touching(file).iter().flat_map(|&i| {
            let f = &coverage.functions[i];
            f.mcdc_records.iter().filter(move |r| f.filenames.get(r.decision.file_id as usize) == Some(&file))
        });
        push_mcdc_records(out, records);
        out.push_str(",\"segments\":");
        push_segments(out, &data.segments);
    }
    out.push_str(",\"summary\":");
    push_summary(out, summary);
    out.push('}');
}

/// An expansion: the region that expands, every region of the function it
/// belongs to (not only the expanded file's, as llvm-cov lists them), and
/// the branches of the expanded file and of the expansions nested in it.
fn push_expansion<'m>(out: &mut String, coverage: &Coverage<'m>, e: &Expansion<'m>) {
    let f = &coverage.functions[e.function];
    let mut branches = Vec::new();
    nested_branches(coverage, e, &mut branches);
    out.push_str("{\"branches\":");
    push_branches(out, branches.iter().filter(|b| is_unfolded(b)));
    out.push_str(",\"filenames\":");
    push_file_names(out, coverage, f.filenames);
    out.push_str(",\"source_region\":");
    push_region(out, &e.region);
    out.push_str(",\"target_regions\":");
    push_regions(out, &f.regions);
    out.push('}');
}

/// The branches of what `e` expands to, those of nested expansions first,
/// as llvm-cov's collectNestedBranches orders them.
fn nested_branches<'m>(coverage: &Coverage<'m>, e: &Expansion<'m>, out: &mut Vec<CountedRegion<'m>>) {
    let inner = coverage.for_expansion(e);
    for nested in &inner.expansions {
        nested_branches(coverage, nested, out);
    }
    out.extend(inner.branches.iter().filter(|b| b.region.file_id == e.region.region.expanded_file_id).copied());
}

fn is_unfolded(b: &CountedRegion<'_>) -> bool {
    !b.true_folded() || !b.false_folded()
}

/// Covered and total of one measure.
#[derive(Debug, Clone, Copy, Default)]
struct Ratio {
    covered: u64,
    count: u64,
}

impl Ratio {
    fn add(&mut self, other: Ratio) {
        self.covered += other.covered;
        self.count += other.count;
    }

    /// Instantiations of one group merge by taking the larger numbers.
    fn merge_max(&mut self, other: Ratio) {
        self.covered = self.covered.max(other.covered);
        self.count = self.count.max(other.count);
    }

    fn count_one(&mut self, covered: bool) {
        self.count += 1;
        self.covered += u64::from(covered);
    }

    /// As llvm-cov computes it, in this order, so the double is the same.
    fn percent(&self) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        self.covered as f64 / self.count as f64 * 100.0
    }
}

/// llvm-cov's `FileCoverageSummary` (or of one function, without the
/// function counts).
#[derive(Debug, Clone, Copy, Default)]
struct Summary {
    lines: Ratio,
    regions: Ratio,
    branches: Ratio,
    functions: Ratio,
    instantiations: Ratio,
    mcdc: Ratio,
}

impl Summary {
    fn add(&mut self, other: &Summary) {
        self.lines.add(other.lines);
        self.regions.add(other.regions);
        self.branches.add(other.branches);
        self.functions.add(other.functions);
        self.instantiations.add(other.instantiations);
        self.mcdc.add(other.mcdc);
    }

    fn merge_max(&mut self, other: &Summary) {
        self.lines.merge_max(other.lines);
        self.regions.merge_max(other.regions);
        self.branches.merge_max(other.branches);
        self.mcdc.merge_max(other.mcdc);
    }
}

/// A file's summary: per instantiation group the larger numbers of its
/// instances, groups added up; a group counts as a function executed when
/// any of its instances ran.
fn file_summary<'m>(coverage: &Coverage<'m>, file: FileName, data: &mut CoverageData<'m>) -> Summary {
    let mut total = Summary::default();
    for group in coverage.instantiation_groups(file) {
        let mut merged: Option<Summary> = None;
        let mut executions = 0u64;
        for &index in &group {
            let s = function_summary(coverage, index, data);
            let count = coverage.functions[index].execution_count;
            executions = executions.wrapping_add(count);
            total.instantiations.count_one(count > 0);
            match &mut merged {
                None => merged = Some(s),
                Some(m) => m.merge_max(&s),
            }
        }
        if let Some(m) = merged {
            total.add(&m);
            total.functions.count_one(executions > 0);
        }
    }
    total
}

/// One function's lines (of its own file), code regions (of every file it
/// maps, macros included) and branches (its own file's and those of the
/// expansions in it, nested ones too).
fn function_summary<'m>(coverage: &Coverage<'m>, index: usize, data: &mut CoverageData<'m>) -> Summary {
    let f = &coverage.functions[index];
    let mut s = Summary::default();
    for r in f.regions.iter().filter(|r| r.region.kind == RegionKind::Code) {
        s.regions.count_one(r.count != 0);
    }
    for r in f.mcdc_records.iter().filter(|r| Some(r.decision.file_id) == f.main_file) {
        let (count, covered) = r.pairs();
        s.mcdc.add(Ratio { covered, count });
    }
    coverage.for_function_into(index, data);
    line_stats(&data.segments, |l, run| {
        if l.mapped {
            s.lines.count += u64::from(run);
            s.lines.covered += if l.count > 0 { u64::from(run) } else { 0 };
        }
    });
    add_branches(&mut s.branches, &data.branches);
    for e in &data.expansions {
        add_expansion_branches(coverage, e, &mut s.branches);
    }
    s
}

fn add_expansion_branches<'m>(coverage: &Coverage<'m>, e: &Expansion<'m>, ratio: &mut Ratio) {
    let inner = coverage.for_expansion(e);
    add_branches(ratio, &inner.branches);
    for nested in &inner.expansions {
        add_expansion_branches(coverage, nested, ratio);
    }
}

/// Each side of a branch that is not folded to a constant is one branch.
fn add_branches(ratio: &mut Ratio, branches: &[CountedRegion<'_>]) {
    for b in branches {
        if !b.true_folded() {
            ratio.count_one(b.count > 0);
        }
        if !b.false_folded() {
            ratio.count_one(b.false_count > 0);
        }
    }
}

fn push_summary(out: &mut String, s: &Summary) {
    out.push_str("{\"branches\":");
    push_ratio(out, &s.branches, true);
    out.push_str(",\"functions\":");
    push_ratio(out, &s.functions, false);
    out.push_str(",\"instantiations\":");
    push_ratio(out, &s.instantiations, false);
    out.push_str(",\"lines\":");
    push_ratio(out, &s.lines, false);
    out.push_str(",\"mcdc\":");
    push_ratio(out, &s.mcdc, true);
    out.push_str(",\"regions\":");
    push_ratio(out, &s.regions, true);
    out.push('}');
}

/// `{"count","covered"[,"notcovered"],"percent"}`: llvm-cov gives the
/// number not covered for regions, branches and MC/DC only.
fn push_ratio(out: &mut String, r: &Ratio, not_covered: bool) {
    out.push_str("{\"count\":");
    push_int(out, r.count as i64);
    out.push_str(",\"covered\":");
    push_int(out, r.covered as i64);
    if not_covered {
        out.push_str(",\"notcovered\":");
        push_int(out, r.count.wrapping_sub(r.covered) as i64);
    }
    out.push_str(",\"percent\":");
    push_double(out, r.percent());
    out.push('}');
}

fn push_segments(out: &mut String, segments: &[Segment]) {
    out.push('[');
    for (i, s) in segments.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('[');
        push_int(out, s.line);
        out.push(',');
        push_int(out, s.col);
        out.push(',');
        push_count(out, s.count);
        for flag in [s.has_count, s.is_region_entry, s.is_gap] {
            out.push_str(if flag { ",true" } else { ",false" });
        }
        out.push(']');
    }
    out.push(']');
}

/// `[lineStart, colStart, lineEnd, colEnd, count, fileID, expandedFileID, kind]`.
fn push_region(out: &mut String, r: &CountedRegion<'_>) {
    push_region_with(out, r, &[r.count]);
}

/// A region with `counts` where its count goes (a branch has two).
fn push_region_with(out: &mut String, r: &CountedRegion<'_>, counts: &[u64]) {
    let m = r.region;
    out.push('[');
    for n in [m.line_start, m.column_start, m.line_end, m.column_end] {
        push_int(out, n);
        out.push(',');
    }
    for (i, &count) in counts.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_count(out, count);
    }
    for n in [m.file_id, m.expanded_file_id, m.kind as u32] {
        out.push(',');
        push_int(out, n);
    }
    out.push(']');
}

fn push_regions(out: &mut String, regions: &[CountedRegion<'_>]) {
    out.push('[');
    for (i, r) in regions.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_region(out, r);
    }
    out.push(']');
}

/// `[lineStart, colStart, lineEnd, colEnd, trueCount, falseCount, fileID,
/// expandedFileID, kind]` for each branch.
fn push_branches<'a, 'm: 'a>(out: &mut String, branches: impl Iterator<Item = &'a CountedRegion<'m>>) {
    out.push('[');
    for (i, b) in branches.enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_region_with(out, b, &[b.count, b.false_count]);
    }
    out.push(']');
}

/// `[lineStart, colStart, lineEnd, colEnd, trueDecisions, falseDecisions,
/// fileID, expandedFileID, kind, [covered per condition], [test vectors]]`
/// for each MC/DC record; a test vector is `{"conditions":[true, false or
/// null (not evaluated) per condition],"executed":true,"result":...}`.
fn push_mcdc_records<'a, 'm: 'a>(out: &mut String, records: impl Iterator<Item = &'a McdcRecord<'m>>) {
    out.push('[');
    for (i, r) in records.enumerate() {
        if i > 0 {
            out.push(',');
        }
        let m = r.decision;
        out.push('[');
        let (true_, false_) = r.decisions();
        for n in [m.line_start, m.column_start, m.line_end, m.column_end] {
            push_int(out, n);
            out.push(',');
        }
        push_count(out, true_);
        out.push(',');
        push_count(out, false_);
        for n in [m.file_id, m.expanded_file_id, m.kind as u32] {
            out.push(',');
            push_int(out, n);
        }
        out.push_str(",[");
        for (c, &covered) in r.covered.iter().enumerate() {
            if c > 0 {
                out.push(',');
            }
            out.push_str(if covered { "true" } else { "false" });
        }
        out.push_str("],[");
        for (v, vector) in r.vectors.iter().enumerate() {
            if v > 0 {
                out.push(',');
            }
            out.push_str("{\"conditions\":[");
            for (c, condition) in vector.conditions.iter().enumerate() {
                if c > 0 {
                    out.push(',');
                }
                out.push_str(match condition {
                    None => "null",
                    Some(true) => "true",
                    Some(false) => "false",
                });
            }
            out.push_str("],\"executed\":true,\"result\":");
            out.push_str(if vector.result { "true" } else { "false" });
            out.push('}');
        }
        out.push_str("]]");
    }
    out.push(']');
}

fn push_file_names(out: &mut String, coverage: &Coverage<'_>, files: &[FileName]) {
    out.push('[');
    for (i, &file) in files.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_string(out, coverage.mapping.file_name(file));
    }
    out.push(']');
}

/// A count as llvm-cov writes it: JSON integers are signed 64-bit there,
/// so larger counts (a negative expression read as unsigned) are clamped.
fn push_count(out: &mut String, count: u64) {
    push_int(out, count.min(i64::MAX as u64));
}

fn push_int(out: &mut String, n: impl itoa::Integer) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// A string as llvm::json quotes it: `"` and `\` escaped, control
/// characters as `\t`, `\n`, `\r` or `\u00XX`, everything else as it is.
fn push_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => {
                let _ = std::fmt::Write::write_fmt(out, format_args!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A double as llvm::json prints it: C's `%.17g`. Seventeen significant
/// digits, correctly rounded; fixed notation when the decimal exponent is
/// from -4 to 16, scientific (`1.5e-05`) otherwise; trailing zeros and a
/// trailing point removed. So 2/3 times 100 is `66.666666666666657`, 75 is
/// `75`.
fn push_double(out: &mut String, x: f64) {
    const DIGITS: i32 = 17;
    if !x.is_finite() {
        // llvm::json prints no such number; percentages never are.
        out.push_str("null");
        return;
    }
    // `{:.16e}` rounds to 17 significant digits exactly as printf does:
    // `d.dddddddddddddddde<exp>`.
    let scientific = format!("{:.*e}", (DIGITS - 1) as usize, x);
    let Some((mantissa, exponent)) = scientific.split_once('e') else {
        out.push_str(&scientific);
        return;
    };
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    out.push_str(sign);
    if (-4..DIGITS).contains(&exponent) {
        let (int_part, frac_part) = if exponent >= 0 {
            digits.split_at(exponent as usize + 1)
        } else {
            ("0", digits.as_str())
        };
        out.push_str(int_part);
        let mut frac = String::new();
        if exponent < 0 {
            frac.extend(std::iter::repeat_n('0', (-exponent - 1) as usize));
        }
        frac.push_str(frac_part);
        let frac = frac.trim_end_matches('0');
        if !frac.is_empty() {
            out.push('.');
            out.push_str(frac);
        }
    } else {
        let (first, rest) = digits.split_at(1);
        out.push_str(first);
        let rest = rest.trim_end_matches('0');
        if !rest.is_empty() {
            out.push('.');
            out.push_str(rest);
        }
        out.push('e');
        out.push(if exponent < 0 { '-' } else { '+' });
        let _ = std::fmt::Write::write_fmt(out, format_args!("{:02}", exponent.unsigned_abs()));
    }
}

#[cfg(test)]
mod tests {
    use super::{push_double, push_string};

    fn g17(x: f64) -> String {
        let mut s = String::new();
        push_double(&mut s, x);
        s
    }

    #[test]
    fn doubles_print_as_printf_g17() {
        // Printed by printf("%.17g") in C.
        assert_eq!(g17(0.0), "0");
        assert_eq!(g17(100.0), "100");
        assert_eq!(g17(75.0), "75");
        assert_eq!(g17(82.8125), "82.8125");
        assert_eq!(g17(2.0 / 3.0 * 100.0), "66.666666666666657");
        assert_eq!(g17(200.0 / 3.0), "66.666666666666671");
        assert_eq!(g17(55.0 / 66.0 * 100.0), "83.333333333333343");
        assert_eq!(g17(1.0 / 3.0 * 100.0), "33.333333333333329");
        assert_eq!(g17(0.001), "0.001");
        assert_eq!(g17(0.0001), "0.0001");
        assert_eq!(g17(0.00001), "1.0000000000000001e-05");
        assert_eq!(g17(1e17), "1e+17");
        assert_eq!(g17(12345678901234567.0), "12345678901234568");
    }

    #[test]
    fn strings_are_escaped_as_llvm_json_escapes_them() {
        let mut s = String::new();
        push_string(&mut s, "a\"b\\c\td\u{1}é\u{7f}");
        assert_eq!(s, "\"a\\\"b\\\\c\\td\\u0001é\u{7f}\"");
    }
}
