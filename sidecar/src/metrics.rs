//! The sidecar's counters, and `GET /metrics` in the Prometheus text format
//! (version 0.0.4).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Counters that only grow, and the last round's duration.
#[derive(Debug, Default)]
pub struct Metrics {
    pub rounds: AtomicU64,
    pub dumps: AtomicU64,
    pub dump_errors: AtomicU64,
    pub resets: AtomicU64,
    pub resolve_errors: AtomicU64,
    /// Sum of target request durations, in microseconds.
    pub dump_micros: AtomicU64,
    /// Of those, the targets' own time to make their answers.
    pub report_micros: AtomicU64,
    pub last_round_micros: AtomicU64,
    pub requests: [AtomicU64; ROUTES.len()],
    pub unauthorized: AtomicU64,
}

/// The routes counted in `livecov_sidecar_requests_total`.
pub const ROUTES: [&str; 8] = ["/coverage", "/reset", "/health", "/targets", "/metrics", "/", "/file", "other"];

impl Metrics {
    pub fn request(&self, path: &str) {
        let i = ROUTES.iter().position(|r| *r == path).unwrap_or(ROUTES.len() - 1);
        self.requests[i].fetch_add(1, Ordering::Relaxed);
    }

    pub fn dump(&self, took: Duration, report_time: Option<Duration>, failed: bool) {
        if failed {
            self.dump_errors.fetch_add(1, Ordering::Relaxed);
        } else {
            self.dumps.fetch_add(1, Ordering::Relaxed);
        }
        self.dump_micros.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        self.report_micros.fetch_add(report_time.unwrap_or_default().as_micros() as u64, Ordering::Relaxed);
    }
}

/// A gauge per target, for the exposition.
pub struct TargetGauge<'a> {
    pub address: &'a str,
    pub instance: Option<&'a str>,
    pub state: &'a str,
    pub last_snapshot: Option<f64>,
}

/// A gauge per source (`--dir`, `--replicas`, the `--target`s).
pub struct SourceGauge<'a> {
    pub source: &'a str,
    /// `ok`, or how its resolution failed (`no_answer`, `refused`, `nxdomain`, ...).
    pub state: &'a str,
    pub targets: usize,
    /// Since when the state holds (Unix time), for `--replicas`.
    pub since: Option<f64>,
}

/// The point-in-time values the exposition needs besides the counters.
pub struct Gauges<'a> {
    pub running: usize,
    pub gone: usize,
    pub error: usize,
    pub lost: usize,
    pub instances: usize,
    pub snapshot_bytes: usize,
    pub targets: Vec<TargetGauge<'a>>,
    pub sources: Vec<SourceGauge<'a>>,
    pub uptime: Duration,
}

pub fn render(m: &Metrics, g: &Gauges<'_>) -> String {
    let mut out = String::with_capacity(4096);
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, String)]| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    let plain = |v: u64| vec![(String::new(), v.to_string())];
    metric(
        "livecov_sidecar_targets",
        "gauge",
        "Targets by state (running: last answer good; error: last answer failed; gone: no longer listed or exited; lost: ended without a final report).",
        &[
            ("{state=\"running\"}".into(), g.running.to_string()),
            ("{state=\"error\"}".into(), g.error.to_string()),
            ("{state=\"gone\"}".into(), g.gone.to_string()),
            ("{state=\"lost\"}".into(), g.lost.to_string()),
        ],
    );
    metric("livecov_sidecar_instances", "gauge", "Instances whose last snapshot is in the merge.", &plain(g.instances as u64));
    metric("livecov_sidecar_snapshot_bytes", "gauge", "Bytes of LCOV snapshots kept.", &plain(g.snapshot_bytes as u64));
    metric("livecov_sidecar_rounds_total", "counter", "Collection rounds (polls and requests).", &plain(load(&m.rounds)));
    metric("livecov_sidecar_dumps_total", "counter", "Target answers received and merged.", &plain(load(&m.dumps)));
    metric("livecov_sidecar_dump_errors_total", "counter", "Target requests that failed (after a retry).", &plain(load(&m.dump_errors)));
    metric(
        "livecov_sidecar_dump_duration_seconds_total",
        "counter",
        "Time spent in target requests, summed.",
        &[(String::new(), format!("{:.6}", load(&m.dump_micros) as f64 / 1e6))],
    );
    metric(
        "livecov_sidecar_target_report_duration_seconds_total",
        "counter",
        "Of that, the time the targets took to make their answers, as their Server-Timing says, summed.",
        &[(String::new(), format!("{:.6}", load(&m.report_micros) as f64 / 1e6))],
    );
    metric(
        "livecov_sidecar_round_duration_seconds",
        "gauge",
        "Duration of the last collection round.",
        &[(String::new(), format!("{:.6}", load(&m.last_round_micros) as f64 / 1e6))],
    );
    metric("livecov_sidecar_resets_total", "counter", "Resets (POST /reset and /coverage?reset=1).", &plain(load(&m.resets)));
    metric("livecov_sidecar_resolve_errors_total", "counter", "Failed DNS resolutions or folder listings.", &plain(load(&m.resolve_errors)));
    let requests: Vec<(String, String)> = ROUTES
        .iter()
        .zip(&m.requests)
        .map(|(r, c)| (format!("{{route=\"{r}\"}}"), load(c).to_string()))
        .collect();
    metric("livecov_sidecar_requests_total", "counter", "Requests served, by route.", &requests);
    metric("livecov_sidecar_unauthorized_total", "counter", "Requests refused for a missing or wrong token.", &plain(load(&m.unauthorized)));
    let up: Vec<(String, String)> = g
        .targets
        .iter()
        .map(|t| (labels(t), if t.state == "running" { "1" } else { "0" }.to_owned()))
        .collect();
    metric("livecov_sidecar_target_up", "gauge", "1 when the target's last answer was good.", &up);
    let last: Vec<(String, String)> = g
        .targets
        .iter()
        .filter_map(|t| t.last_snapshot.map(|s| (labels(t), format!("{s:.3}"))))
        .collect();
    metric(
        "livecov_sidecar_target_last_snapshot_timestamp_seconds",
        "gauge",
        "When the target's last snapshot was taken (Unix time).",
        &last,
    );
    let source = |s: &SourceGauge<'_>| format!("{{source=\"{}\"}}", escape(s.source));
    let targets: Vec<(String, String)> = g.sources.iter().map(|s| (source(s), s.targets.to_string())).collect();
    metric("livecov_sidecar_source_targets", "gauge", "Targets (and reports) each source lists now.", &targets);
    let states: Vec<(String, String)> = g
        .sources
        .iter()
        .map(|s| (format!("{{source=\"{}\",state=\"{}\"}}", escape(s.source), escape(s.state)), "1".to_owned()))
        .collect();
    metric(
        "livecov_sidecar_source_state",
        "gauge",
        "1 for each source's state: ok, or how its resolution failed (no_answer, refused, nxdomain, no_records, failed).",
        &states,
    );
    let since: Vec<(String, String)> =
        g.sources.iter().filter_map(|s| s.since.map(|t| (source(s), format!("{t:.3}")))).collect();
    metric(
        "livecov_sidecar_source_state_since_timestamp_seconds",
        "gauge",
        "Since when a --replicas source is in its state (Unix time): when its name failed, or came back.",
        &since,
    );
    metric(
        "livecov_sidecar_uptime_seconds",
        "gauge",
        "Seconds since the sidecar started.",
        &[(String::new(), format!("{:.3}", g.uptime.as_secs_f64()))],
    );
    out
}

fn labels(t: &TargetGauge<'_>) -> String {
    format!(
        "{{address=\"{}\",instance=\"{}\",state=\"{}\"}}",
        escape(t.address),
        escape(t.instance.unwrap_or("")),
        escape(t.state)
    )
}

/// A label value: backslash, double quote and newline escaped.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition() {
        let m = Metrics::default();
        m.request("/coverage");
        m.request("/nope");
        m.dump(Duration::from_millis(1500), Some(Duration::from_millis(250)), false);
        m.dump(Duration::from_millis(500), None, true);
        let g = Gauges {
            running: 1,
            gone: 1,
            error: 0,
            lost: 0,
            instances: 2,
            snapshot_bytes: 10,
            targets: vec![TargetGauge { address: "http://1.2.3.4:1", instance: Some("a\"b"), state: "running", last_snapshot: Some(1.5) }],
            sources: vec![SourceGauge { source: "dns:cov.ns:9464", state: "nxdomain", targets: 0, since: Some(2.0) }],
            uptime: Duration::from_secs(3),
        };
        let text = render(&m, &g);
        for want in [
            "livecov_sidecar_targets{state=\"gone\"} 1\n",
            "livecov_sidecar_dumps_total 1\n",
            "livecov_sidecar_dump_errors_total 1\n",
            "livecov_sidecar_dump_duration_seconds_total 2.000000\n",
            "livecov_sidecar_target_report_duration_seconds_total 0.250000\n",
            "livecov_sidecar_requests_total{route=\"/coverage\"} 1\n",
            "livecov_sidecar_requests_total{route=\"other\"} 1\n",
            "livecov_sidecar_target_up{address=\"http://1.2.3.4:1\",instance=\"a\\\"b\",state=\"running\"} 1\n",
            "# TYPE livecov_sidecar_instances gauge\n",
            "livecov_sidecar_source_targets{source=\"dns:cov.ns:9464\"} 0\n",
            "livecov_sidecar_source_state{source=\"dns:cov.ns:9464\",state=\"nxdomain\"} 1\n",
            "livecov_sidecar_source_state_since_timestamp_seconds{source=\"dns:cov.ns:9464\"} 2.000\n",
        ] {
            assert!(text.contains(want), "{want} not in\n{text}");
        }
    }
}
