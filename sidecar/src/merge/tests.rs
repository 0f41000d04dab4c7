use super::*;

fn merged(inputs: &[&str]) -> String {
    let mut m = Merger::new();
    for (i, text) in inputs.iter().enumerate() {
        m.add(&format!("input{i}"), text).unwrap_or_else(|e| panic!("{e}"));
    }
    m.finish()
}

fn error_of(text: &str) -> Error {
    Merger::new().add("bad.lcov", text).expect_err("a malformed input")
}

// ---------------------------------------------------------------- examples

/// What llvm-cov 22 writes, which a merge of it alone must give back as it is.
const LLVM_COV: &str = "\
SF:/src/app/main.rs
FN:3,_RNvCs1_3app4main
FN:12,_RNvCs1_3app5parse
FNDA:1,_RNvCs1_3app4main
FNDA:0,_RNvCs1_3app5parse
FNF:2
FNH:1
DA:3,1
DA:4,1
DA:5,0
DA:12,0
DA:13,0
BRDA:4,0,0,1
BRDA:4,0,1,0
BRDA:13,0,0,-
BRDA:13,0,1,-
BRF:4
BRH:1
LF:5
LH:2
end_of_record
SF:/src/app/util.rs
FNF:0
FNH:0
DA:1,7
BRF:0
BRH:0
LF:1
LH:1
end_of_record
";

#[test]
fn llvm_cov_output_is_a_fixed_point() {
    assert_eq!(merged(&[LLVM_COV]), LLVM_COV);
    assert_eq!(merged(&[LLVM_COV, ""]), LLVM_COV);
    assert_eq!(merged(&["", LLVM_COV, "\n"]), LLVM_COV);
}

#[test]
fn counts_are_summed_per_line_function_and_branch() {
    let other = "\
SF:/src/app/main.rs
FN:12,_RNvCs1_3app5parse
FNDA:4,_RNvCs1_3app5parse
FNDA:2,_RNvCs1_3app4main
DA:5,3
DA:13,4
DA:20,1
BRDA:4,0,0,-
BRDA:4,0,1,-
BRDA:13,0,0,0
BRDA:13,0,1,4
end_of_record
";
    let out = merged(&[LLVM_COV, other]);
    let main_rs = out.split("end_of_record\n").next().unwrap();
    assert_eq!(
        main_rs,
        "\
SF:/src/app/main.rs
FN:3,_RNvCs1_3app4main
FN:12,_RNvCs1_3app5parse
FNDA:3,_RNvCs1_3app4main
FNDA:4,_RNvCs1_3app5parse
FNF:2
FNH:2
DA:3,1
DA:4,1
DA:5,3
DA:12,0
DA:13,4
DA:20,1
BRDA:4,0,0,1
BRDA:4,0,1,0
BRDA:13,0,0,0
BRDA:13,0,1,4
BRF:4
BRH:2
LF:6
LH:5
"
    );
}

#[test]
fn a_dash_is_never_reached() {
    let a = "SF:f\nBRDA:1,0,0,-\nBRDA:1,0,1,-\nBRDA:2,0,0,-\nend_of_record\n";
    let b = "SF:f\nBRDA:1,0,0,-\nBRDA:1,0,1,-\nBRDA:2,0,0,0\nBRDA:3,0,0,-\nend_of_record\n";
    let out = merged(&[a, b]);
    assert!(out.contains("BRDA:1,0,0,-\nBRDA:1,0,1,-\nBRDA:2,0,0,0\nBRDA:3,0,0,-\nBRF:4\nBRH:0\n"), "{out}");
    let c = "SF:f\nBRDA:1,0,1,5\nend_of_record\n";
    assert!(merged(&[a, c]).contains("BRDA:1,0,0,-\nBRDA:1,0,1,5\n"));
}

#[test]
fn records_are_keyed_and_sorted_by_test_then_file() {
    let a = "TN:zeta\nSF:b.c\nDA:1,1\nend_of_record\nSF:a.c\nDA:1,1\nend_of_record\n";
    let b = "SF:c.c\nDA:1,1\nend_of_record\nTN:alpha\nSF:b.c\nDA:1,2\nend_of_record\n";
    let c = "TN:zeta\nSF:a.c\nDA:1,5\nend_of_record\n";
    let out = merged(&[a, b, c]);
    let heads: Vec<&str> = out.lines().filter(|l| l.starts_with("TN:") || l.starts_with("SF:") || l.starts_with("DA:")).collect();
    assert_eq!(
        heads,
        ["SF:c.c", "DA:1,1", "TN:alpha", "SF:b.c", "DA:1,2", "TN:zeta", "SF:a.c", "DA:1,6", "TN:zeta", "SF:b.c", "DA:1,1"]
    );
    // An empty TN: is no test name; each input starts without one.
    assert_eq!(merged(&["TN:\nSF:x\nend_of_record\n", "TN:t\nSF:y\nend_of_record\n", "SF:x\nend_of_record\n"]).matches("TN:").count(), 1);
}

#[test]
fn functions_keep_the_first_line_seen_and_their_order() {
    let a = "SF:f\nFNDA:2,late\nFN:7,first\nFNDA:1,first\nend_of_record\n";
    let b = "SF:f\nFN:9,first\nFN:3,late\nFN:5,10,fresh\nFNDA:0,fresh\nend_of_record\n";
    let out = merged(&[a, b]);
    assert!(
        out.contains("FN:3,late\nFN:7,first\nFN:5,10,fresh\nFNDA:2,late\nFNDA:1,first\nFNDA:0,fresh\nFNF:3\nFNH:2\n"),
        "{out}"
    );
    // One never given a line comes after those that were, in a merge and
    // in a merge of it.
    let out = merged(&["SF:f\nFNDA:1,nowhere\nFN:2,here\nFNDA:1,here\nend_of_record\n"]);
    assert!(out.contains("FN:2,here\nFNDA:1,here\nFNDA:1,nowhere\n"), "{out}");
    assert_eq!(merged(&[&out]), out);
    // A function with a location but no FNDA anywhere is a function not run.
    assert!(merged(&["SF:f\nFN:1,g\nend_of_record\n"]).contains("FN:1,g\nFNDA:0,g\nFNF:1\nFNH:0\n"));
}

#[test]
fn function_names_may_hold_commas() {
    let cpp = "SF:m.cpp\nFN:4,std::pair<int, int> swap(std::pair<int, int>)\nFNDA:3,std::pair<int, int> swap(std::pair<int, int>)\nend_of_record\n";
    let out = merged(&[cpp, cpp]);
    assert!(out.contains("FN:4,std::pair<int, int> swap(std::pair<int, int>)\nFNDA:6,std::pair<int, int> swap("), "{out}");
    // lcov 2's FN:start,end,name, and a name that looks numeric after the line.
    let out = merged(&["SF:m.c\nFN:4,9,main\nFN:5,1x\nFNDA:1,main\nend_of_record\n"]);
    assert!(out.contains("FN:4,9,main\nFN:5,1x\nFNDA:1,main\nFNDA:0,1x\n"), "{out}");
}

#[test]
fn lcov_2_2_function_records_are_read() {
    let lcov22 = "SF:a.c\nFNL:0,3,8\nFNA:0,5,main\nFNL:1,10\nFNA:1,0,helper\nFNA:1,0,helper_alias\nFNF:2\nFNH:1\nDA:3,5\nend_of_record\n";
    let out = merged(&[lcov22]);
    assert!(
        out.contains("FN:3,8,main\nFN:10,helper\nFN:10,helper_alias\nFNDA:5,main\nFNDA:0,helper\nFNDA:0,helper_alias\nFNF:3\nFNH:1\n"),
        "{out}"
    );
}

#[test]
fn summaries_are_recomputed() {
    let lying = "SF:f\nFNF:99\nFNH:98\nDA:1,0\nDA:2,3\nLF:50\nLH:50\nBRDA:2,0,0,1\nBRF:7\nBRH:7\nend_of_record\n";
    assert_eq!(
        merged(&[lying]),
        "SF:f\nFNF:0\nFNH:0\nDA:1,0\nDA:2,3\nBRDA:2,0,0,1\nBRF:1\nBRH:1\nLF:2\nLH:1\nend_of_record\n"
    );
}

#[test]
fn lines_out_of_order_or_repeated_are_sorted_and_summed() {
    let out = merged(&["SF:f\nDA:10,1\nDA:2,1\nDA:10,4\nBRDA:3,1,0,1\nBRDA:3,0,1,1\nBRDA:3,1,0,-\nend_of_record\n"]);
    assert_eq!(
        out,
        "SF:f\nFNF:0\nFNH:0\nDA:2,1\nDA:10,5\nBRDA:3,0,1,1\nBRDA:3,1,0,1\nBRF:2\nBRH:2\nLF:2\nLH:2\nend_of_record\n"
    );
}

#[test]
fn checksums_are_kept() {
    let a = "SF:f\nDA:1,1,abc\nDA:2,0\nend_of_record\n";
    let b = "SF:f\nDA:1,1,zzz\nDA:2,1,def\nend_of_record\n";
    assert!(merged(&[a, b]).contains("DA:1,2,abc\nDA:2,1,def\n"));
}

#[test]
fn block_and_branch_ids_sort_as_numbers_then_text() {
    // coverage.py describes branches; lcov 2 marks exception blocks `e`.
    let py = "SF:a.py\nBRDA:5,0,return from function 'f',0\nBRDA:5,0,jump to line 7,1\nBRDA:5,e0,1,0\nBRDA:5,0,10,2\nBRDA:5,0,9,-\nend_of_record\n";
    let out = merged(&[py, py]);
    let brda: Vec<&str> = out.lines().filter(|l| l.starts_with("BRDA:")).collect();
    assert_eq!(
        brda,
        [
            "BRDA:5,0,9,-",
            "BRDA:5,0,10,4",
            "BRDA:5,0,jump to line 7,2",
            "BRDA:5,0,return from function 'f',0",
            "BRDA:5,e0,1,0"
        ]
    );
}

#[test]
fn sums_saturate() {
    let big = "SF:f\nDA:1,18446744073709551615\nFNDA:18446744073709551615,g\nBRDA:1,0,0,18446744073709551615\nend_of_record\n";
    let out = merged(&[big, big, "SF:f\nDA:1,99999999999999999999999\nend_of_record\n"]);
    assert!(out.contains("DA:1,18446744073709551615\n"), "{out}");
    assert!(out.contains("FNDA:18446744073709551615,g\n"));
    assert!(out.contains("BRDA:1,0,0,18446744073709551615\n"));
}

#[test]
fn other_lines_and_crlf_are_tolerated() {
    let geninfo = "TN:\r\nVER:abc\r\n# a comment\r\n\r\nSF:/x/a.c\r\nFN:1,main\r\nFNDA:1,main\r\nMCDC:2,1,t,0,0,a\r\nDA:1,1\r\nend_of_record\r\n";
    assert_eq!(
        merged(&[geninfo]),
        "SF:/x/a.c\nFN:1,main\nFNDA:1,main\nFNF:1\nFNH:1\nDA:1,1\nBRF:0\nBRH:0\nLF:1\nLH:1\nend_of_record\n"
    );
    // Every CR that ends a line, not only the last: none is left in a name.
    assert_eq!(merged(&["SF:/x/a.c\r\r\nDA:1,1\r\r\nend_of_record\r\r\n"]), merged(&["SF:/x/a.c\nDA:1,1\nend_of_record\n"]));
}

#[test]
fn a_record_left_open_is_closed() {
    // A new SF: closes the record before it; the end of the input too.
    let out = merged(&["SF:a\nDA:1,1\nSF:b\nDA:2,2\n", "SF:a\nDA:1,1"]);
    assert_eq!(out.matches("end_of_record").count(), 2);
    assert!(out.contains("SF:a\nFNF:0\nFNH:0\nDA:1,2\n"));
    assert!(out.contains("SF:b\nFNF:0\nFNH:0\nDA:2,2\n"));
}

#[test]
fn c8_and_coverage_py_reports_merge() {
    // c8 (istanbul): FNF/FNH before FNDA, anonymous functions.
    let c8 = "TN:\nSF:/app/src/index.js\nFN:1,(anonymous_0)\nFN:4,handler\nFNF:2\nFNH:1\nFNDA:1,(anonymous_0)\nFNDA:0,handler\nDA:1,1\nDA:4,0\nDA:5,0\nLF:3\nLH:1\nBRDA:5,0,0,0\nBRDA:5,0,1,0\nBRF:2\nBRH:0\nend_of_record\n";
    let c8b = c8.replace("FNDA:0,handler", "FNDA:3,handler").replace("DA:4,0", "DA:4,3").replace("BRDA:5,0,1,0", "BRDA:5,0,1,3");
    let out = merged(&[c8, &c8b]);
    assert!(out.contains("FNDA:2,(anonymous_0)\nFNDA:3,handler\nFNF:2\nFNH:2\nDA:1,2\nDA:4,3\nDA:5,0\nBRDA:5,0,0,0\nBRDA:5,0,1,3\nBRF:2\nBRH:1\nLF:3\nLH:2\n"), "{out}");
    // coverage.py: DA with an MD5 checksum, FN:start,end,name.
    let py = "SF:app/views.py\nDA:1,1,cGhhbnRvbQ\nDA:3,0,dHJ1bms\nFN:3,5,index\nFNDA:0,index\nFNF:1\nFNH:0\nLF:2\nLH:1\nend_of_record\n";
    let out = merged(&[py, &py.replace("DA:3,0", "DA:3,2").replace("FNDA:0", "FNDA:2")]);
    assert!(out.contains("FN:3,5,index\nFNDA:2,index\nFNF:1\nFNH:1\nDA:1,2,cGhhbnRvbQ\nDA:3,2,dHJ1bms\n"), "{out}");
}

// ---------------------------------------------------------------- errors

#[test]
fn malformed_lines_name_the_input_and_line() {
    let cases: &[(&str, usize, &str)] = &[
        ("DA:1,1\n", 1, "outside a record"),
        ("SF:a\nDA:1,1\nend_of_record\nDA:2,2\n", 4, "outside a record"),
        ("TN:t\nFNDA:1,f\n", 2, "outside a record"),
        ("BRDA:1,0,0,1\n", 1, "outside a record"),
        ("SF:a\nDA:x,1\n", 2, "bad line number"),
        ("SF:a\nDA:1,-1\n", 2, "bad number"),
        ("SF:a\nDA:1,1.5\n", 2, "bad number"),
        ("SF:a\nDA:1\n", 2, "DA:line,count"),
        ("SF:a\nDA:4294967296,1\n", 2, "bad line number"),
        ("SF:a\nFN:,f\n", 2, "bad line number"),
        ("SF:a\nFN:1\n", 2, "FN:line,name"),
        ("SF:a\nFN:1,\n", 2, "without a function name"),
        ("SF:a\nFNDA:one,f\n", 2, "bad number"),
        ("SF:a\nFNDA:1\n", 2, "FNDA:count,name"),
        ("SF:a\nBRDA:1,0,0\n", 2, "BRDA:line,block,branch,taken"),
        ("SF:a\nBRDA:1,0,0,x\n", 2, "bad number"),
        ("SF:a\nBRDA:1,,0,1\n", 2, "BRDA:line,block,branch,taken"),
        ("SF:a\nLH:many\n", 2, "bad number"),
        ("SF:\n", 1, "without a file name"),
        ("SF:a\nFNA:0,1\n", 2, "FNA:index,count,name"),
    ];
    for (text, line, what) in cases {
        let e = error_of(text);
        assert_eq!(e.line, Some(*line), "{text:?}: {e}");
        assert_eq!(e.source_name, "bad.lcov");
        let shown = e.to_string();
        assert!(shown.starts_with(&format!("bad.lcov:{line}: ")) && shown.contains(what), "{text:?}: {shown}");
    }
}

#[test]
fn a_failed_input_leaves_the_merger_unchanged() {
    let mut m = Merger::new();
    m.add("good", LLVM_COV).unwrap();
    let before = m.clone().finish();
    m.add("bad", "SF:/src/app/main.rs\nDA:3,100\nend_of_record\nSF:new.rs\nDA:1,1\nDA:oops\n").unwrap_err();
    assert_eq!(m.clone().finish(), before);
    let err = m.add_reader("bad", &b"SF:a\nDA:1,\xff\n"[..]).unwrap_err();
    assert_eq!((err.line, err.message.contains("UTF-8")), (Some(2), true), "{err}");
    assert_eq!(m.finish(), before);
}

/// A reader that returns 1 to 7 bytes at a time.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.step += 1;
        let n = (self.step % 7 + 1).min(self.data.len()).min(buf.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

#[test]
fn readers_absorb_and_the_helper_agree_with_add() {
    let inputs = [LLVM_COV, "TN:t\nSF:x\nDA:1,1\nend_of_record\n", "SF:/src/app/util.rs\nDA:1,1\nDA:2,0\nend_of_record\n"];
    let by_add = merged(&inputs);
    let mut by_reader = Merger::new();
    for text in inputs {
        by_reader.add_reader("r", Trickle { data: text.as_bytes(), step: 0 }).unwrap();
    }
    assert_eq!(by_reader.finish(), by_add);
    // Blocks that end inside a line, inside a UTF-8 character, or at an
    // error, wherever: the same result and the same line numbers.
    let text = "SF:é/ü.rs\nDA:1,1\nFNDA:2,naïve\nend_of_record\nSF:x\nDA:y,1\n";
    let whole = Merger::new().add("t", text).unwrap_err();
    let trickled = Merger::new().add_reader("t", Trickle { data: text.as_bytes(), step: 0 }).unwrap_err();
    assert_eq!((whole.line, trickled.line), (Some(6), Some(6)));
    let good = &text[..text.find("SF:x").unwrap()];
    for step in 0..7 {
        let mut m = Merger::new();
        m.add_reader("t", Trickle { data: good.as_bytes(), step }).unwrap();
        assert_eq!(m.finish(), merged(&[good]));
    }
    assert!(merged(&[good]).contains("SF:é/ü.rs\n"));
    let mut left = Merger::new();
    left.add("a", inputs[0]).unwrap();
    let mut right = Merger::new();
    right.add("b", inputs[1]).unwrap();
    right.add("c", inputs[2]).unwrap();
    left.absorb(right);
    assert_eq!(left.finish(), by_add);
    assert_eq!(merge(inputs.iter().map(|t| ("i", *t))).unwrap(), by_add);
}

#[test]
fn totals_add_up_the_records() {
    let mut m = Merger::new();
    m.add("a", LLVM_COV).unwrap();
    assert_eq!(
        m.totals(),
        Totals {
            records: 2,
            summary: Summary { lines: 6, lines_hit: 3, functions: 2, functions_hit: 1, branches: 4, branches_hit: 1 }
        }
    );
    assert!(Merger::new().is_empty());
    assert_eq!(Merger::new().finish(), "");
}

// ---------------------------------------------------------------- properties

mod properties {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// The functions a file may have, in the order a compiler would list
    /// them, each at one line (reports of one build agree on both).
    const FUNCTIONS: &[(&str, u32)] = &[("main", 1), ("parse, then run", 5), ("helper", 9), ("<T as Trait>::f", 14)];

    /// A record as a model: what a report says about (test, file).
    #[derive(Debug, Clone)]
    struct Rec {
        test: &'static str,
        file: &'static str,
        lines: BTreeMap<u32, u64>,
        /// Indices into FUNCTIONS, ascending, with counts.
        functions: BTreeMap<usize, u64>,
        branches: BTreeMap<(u32, u32, u32), Option<u64>>,
    }

    fn count() -> impl Strategy<Value = u64> {
        prop_oneof![3 => 0u64..4, 2 => 0u64..1_000_000, 1 => Just(u64::MAX - 1)]
    }

    fn rec() -> impl Strategy<Value = Rec> {
        (
            prop::sample::select(vec!["", "", "login", "checkout"]),
            prop::sample::select(vec!["/src/a.rs", "/src/b.rs", "lib/c.c"]),
            prop::collection::btree_map(1u32..40, count(), 0..12),
            prop::collection::btree_map(0..FUNCTIONS.len(), count(), 0..=FUNCTIONS.len()),
            prop::collection::btree_map((1u32..40, 0u32..3, 0u32..12), prop::option::weighted(0.7, count()), 0..8),
        )
            .prop_map(|(test, file, lines, functions, branches)| Rec { test, file, lines, functions, branches })
    }

    fn report() -> impl Strategy<Value = Vec<Rec>> {
        prop::collection::vec(rec(), 0..5)
    }

    /// The report as LCOV, the way tools write it (TN: before records
    /// that have one, summaries included, and wrong on purpose).
    fn render(report: &[Rec]) -> String {
        let mut out = String::new();
        for r in report {
            out.push_str(&format!("TN:{}\nSF:{}\n", r.test, r.file));
            for &i in r.functions.keys() {
                out.push_str(&format!("FN:{},{}\n", FUNCTIONS[i].1, FUNCTIONS[i].0));
            }
            for (&i, c) in &r.functions {
                out.push_str(&format!("FNDA:{c},{}\n", FUNCTIONS[i].0));
            }
            out.push_str("FNF:1\nFNH:0\n");
            for (l, c) in &r.lines {
                out.push_str(&format!("DA:{l},{c}\n"));
            }
            for ((l, b, br), t) in &r.branches {
                match t {
                    Some(t) => out.push_str(&format!("BRDA:{l},{b},{br},{t}\n")),
                    None => out.push_str(&format!("BRDA:{l},{b},{br},-\n")),
                }
            }
            out.push_str("LF:0\nLH:0\nend_of_record\n");
        }
        out
    }

    /// FN and FNDA lines sorted within each record: the output up to the
    /// order in which functions were first seen.
    fn up_to_function_order(lcov: &str) -> String {
        let mut out = String::new();
        for record in lcov.split_inclusive("end_of_record\n") {
            let mut fns: Vec<&str> = record.lines().filter(|l| l.starts_with("FN:") || l.starts_with("FNDA:")).collect();
            fns.sort_unstable();
            let mut fns = fns.into_iter();
            for line in record.lines() {
                if line.starts_with("FN:") || line.starts_with("FNDA:") {
                    out.push_str(fns.next().expect("as many"));
                } else {
                    out.push_str(line);
                }
                out.push('\n');
            }
        }
        out
    }

    /// Multiplies every count of DA, FNDA and BRDA lines by `n` (saturating).
    fn times(lcov: &str, n: u64) -> String {
        let mul = |c: &str| c.parse::<u64>().expect("a count").saturating_mul(n).to_string();
        lcov.lines()
            .map(|l| {
                if let Some(rest) = l.strip_prefix("DA:") {
                    let (line, c) = rest.split_once(',').unwrap();
                    format!("DA:{line},{}\n", mul(c))
                } else if let Some(rest) = l.strip_prefix("FNDA:") {
                    let (c, name) = rest.split_once(',').unwrap();
                    format!("FNDA:{},{name}\n", mul(c))
                } else if let Some(rest) = l.strip_prefix("BRDA:") {
                    let (key, c) = rest.rsplit_once(',').unwrap();
                    if c == "-" {
                        format!("{l}\n")
                    } else {
                        format!("BRDA:{key},{}\n", mul(c))
                    }
                } else {
                    format!("{l}\n")
                }
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn merging_with_an_empty_report_normalises(a in report()) {
            let text = render(&a);
            let normal = merged(&[&text]);
            prop_assert_eq!(merged(&[&text, ""]), normal.clone());
            prop_assert_eq!(merged(&["", &text]), normal.clone());
            // Normal form is a fixed point.
            prop_assert_eq!(merged(&[&normal]), normal);
        }

        #[test]
        fn merge_is_associative(a in report(), b in report(), c in report()) {
            let (a, b, c) = (render(&a), render(&b), render(&c));
            let left = merged(&[&merged(&[&a, &b]), &c]);
            let right = merged(&[&a, &merged(&[&b, &c])]);
            prop_assert_eq!(&left, &right);
            prop_assert_eq!(&left, &merged(&[&a, &b, &c]));
        }

        #[test]
        fn merge_is_commutative(a in report(), b in report()) {
            let (a, b) = (render(&a), render(&b));
            prop_assert_eq!(up_to_function_order(&merged(&[&a, &b])), up_to_function_order(&merged(&[&b, &a])));
        }

        #[test]
        fn merge_is_commutative_when_reports_list_the_same_functions(a in report(), b in report()) {
            let all = |mut r: Vec<Rec>| {
                for rec in &mut r {
                    for i in 0..FUNCTIONS.len() {
                        rec.functions.entry(i).or_insert(0);
                    }
                }
                render(&r)
            };
            let (a, b) = (all(a), all(b));
            prop_assert_eq!(merged(&[&a, &b]), merged(&[&b, &a]));
        }

        #[test]
        fn merging_n_copies_multiplies_counts(a in report(), n in 1u64..6) {
            let text = render(&a);
            let copies = vec![text.as_str(); n as usize];
            prop_assert_eq!(merged(&copies), times(&merged(&[&text]), n));
        }

        #[test]
        fn merge_sums_the_models(reports in prop::collection::vec(report(), 0..4)) {
            // Expected: per (test, file), sums per line, function and branch.
            type Sum = (BTreeMap<u32, u64>, BTreeMap<usize, u64>, BTreeMap<(u32, u32, u32), Option<u64>>);
            let mut want: BTreeMap<(&str, &str), Sum> = BTreeMap::new();
            for r in reports.iter().flatten() {
                let s = want.entry((r.test, r.file)).or_default();
                for (l, c) in &r.lines {
                    let e = s.0.entry(*l).or_default();
                    *e = e.saturating_add(*c);
                }
                for (f, c) in &r.functions {
                    let e = s.1.entry(*f).or_default();
                    *e = e.saturating_add(*c);
                }
                for (k, t) in &r.branches {
                    let e = s.2.entry(*k).or_insert(None);
                    *e = add_taken(*e, *t);
                }
            }
            let texts: Vec<String> = reports.iter().map(|r| render(r)).collect();
            let out = merged(&texts.iter().map(String::as_str).collect::<Vec<_>>());
            let records: Vec<&str> = out.split_inclusive("end_of_record\n").collect();
            prop_assert_eq!(records.len(), want.len());
            for (record, ((test, file), (lines, functions, branches))) in records.iter().zip(&want) {
                let mut expected = String::new();
                if !test.is_empty() {
                    expected.push_str(&format!("TN:{test}\n"));
                }
                expected.push_str(&format!("SF:{file}\n"));
                let by_line: BTreeMap<&str, u64> = functions.iter().map(|(f, c)| (FUNCTIONS[*f].0, *c)).collect();
                let got_fns: BTreeMap<&str, u64> = record
                    .lines()
                    .filter_map(|l| l.strip_prefix("FNDA:"))
                    .map(|l| {
                        let (c, n) = l.split_once(',').unwrap();
                        (n, c.parse().unwrap())
                    })
                    .collect();
                prop_assert_eq!(&got_fns, &by_line);
                prop_assert!(record.starts_with(&expected), "{} does not start with {}", record, expected);
                let da: Vec<String> = lines.iter().map(|(l, c)| format!("DA:{l},{c}")).collect();
                let got_da: Vec<&str> = record.lines().filter(|l| l.starts_with("DA:")).collect();
                prop_assert_eq!(got_da, da.iter().map(String::as_str).collect::<Vec<_>>());
                let brda: Vec<String> = branches
                    .iter()
                    .map(|((l, b, br), t)| format!("BRDA:{l},{b},{br},{}", t.map_or("-".to_owned(), |t| t.to_string())))
                    .collect();
                let got_brda: Vec<&str> = record.lines().filter(|l| l.starts_with("BRDA:")).collect();
                prop_assert_eq!(got_brda, brda.iter().map(String::as_str).collect::<Vec<_>>());
                let summary = format!(
                    "FNF:{}\nFNH:{}\n",
                    functions.len(),
                    functions.values().filter(|c| **c > 0).count()
                );
                prop_assert!(record.contains(&summary), "{}", record);
                let tail = format!(
                    "BRF:{}\nBRH:{}\nLF:{}\nLH:{}\nend_of_record\n",
                    branches.len(),
                    branches.values().filter(|t| t.is_some_and(|t| t > 0)).count(),
                    lines.len(),
                    lines.values().filter(|c| **c > 0).count()
                );
                prop_assert!(record.ends_with(&tail), "{}", record);
            }
        }
    }
}
