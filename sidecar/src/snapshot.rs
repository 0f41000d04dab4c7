//! What the sidecar and `livecov collect` keep of an instance, and the
//! helpers both use on LCOV text.

use std::time::{SystemTime, UNIX_EPOCH};

use hyper::body::Bytes;

use std::collections::BTreeMap;
use std::sync::Arc;

use livecov::fleet::{self, BuildMapping};
use livecov::profile::Counters;

use crate::merge::{Merger, Totals};

/// An instance's metadata, from its `GET /health` or its
/// `reports/<instance>.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Meta {
    pub runtime: Option<String>,
    pub program: Option<String>,
    pub build_id: Option<String>,
    pub pid: Option<u64>,
    /// `running` or `exited`, as the instance said.
    pub state: Option<String>,
}

impl Meta {
    /// Reads the fields of a `/health` or metadata JSON document; a
    /// document that is not JSON gives nothing.
    pub fn from_json(text: &[u8]) -> Meta {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(text) else { return Meta::default() };
        let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
        Meta { runtime: s("runtime"), program: s("program"), build_id: s("build_id"), pid: v.get("pid").and_then(|p| p.as_u64()), state: s("state") }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "runtime": self.runtime,
            "program": self.program,
            "build_id": self.build_id,
            "pid": self.pid,
        })
    }
}

/// Checks that `body` is LCOV the merger reads (UTF-8, no malformed line).
pub fn check_lcov(name: &str, body: &[u8]) -> Result<(), String> {
    let text = std::str::from_utf8(body).map_err(|_| "the answer is not UTF-8 text, so not LCOV".to_owned())?;
    let mut m = Merger::new();
    m.add(name, text).map_err(|e| format!("the answer is not LCOV: {e}"))?;
    // The merger ignores lines it does not know: text without a single
    // record but with other lines (an HTML page...) is not a report.
    if m.is_empty() {
        if let Some(line) = text.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with("TN:") && !l.starts_with('#')) {
            let line: String = line.chars().take(60).collect();
            return Err(format!("the answer is not LCOV (no SF: record; it starts with {line:?})"));
        }
    }
    Ok(())
}

/// The report with every record named `test` (`TN:test`): existing `TN:`
/// lines dropped, one `TN:` put first.
pub fn retitle(text: &str, test: &str) -> String {
    let mut out = String::with_capacity(text.len() + test.len() + 4);
    out.push_str("TN:");
    out.push_str(test);
    out.push('\n');
    for line in text.split_inclusive('\n') {
        if !line.starts_with("TN:") {
            out.push_str(line);
        }
    }
    out
}

/// Merges reports (name, LCOV), each retitled when `test` is given.
pub fn merge_texts<'a>(inputs: impl IntoIterator<Item = (&'a str, &'a [u8])>, test: Option<&str>) -> Result<Merger, String> {
    let mut merger = Merger::new();
    for (name, body) in inputs {
        let text = std::str::from_utf8(body).map_err(|_| format!("{name}: not UTF-8"))?;
        let r = match test {
            Some(t) => merger.add(name, &retitle(text, t)),
            None => merger.add(name, text),
        };
        r.map_err(|e| e.to_string())?;
    }
    Ok(merger)
}

/// The exact groups of `instances` (name, build mapping, gzipped
/// counters): per build mapping, the instances' counters merged as
/// `llvm-profdata merge` merges their raw profiles, and the LCOV of the sum
/// as `llvm-cov export` prints it (`TN:test` when given). By mapping id.
pub fn exact_groups<'a>(
    instances: impl IntoIterator<Item = (&'a str, &'a Arc<BuildMapping>, &'a Bytes)>,
    test: Option<&str>,
    max_body: usize,
) -> Result<Vec<(String, String)>, String> {
    let mut groups: BTreeMap<&str, (&BuildMapping, Counters)> = BTreeMap::new();
    for (instance, mapping, counters) in instances {
        let document = fleet::gunzip("counters", counters, max_body).map_err(|e| format!("{instance}: {e}"))?;
        let (mapping, sum) = groups.entry(mapping.id()).or_insert_with(|| (mapping, Counters::new()));
        mapping.add(sum, &document).map_err(|e| format!("{instance}: {e}"))?;
    }
    Ok(groups.into_iter().map(|(id, (mapping, sum))| (id.to_owned(), mapping.report(&sum, test))).collect())
}

/// When every instance is of one exact group: that group's id and the
/// instances' counters summed (gzip), which a collector above merges as one
/// process of the build. `None` otherwise (several builds, an instance
/// without counters, none at all, single-byte counters).
pub fn one_group_sum<'a>(
    instances: impl IntoIterator<Item = (&'a str, Option<&'a Arc<BuildMapping>>, &'a Bytes)>,
    max_body: usize,
) -> Result<Option<(String, Vec<u8>)>, String> {
    let mut mapping: Option<&BuildMapping> = None;
    let mut documents = Vec::new();
    for (instance, m, counters) in instances {
        let Some(m) = m else { return Ok(None) };
        if mapping.is_some_and(|first| first.id() != m.id()) {
            return Ok(None);
        }
        mapping = Some(m);
        documents.push(fleet::gunzip("counters", counters, max_body).map_err(|e| format!("{instance}: {e}"))?);
    }
    let Some(mapping) = mapping else { return Ok(None) };
    let documents: Vec<&[u8]> = documents.iter().map(Vec::as_slice).collect();
    let sum = mapping.sum(&documents).map_err(|e| e.to_string())?;
    Ok(sum.map(|doc| (mapping.id().to_owned(), fleet::gzip(&doc))))
}

/// The final report: the LCOV `texts` (retitled when `test` is given) and
/// the exact groups' reports, merged as LCOV. A single exact group and
/// nothing else is its report as it is: an LCOV merge would recount its
/// LF/LH and FNF/FNH from its lines and functions, which llvm-cov does not.
/// So is a single text when no test name is given: the report of a pod
/// sidecar (an exact group within the pod) stays what the pod served.
pub fn merge_all(texts: &[(String, Bytes)], groups: &[(String, String)], test: Option<&str>) -> Result<String, String> {
    if let ([], [(_, report)]) = (texts, groups) {
        return Ok(report.clone());
    }
    if let ([(name, text)], [], None) = (texts, groups, test) {
        return String::from_utf8(text.to_vec()).map_err(|_| format!("{name}: not UTF-8"));
    }
    let mut merger = merge_texts(texts.iter().map(|(i, b)| (i.as_str(), &b[..])), test)?;
    for (id, report) in groups {
        merger.add(&format!("exact group {id}"), report).map_err(|e| e.to_string())?;
    }
    let mut out = Vec::new();
    merger.write_to(&mut out).map_err(|e| e.to_string())?;
    String::from_utf8(out).map_err(|_| "the merge is not UTF-8".to_owned())
}

/// The totals of a report, from its summary lines (`LF`, `LH`, ...).
pub fn totals(lcov: &str) -> Totals {
    let mut t = Totals::default();
    let s = &mut t.summary;
    for line in lcov.lines() {
        let Some((tag, n)) = line.split_once(':') else {
            t.records += u64::from(line == "end_of_record") as usize;
            continue;
        };
        let n: u64 = n.parse().unwrap_or(0);
        match tag {
            "LF" => s.lines += n,
            "LH" => s.lines_hit += n,
            "FNF" => s.functions += n,
            "FNH" => s.functions_hit += n,
            "BRF" => s.branches += n,
            "BRH" => s.branches_hit += n,
            _ => {}
        }
    }
    t
}

/// RFC 3339 in UTC with milliseconds, e.g. `2026-05-01T12:00:00.123Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Seconds since the epoch, as a float.
pub fn unix_secs(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// A fresh instance id for a sidecar: `sidecar-<pid>-<16 hex digits>`.
pub fn new_instance_id() -> String {
    let mut bytes = [0u8; 8];
    let random = std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
    if random.is_err() {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        bytes = (nanos as u64 ^ u64::from(std::process::id()).rotate_left(32)).to_le_bytes();
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("sidecar-{}-{hex}", std::process::id())
}

/// A file name for an instance id (ids are `[A-Za-z0-9._-]` in practice;
/// anything else becomes `_`).
pub fn file_name_for(instance: &str) -> String {
    let mut s: String =
        instance.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect();
    if s.is_empty() || s.starts_with('.') {
        s.insert(0, '_');
    }
    s.truncate(200);
    s
}

/// The body of a response as text for a message: at most 200 characters.
pub fn excerpt(body: &Bytes) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(400)]);
    let mut s: String = text.chars().filter(|c| !c.is_control()).take(200).collect();
    if body.len() > 400 {
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_format_as_rfc3339() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_millis(951_782_400_123)), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(1_777_593_599)), "2026-04-30T23:59:59.000Z");
    }

    #[test]
    fn retitle_names_every_record() {
        assert_eq!(retitle("SF:a\nend_of_record\n", "t"), "TN:t\nSF:a\nend_of_record\n");
        assert_eq!(retitle("TN:x\nSF:a\nend_of_record\nTN:y\nSF:b\n", "t"), "TN:t\nSF:a\nend_of_record\nSF:b\n");
        let m = merge_texts([("a", &b"TN:x\nSF:a\nDA:1,1\nend_of_record\n"[..]), ("b", b"SF:a\nDA:1,2\nend_of_record\n")], Some("t"))
            .unwrap();
        assert_eq!(m.finish(), "TN:t\nSF:a\nFNF:0\nFNH:0\nDA:1,3\nBRF:0\nBRH:0\nLF:1\nLH:1\nend_of_record\n");
    }

    #[test]
    fn lcov_is_checked() {
        assert!(check_lcov("x", b"SF:a\nDA:1,1\nend_of_record\n").is_ok());
        assert!(check_lcov("x", b"SF:a\nDA:1,x\n").unwrap_err().contains("not LCOV"));
        assert!(check_lcov("x", b"\xff\xfe").unwrap_err().contains("UTF-8"));
        assert!(check_lcov("x", b"<html>hello</html>\n").unwrap_err().contains("no SF: record"));
        assert!(check_lcov("x", b"").is_ok());
    }

    #[test]
    fn metadata_and_names() {
        let m = Meta::from_json(br#"{"runtime":"rust","program":"/bin/x","build_id":"ab","pid":7,"state":"exited"}"#);
        assert_eq!(m.runtime.as_deref(), Some("rust"));
        assert_eq!(m.pid, Some(7));
        assert_eq!(Meta::from_json(b"nope"), Meta::default());
        assert_eq!(file_name_for("rust-1-ab"), "rust-1-ab");
        assert_eq!(file_name_for("../x/y"), "_.._x_y");
        assert!(new_instance_id().starts_with("sidecar-"));
        let s = livecov::agent::summary_json("SF:a\nLF:2\nLH:1\nend_of_record\n", serde_json::Map::new());
        assert!(s.contains(r#""lines":2"#) && s.contains(r#""lines_hit":1"#), "{s}");
    }
}
