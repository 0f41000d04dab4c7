//! `livecov report`, end to end: its TOTAL row against `llvm-cov report`
//! (LLVM 22) for the C, C++ and Rust fixtures; its Cobertura XML read by
//! pycobertura, checked against coverage-04.dtd (lxml) and used by
//! diff-cover on a git change; the thresholds both ways; the LCOV of c8,
//! coverage.py and genhtml's lcov read; the Markdown and JSON shapes; and
//! the errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use livecov_tests::service::scratch;
use livecov_tests::{fixture, livecov_bin, llvm_tool, merge_profdata, oracle_lcov, run_checked, workspace_root};

fn livecov(args: &[&str]) -> Output {
    Command::new(livecov_bin()).args(args).env("SOURCE_DATE_EPOCH", "1700000000").output().expect("run livecov")
}

fn ok(args: &[&str]) -> String {
    let out = livecov(args);
    assert!(out.status.success(), "livecov {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// Runs a command that must exit 1; returns its standard output and error.
fn fails(args: &[&str]) -> (String, String) {
    let out = livecov(args);
    assert_eq!(out.status.code(), Some(1), "livecov {args:?}: {out:?}");
    (String::from_utf8(out.stdout).expect("UTF-8"), String::from_utf8(out.stderr).expect("UTF-8"))
}

fn write(path: &Path, text: &str) -> String {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path.to_str().expect("a UTF-8 path").to_owned()
}

/// The numbers after `TOTAL` in a table.
fn total_row(table: &str) -> Vec<String> {
    let row = table.lines().find(|l| l.starts_with("TOTAL")).unwrap_or_else(|| panic!("no TOTAL in\n{table}"));
    row.split_whitespace().skip(1).map(str::to_owned).collect()
}

/// Sums of LF, LH, FNF, FNH, BRF, BRH over an LCOV report.
fn summaries(lcov: &str) -> [u64; 6] {
    let mut t = [0; 6];
    for line in lcov.lines() {
        for (i, tag) in ["LF:", "LH:", "FNF:", "FNH:", "BRF:", "BRH:"].iter().enumerate() {
            if let Some(v) = line.strip_prefix(tag) {
                t[i] += v.parse::<u64>().expect("a number");
            }
        }
    }
    t
}

/// The report venv (pycobertura, diff-cover), brought up to date once per test process.
fn report_venv() -> PathBuf {
    static READY: OnceLock<()> = OnceLock::new();
    READY.get_or_init(|| {
        run_checked(
            Command::new("bash").arg(workspace_root().join("tests/scripts/deps-report.sh")),
            "tests/scripts/deps-report.sh (pycobertura and diff-cover)",
        );
    });
    workspace_root().join("target/report-venv")
}

#[test]
fn total_is_llvm_cov_reports_for_the_c_cpp_and_rust_fixtures() {
    let dir = scratch("report", "llvm-cov");
    for name in ["c-clang19", "cpp", "rust"] {
        let fixture = fixture(name);
        for run in &fixture.runs {
            let context = format!("{name}/{}", run.label);
            let lcov = write(&dir.join(format!("{name}-{}.lcov", run.label)), &oracle_lcov(fixture, run, &[]));
            let profdata = dir.join(format!("{name}-{}.profdata", run.label));
            merge_profdata(fixture, run, &profdata);
            let mut cmd = Command::new(llvm_tool("llvm-cov"));
            cmd.arg("report").arg(&fixture.binary).arg("-instr-profile").arg(&profdata);
            let llvm = String::from_utf8(run_checked(&mut cmd, &format!("llvm-cov report of {context}")).stdout).unwrap();
            // llvm-cov: regions (3 columns), functions, lines, branches (3 each).
            let want = total_row(&llvm);
            let got = total_row(&ok(&["report", &lcov]));
            assert_eq!(got, want[3..12].to_vec(), "{context}: ours\n{got:?}\nllvm-cov report\n{llvm}");
        }
    }
}

#[test]
fn several_inputs_total_as_livecov_merge_counts() {
    let dir = scratch("report", "several");
    let fixture = fixture("c-clang19");
    let files: Vec<String> = fixture
        .runs
        .iter()
        .map(|run| write(&dir.join(format!("{}.lcov", run.label)), &oracle_lcov(fixture, run, &[])))
        .collect();
    let mut args = vec!["merge", "-o"];
    let merged = dir.join("merged.lcov");
    args.push(merged.to_str().unwrap());
    args.extend(files.iter().map(String::as_str));
    ok(&args);
    let [lf, lh, fnf, fnh, brf, brh] = summaries(&std::fs::read_to_string(&merged).unwrap());
    let mut report = vec!["report", "--format", "json"];
    report.extend(files.iter().map(String::as_str));
    let json: serde_json::Value = serde_json::from_str(&ok(&report)).unwrap();
    let t = &json["totals"];
    assert_eq!(
        [&t["lines"], &t["lines_hit"], &t["functions"], &t["functions_hit"], &t["branches"], &t["branches_hit"]],
        [lf, lh, fnf, fnh, brf, brh].map(serde_json::Value::from).each_ref(),
        "{json}"
    );
    // And the merged file alone reports the same.
    assert_eq!(serde_json::from_str::<serde_json::Value>(&ok(&["report", "--format", "json", merged.to_str().unwrap()])).unwrap()["totals"], *t);
}

/// What pycobertura reads of a Cobertura file, and whether lxml finds it
/// valid against coverage-04.dtd.
const READ_COBERTURA: &str = r#"
import json, sys
from lxml import etree
from pycobertura import Cobertura
dtd = etree.DTD(sys.argv[2])
valid = dtd.validate(etree.parse(sys.argv[1]))
c = Cobertura(sys.argv[1])
files = {}
for f in c.files():
    statuses = [s for _, s in c.line_statuses(f)]
    files[f] = {"statements": c.total_statements(f), "statuses": [statuses.count(s) for s in ("hit", "partial", "miss")]}
print(json.dumps({"valid": valid, "errors": [str(e) for e in dtd.error_log], "statements": c.total_statements(),
                  "line_rate": c.line_rate(), "branch_rate": c.branch_rate(), "files": files}))
"#;

/// coverage-04.dtd, as Cobertura publishes it.
const COVERAGE_04_DTD: &str = r#"<!ELEMENT coverage (sources?,packages)>
<!ATTLIST coverage line-rate        CDATA #REQUIRED>
<!ATTLIST coverage branch-rate      CDATA #REQUIRED>
<!ATTLIST coverage lines-covered    CDATA #REQUIRED>
<!ATTLIST coverage lines-valid      CDATA #REQUIRED>
<!ATTLIST coverage branches-covered CDATA #REQUIRED>
<!ATTLIST coverage branches-valid   CDATA #REQUIRED>
<!ATTLIST coverage complexity       CDATA #REQUIRED>
<!ATTLIST coverage version          CDATA #REQUIRED>
<!ATTLIST coverage timestamp        CDATA #REQUIRED>
<!ELEMENT sources (source*)>
<!ELEMENT source (#PCDATA)>
<!ELEMENT packages (package*)>
<!ELEMENT package (classes)>
<!ATTLIST package name        CDATA #REQUIRED>
<!ATTLIST package line-rate   CDATA #REQUIRED>
<!ATTLIST package branch-rate CDATA #REQUIRED>
<!ATTLIST package complexity  CDATA #REQUIRED>
<!ELEMENT classes (class*)>
<!ELEMENT class (methods,lines)>
<!ATTLIST class name        CDATA #REQUIRED>
<!ATTLIST class filename    CDATA #REQUIRED>
<!ATTLIST class line-rate   CDATA #REQUIRED>
<!ATTLIST class branch-rate CDATA #REQUIRED>
<!ATTLIST class complexity  CDATA #REQUIRED>
<!ELEMENT methods (method*)>
<!ELEMENT method (lines)>
<!ATTLIST method name        CDATA #REQUIRED>
<!ATTLIST method signature   CDATA #REQUIRED>
<!ATTLIST method line-rate   CDATA #REQUIRED>
<!ATTLIST method branch-rate CDATA #REQUIRED>
<!ATTLIST method complexity  CDATA #REQUIRED>
<!ELEMENT lines (line*)>
<!ELEMENT line (conditions*)>
<!ATTLIST line number CDATA #REQUIRED>
<!ATTLIST line hits   CDATA #REQUIRED>
<!ATTLIST line branch CDATA "false">
<!ATTLIST line condition-coverage CDATA "100%">
<!ELEMENT conditions (condition*)>
<!ELEMENT condition EMPTY>
<!ATTLIST condition number   CDATA #REQUIRED>
<!ATTLIST condition type     CDATA #REQUIRED>
<!ATTLIST condition coverage CDATA #REQUIRED>
"#;

/// Per file of an LCOV report: DA lines, DA lines hit, BRDA entries, BRDA
/// taken; and the lines pycobertura calls hit, partial and missed (by
/// their branches where they have some, else by their hits).
fn entries(lcov: &str) -> std::collections::BTreeMap<String, ([u64; 4], [u64; 3])> {
    use std::collections::BTreeMap;
    /// Per line: its DA count; its BRDA entries and those taken.
    type File = (BTreeMap<u32, u64>, BTreeMap<u32, (u64, u64)>);
    let mut files: BTreeMap<String, File> = BTreeMap::new();
    let mut current = String::new();
    for line in lcov.lines() {
        if let Some(f) = line.strip_prefix("SF:") {
            current = f.to_owned();
        } else if let Some(da) = line.strip_prefix("DA:") {
            let mut fields = da.split(',');
            let (n, count) = (fields.next().unwrap().parse().unwrap(), fields.next().unwrap().parse::<u64>().unwrap());
            files.entry(current.clone()).or_default().0.insert(n, count);
        } else if let Some(br) = line.strip_prefix("BRDA:") {
            let n = br.split(',').next().unwrap().parse().unwrap();
            let e = files.entry(current.clone()).or_default().1.entry(n).or_default();
            e.0 += 1;
            e.1 += u64::from(!br.ends_with(",-") && !br.ends_with(",0"));
        }
    }
    files
        .into_iter()
        .map(|(file, (lines, branches))| {
            let mut counts = [lines.len() as u64, lines.values().filter(|&&c| c > 0).count() as u64, 0, 0];
            let mut statuses = [0; 3];
            for (n, count) in &lines {
                let status = match branches.get(n) {
                    Some(&(found, taken)) if taken == found => 0,
                    Some(&(_, 0)) => 2,
                    Some(_) => 1,
                    None if *count > 0 => 0,
                    None => 2,
                };
                statuses[status] += 1;
            }
            for (found, taken) in branches.values() {
                counts[2] += found;
                counts[3] += taken;
            }
            (file, (counts, statuses))
        })
        .collect()
}

fn attribute<'a>(xml: &'a str, element: &str, name: &str) -> &'a str {
    let start = xml.find(&format!("<{element} ")).unwrap_or_else(|| panic!("no <{element}> in\n{xml}"));
    let tag = &xml[start..start + xml[start..].find('>').expect("a whole tag")];
    let at = tag.find(&format!(" {name}=\"")).unwrap_or_else(|| panic!("no {name} in {tag}")) + name.len() + 3;
    &tag[at..at + tag[at..].find('"').expect("a closing quote")]
}

#[test]
fn cobertura_is_valid_and_pycobertura_reads_the_lcovs_lines() {
    let venv = report_venv();
    let dir = scratch("report", "cobertura");
    let dtd = write(&dir.join("coverage-04.dtd"), COVERAGE_04_DTD);
    let script = write(&dir.join("read.py"), READ_COBERTURA);
    for name in ["c-clang19", "rust"] {
        let fixture = fixture(name);
        let text = oracle_lcov(fixture, fixture.runs.last().expect("a run"), &[]);
        let lcov = write(&dir.join(format!("{name}.lcov")), &text);
        let xml_path = dir.join(format!("{name}.xml"));
        ok(&["report", "--format", "cobertura", "-o", xml_path.to_str().unwrap(), &lcov]);
        let xml = std::fs::read_to_string(&xml_path).unwrap();
        let out = run_checked(Command::new(venv.join("bin/python")).arg(&script).arg(&xml_path).arg(&dtd), "pycobertura");
        let read: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(read["valid"], true, "{name}: not valid against coverage-04.dtd: {}", read["errors"]);

        let want = entries(&text);
        let sum = |i: usize| want.values().map(|(e, _)| e[i]).sum::<u64>();
        assert_eq!(attribute(&xml, "coverage", "lines-valid"), sum(0).to_string(), "{name}");
        assert_eq!(attribute(&xml, "coverage", "lines-covered"), sum(1).to_string(), "{name}");
        assert_eq!(attribute(&xml, "coverage", "branches-valid"), sum(2).to_string(), "{name}");
        assert_eq!(attribute(&xml, "coverage", "branches-covered"), sum(3).to_string(), "{name}");
        assert_eq!(attribute(&xml, "coverage", "timestamp"), "1700000000000", "{name}: SOURCE_DATE_EPOCH");
        assert_eq!(read["statements"], sum(0), "{name}");
        let rate = |found: u64, hit: u64| (hit * 10_000).checked_div(found).map_or(1.0, |q| q as f64 / 10_000.0);
        assert_eq!(read["line_rate"].as_f64(), Some(rate(sum(0), sum(1))), "{name}");
        assert_eq!(read["branch_rate"].as_f64(), Some(rate(sum(2), sum(3))), "{name}");
        // Every file, under the common folder (the <source>).
        let source = attribute_text(&xml, "source");
        for (file, (e, statuses)) in &want {
            let relative = file.strip_prefix(&format!("{source}/")).unwrap_or_else(|| panic!("{file} not under {source}"));
            let f = &read["files"][relative];
            assert_eq!(f["statements"].as_u64(), Some(e[0]), "{name} {file}: {read}");
            assert_eq!(f["statuses"], serde_json::json!(statuses), "{name} {file}: hit, partial, missed: {read}");
        }
    }
}

fn attribute_text<'a>(xml: &'a str, element: &str) -> &'a str {
    let start = xml.find(&format!("<{element}>")).expect("the element") + element.len() + 2;
    &xml[start..start + xml[start..].find('<').expect("its end")]
}

#[test]
fn diff_cover_reads_the_cobertura_of_a_change() {
    let venv = report_venv();
    let dir = scratch("report", "diff-cover");
    let repo = dir.join("repo");
    std::fs::create_dir_all(repo.join("src")).unwrap();
    let git = |args: &[&str]| {
        run_checked(
            Command::new("git")
                .args(["-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"])
                .args(args)
                .current_dir(&repo),
            &format!("git {args:?}"),
        )
    };
    git(&["init", "-q"]);
    write(&repo.join("src/a.c"), "int a(void) {\n  return 1;\n}\n");
    write(&repo.join("b.c"), "int b(void) { return 2; }\n");
    git(&["add", "."]);
    git(&["commit", "-q", "-m", "base"]);
    git(&["checkout", "-q", "-b", "change"]);
    write(&repo.join("src/a.c"), "int a(int x) {\n  if (x)\n    return 1;\n  return 0;\n}\n");
    git(&["commit", "-q", "-am", "change"]);
    // Lines 2 and 3 ran, line 4 did not; a path inside an image, rewritten to the checkout.
    let lcov = write(
        &dir.join("app.lcov"),
        "SF:/build/src/a.c\nDA:1,3\nDA:2,3\nDA:3,3\nDA:4,0\nBRDA:2,0,0,3\nBRDA:2,0,1,0\nend_of_record\n\
         SF:/build/b.c\nDA:1,1\nend_of_record\n",
    );
    let xml = dir.join("coverage.xml");
    let equivalence = format!("/build,{}", repo.display());
    ok(&["report", "--format", "cobertura", "--path-equivalence", &equivalence, "-o", xml.to_str().unwrap(), &lcov]);
    let json = dir.join("diff-cover.json");
    let out = Command::new(venv.join("bin/diff-cover"))
        .arg(&xml)
        .args(["--compare-branch=main", "--json-report"])
        .arg(&json)
        .current_dir(&repo)
        .output()
        .expect("run diff-cover");
    assert!(out.status.success(), "diff-cover: {out:?}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let file = &report["src_stats"]["src/a.c"];
    assert_eq!(file["violation_lines"], serde_json::json!([4]), "{report}");
    assert_eq!(report["total_num_lines"], 4, "{report}");
    assert_eq!(report["total_num_violations"], 1, "{report}");
}

#[test]
fn each_threshold_passes_at_its_figure_and_fails_above() {
    let dir = scratch("report", "thresholds");
    // Lines 2/3 (66.66...%), functions 1/2 (50%), branches 1/4 (25%).
    let lcov = write(
        &dir.join("t.lcov"),
        "SF:/src/t.c\nFN:1,f\nFN:5,g\nFNDA:1,f\nFNDA:0,g\nDA:1,1\nDA:2,1\nDA:5,0\n\
         BRDA:2,0,0,1\nBRDA:2,0,1,0\nBRDA:2,1,0,-\nBRDA:2,1,1,-\nend_of_record\n",
    );
    for (flag, passes, fails_at, message) in [
        ("--fail-under-lines", "66.6", "66.67", "livecov: line coverage 66.67% (2/3) is under --fail-under-lines 66.67\n"),
        ("--fail-under-functions", "50", "50.01", "livecov: function coverage 50.00% (1/2) is under --fail-under-functions 50.01\n"),
        ("--fail-under-branches", "25", "26", "livecov: branch coverage 25.00% (1/4) is under --fail-under-branches 26\n"),
    ] {
        let table = ok(&["report", flag, passes, &lcov]);
        assert!(table.contains("TOTAL"), "{table}");
        let (out, err) = fails(&["report", flag, fails_at, &lcov]);
        // The report is written all the same, then one line says why.
        assert_eq!(out, table, "{flag}");
        assert_eq!(err, message, "{flag}");
    }
    // A report to a file is written before the verdict too; all three fail, a line each.
    let out = dir.join("report.md");
    let (_, err) = fails(&[
        "report", "--format", "markdown", "-o", out.to_str().unwrap(), "--fail-under-lines", "100",
        "--fail-under-functions", "100", "--fail-under-branches", "100", &lcov,
    ]);
    assert_eq!(err.lines().count(), 3, "{err}");
    assert!(std::fs::read_to_string(&out).unwrap().contains("**TOTAL**"));
    // Nothing of a kind (no branches here) is never under.
    let plain = write(&dir.join("plain.lcov"), "SF:/src/p.c\nDA:1,1\nend_of_record\n");
    ok(&["report", "--fail-under-branches", "100", &plain]);
}

#[test]
fn bad_thresholds_paths_and_inputs_say_what_to_do() {
    let dir = scratch("report", "errors");
    let lcov = write(&dir.join("t.lcov"), "SF:/src/t.c\nDA:1,1\nend_of_record\n");
    for (args, says) in [
        (vec!["--fail-under-lines", "eighty"], "is not a percentage: give a number from 0 to 100"),
        (vec!["--fail-under-branches", "120"], "is over 100"),
        (vec!["--path-equivalence", "/build"], "is not FROM,TO"),
        (vec!["--ignore-filename-regex", "("], "is not a valid regular expression"),
        (vec!["--format", "html"], "invalid value 'html'"),
    ] {
        let mut all = vec!["report"];
        all.extend(args);
        all.push(&lcov);
        let out = livecov(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{all:?}: {err}");
    }
    let missing = dir.join("missing.lcov");
    let (_, err) = fails(&["report", missing.to_str().unwrap()]);
    assert!(err.contains("cannot open") && err.contains("missing.lcov"), "{err}");
    let json = write(&dir.join("coverage.json"), "{\"files\": []}\n");
    let (_, err) = fails(&["report", &lcov, &json]);
    assert!(err.contains("coverage.json: no coverage record in it") && err.contains("is it LCOV?"), "{err}");
    let bad = write(&dir.join("bad.lcov"), "SF:/src/t.c\nDA:x,1\nend_of_record\n");
    let (_, err) = fails(&["report", &bad]);
    assert!(err.contains("bad.lcov:2"), "{err}");
    let help = ok(&["report", "--help"]);
    assert!(help.contains("Examples:") && help.contains("livecov report ") && help.contains("--fail-under-lines"), "{help}");
}

#[test]
fn markdown_and_json_shapes() {
    let dir = scratch("report", "shapes");
    let lcov = write(
        &dir.join("s.lcov"),
        "TN:one\nSF:/r/src/a_b.c\nFNDA:1,f\nDA:1,1\nDA:2,0\nend_of_record\n\
         TN:two\nSF:/r/src/a_b.c\nDA:2,4\nend_of_record\nSF:/r/lib/c.c\nDA:1,0\nBRDA:1,0,0,0\nBRDA:1,0,1,1\nend_of_record\n",
    );
    let md = ok(&["report", "--format", "markdown", &lcov]);
    assert_eq!(
        md,
        "| File | Functions | Lines | Branches |\n|:---|---:|---:|---:|\n\
         | `lib/c.c` | - | 0.00% (0/1) | 50.00% (1/2) |\n\
         | `src/a_b.c` | 100.00% (1/1) | 100.00% (2/2) | - |\n\
         | **TOTAL** | **100.00% (1/1)** | **66.67% (2/3)** | **50.00% (1/2)** |\n"
    );
    let json: serde_json::Value = serde_json::from_str(&ok(&["report", "--format", "json", &lcov])).unwrap();
    assert_eq!(json["totals"]["files"], 2);
    assert_eq!(json["totals"]["lines_percent"], 66.67);
    assert_eq!(json["files"][1]["file"], "/r/src/a_b.c");
    assert_eq!(json["files"][1]["branches_percent"], serde_json::Value::Null);
    assert_eq!(json["files"][0]["branches_hit"], 1);
    // --ignore-filename-regex matches the paths as the LCOV has them; --path-equivalence rewrites the rest.
    let json: serde_json::Value = serde_json::from_str(&ok(&[
        "report", "--format", "json", "--ignore-filename-regex", "^/r/lib/", "--path-equivalence", "/r/src,/home/me/src", &lcov,
    ]))
    .unwrap();
    assert_eq!(json["files"].as_array().unwrap().len(), 1, "{json}");
    assert_eq!(json["files"][0]["file"], "/home/me/src/a_b.c");
}

#[test]
fn reads_the_lcov_of_c8_coverage_py_and_genhtmls_lcov() {
    let dir = scratch("report", "producers");
    // c8 over a small script.
    std::fs::write(dir.join("pick.js"), "function pick(x) {\n  if (x > 1) {\n    return 'big';\n  }\n  return 'small';\n}\nfunction unused() { return 0; }\nconsole.log(pick(2));\n").unwrap();
    let mut c8 = Command::new(livecov_tests::node::node_tool("c8"));
    c8.args(["--reporter=lcov", "--report-dir", "c8", "node", "pick.js"]).current_dir(&dir);
    livecov_tests::node::clean_env(&mut c8);
    run_checked(&mut c8, "c8 node pick.js");
    // coverage.py, with branches.
    std::fs::write(dir.join("pick.py"), "def pick(x):\n    if x > 1:\n        return 'big'\n    return 'small'\n\ndef unused():\n    return 0\n\nprint(pick(2))\n").unwrap();
    run_checked(livecov_tests::python::command("coverage").args(["run", "--branch", "pick.py"]).current_dir(&dir), "coverage run");
    run_checked(livecov_tests::python::command("coverage").args(["lcov", "-o", "py.lcov"]).current_dir(&dir), "coverage lcov");
    // lcov/geninfo 2.x style: checksums, FNL/FNA, an exception branch block.
    let genhtml = write(
        &dir.join("geninfo.info"),
        "TN:\nSF:/src/g.c\nFNL:0,1,4\nFNA:0,2,main\nFNF:1\nFNH:1\nDA:1,2,abc\nDA:2,2\nDA:3,0\nBRDA:2,0,0,2\nBRDA:2,e0,1,0\nBRF:2\nBRH:1\nLF:3\nLH:2\nend_of_record\n",
    );
    for lcov in [dir.join("c8/lcov.info"), dir.join("py.lcov"), PathBuf::from(&genhtml)] {
        let text = std::fs::read_to_string(&lcov).unwrap_or_else(|e| panic!("{}: {e}", lcov.display()));
        let [lf, lh, fnf, fnh, brf, brh] = summaries(&text);
        assert!(lf > 0 && lh > 0 && lh < lf, "{}: {text}", lcov.display());
        let path = lcov.to_str().unwrap();
        let json: serde_json::Value = serde_json::from_str(&ok(&["report", "--format", "json", path])).unwrap();
        let t = &json["totals"];
        assert_eq!(
            [&t["lines"], &t["lines_hit"], &t["functions"], &t["functions_hit"], &t["branches"], &t["branches_hit"]],
            [lf, lh, fnf, fnh, brf, brh].map(serde_json::Value::from).each_ref(),
            "{}: {json}",
            lcov.display()
        );
        let xml = ok(&["report", "--format", "cobertura", path]);
        assert!(xml.contains("<class ") && xml.contains(r#"branch="true""#), "{}: {xml}", lcov.display());
    }
}

#[test]
fn merge_takes_the_same_path_equivalence() {
    let dir = scratch("report", "merge-paths");
    let image = write(&dir.join("image.lcov"), "SF:/app/./src/a.c\nDA:1,1\nDA:2,0\nend_of_record\nSF:/opt/b.c\nDA:1,1\nend_of_record\n");
    let local = write(&dir.join("local.lcov"), "SF:/home/me/src/a.c\nDA:2,3\nend_of_record\n");
    let merged = ok(&["merge", "--path-equivalence", "/app,/home/me", &image, &local]);
    // /app/./src/a.c is /home/me/src/a.c: one record; /opt/b.c as it was.
    assert_eq!(
        merged,
        "SF:/home/me/src/a.c\nFNF:0\nFNH:0\nDA:1,1\nDA:2,3\nBRF:0\nBRH:0\nLF:2\nLH:2\nend_of_record\n\
         SF:/opt/b.c\nFNF:0\nFNH:0\nDA:1,1\nBRF:0\nBRH:0\nLF:1\nLH:1\nend_of_record\n"
    );
    let out = livecov(&["merge", "--path-equivalence", "/app", &image]);
    assert_eq!(out.status.code(), Some(2), "a bad argument: {out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not FROM,TO"));
}
