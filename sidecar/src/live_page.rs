//! The sidecar's live page: `GET /` shows the merged coverage (totals, a
//! table per file), line coverage over time since the sidecar started, and
//! the targets with their states and errors; with `--source-root`,
//! `GET /file?path=...` shows a file's lines coloured by their hits.
//!
//! People watch their tests fill the coverage in a browser, often over a
//! port-forward, without network access to anything else: the page is one
//! HTML document written here by hand, with inline CSS and an inline SVG
//! chart, no script and no external asset. It reloads itself with
//! `<meta http-equiv="refresh">`, so a browser extension that adds the
//! bearer token to the page's requests adds it to every reload too.
//!
//! Every text that comes from a target, a report or a file (file names,
//! errors, source lines) goes through [`escape`].

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::report::percent_cell;

/// Points of line coverage kept for the chart (the oldest go first).
pub const HISTORY_POINTS: usize = 500;

/// Seconds between reloads when the page's URL does not say (`?refresh=N`).
pub const DEFAULT_REFRESH_SECS: u32 = 5;

/// The longest `?refresh=N` accepted, a day: longer is a typo.
const MAX_REFRESH_SECS: u32 = 86_400;

/// Line coverage at one moment, `secs` after the sidecar started.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub secs: f64,
    pub lines_hit: u64,
    pub lines: u64,
}

/// Line coverage over time: a point each time the merge's line totals
/// change, the last [`HISTORY_POINTS`] of them.
#[derive(Debug, Default)]
pub struct History {
    points: VecDeque<Point>,
}

impl History {
    /// Keeps `p` unless the totals are those of the last point (a merge
    /// whose counts changed but not which lines ran draws nothing new), or
    /// it is older (of a merge that took longer than a later one).
    pub fn record(&mut self, p: Point) {
        let same = |last: &Point| (last.lines_hit, last.lines) == (p.lines_hit, p.lines);
        if self.points.back().is_some_and(|last| same(last) || last.secs > p.secs) {
            return;
        }
        if self.points.len() == HISTORY_POINTS {
            self.points.pop_front();
        }
        self.points.push_back(p);
    }

    pub fn points(&self) -> Vec<Point> {
        self.points.iter().copied().collect()
    }
}

// ---------------------------------------------------------------- queries

/// The query of `GET /` or `GET /file`: each parameter in `allowed` at
/// most once, percent-decoded; anything else is refused, so that a typo is
/// never silently ignored.
pub fn parse_query(query: Option<&str>, allowed: &[&str]) -> Result<HashMap<String, String>, String> {
    let mut out = HashMap::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (k, v) = (percent_decode(k)?, percent_decode(v)?);
        if !allowed.contains(&k.as_str()) {
            return Err(format!("unknown query parameter {:?} (valid: {})", clip(&k), allowed.join(", ")));
        }
        if out.insert(k.clone(), v).is_some() {
            return Err(format!("query parameter {k} given more than once"));
        }
    }
    Ok(out)
}

/// `?refresh=N`: seconds between reloads, 0 for none.
pub fn refresh_secs(params: &HashMap<String, String>) -> Result<u32, String> {
    let Some(v) = params.get("refresh") else { return Ok(DEFAULT_REFRESH_SECS) };
    v.parse::<u32>().ok().filter(|n| *n <= MAX_REFRESH_SECS).ok_or_else(|| {
        format!("invalid refresh {:?}: seconds between reloads, 0 to {MAX_REFRESH_SECS} (0: never)", clip(v))
    })
}

/// Decodes `%XX` escapes and `+` (a space), then UTF-8.
fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let byte = s.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
                out.push(byte.ok_or("invalid percent-encoding in the query")?);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| "the query is not UTF-8 once percent-decoded".to_owned())
}

fn clip(s: &str) -> String {
    s.chars().take(100).collect()
}

// ---------------------------------------------------------------- sources

/// `--source-root`: the folder where the sources of the report's files
/// are, as the report names them (an absolute path inside it, or a path
/// relative to it).
#[derive(Debug, Clone)]
pub struct SourceRoot {
    /// Canonical, so that [`SourceRoot::resolve`] compares real paths.
    root: PathBuf,
}

impl SourceRoot {
    pub fn new(dir: &Path) -> Result<SourceRoot, String> {
        let root = std::fs::canonicalize(dir)
            .map_err(|e| format!("--source-root {}: {e}: give the folder the sources are in", dir.display()))?;
        if !root.is_dir() {
            return Err(format!("--source-root {} is not a folder: give the folder the sources are in", dir.display()));
        }
        Ok(SourceRoot { root })
    }

    /// The file a report's `path` stands for, refused unless it is a file
    /// inside the root once every `..` and symbolic link is resolved (a
    /// hostile report must not make the sidecar serve `/etc/shadow`).
    pub fn resolve(&self, path: &str) -> Result<PathBuf, String> {
        let given = Path::new(path);
        let candidate = if given.is_absolute() { given.to_owned() } else { self.root.join(given) };
        let outside = || {
            format!(
                "{} is not a file under --source-root {} (the report's paths must be inside it, or relative to it)",
                clip(path),
                self.root.display()
            )
        };
        let real = std::fs::canonicalize(&candidate).map_err(|_| outside())?;
        if !real.starts_with(&self.root) || !real.is_file() {
            return Err(outside());
        }
        Ok(real)
    }
}

/// A file's lines in the merged report.
#[derive(Debug, Default, PartialEq)]
pub struct FileLines {
    /// Hits per line (`DA` records).
    pub hits: BTreeMap<u32, u64>,
    /// `LF` and `LH`, as the table of `GET /` shows them (llvm-cov's come
    /// from function summaries, so they may differ from the `DA` count).
    pub lines: u64,
    pub lines_hit: u64,
}

/// The records of `path` in an LCOV text, `None` when it has none.
pub fn file_lines(lcov: &str, path: &str) -> Option<FileLines> {
    let mut file: Option<FileLines> = None;
    let mut inside = false;
    for line in lcov.lines() {
        if let Some(sf) = line.strip_prefix("SF:") {
            inside = sf == path;
            if inside {
                file.get_or_insert_with(FileLines::default);
            }
            continue;
        }
        let Some(f) = file.as_mut().filter(|_| inside) else { continue };
        let (tag, value) = line.split_once(':').unwrap_or((line, ""));
        match tag {
            "DA" => {
                let mut fields = value.split(',');
                let number = fields.next().and_then(|n| n.parse::<u32>().ok());
                let count = fields.next().and_then(|c| c.parse::<u64>().ok());
                if let (Some(n), Some(c)) = (number, count) {
                    let slot = f.hits.entry(n).or_insert(0);
                    *slot = slot.saturating_add(c);
                }
            }
            "LF" => f.lines += value.parse::<u64>().unwrap_or(0),
            "LH" => f.lines_hit += value.parse::<u64>().unwrap_or(0),
            _ => inside = line != "end_of_record",
        }
    }
    file
}

// ---------------------------------------------------------------- HTML

/// Text for HTML, in an element or an attribute value.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes all but RFC 3986's unreserved characters (a file's path
/// in a link).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

const STYLE: &str = "
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d2328;background:#fafbfc}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .5em}
.meta{color:#5c6670;margin:0}
.totals{display:flex;gap:1em;flex-wrap:wrap}
.total{background:#fff;border:1px solid #d8dee4;border-radius:6px;padding:.6em 1em;min-width:12em}
.total h3{margin:0;font-size:.9em;color:#5c6670;font-weight:normal}
.total .pct{font-size:1.8em;font-weight:600;margin:.1em 0}
.bar{background:#e9ecef;border-radius:3px;height:6px;overflow:hidden;min-width:6em}
.bar span{display:block;height:100%}
.good{background:#2da44e}.fair{background:#d4a72c}.poor{background:#cf222e}.none{background:#afb8c1}
table{border-collapse:collapse;background:#fff;border:1px solid #d8dee4}
th,td{padding:.25em .7em;border-bottom:1px solid #eaeef2;text-align:left;vertical-align:top}
th{background:#f3f5f7;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.state-running{color:#1a7f37}.state-error{color:#cf222e;font-weight:600}.state-lost{color:#bc4c00}.state-gone{color:#5c6670}
.error{color:#cf222e;max-width:40em;word-break:break-word}
svg{background:#fff;border:1px solid #d8dee4;border-radius:6px}
.source td{border:0;padding:0 .6em;font:12px/1.5 ui-monospace,monospace;white-space:pre}
.source tr.covered td.code{background:#dafbe1}.source tr.uncovered td.code{background:#ffebe9}
.source td.n,.source td.hits{color:#5c6670;text-align:right;user-select:none}
";

/// What `GET /` shows.
pub struct Page<'a> {
    pub instance: &'a str,
    pub uptime: Duration,
    /// The merge's summary, as `GET /coverage?format=json` serves it.
    pub summary: &'a Value,
    pub history: &'a [Point],
    /// The document `GET /targets` serves.
    pub targets: &'a Value,
    pub refresh: u32,
    /// Files link to `GET /file` (with `--source-root`).
    pub linked: bool,
}

fn head(out: &mut String, title: &str, refresh: u32) {
    let _ = write!(out, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    if refresh > 0 {
        let _ = write!(out, "<meta http-equiv=\"refresh\" content=\"{refresh}\">");
    }
    let _ = writeln!(
        out,
        "<meta name=\"viewport\" content=\"width=device-width\"><title>{}</title><style>{STYLE}</style></head><body>",
        escape(title)
    );
}

fn number(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

fn text<'v>(v: &'v Value, key: &str) -> &'v str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// The colour class of a bar.
fn grade(found: u64, hit: u64) -> &'static str {
    if found == 0 {
        return "none";
    }
    match hit * 100 / found {
        80.. => "good",
        50.. => "fair",
        _ => "poor",
    }
}

fn bar(found: u64, hit: u64) -> String {
    let width = if found == 0 { 0.0 } else { hit as f64 * 100.0 / found as f64 };
    format!("<div class=\"bar\"><span class=\"{}\" style=\"width:{width:.1}%\"></span></div>", grade(found, hit))
}

/// `GET /`.
pub fn render(page: &Page<'_>) -> String {
    let mut out = String::with_capacity(16 * 1024);
    head(&mut out, "livecov sidecar: coverage", page.refresh);
    let totals = &page.summary["totals"];
    let _ = writeln!(
        out,
        "<h1>Coverage</h1><p class=\"meta\">livecov sidecar {} · up {} · {} instance(s) merged · {} target(s) failed · {}</p>",
        escape(page.instance),
        duration(page.uptime.as_secs_f64()),
        number(page.summary, "instances"),
        number(page.summary, "targets_failed"),
        if page.refresh > 0 {
            format!("reloads every {} s (<a href=\"./?refresh=0\">stop</a>)", page.refresh)
        } else {
            format!("not reloading (<a href=\"./?refresh={DEFAULT_REFRESH_SECS}\">reload every {DEFAULT_REFRESH_SECS} s</a>)")
        }
    );
    out.push_str("<section class=\"totals\">");
    for (id, title, found_key, hit_key) in [
        ("lines", "Lines", "lines", "lines_hit"),
        ("functions", "Functions", "functions", "functions_hit"),
        ("branches", "Branches", "branches", "branches_hit"),
    ] {
        let (found, hit) = (number(totals, found_key), number(totals, hit_key));
        let _ = write!(
            out,
            "<div class=\"total\" id=\"total-{id}\" data-hit=\"{hit}\" data-found=\"{found}\"><h3>{title}</h3>\
             <p class=\"pct\">{}</p><p class=\"meta\">{hit} of {found}</p>{}</div>",
            percent_cell(found, hit),
            bar(found, hit)
        );
    }
    out.push_str("</section>\n<h2>Line coverage since the sidecar started</h2>\n");
    chart(&mut out, page.history, page.uptime.as_secs_f64());
    files(&mut out, page.summary, page.linked, page.refresh);
    targets(&mut out, page.targets);
    out.push_str("</body></html>\n");
    out
}

/// `3 s`, `4 min 05 s`, `2 h 03 min`.
fn duration(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {:02} s", s / 60, s % 60),
        _ => format!("{} h {:02} min", s / 3600, s % 3600 / 60),
    }
}

/// Line coverage (percent) over time as steps: each point holds until the
/// next, the last until now.
fn chart(out: &mut String, points: &[Point], now: f64) {
    const W: f64 = 720.0;
    const H: f64 = 180.0;
    // Room for the axis labels.
    const LEFT: f64 = 44.0;
    const RIGHT: f64 = 12.0;
    const TOP: f64 = 10.0;
    const BOTTOM: f64 = 24.0;
    let pct = |p: &Point| if p.lines == 0 { 0.0 } else { p.lines_hit as f64 * 100.0 / p.lines as f64 };
    let span = now.max(1.0);
    let x = |secs: f64| LEFT + (secs / span).clamp(0.0, 1.0) * (W - LEFT - RIGHT);
    let y = |pct: f64| TOP + (1.0 - pct / 100.0) * (H - TOP - BOTTOM);
    let _ = write!(
        out,
        "<svg id=\"history\" data-points=\"{}\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" role=\"img\" \
         aria-label=\"line coverage over time\">",
        points.len()
    );
    for (level, label) in [(0.0, "0 %"), (50.0, "50 %"), (100.0, "100 %")] {
        let _ = write!(
            out,
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#eaeef2\"/>\
             <text x=\"{}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\" fill=\"#5c6670\">{label}</text>",
            W - RIGHT,
            LEFT - 6.0,
            y(level) + 4.0,
            y = y(level)
        );
    }
    let _ = write!(
        out,
        "<text x=\"{LEFT}\" y=\"{}\" font-size=\"11\" fill=\"#5c6670\">start</text>\
         <text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"end\" fill=\"#5c6670\">now ({} later)</text>",
        H - 6.0,
        W - RIGHT,
        H - 6.0,
        duration(now)
    );
    if let Some(first) = points.first() {
        let mut path = format!("M{:.1} {:.1}", x(first.secs), y(pct(first)));
        for p in &points[1..] {
            let _ = write!(path, "H{:.1}V{:.1}", x(p.secs), y(pct(p)));
        }
        let _ = write!(path, "H{:.1}", x(now));
        let area = format!("{path}V{:.1}H{:.1}Z", y(0.0), x(first.secs));
        let _ = write!(
            out,
            "<path d=\"{area}\" fill=\"#2da44e\" fill-opacity=\"0.12\"/>\
             <path d=\"{path}\" fill=\"none\" stroke=\"#2da44e\" stroke-width=\"2\"/>"
        );
        for p in points {
            let _ = write!(
                out,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"#2da44e\"><title>{} after the start: {} of {} lines ({})</title></circle>",
                x(p.secs),
                y(pct(p)),
                duration(p.secs),
                p.lines_hit,
                p.lines,
                percent_cell(p.lines, p.lines_hit)
            );
        }
    } else {
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" font-size=\"12\" text-anchor=\"middle\" fill=\"#5c6670\">no merge yet</text>",
            W / 2.0,
            H / 2.0
        );
    }
    out.push_str("</svg>\n");
}

fn files(out: &mut String, summary: &Value, linked: bool, refresh: u32) {
    let files = summary["files"].as_array().map(Vec::as_slice).unwrap_or_default();
    let _ = writeln!(out, "<h2>Files ({})</h2>", files.len());
    if files.is_empty() {
        out.push_str("<p class=\"meta\">No file in the merge yet.</p>\n");
        return;
    }
    out.push_str(
        "<table id=\"files\"><tr><th>file</th><th colspan=\"3\">lines</th><th colspan=\"2\">functions</th>\
         <th colspan=\"2\">branches</th></tr>\n",
    );
    for f in files {
        let name = text(f, "file");
        let cell = if linked {
            format!("<a href=\"file?path={}&amp;refresh={refresh}\">{}</a>", percent_encode(name), escape(name))
        } else {
            escape(name)
        };
        let _ = write!(out, "<tr><td class=\"file\">{cell}</td>");
        for (found_key, hit_key, with_bar) in
            [("lines", "lines_hit", true), ("functions", "functions_hit", false), ("branches", "branches_hit", false)]
        {
            let (found, hit) = (number(f, found_key), number(f, hit_key));
            let _ = write!(out, "<td class=\"num\">{}</td><td class=\"num\">{hit}/{found}</td>", percent_cell(found, hit));
            if with_bar {
                let _ = write!(out, "<td>{}</td>", bar(found, hit));
            }
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");
}

fn targets(out: &mut String, doc: &Value) {
    let rows = doc["targets"].as_array().map(Vec::as_slice).unwrap_or_default();
    let _ = writeln!(out, "<h2>Targets ({})</h2>", rows.len());
    for w in doc["warnings"].as_array().map(Vec::as_slice).unwrap_or_default() {
        let _ = writeln!(out, "<p class=\"error\">{}</p>", escape(w.as_str().unwrap_or("")));
    }
    if !rows.is_empty() {
        out.push_str(
            "<table id=\"targets\"><tr><th>address</th><th>kind</th><th>state</th><th>instance</th><th>program</th>\
             <th>pid</th><th>last snapshot</th><th>in merge</th><th>last error</th></tr>\n",
        );
        for t in rows {
            let state = text(t, "state");
            let pid = t.get("pid").and_then(Value::as_u64).map(|p| p.to_string()).unwrap_or_default();
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td class=\"state-{}\">{}</td><td>{}</td><td>{}</td><td class=\"num\">{pid}</td>\
                 <td>{}</td><td>{}</td><td class=\"error\">{}</td></tr>",
                escape(text(t, "address")),
                escape(text(t, "kind")),
                escape(state),
                escape(state),
                escape(text(t, "instance")),
                escape(text(t, "program")),
                escape(text(t, "last_snapshot")),
                if t["in_merge"] == true { "yes" } else { "no" },
                escape(text(t, "last_error")),
            );
        }
        out.push_str("</table>\n");
    }
    let sources = doc["sources"].as_array().map(Vec::as_slice).unwrap_or_default();
    if !sources.is_empty() {
        out.push_str(
            "<h2>Sources</h2><table id=\"sources\"><tr><th>source</th><th>state</th><th>targets</th><th>since</th>\
             <th>error</th></tr>\n",
        );
        for s in sources {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td class=\"num\">{}</td><td>{}</td><td class=\"error\">{}</td></tr>",
                escape(text(s, "source")),
                escape(text(s, "state")),
                number(s, "targets"),
                escape(text(s, "since")),
                escape(text(s, "error")),
            );
        }
        out.push_str("</table>\n");
    }
}

/// `GET /file`: `source` (the file's text) with each line's hits, lines
/// that ran `covered`, lines that did not `uncovered`.
pub fn render_file(path: &str, source: &str, file: &FileLines, refresh: u32) -> String {
    let mut out = String::with_capacity(source.len() * 2 + 4096);
    head(&mut out, &format!("livecov: {path}"), refresh);
    let (found, hit, hits) = (file.lines, file.lines_hit, &file.hits);
    let _ = write!(
        out,
        "<p class=\"meta\"><a href=\"./?refresh={refresh}\">← coverage</a></p><h1>{}</h1>\
         <p class=\"meta\" id=\"file-lines\" data-hit=\"{hit}\" data-found=\"{found}\">lines {hit} of {found} ({})</p>\n\
         <table class=\"source\">\n",
        escape(path),
        percent_cell(found, hit)
    );
    for (i, line) in source.lines().enumerate() {
        let n = i as u32 + 1;
        let (class, count) = match hits.get(&n) {
            Some(0) => (" class=\"uncovered\"", "0".to_owned()),
            Some(c) => (" class=\"covered\"", c.to_string()),
            None => ("", String::new()),
        };
        let _ = writeln!(
            out,
            "<tr id=\"L{n}\"{class}><td class=\"n\">{n}</td><td class=\"hits\">{count}</td><td class=\"code\">{}</td></tr>",
            escape(line)
        );
    }
    out.push_str("</table></body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_keeps_changes_and_the_last_points() {
        let mut h = History::default();
        let p = |secs: f64, lines_hit: u64| Point { secs, lines_hit, lines: 10 };
        h.record(p(0.0, 1));
        h.record(p(1.0, 1));
        h.record(p(2.0, 2));
        h.record(p(1.5, 5));
        assert_eq!(h.points(), [p(0.0, 1), p(2.0, 2)]);
        for i in 0..HISTORY_POINTS as u64 + 10 {
            h.record(p(3.0 + i as f64, 3 + i));
        }
        let points = h.points();
        assert_eq!(points.len(), HISTORY_POINTS);
        assert_eq!(points.last().map(|p| p.lines_hit), Some(HISTORY_POINTS as u64 + 12));
    }

    #[test]
    fn queries_are_decoded_and_checked() {
        let q = parse_query(Some("path=%2Fsrc%2Fa+b.rs&refresh=0"), &["path", "refresh"]).unwrap();
        assert_eq!(q["path"], "/src/a b.rs");
        assert_eq!(refresh_secs(&q), Ok(0));
        assert_eq!(refresh_secs(&HashMap::new()), Ok(DEFAULT_REFRESH_SECS));
        assert!(parse_query(Some("nope=1"), &["refresh"]).is_err());
        assert!(parse_query(Some("refresh=1&refresh=2"), &["refresh"]).is_err());
        assert!(parse_query(Some("refresh=%zz"), &["refresh"]).is_err());
        let bad = parse_query(Some("refresh=-1"), &["refresh"]).unwrap();
        assert!(refresh_secs(&bad).is_err());
    }

    #[test]
    fn escaping_and_links() {
        assert_eq!(escape("<a href=\"x\">'&'</a>"), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
        assert_eq!(percent_encode("/src/a b&c.rs"), "/src/a%20b%26c.rs");
    }

    #[test]
    fn the_lines_of_one_file() {
        let lcov = "SF:/a.rs\nDA:1,3\nDA:2,0\nLF:2\nLH:1\nend_of_record\nSF:/b.rs\nDA:1,1\nend_of_record\n\
                    SF:/a.rs\nDA:1,2\nend_of_record\nDA:9,9\n";
        let file = file_lines(lcov, "/a.rs").unwrap();
        assert_eq!(file, FileLines { hits: BTreeMap::from([(1, 5), (2, 0)]), lines: 2, lines_hit: 1 });
        assert!(file_lines(lcov, "/c.rs").is_none());
        let page = render_file("/a.rs", "fn a() {}\n<b>\n", &file, 0);
        assert!(page.contains("<tr id=\"L1\" class=\"covered\">"), "{page}");
        assert!(page.contains("<tr id=\"L2\" class=\"uncovered\">") && page.contains("&lt;b&gt;"), "{page}");
        assert!(!page.contains("http-equiv"));
    }

    #[test]
    fn the_source_root_refuses_what_is_outside() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("src");
        std::fs::create_dir_all(root.join("lib")).unwrap();
        std::fs::write(root.join("lib/a.rs"), "fn a() {}\n").unwrap();
        std::fs::write(dir.path().join("secret"), "no\n").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), root.join("link.rs")).unwrap();
        let r = SourceRoot::new(&root).unwrap();
        let inside = std::fs::canonicalize(root.join("lib/a.rs")).unwrap();
        assert_eq!(r.resolve("lib/a.rs").unwrap(), inside);
        assert_eq!(r.resolve(inside.to_str().unwrap()).unwrap(), inside);
        for bad in ["../secret", "lib/../../secret", "link.rs", "lib", "missing.rs", "/etc/passwd"] {
            assert!(r.resolve(bad).is_err(), "{bad} was served");
        }
        assert!(SourceRoot::new(&dir.path().join("secret")).is_err());
        assert!(SourceRoot::new(&dir.path().join("none")).is_err());
    }
}
