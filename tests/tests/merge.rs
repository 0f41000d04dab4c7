//! LCOV merging (`livecov_cli::merge`) on real reports: llvm-cov 22's LCOV
//! of the fixtures' runs, merged, against what llvm-cov 22 computes from the
//! runs' profiles together; and reports of several tools merged together.

use std::collections::BTreeMap;

use livecov_cli::merge::Merger;
use livecov_tests::{fixtures, oracle_lcov, Fixture, Run};

/// A run made of the executions (and profiles) of `runs` together.
fn together(runs: &[&Run]) -> Run {
    Run {
        label: runs.iter().map(|r| r.label.as_str()).collect::<Vec<_>>().join("+"),
        args: runs.iter().flat_map(|r| r.args.clone()).collect(),
        profraws: runs.iter().flat_map(|r| r.profraws.clone()).collect(),
        dir: runs[0].dir.clone(),
    }
}

fn merged(inputs: &[(&str, &str)]) -> String {
    let mut m = Merger::new();
    for (name, text) in inputs {
        m.add(name, text).unwrap_or_else(|e| panic!("{e}"));
    }
    m.finish()
}

/// Per file: DA by line, FNDA by function, FN lines, BRDA lines.
#[derive(Debug, Default)]
struct FileCoverage {
    lines: BTreeMap<u32, u64>,
    functions: BTreeMap<String, u64>,
    fn_lines: Vec<String>,
    branches: Vec<String>,
}

fn parse(lcov: &str) -> BTreeMap<String, FileCoverage> {
    let mut files: BTreeMap<String, FileCoverage> = BTreeMap::new();
    let mut current = String::new();
    for line in lcov.lines() {
        if let Some(f) = line.strip_prefix("SF:") {
            current = f.to_owned();
            files.entry(current.clone()).or_default();
        } else if let Some(da) = line.strip_prefix("DA:") {
            let mut fields = da.split(',');
            let (l, c) = (fields.next().expect("line"), fields.next().expect("DA:line,count"));
            files.get_mut(&current).expect("SF first").lines.insert(l.parse().expect("line"), c.parse().expect("count"));
        } else if let Some(fnda) = line.strip_prefix("FNDA:") {
            let (c, name) = fnda.split_once(',').expect("FNDA:count,name");
            *files.get_mut(&current).expect("SF first").functions.entry(name.to_owned()).or_default() +=
                c.parse::<u64>().expect("count");
        } else if line.starts_with("FN:") {
            files.get_mut(&current).expect("SF first").fn_lines.push(line.to_owned());
        } else if line.starts_with("BRDA:") {
            files.get_mut(&current).expect("SF first").branches.push(line.to_owned());
        }
    }
    files
}

/// The report without its summary records, which llvm-cov computes from
/// per-function summaries (instantiation groups, regions) that LCOV does
/// not carry, and the merge from the merged entries.
fn without_summaries(lcov: &str) -> String {
    lcov.lines()
        .filter(|l| !["FNF:", "FNH:", "LF:", "LH:", "BRF:", "BRH:"].iter().any(|p| l.starts_with(p)))
        .map(|l| format!("{l}\n"))
        .collect()
}

fn first_two_runs(fixture: &Fixture) -> (&Run, &Run) {
    (&fixture.runs[0], &fixture.runs[1])
}

#[test]
fn two_runs_merged_agree_with_llvm_cov_over_both_profiles() {
    for fixture in fixtures() {
        let (a, b) = first_two_runs(fixture);
        let lcov_a = oracle_lcov(fixture, a, &[]);
        let lcov_b = oracle_lcov(fixture, b, &[]);
        let want_text = oracle_lcov(fixture, &together(&[a, b]), &[]);
        let got_text = merged(&[(&a.label, &lcov_a), (&b.label, &lcov_b)]);
        let context = format!("{} {}+{}", fixture.name, a.label, b.label);

        let (got, want) = (parse(&got_text), parse(&want_text));
        let (pa, pb) = (parse(&lcov_a), parse(&lcov_b));
        assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "{context}: files");
        assert!(want.values().any(|f| f.functions.values().any(|&c| c > 0)), "{context}: nothing ran");
        for (file, w) in &want {
            let g = &got[file];
            // Function counts are counter values: they add up exactly.
            assert_eq!(g.functions, w.functions, "{context} {file}: FNDA");
            assert_eq!(g.fn_lines, w.fn_lines, "{context} {file}: FN");
            // So are branch counts, `-` (never reached) included.
            assert_eq!(g.branches, w.branches, "{context} {file}: BRDA");
            // A line's count is the largest count of the regions on it:
            // the merged sum is at least llvm-cov's, which is at least each
            // run's, and equal when only one run reached the line; which
            // lines ran agrees exactly.
            assert_eq!(g.lines.keys().collect::<Vec<_>>(), w.lines.keys().collect::<Vec<_>>(), "{context} {file}: DA lines");
            for (line, &want_count) in &w.lines {
                let (ca, cb) = (pa[file].lines[line], pb[file].lines[line]);
                let got_count = g.lines[line];
                assert_eq!(got_count, ca + cb, "{context} {file}:{line}");
                assert!(ca.max(cb) <= want_count && want_count <= got_count, "{context} {file}:{line}: {ca}+{cb} vs {want_count}");
                if ca == 0 || cb == 0 {
                    assert_eq!(got_count, want_count, "{context} {file}:{line}");
                }
                assert_eq!(got_count > 0, want_count > 0, "{context} {file}:{line}: hit");
            }
        }
    }
}

#[test]
fn n_copies_of_a_run_agree_exactly_with_llvm_cov_over_n_copies_of_its_profiles() {
    // With every counter multiplied by n, so is every line's count: the
    // merge of n copies of a report is llvm-cov's report of n copies of its
    // profiles, record for record, but for the summary records.
    for fixture in fixtures() {
        let run = fixture.runs.last().expect("a run");
        let lcov = oracle_lcov(fixture, run, &[]);
        let want = oracle_lcov(fixture, &together(&[run, run, run]), &[]);
        let got = merged(&[("1", &lcov), ("2", &lcov), ("3", &lcov)]);
        assert_eq!(without_summaries(&got), without_summaries(&want), "{} {}", fixture.name, run.label);
        // And one report alone comes back as it was, summaries aside.
        assert_eq!(without_summaries(&merged(&[("1", &lcov)])), without_summaries(&lcov), "{}", fixture.name);
    }
}

#[test]
fn every_run_of_every_fixture_merges_in_any_order_and_grouping() {
    for fixture in fixtures() {
        let reports: Vec<String> = fixture.runs.iter().map(|r| oracle_lcov(fixture, r, &[])).collect();
        let named: Vec<(&str, &str)> = reports.iter().map(|r| ("run", r.as_str())).collect();
        let forward = merged(&named);
        let backward = merged(&named.iter().rev().copied().collect::<Vec<_>>());
        // Reports of one build list the same functions in the same order.
        assert_eq!(forward, backward, "{}", fixture.name);
        let mut grouped = Merger::new();
        for part in named.chunks(2) {
            let mut m = Merger::new();
            for (name, text) in part {
                m.add(name, text).unwrap();
            }
            grouped.absorb(m);
        }
        assert_eq!(grouped.finish(), forward, "{}", fixture.name);
        let want = oracle_lcov(fixture, &together(&fixture.runs.iter().collect::<Vec<_>>()), &[]);
        let (got, want) = (parse(&forward), parse(&want));
        for (file, w) in &want {
            assert_eq!(got[file].functions, w.functions, "{} {file}", fixture.name);
            let hit = |f: &FileCoverage| f.lines.iter().filter(|(_, c)| **c > 0).map(|(l, _)| *l).collect::<Vec<_>>();
            assert_eq!(hit(&got[file]), hit(w), "{} {file}", fixture.name);
        }
    }
}

#[test]
fn per_test_reports_stay_apart_and_merge_by_name() {
    let fixture = &fixtures()[0];
    let (a, b) = first_two_runs(fixture);
    let (lcov_a, lcov_b) = (oracle_lcov(fixture, a, &[]), oracle_lcov(fixture, b, &[]));
    // As an agent writes them for ?test=NAME: TN: before each record.
    let named = |name: &str, lcov: &str| lcov.replace("SF:", &format!("TN:{name}\nSF:"));
    let out = merged(&[("a", &named("alpha", &lcov_a)), ("b", &named("beta", &lcov_b)), ("a2", &named("alpha", &lcov_a)), ("plain", &lcov_b)]);
    let records: Vec<&str> = out.split_inclusive("end_of_record\n").collect();
    let files = parse(&lcov_a).len();
    assert_eq!(records.len(), 3 * files, "unnamed, alpha and beta records");
    // Unnamed first, then by test name.
    assert!(records[0].starts_with("SF:"));
    assert!(records[files].starts_with("TN:alpha\nSF:"));
    assert!(records[2 * files].starts_with("TN:beta\nSF:"));
    let alpha: String = records[files..2 * files].concat();
    let doubled = merged(&[("a", &lcov_a), ("a", &lcov_a)]);
    assert_eq!(alpha, named("alpha", &doubled));
    let unnamed: String = records[..files].concat();
    assert_eq!(unnamed, merged(&[("b", &lcov_b)]));
}

#[test]
fn reports_of_other_tools_merge_with_llvm_cov_s() {
    let fixture = &fixtures()[0];
    let run = &fixture.runs[0];
    let lcov = oracle_lcov(fixture, run, &[]);
    let file = parse(&lcov).keys().next().expect("a file").clone();
    // geninfo's view of the same file: a checksum, lcov 2's FN with an end
    // line, branch counts, summaries that are wrong for the merge.
    let geninfo = format!(
        "TN:\nSF:{file}\nVER:1\nFN:1,2,geninfo_only\nFNDA:3,geninfo_only\nFNF:1\nFNH:1\nDA:1,2,abcdef\nBRDA:1,0,0,-\nLF:1\nLH:1\nend_of_record\n"
    );
    // c8's and coverage.py's of other files.
    let c8 = "TN:\nSF:/app/index.js\nFN:1,(anonymous_0)\nFNF:1\nFNH:1\nFNDA:1,(anonymous_0)\nDA:1,1\nLF:1\nLH:1\nBRF:0\nBRH:0\nend_of_record\n";
    let py = "SF:app/views.py\nDA:1,1,cGhhbnRvbQ\nBRDA:1,0,jump to line 3,0\nLF:1\nLH:1\nend_of_record\n";
    let out = merged(&[("llvm-cov", &lcov), ("geninfo", &geninfo), ("c8", c8), ("coverage.py", py)]);
    let got = parse(&out);
    assert_eq!(got.len(), parse(&lcov).len() + 2);
    let merged_file = &got[&file];
    assert_eq!(merged_file.functions["geninfo_only"], 3);
    assert_eq!(merged_file.lines[&1], parse(&lcov)[&file].lines.get(&1).copied().unwrap_or(0) + 2);
    assert!(out.contains("FN:1,2,geninfo_only\n"), "{out}");
    assert!(out.contains("SF:/app/index.js\nFN:1,(anonymous_0)\nFNDA:1,(anonymous_0)\nFNF:1\nFNH:1\nDA:1,1\nBRF:0\nBRH:0\nLF:1\nLH:1\nend_of_record\n"));
    assert!(out.contains("BRDA:1,0,jump to line 3,0\nBRF:1\nBRH:0\n"), "{out}");
    // Records come out sorted by file name.
    let sf: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix("SF:")).collect();
    let mut sorted = sf.clone();
    sorted.sort_unstable();
    assert_eq!(sf, sorted);
}

#[test]
fn a_malformed_report_among_real_ones_is_named_and_changes_nothing() {
    let fixture = &fixtures()[0];
    let lcov = oracle_lcov(fixture, &fixture.runs[0], &[]);
    let mut m = Merger::new();
    m.add("good.lcov", &lcov).unwrap();
    // A real report cut in the middle of a DA line.
    let torn = format!("{}\nDA:12,", &lcov[..lcov.find("\nDA:").expect("a DA line")]);
    let e = m.add("torn.lcov", &torn).unwrap_err();
    assert_eq!(e.to_string(), format!("torn.lcov:{}: DA: bad number \"\"", torn.lines().count()));
    assert_eq!(m.finish(), merged(&[("good", &lcov)]));
}
