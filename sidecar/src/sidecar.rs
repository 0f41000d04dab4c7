//! `livecov sidecar`: serves the merged coverage of its targets.
//!
//! In a pod, over the coverage directory shared with the pod's processes
//! (`--dir`); as an aggregator, over the replicas behind a headless Service
//! (`--replicas`), which are agents or other sidecars; or over static
//! `--target`s. Same routes as an agent, over the merge:
//!
//! | request | answer |
//! |---|---|
//! | `GET /coverage[?test=NAME&reset=1&format=lcov\|json]` | the merge of every instance's last snapshot, fresh from the live targets |
//! | `POST /reset` | `204`: every live target reset, gone instances forgotten |
//! | `GET /health` | the sidecar's instance, targets by state |
//! | `GET /targets` | every target: address, instance, state, last snapshot, last error |
//! | `GET /metrics` | Prometheus text |
//! | `GET /` | the live page ([`crate::live_page`]): totals, files, coverage over time, targets |
//! | `GET /file?path=PATH` | with `--source-root`, a file's lines coloured by hits |
//!
//! # Instances
//!
//! Targets answer with `Livecov-Instance`. The sidecar keeps the last
//! snapshot of every instance: snapshots of one instance replace each
//! other, different instances sum (LCOV merge). An instance that went away
//! (a process that exited, a replica deleted or scaled down, a restart with
//! a new instance) keeps its last snapshot in the merge until a reset. With
//! `--poll-interval` the targets are asked periodically, so that what a
//! replica counted is kept even when it disappears between two requests.
//! The sidecar answers with an instance id of its own, so an aggregator over
//! several sidecars merges them per instance in turn.
//!
//! # Rounds
//!
//! A round lists the targets (DNS re-resolved at most once per
//! `--resolve-interval`), asks them all (`--parallelism` at once, each
//! request bounded by `--timeout` and tried twice at most, answers bounded
//! by `--max-size`), and updates the snapshots. Concurrent `GET /coverage`
//! requests share a round that started after they arrived; resets are
//! rounds of their own, never shared.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioTimer;
use livecov::agent::connection::{self, authorized, Surface};
use livecov::agent::server::{parse_query, timing, Format, MAPPING_HEADER, TIMING_HEADER};
use tokio::sync::{watch, Semaphore};

use crate::client::{self, CoverageQuery};
use crate::collect::{parse_seconds, read_counters, read_report, source_json, TargetArgs};
use crate::fanout::{fetch_all, report_ms, Ask, FetchOptions, Fetched, Outcome};
use crate::live_page::{self, History, Point, SourceRoot};
use crate::metrics::{self, Gauges, Metrics, SourceGauge, TargetGauge};
use crate::path_equivalence::PathEquivalence;
use crate::snapshot::{self, rfc3339, unix_secs, Meta};
use crate::stderr::say;
use crate::targets::{Discovery, Found, SourceState, SourceStatus};
use livecov::fleet::BuildMapping;

#[derive(clap::Args, Debug)]
#[command(
    about = "Serve the merged live coverage of a pod's processes or of a Service's replicas",
    long_about = "Serves GET /coverage (?test=NAME, ?reset=1, ?format=lcov|json), POST /reset, \
                  GET /health, GET /targets, GET /metrics and a live page for a browser (GET /: \
                  totals, files, coverage over time, targets) over the merge of its targets: the \
                  agents (and exited processes' reports) of a coverage directory, the replicas \
                  behind a headless Service (agents or other sidecars, re-resolved as they come \
                  and go), static targets. The instances of one build are merged exactly, as \
                  llvm-cov reports their profiles merged (--lcov-merge: as LCOV). Each instance's \
                  last snapshot stays in the merge until a reset, also when its process or \
                  replica is gone. A name that does not resolve (no answer, REFUSED, NXDOMAIN, \
                  no records) is reported with what to check and resolved again: the sidecar \
                  keeps running, as it may start before its replicas.",
    after_help = "Examples:\n  \
                  livecov sidecar --dir /cov --listen 0.0.0.0:9464 --token-file /run/secrets/token\n  \
                  livecov sidecar --replicas dns:app-coverage.ci.svc.cluster.local:9464 \\\n      \
                  --target-token-file /run/secrets/token --poll-interval 15 --listen 0.0.0.0:9464\n  \
                  livecov sidecar --dir /tmp/cov --socket /tmp/cov-sidecar.sock"
)]
pub struct Args {
    #[command(flatten)]
    pub targets: TargetArgs,
    /// Serve on this TCP address (e.g. 0.0.0.0:9464; port 0 picks one).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Serve on this Unix socket (no token needed there: its mode protects it).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Mode of the --socket file, octal.
    #[arg(long, value_name = "MODE", default_value = "600", value_parser = parse_mode)]
    pub socket_mode: u32,
    /// Bearer token clients must send on the TCP listener.
    #[arg(long, value_name = "TOKEN", env = "LIVECOV_SIDECAR_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Read the clients' bearer token from this file (its first line).
    #[arg(long, value_name = "PATH", env = "LIVECOV_SIDECAR_TOKEN_FILE", hide_env_values = true)]
    pub token_file: Option<PathBuf>,
    /// Ask every target this often (seconds), keeping the last snapshot of
    /// every instance: replicas deleted between two requests still count.
    #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
    pub poll_interval: Option<Duration>,
    /// Resolve --replicas names again after this many seconds, from the
    /// start and also between requests: the log, /targets, /health and
    /// /metrics say when a name fails (and why) or comes back.
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_seconds)]
    pub resolve_interval: Duration,
    /// The folder the report's source files are in (the report's paths are
    /// inside it, or relative to it): the live page (GET /) then links each
    /// file to its lines coloured by hits (GET /file?path=PATH). Nothing
    /// outside it is served.
    #[arg(long, value_name = "DIR")]
    pub source_root: Option<PathBuf>,
    /// Concurrent client connections.
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub max_connections: u32,
    /// Rewrite the source files' paths (SF:) that start with the folder
    /// FROM (inside the image) to start with TO instead (the checkout, as
    /// --source-root sees it), in the LCOV, JSON and live page served, as
    /// llvm-cov's -path-equivalence; repeatable, the first that applies
    /// wins. The counters and mapping an aggregator takes (exact merge)
    /// keep the build's paths: give the aggregator the flag too.
    #[arg(long, value_name = "FROM,TO", value_parser = PathEquivalence::parse)]
    pub path_equivalence: Vec<PathEquivalence>,
}

fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not a file mode (octal, e.g. 600 or 660)"))
}

// ---------------------------------------------------------------- state

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    /// No longer listed, or exited with a final report.
    Gone,
    Error,
    /// Only as shown ([`Sidecar::rows`]): a process of a `--dir` that is
    /// gone without a final report (killed, or unable to write it), so the
    /// counts of its last moments are missing.
    Lost,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Gone => "gone",
            State::Error => "error",
            State::Lost => "lost",
        }
    }
}

/// A row's state as `/targets`, `/health` and `/metrics` show it: an
/// ended process of a `--dir` is `gone` when its final report is in the
/// merge (its metadata says `exited`), else `lost`.
fn shown_state(row: &TargetRow, store: &Store) -> State {
    let from_dir = row.report || row.source.starts_with("dir:");
    if row.state != State::Gone || !from_dir {
        return row.state;
    }
    let final_report = row.instance.as_ref().and_then(|i| store.instances.get(i)).is_some_and(|i| {
        i.report.is_some() && i.meta.as_ref().and_then(|m| m.state.as_deref()) == Some("exited")
    });
    if final_report {
        State::Gone
    } else {
        State::Lost
    }
}

#[derive(Debug, Clone)]
struct TargetRow {
    source: String,
    /// A report file rather than a live target.
    report: bool,
    instance: Option<String>,
    state: State,
    last_snapshot: Option<SystemTime>,
    last_error: Option<String>,
    last_duration: Option<Duration>,
    /// Of that, the target's own time to make its answer, when it says.
    last_report: Option<Duration>,
    dumps: u64,
    errors: u64,
}

#[derive(Debug, Clone)]
struct Instance {
    /// LCOV, or for an instance of an exact group its counters (gzip).
    body: Bytes,
    /// The build mapping of an instance merged exactly.
    exact: Option<Arc<BuildMapping>>,
    taken: SystemTime,
    address: String,
    /// For a report: (modified, size), to read it again only when it changed.
    report: Option<(SystemTime, u64)>,
    meta: Option<Meta>,
}

#[derive(Debug, Default)]
struct Store {
    /// Bumped whenever the merge may change.
    generation: u64,
    targets: BTreeMap<String, TargetRow>,
    instances: BTreeMap<String, Instance>,
    sources: Vec<SourceStatus>,
    /// The last merge: (generation, test, LCOV).
    cache: Option<(u64, Option<String>, Bytes)>,
    /// Instances forgotten by a reset: the left-over socket of such a
    /// process is not shown again.
    forgotten: std::collections::HashSet<String>,
}

pub struct Sidecar {
    instance: String,
    started: Instant,
    options: FetchOptions,
    discovery: tokio::sync::Mutex<Discovery>,
    rounds: tokio::sync::Mutex<()>,
    /// Normal rounds started (read without the round lock to detect a
    /// round that started after a request arrived).
    round_seq: AtomicU64,
    store: Mutex<Store>,
    /// Merges computed at once (each holds a copy of the merge in memory).
    merges: Semaphore,
    /// Line coverage over time, for the live page.
    history: Mutex<History>,
    /// `--path-equivalence`, applied to every merge served.
    path_equivalence: Arc<Vec<PathEquivalence>>,
    pub metrics: Metrics,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a reset round hands back.
struct ResetOutcome {
    /// The merge before forgetting (for `/coverage?reset=1`).
    entries: Vec<Entry>,
    failed: Vec<String>,
}

impl Sidecar {
    pub fn new(
        instance: String,
        options: FetchOptions,
        discovery: Discovery,
        path_equivalence: Vec<PathEquivalence>,
    ) -> Sidecar {
        Sidecar {
            instance,
            started: Instant::now(),
            options,
            discovery: tokio::sync::Mutex::new(discovery),
            rounds: tokio::sync::Mutex::new(()),
            round_seq: AtomicU64::new(0),
            store: Mutex::new(Store::default()),
            merges: Semaphore::new(2),
            history: Mutex::new(History::default()),
            path_equivalence: Arc::new(path_equivalence),
            metrics: Metrics::default(),
        }
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// A normal round, unless one that started after `seen` (a value of
    /// `round_seq` read on arrival) has completed meanwhile.
    pub async fn refresh(&self, seen: Option<u64>) {
        let _round = self.rounds.lock().await;
        if let Some(seen) = seen {
            if self.round_seq.load(Ordering::Acquire) > seen {
                return; // a round that started after the request served it
            }
        }
        self.round_seq.fetch_add(1, Ordering::AcqRel);
        let ask = Ask::Coverage(CoverageQuery::default());
        let (found, fetched) = self.ask_all(&ask).await;
        self.apply(&found, &fetched).await;
    }

    /// Resolves the `--replicas` names that are due, between rounds too, so
    /// that `/targets`, `/health`, `/metrics` and the log say when a name
    /// fails or comes back even when nobody asks for coverage.
    pub async fn resolve(&self) {
        let found = self.discovery.lock().await.discover(false).await;
        self.noted(&found);
    }

    /// Keeps how the sources fared, and logs the names that failed or came back.
    fn noted(&self, found: &Found) {
        self.metrics.resolve_errors.fetch_add(found.failures as u64, Ordering::Relaxed);
        lock(&self.store).sources = found.sources.clone();
        for change in &found.changes {
            say(format_args!("livecov sidecar: {change}"));
        }
    }

    /// Lists and asks every target.
    async fn ask_all(&self, ask: &Ask) -> (Found, Vec<Fetched>) {
        let clock = Instant::now();
        let found = self.discovery.lock().await.discover(false).await;
        self.noted(&found);
        let known: std::collections::HashSet<String> = {
            let store = lock(&self.store);
            store.instances.iter().filter(|(_, i)| i.meta.is_some()).map(|(k, _)| k.clone()).collect()
        };
        let want_meta = Arc::new(move |instance: &str| !known.contains(instance));
        let fetched = fetch_all(&found.endpoints, ask, &self.options, Some(&self.instance), want_meta, None).await;
        for f in &fetched {
            self.metrics.dump(f.duration, f.report_time, f.error().is_some());
        }
        self.metrics.rounds.fetch_add(1, Ordering::Relaxed);
        self.metrics.last_round_micros.store(clock.elapsed().as_micros() as u64, Ordering::Relaxed);
        (found, fetched)
    }

    /// Updates the targets and snapshots from a round's answers and the
    /// reports found.
    async fn apply(&self, found: &Found, fetched: &[Fetched]) {
        {
            let mut store = lock(&self.store);
            let store = &mut *store;
            let listed: std::collections::HashSet<String> = found.endpoints.iter().map(|e| e.address()).collect();
            for (address, row) in store.targets.iter_mut() {
                if !row.report && !listed.contains(address) && row.state != State::Gone {
                    row.state = State::Gone;
                }
            }
            for f in fetched {
                let address = f.endpoint.address();
                let row = store.targets.entry(address.clone()).or_insert_with(|| TargetRow {
                    source: f.endpoint.source.clone(),
                    report: false,
                    instance: None,
                    state: State::Running,
                    last_snapshot: None,
                    last_error: None,
                    last_duration: None,
                    last_report: None,
                    dumps: 0,
                    errors: 0,
                });
                row.source = f.endpoint.source.clone();
                row.last_duration = Some(f.duration);
                row.last_report = f.report_time;
                match &f.outcome {
                    Outcome::Snapshot { instance, body: answer, meta }
                    | Outcome::Counters { instance, counters: answer, meta, .. } => {
                        // Counters are of an exact group: their mapping's id.
                        let exact = match &f.outcome {
                            Outcome::Counters { mapping, .. } => Some(mapping.clone()),
                            _ => None,
                        };
                        row.state = State::Running;
                        row.instance = Some(instance.clone());
                        row.last_snapshot = Some(f.started);
                        row.last_error = None;
                        row.dumps += 1;
                        let old = store.instances.get(instance);
                        let meta = meta.clone().or_else(|| old.and_then(|o| o.meta.clone()));
                        if old.is_none_or(|o| o.body != *answer) {
                            store.generation += 1;
                        }
                        let state = Instance {
                            body: answer.clone(),
                            exact,
                            taken: f.started,
                            address: address.clone(),
                            report: None,
                            meta,
                        };
                        store.instances.insert(instance.clone(), state);
                    }
                    Outcome::Reset { instance } => {
                        row.state = State::Running;
                        if instance.is_some() {
                            row.instance = instance.clone();
                        }
                        row.last_error = None;
                    }
                    Outcome::Gone(_) => {
                        row.state = State::Gone;
                        row.last_error = None;
                        if row.instance.is_none() {
                            // An agent's socket is named after its instance.
                            if let crate::client::Target::Unix(path) = &f.endpoint.target {
                                row.instance = path.file_stem().and_then(|s| s.to_str()).map(str::to_owned);
                            }
                        }
                    }
                    Outcome::Failed(e) => {
                        row.state = State::Error;
                        row.last_error = Some(e.clone());
                        row.errors += 1;
                    }
                }
            }
            store.sources = found.sources.clone();
        }
        self.load_reports(found).await;
        // A gone process whose report is in the merge is shown by its
        // report's row only (not also by its left-over socket's).
        let mut store = lock(&self.store);
        let reported: std::collections::HashSet<String> =
            store.targets.values().filter(|r| r.report).filter_map(|r| r.instance.clone()).collect();
        let store = &mut *store;
        let (instances, forgotten) = (&store.instances, &store.forgotten);
        store.targets.retain(|_, r| {
            let Some(i) = r.instance.as_ref().filter(|_| !r.report && r.state == State::Gone) else { return true };
            !reported.contains(i) && (!forgotten.contains(i) || instances.contains_key(i))
        });
    }

    /// Reads the reports of instances without a newer snapshot.
    async fn load_reports(&self, found: &Found) {
        let wanted: Vec<_> = {
            let store = lock(&self.store);
            found
                .reports
                .iter()
                .filter(|r| match store.instances.get(&r.instance) {
                    None => true,
                    Some(i) => match i.report {
                        Some(seen) => seen != (r.modified, r.size),
                        None => r.modified > i.taken,
                    },
                })
                .cloned()
                .collect()
        };
        if wanted.is_empty() {
            return;
        }
        let max = self.options.max_body;
        let mappings = self.options.mappings.clone();
        let read = tokio::task::spawn_blocking(move || {
            wanted.into_iter().map(|r| {
                let (body, meta, mut error) = read_report(&r, max);
                // Its counters, when a live process of its build gave the
                // mapping (in this round or an earlier one).
                let exact = match body.is_some().then(|| read_counters(&r, mappings.as_deref(), max)) {
                    Some(Ok(exact)) => exact,
                    Some(Err(e)) => {
                        error = Some(e);
                        None
                    }
                    None => None,
                };
                let body = body.filter(|_| error.is_none());
                let (body, exact) = match exact {
                    Some((mapping, counters)) => (Some(counters), Some(mapping)),
                    None => (body, None),
                };
                (r, body, exact, meta, error)
            }).collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        let mut store = lock(&self.store);
        let store = &mut *store;
        for (report, body, exact, meta, error) in read {
            let address = report.path.display().to_string();
            // A process whose socket still answers (or fails) is shown by
            // its socket's row; its newer report only feeds the merge.
            let live = store.targets.values().any(|r| {
                !r.report && r.state != State::Gone && r.instance.as_deref() == Some(report.instance.as_str())
            });
            if !live {
                // The report stands for the process now: a left-over socket
                // row of the same instance (gone) is superseded by it.
                store.targets.retain(|_, r| {
                    r.report || r.state != State::Gone || r.instance.as_deref() != Some(report.instance.as_str())
                });
                let row = store.targets.entry(address.clone()).or_insert_with(|| TargetRow {
                    source: report.source.clone(),
                    report: true,
                    instance: Some(report.instance.clone()),
                    state: State::Gone,
                    last_snapshot: None,
                    last_error: None,
                    last_duration: None,
                    last_report: None,
                    dumps: 0,
                    errors: 0,
                });
                match &error {
                    None => {
                        row.state = State::Gone;
                        row.last_snapshot = Some(report.modified);
                        row.last_error = None;
                        row.dumps += 1;
                    }
                    Some(e) => {
                        row.state = State::Error;
                        row.last_error = Some(e.clone());
                        row.errors += 1;
                    }
                }
            }
            if let Some(body) = body {
                let old = store.instances.get(&report.instance);
                let meta = meta.or_else(|| old.and_then(|o| o.meta.clone()));
                store.generation += 1;
                store.instances.insert(
                    report.instance.clone(),
                    Instance {
                        body,
                        exact,
                        taken: report.modified,
                        address,
                        report: Some((report.modified, report.size)),
                        meta,
                    },
                );
            }
        }
    }

    /// A reset round: every live target reset (dump-and-reset when
    /// `dump`), then every gone instance and report forgotten.
    async fn reset(&self, dump: bool) -> ResetOutcome {
        let _round = self.rounds.lock().await;
        let ask = if dump { Ask::Coverage(CoverageQuery { reset: true, ..Default::default() }) } else { Ask::Reset };
        let (found, fetched) = self.ask_all(&ask).await;
        self.apply(&found, &fetched).await;
        let reset_at = SystemTime::now();
        self.metrics.resets.fetch_add(1, Ordering::Relaxed);
        let failed: Vec<String> = fetched
            .iter()
            .filter_map(|f| f.error().map(|e| format!("{}: {e}", f.endpoint.address())))
            .collect();
        let entries = {
            let mut store = lock(&self.store);
            let entries = if dump { self.entries_locked(&store) } else { Vec::new() };
            // Forget: every snapshot (live targets start again from zero),
            // gone targets and reports.
            let gone: Vec<String> = store
                .instances
                .keys()
                .chain(store.targets.values().filter(|r| r.report || r.state == State::Gone).filter_map(|r| r.instance.as_ref()))
                .filter(|i| !store.targets.values().any(|r| !r.report && r.state == State::Running && r.instance.as_ref() == Some(*i)))
                .cloned()
                .collect();
            store.forgotten.extend(gone);
            store.instances.clear();
            store.targets.retain(|_, row| !row.report && row.state != State::Gone);
            for row in store.targets.values_mut() {
                row.last_snapshot = None;
            }
            store.generation += 1;
            store.cache = None;
            entries
        };
        let errors = self.discovery.lock().await.mark_reset(reset_at);
        for e in errors {
            say(format_args!("livecov sidecar: {e} (the reset is kept in memory only)"));
        }
        ResetOutcome { entries, failed }
    }

    fn entries_locked(&self, store: &Store) -> Vec<Entry> {
        store.instances.iter().map(|(k, i)| (k.clone(), i.body.clone(), i.exact.clone())).collect()
    }

    /// The merge of every instance's last snapshot, `TN:test` when given.
    async fn merged(&self, test: Option<String>) -> Result<(Bytes, usize), String> {
        let (generation, entries) = {
            let store = lock(&self.store);
            if let Some((g, t, text)) = &store.cache {
                if *g == store.generation && *t == test {
                    return Ok((text.clone(), store.instances.len()));
                }
            }
            (store.generation, self.entries_locked(&store))
        };
        // The merge stands for this moment, however long it takes.
        let taken = self.started.elapsed().as_secs_f64();
        let n = entries.len();
        let _permit = self.merges.acquire().await.map_err(|_| "shutting down".to_owned())?;
        let text = merge_entries(entries, test.clone(), self.options.max_body, self.path_equivalence.clone()).await?;
        if test.is_none() {
            let totals = snapshot::totals(&String::from_utf8_lossy(&text));
            lock(&self.history).record(Point { secs: taken, lines_hit: totals.summary.lines_hit, lines: totals.summary.lines });
        }
        let mut store = lock(&self.store);
        if store.generation == generation {
            store.cache = Some((generation, test, text.clone()));
        }
        Ok((text, n))
    }

    fn counts(&self) -> (usize, usize, usize, usize) {
        let rows = self.rows();
        let count = |s: State| rows.iter().filter(|r| r.2 == s).count();
        (count(State::Running), count(State::Error), count(State::Gone), count(State::Lost))
    }

    /// Every target row, plus a `gone` row for each instance in the merge
    /// that no target answers as any more (a restart under the same
    /// address, say).
    fn rows(&self) -> Vec<(String, TargetRow, State)> {
        let store = lock(&self.store);
        let mut out: Vec<(String, TargetRow, State)> =
            store.targets.iter().map(|(a, r)| (a.clone(), r.clone(), shown_state(r, &store))).collect();
        let shown: std::collections::HashSet<&str> =
            store.targets.values().filter_map(|r| r.instance.as_deref()).collect();
        for (instance, i) in &store.instances {
            if !shown.contains(instance.as_str()) {
                let row = TargetRow {
                    source: store.targets.get(&i.address).map_or_else(String::new, |r| r.source.clone()),
                    report: i.report.is_some(),
                    instance: Some(instance.clone()),
                    state: State::Gone,
                    last_snapshot: Some(i.taken),
                    last_error: None,
                    last_duration: None,
                    last_report: None,
                    dumps: 0,
                    errors: 0,
                };
                out.push((i.address.clone(), row, State::Gone));
            }
        }
        out
    }

    /// The document of `GET /targets`.
    fn targets_doc(&self) -> serde_json::Value {
        let metas: HashMap<String, (Option<Meta>, usize, Option<String>)> = {
            let store = lock(&self.store);
            let group = |i: &Instance| i.exact.as_ref().map(|m| m.id().to_owned());
            store.instances.iter().map(|(k, i)| (k.clone(), (i.meta.clone(), i.body.len(), group(i)))).collect()
        };
        let rows: Vec<serde_json::Value> = self
            .rows()
            .into_iter()
            .map(|(address, r, state)| {
                let (meta, bytes, group) = r
                    .instance
                    .as_ref()
                    .and_then(|i| metas.get(i))
                    .map_or((None, None, None), |(m, b, g)| (m.clone(), Some(*b), g.clone()));
                let meta = meta.unwrap_or_default();
                serde_json::json!({
                    "address": address,
                    "source": r.source,
                    "kind": if r.report { "report" } else { "live" },
                    "instance": r.instance,
                    "state": state.as_str(),
                    "last_snapshot": r.last_snapshot.map(rfc3339),
                    "last_snapshot_unix": r.last_snapshot.map(unix_secs),
                    "last_error": r.last_error,
                    "last_duration_ms": r.last_duration.map(|d| (d.as_secs_f64() * 1000.0).round() as u64),
                    "last_report_ms": report_ms(r.last_report),
                    "snapshot_bytes": bytes,
                    "in_merge": bytes.is_some(),
                    "group": group,
                    "dumps": r.dumps,
                    "errors": r.errors,
                    "runtime": meta.runtime,
                    "program": meta.program,
                    "build_id": meta.build_id,
                    "pid": meta.pid,
                })
            })
            .collect();
        let (sources, warnings) = {
            let store = lock(&self.store);
            (store.sources.iter().map(source_json).collect::<Vec<_>>(), self.warnings(&store.sources))
        };
        serde_json::json!({ "instance": self.instance, "targets": rows, "sources": sources, "warnings": warnings })
    }

    /// What `/health` and `/targets` warn of: no target found (a sidecar
    /// started before its replicas keeps looking), and each source's error.
    fn warnings(&self, sources: &[SourceStatus]) -> Vec<String> {
        let mut out = Vec::new();
        if !sources.is_empty() && sources.iter().all(|s| s.targets == 0) {
            out.push("no target found yet: the sidecar keeps looking (see sources)".to_owned());
        }
        out.extend(sources.iter().filter_map(|s| s.error.as_ref().map(|e| format!("{}: {e}", s.source))));
        out
    }

    fn health_json(&self) -> String {
        let (running, error, gone, lost) = self.counts();
        let (instances, found, sources_failing, warnings) = {
            let store = lock(&self.store);
            let found: usize = store.sources.iter().map(|s| s.targets).sum();
            let failing = store.sources.iter().filter(|s| s.state != SourceState::Ok).count();
            (store.instances.len(), found, failing, self.warnings(&store.sources))
        };
        serde_json::json!({
            "instance": self.instance,
            "pid": std::process::id(),
            "runtime": "sidecar",
            "livecov_version": env!("CARGO_PKG_VERSION"),
            "program": std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default(),
            "build_id": null,
            "uptime_secs": self.started.elapsed().as_secs_f64(),
            "state": "running",
            "targets": { "running": running, "error": error, "gone": gone, "lost": lost },
            "instances": instances,
            "targets_found": found,
            "sources_failing": sources_failing,
            "warnings": warnings,
        })
        .to_string()
    }

    fn metrics_text(&self) -> String {
        let rows = self.rows();
        let (snapshot_bytes, instances, sources) = {
            let store = lock(&self.store);
            (store.instances.values().map(|i| i.body.len()).sum(), store.instances.len(), store.sources.clone())
        };
        let count = |s: State| rows.iter().filter(|r| r.2 == s).count();
        let gauges = Gauges {
            running: count(State::Running),
            gone: count(State::Gone),
            error: count(State::Error),
            lost: count(State::Lost),
            instances,
            snapshot_bytes,
            targets: rows
                .iter()
                .map(|(a, r, s)| TargetGauge {
                    address: a,
                    instance: r.instance.as_deref(),
                    state: s.as_str(),
                    last_snapshot: r.last_snapshot.map(unix_secs),
                })
                .collect(),
            sources: sources
                .iter()
                .map(|s| SourceGauge {
                    source: &s.source,
                    state: s.state.as_str(),
                    targets: s.targets,
                    since: s.since.map(unix_secs),
                })
                .collect(),
            uptime: self.started.elapsed(),
        };
        metrics::render(&self.metrics, &gauges)
    }
}

/// An instance in the merge: its id, its last snapshot, and its build
/// mapping when it is merged exactly.
type Entry = (String, Bytes, Option<Arc<BuildMapping>>);

/// Instances of one build summed counter by counter (an exact group per
/// build mapping), merged as LCOV with each other and with the rest; the
/// paths of the merge rewritten by `path_equivalence`.
async fn merge_entries(
    entries: Vec<Entry>,
    test: Option<String>,
    max_body: usize,
    path_equivalence: Arc<Vec<PathEquivalence>>,
) -> Result<Bytes, String> {
    tokio::task::spawn_blocking(move || {
        let exact = entries.iter().filter_map(|(k, b, m)| m.as_ref().map(|m| (k.as_str(), m, b)));
        let groups = snapshot::exact_groups(exact, test.as_deref(), max_body)?;
        let texts: Vec<(String, Bytes)> =
            entries.iter().filter(|e| e.2.is_none()).map(|(k, b, _)| (k.clone(), b.clone())).collect();
        let merged = snapshot::merge_all(&texts, &groups, test.as_deref())?;
        Ok(Bytes::from(PathEquivalence::rewrite_lcov(&path_equivalence, merged.as_bytes()).into_owned()))
    })
    .await
    .map_err(|_| "internal error while merging".to_owned())?
}

// ---------------------------------------------------------------- running

pub fn run(args: Args) -> Result<()> {
    if args.listen.is_none() && args.socket.is_none() {
        bail!("nothing to listen on: give --listen ADDR (e.g. 0.0.0.0:9464) and/or --socket PATH");
    }
    let token = client::resolve_token(args.token.as_ref(), args.token_file.as_ref())?;
    let options = args.targets.fetch_options()?;
    let source_root = args.source_root.as_deref().map(SourceRoot::new).transpose().map_err(anyhow::Error::msg)?;
    let mut discovery = args.targets.discovery(args.resolve_interval)?;
    if let Some(socket) = &args.socket {
        let socket = std::path::absolute(socket).unwrap_or_else(|_| socket.clone());
        for dir in discovery.dirs() {
            let sockets = std::path::absolute(dir.join("sockets")).unwrap_or_else(|_| dir.join("sockets"));
            if socket.parent() == Some(sockets.as_path()) {
                bail!(
                    "--socket {} is inside {}, where the sidecar looks for agents: put it elsewhere",
                    socket.display(),
                    sockets.display()
                );
            }
        }
        discovery.exclude(socket);
    }
    if args.listen.is_some() && token.is_none() {
        say(format_args!(
            "livecov sidecar: warning: no --token: anyone who reaches the TCP listener can read and reset coverage"
        ));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("livecov-sidecar")
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(serve_main(args, token, options, discovery, source_root))
}

/// The file in a `--dir` that keeps the sidecar's instance id across
/// restarts of its container.
pub const INSTANCE_FILE: &str = ".livecov-sidecar-instance";

/// The sidecar's instance id. Over a `--dir`, the one kept in
/// `DIR/.livecov-sidecar-instance` (made on first start): a restarted
/// sidecar container serves the same processes and reports, so an
/// aggregator must replace its earlier snapshot, not add to it; a new pod
/// (a new volume) gets a new id. Otherwise a fresh id.
fn instance_id(dirs: &[PathBuf]) -> String {
    let Some(dir) = dirs.first() else { return snapshot::new_instance_id() };
    let path = dir.join(INSTANCE_FILE);
    if let Ok(text) = std::fs::read_to_string(&path) {
        let id = text.trim();
        if !id.is_empty() && id.len() <= 200 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
            return id.to_owned();
        }
    }
    let id = snapshot::new_instance_id();
    let tmp = dir.join(format!("{INSTANCE_FILE}.tmp{}", std::process::id()));
    let kept = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, format!("{id}\n")))
        .and_then(|()| std::fs::hard_link(&tmp, &path));
    let _ = std::fs::remove_file(&tmp);
    match kept {
        Ok(()) => id,
        // Another sidecar made it first: use its id.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            std::fs::read_to_string(&path).map(|t| t.trim().to_owned()).ok().filter(|t| !t.is_empty()).unwrap_or(id)
        }
        Err(_) => id,
    }
}

async fn serve_main(
    args: Args,
    token: Option<String>,
    options: FetchOptions,
    discovery: Discovery,
    source_root: Option<SourceRoot>,
) -> Result<()> {
    let watch_names = discovery.has_replicas().then(|| discovery.resolve_interval());
    let sidecar =
        Arc::new(Sidecar::new(instance_id(&args.targets.dirs), options, discovery, args.path_equivalence.clone()));
    let tcp = match args.listen {
        Some(addr) => {
            let l = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
            Some(l)
        }
        None => None,
    };
    let unix = match &args.socket {
        Some(path) => Some(bind_unix(path, args.socket_mode)?),
        None => None,
    };
    {
        use std::io::Write;
        // Where it listens, for whoever started it. Its work does not need
        // them read: lines standard output cannot take (a pipe whose reader
        // is gone, a full disk) go to the log.
        let mut lines = format!("livecov sidecar: instance {}\n", sidecar.instance());
        if let Some(l) = &tcp {
            lines.push_str(&format!("listening on http://{}\n", l.local_addr()?));
        }
        if let Some(path) = &args.socket {
            lines.push_str(&format!("listening on unix:{}\n", path.display()));
        }
        let mut out = std::io::stdout().lock();
        if let Err(e) = out.write_all(lines.as_bytes()).and_then(|()| out.flush()) {
            say(format_args!("livecov sidecar: cannot write to standard output ({e}): {}", lines.trim_end().replace('\n', "; ")));
        }
    }
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    // Names are followed from the start, also without --poll-interval: a
    // sidecar may start before its replicas (and its DNS records) exist.
    if let Some(every) = watch_names {
        let sc = sidecar.clone();
        let mut stop = shutdown_rx.clone();
        tokio::spawn(async move {
            loop {
                sc.resolve().await;
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = stop.changed() => break,
                }
            }
        });
    }
    if let Some(every) = args.poll_interval {
        let sc = sidecar.clone();
        let mut stop = shutdown_rx.clone();
        tokio::spawn(async move {
            loop {
                sc.refresh(None).await;
                // The live page's chart follows the polls, also while
                // nobody looks (the merge is kept for the next request).
                if let Err(e) = sc.merged(None).await {
                    say(format_args!("livecov sidecar: cannot merge the polled coverage: {e}"));
                }
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = stop.changed() => break,
                }
            }
        });
    }
    let ctx = Arc::new(Ctx {
        sidecar,
        token: token.map(String::into_bytes),
        source_root,
        max_connections: args.max_connections as usize,
    });
    let server = tokio::spawn(serve(ctx, unix, tcp, shutdown_rx));
    wait_for_signal().await;
    let _ = shutdown_tx.send(true);
    let _ = server.await;
    if let Some(path) = &args.socket {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

fn bind_unix(path: &std::path::Path, mode: u32) -> Result<tokio::net::UnixListener> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            // Stale, or another sidecar's: refuse to steal a live one.
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                bail!("{} is the socket of a running server", path.display());
            }
            std::fs::remove_file(path).with_context(|| format!("cannot remove the stale socket {}", path.display()))?;
        }
        Ok(_) => bail!("{} exists and is not a socket", path.display()),
        Err(_) => {}
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    }
    // Bound with a restrictive umask, then given its mode: never wider.
    // Safety: umask only sets the process's file mode mask.
    let old = unsafe { libc::umask(0o177) };
    let bound = std::os::unix::net::UnixListener::bind(path);
    unsafe { libc::umask(old) };
    let l = bound.with_context(|| format!("cannot listen on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", path.display()))?;
    l.set_nonblocking(true)?;
    Ok(tokio::net::UnixListener::from_std(l)?)
}

// ---------------------------------------------------------------- serving

/// The largest request body read (by `POST /reset`, which ignores it).
const MAX_BODY_BYTES: usize = 64 * 1024;
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
const MAX_HEADER_BYTES: usize = 16 * 1024;
const MAX_HEADERS: usize = 64;

struct Ctx {
    sidecar: Arc<Sidecar>,
    token: Option<Vec<u8>>,
    source_root: Option<SourceRoot>,
    max_connections: usize,
}

async fn serve(
    ctx: Arc<Ctx>,
    unix: Option<tokio::net::UnixListener>,
    tcp: Option<tokio::net::TcpListener>,
    shutdown: watch::Receiver<bool>,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_headers(MAX_HEADERS)
        .max_buf_size((MAX_HEADER_BYTES + 1024).max(8192))
        .keep_alive(true);
    let surface = Surface {
        http,
        permits: Arc::new(Semaphore::new(ctx.max_connections.max(1))),
        instance: HeaderValue::from_str(ctx.sidecar.instance()).unwrap_or(HeaderValue::from_static("sidecar")),
        idle_timeout: IDLE_TIMEOUT,
        listed: false,
    };
    connection::serve(surface, unix, tcp, shutdown, move |req, tcp| {
        // A panic in a handler becomes a 500, never a dead sidecar.
        let handled = tokio::spawn(handle(ctx.clone(), tcp, req));
        async move { handled.await.unwrap_or_else(|_| error(500, "internal error in the livecov sidecar")) }
    })
    .await
}

type Resp = Response<Full<Bytes>>;

const ROUTES: &str = "GET /coverage, POST /reset, GET /health, GET /targets, GET /metrics, GET / (the live page), GET /file";

async fn handle(ctx: Arc<Ctx>, tcp: bool, req: Request<Incoming>) -> Resp {
    let sc = &ctx.sidecar;
    let path = req.uri().path().to_owned();
    sc.metrics.request(&path);
    if tcp {
        if let Some(token) = &ctx.token {
            if !authorized(req.headers().get(header::AUTHORIZATION), token) {
                sc.metrics.unauthorized.fetch_add(1, Ordering::Relaxed);
                let mut r = error(401, "missing or wrong bearer token (Authorization: Bearer <token>)");
                r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                return r;
            }
        }
    }
    let allow = match path.as_str() {
        "/coverage" | "/health" | "/targets" | "/metrics" | "/" | "/file" => Method::GET,
        "/reset" => Method::POST,
        _ => return error(404, &format!("no route {} (routes: {ROUTES})", clip(&path))),
    };
    if req.method() != allow {
        let mut r = error(405, &format!("method {} not allowed on {path} (allowed: {allow})", clip(req.method().as_str())));
        r.headers_mut().insert(header::ALLOW, HeaderValue::from_static(if allow == Method::GET { "GET" } else { "POST" }));
        return r;
    }
    match path.as_str() {
        "/coverage" => {
            let q = match parse_query(req.uri().query()) {
                Ok(q) => q,
                Err(e) => return error(e.status, &e.message),
            };
            let started = Instant::now();
            let answer = match q.format {
                Format::Lcov | Format::Json => coverage(sc, q.test, q.reset, q.format == Format::Json).await,
                Format::Counters => counters(sc, q.test, q.reset).await,
                Format::Mapping => {
                    mapping(sc, req.headers().get(MAPPING_HEADER).and_then(|v| v.to_str().ok()))
                }
                _ => return error(
                    400,
                    "a sidecar serves merged LCOV (format=lcov or json) and, for an aggregator, the counters \
                     and mapping of its exact group (format=counters, mapping); raw profiles come from each \
                     agent (GET /targets lists them)",
                ),
            };
            timed(answer, started)
        }
        "/reset" => {
            if let Err(r) = read_body(req.into_body()).await {
                return r;
            }
            let outcome = sc.reset(false).await;
            if outcome.failed.is_empty() {
                empty(StatusCode::NO_CONTENT)
            } else {
                error(
                    502,
                    &format!(
                        "{} target(s) could not be reset (the others were, and gone instances were forgotten): {}",
                        outcome.failed.len(),
                        outcome.failed.join("; ")
                    ),
                )
            }
        }
        "/health" => ok("application/json", Bytes::from(sc.health_json())),
        "/targets" => ok("application/json", Bytes::from(sc.targets_doc().to_string())),
        "/" => page(&ctx, req.uri().query()).await,
        "/file" => file_page(&ctx, req.uri().query()).await,
        _ => ok("text/plain; version=0.0.4; charset=utf-8", Bytes::from(sc.metrics_text())),
    }
}

async fn coverage(sc: &Sidecar, test: Option<String>, reset: bool, json: bool) -> Resp {
    let (text, instances, failed) = if reset {
        let outcome = sc.reset(true).await;
        let n = outcome.entries.len();
        match merge_now(sc, outcome.entries, test).await {
            Ok(text) => (text, n, outcome.failed.len()),
            Err(r) => return r,
        }
    } else {
        let seen = sc.round_seq.load(Ordering::Acquire);
        sc.refresh(Some(seen)).await;
        match sc.merged(test).await {
            Ok((text, n)) => (text, n, sc.counts().1),
            Err(e) => return error(500, &e),
        }
    };
    let r = if json {
        ok("application/json", Bytes::from(summary_json(&text, instances, failed)))
    } else {
        ok("text/plain; charset=utf-8", text)
    };
    counted(r, instances, failed)
}

/// The merge of `entries` (those a reset handed back), one of the merges
/// computed at once.
async fn merge_now(sc: &Sidecar, entries: Vec<Entry>, test: Option<String>) -> Result<Bytes, Resp> {
    let Ok(_permit) = sc.merges.acquire().await else { return Err(error(503, "shutting down")) };
    merge_entries(entries, test, sc.options.max_body, sc.path_equivalence.clone()).await.map_err(|e| error(500, &e))
}

/// `r`, if a `200`, with the time it took to make since `started` (as
/// an agent's: its targets' fetches and their merge), which an aggregator
/// over this sidecar reads as the agents' (see `client::Response::report_time`).
fn timed(mut r: Resp, started: Instant) -> Resp {
    if r.status() == StatusCode::OK {
        if let Ok(v) = HeaderValue::from_str(&timing(started.elapsed())) {
            r.headers_mut().insert(TIMING_HEADER, v);
        }
    }
    r
}

/// `r` with the headers of a merge: instances merged, targets failed.
fn counted(mut r: Resp, instances: usize, failed: usize) -> Resp {
    let h = r.headers_mut();
    h.insert("livecov-instances", HeaderValue::from(instances));
    h.insert("livecov-targets-failed", HeaderValue::from(failed));
    r
}

/// `GET /coverage?format=json`: per-file and total counts of a merge.
fn summary_json(lcov: &[u8], instances: usize, failed: usize) -> String {
    let mut extra = serde_json::Map::new();
    extra.insert("instances".into(), instances.into());
    extra.insert("targets_failed".into(), failed.into());
    livecov::agent::summary_json(&String::from_utf8_lossy(lcov), extra)
}

/// The merge as `GET /coverage` serves it, for the live page.
async fn fresh_merge(sc: &Sidecar) -> Result<(Bytes, usize), Resp> {
    let seen = sc.round_seq.load(Ordering::Acquire);
    sc.refresh(Some(seen)).await;
    sc.merged(None).await.map_err(|e| error(500, &e))
}

/// `GET /[?refresh=N]`: the live page.
async fn page(ctx: &Ctx, query: Option<&str>) -> Resp {
    let refresh = match live_page::parse_query(query, &["refresh"]).and_then(|q| live_page::refresh_secs(&q)) {
        Ok(r) => r,
        Err(e) => return error(400, &e),
    };
    let sc = &ctx.sidecar;
    let (text, instances) = match fresh_merge(sc).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    // The page shows the very numbers of GET /coverage?format=json.
    let summary = serde_json::from_str(&summary_json(&text, instances, sc.counts().1)).unwrap_or_default();
    let history = lock(&sc.history).points();
    let body = live_page::render(&live_page::Page {
        instance: sc.instance(),
        uptime: sc.started.elapsed(),
        summary: &summary,
        history: &history,
        targets: &sc.targets_doc(),
        refresh,
        linked: ctx.source_root.is_some(),
    });
    html(body)
}

/// `GET /file?path=PATH[&refresh=N]`: a file of the merge, read under
/// `--source-root`, its lines coloured by their hits.
async fn file_page(ctx: &Ctx, query: Option<&str>) -> Resp {
    let Some(root) = ctx.source_root.clone() else {
        return error(
            404,
            "no --source-root: start the sidecar with --source-root DIR (the folder the sources are in) to see files",
        );
    };
    let q = match live_page::parse_query(query, &["path", "refresh"]) {
        Ok(q) => q,
        Err(e) => return error(400, &e),
    };
    let refresh = match live_page::refresh_secs(&q) {
        Ok(r) => r,
        Err(e) => return error(400, &e),
    };
    let Some(path) = q.get("path").filter(|p| !p.is_empty()).cloned() else {
        return error(400, "give the file: /file?path=PATH, a file of the report (GET /coverage?format=json lists them)");
    };
    let (text, _) = match fresh_merge(&ctx.sidecar).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    // Only the report's files: the path names a record before it names a file.
    let Some(lines) = live_page::file_lines(&String::from_utf8_lossy(&text), &path) else {
        return error(
            404,
            &format!("{} is not a file of the merged report (GET /coverage?format=json lists them)", clip(&path)),
        );
    };
    let max = ctx.sidecar.options.max_body;
    let read = tokio::task::spawn_blocking(move || {
        let file = root.resolve(&path)?;
        let bytes = std::fs::read(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        if bytes.len() > max {
            return Err(format!("{} is larger than {} MiB: raise --max-size", file.display(), max.div_ceil(1 << 20)));
        }
        Ok(live_page::render_file(&path, &String::from_utf8_lossy(&bytes), &lines, refresh))
    })
    .await;
    match read {
        Ok(Ok(page)) => html(page),
        Ok(Err(e)) => error(404, &e),
        Err(_) => error(500, "internal error while reading the file"),
    }
}

/// `?format=counters`: when every instance in the merge is of one exact
/// group (a pod's processes of one build), their counters summed, under
/// the group's mapping id, so that an aggregator merges this pod exactly
/// with the others; otherwise the merge as LCOV, which it merges as LCOV.
async fn counters(sc: &Sidecar, test: Option<String>, reset: bool) -> Resp {
    let (entries, failed) = if reset {
        let outcome = sc.reset(true).await;
        (outcome.entries, Some(outcome.failed.len()))
    } else {
        let seen = sc.round_seq.load(Ordering::Acquire);
        sc.refresh(Some(seen)).await;
        (sc.entries_locked(&lock(&sc.store)), None)
    };
    let max = sc.options.max_body;
    let summed = tokio::task::spawn_blocking(move || {
        let sum = snapshot::one_group_sum(entries.iter().map(|(k, b, m)| (k.as_str(), m.as_ref(), b)), max);
        (sum, entries)
    })
    .await;
    let (sum, entries) = match summed {
        Ok((Ok(sum), entries)) => (sum, entries),
        Ok((Err(e), _)) => return error(500, &e),
        Err(_) => return error(500, "internal error while summing counters"),
    };
    let Some((id, body)) = sum else {
        // The round above is this answer's: the merge is taken as it left it.
        let n = entries.len();
        let (text, n, failed) = match failed {
            Some(failed) => match merge_now(sc, entries, test).await {
                Ok(text) => (text, n, failed),
                Err(r) => return r,
            },
            None => match sc.merged(test).await {
                Ok((text, n)) => (text, n, sc.counts().1),
                Err(e) => return error(500, &e),
            },
        };
        return counted(ok("text/plain; charset=utf-8", text), n, failed);
    };
    let mut r = ok("application/gzip", Bytes::from(body));
    if let Ok(v) = HeaderValue::from_str(&id) {
        r.headers_mut().insert(MAPPING_HEADER, v);
    }
    counted(r, entries.len(), failed.unwrap_or_else(|| sc.counts().1))
}

/// `?format=mapping`: the build mapping named by the request's
/// `Livecov-Mapping` (as an aggregator asks, after counters that named it),
/// else the one of this sidecar's exact group, as its agents served it.
fn mapping(sc: &Sidecar, wanted: Option<&str>) -> Resp {
    let id = match wanted {
        Some(id) => Some(id.to_owned()),
        None => {
            let store = lock(&sc.store);
            let ids: Option<std::collections::BTreeSet<String>> =
                store.instances.values().map(|i| i.exact.as_ref().map(|m| m.id().to_owned())).collect();
            ids.filter(|ids| ids.len() == 1).and_then(|ids| ids.into_iter().next())
        }
    };
    let document = id.as_deref().zip(sc.options.mappings.as_ref()).and_then(|(id, m)| m.document(id));
    match (document, id) {
        (Some(d), Some(id)) => {
            let mut r = ok("application/gzip", d);
            if let Ok(v) = HeaderValue::from_str(&id) {
                r.headers_mut().insert(MAPPING_HEADER, v);
            }
            r
        }
        (_, Some(id)) => error(404, &format!("this sidecar has no build mapping {}", clip(&id))),
        _ => error(
            404,
            "this sidecar's merge is not one exact group (several builds, or instances without counters): \
             ask for its LCOV",
        ),
    }
}

/// Reads (and discards) a request body of at most [`MAX_BODY_BYTES`].
async fn read_body(body: Incoming) -> Result<(), Resp> {
    use hyper::body::Body as _;
    let too_large = || {
        let mut r = error(413, &format!("request body over {MAX_BODY_BYTES} bytes"));
        r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        r
    };
    if body.size_hint().lower() > MAX_BODY_BYTES as u64 {
        return Err(too_large());
    }
    match tokio::time::timeout(HEADER_READ_TIMEOUT, Limited::new(body, MAX_BODY_BYTES).collect()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Ok(Err(e)) => Err(error(400, &format!("could not read the request body: {e}"))),
        Err(_) => Err(error(408, "request body not received in time")),
    }
}

fn clip(s: &str) -> String {
    s.chars().take(100).collect()
}

fn ok(content_type: &'static str, bytes: Bytes) -> Resp {
    let mut r = Response::new(Full::new(bytes));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// A page of [`live_page`]: it has no script, and the browser is told to
/// run none, so that a name that escaped escaping still cannot act.
fn html(page: String) -> Resp {
    let mut r = ok("text/html; charset=utf-8", Bytes::from(page));
    let h = r.headers_mut();
    h.insert(
        "content-security-policy",
        HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'"),
    );
    h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    r
}

fn empty(status: StatusCode) -> Resp {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = status;
    r
}

fn error(status: u16, message: &str) -> Resp {
    let status = StatusCode::from_u16(status)
        .ok()
        .filter(|s| s.is_client_error() || s.is_server_error())
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::json!({ "error": message }).to_string();
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer() {
        let h = |s: &'static str| HeaderValue::from_static(s);
        assert!(authorized(Some(&h("Bearer s3cret")), b"s3cret"));
        assert!(authorized(Some(&h("bearer  s3cret ")), b"s3cret"));
        assert!(!authorized(Some(&h("Bearer s3cre")), b"s3cret"));
        assert!(!authorized(Some(&h("Basic s3cret")), b"s3cret"));
        assert!(!authorized(None, b"s3cret"));
    }

    #[test]
    fn a_sidecar_over_a_dir_keeps_its_instance_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = [dir.path().join("cov")];
        let first = instance_id(&dirs);
        assert!(first.starts_with("sidecar-"), "{first}");
        assert_eq!(instance_id(&dirs), first);
        assert_ne!(instance_id(&[]), instance_id(&[]));
        std::fs::write(dirs[0].join(INSTANCE_FILE), "bad id/..\n").unwrap();
        assert_ne!(instance_id(&dirs), first);
    }

    #[test]
    fn modes_parse() {
        assert_eq!(parse_mode("600"), Ok(0o600));
        assert_eq!(parse_mode("0o660"), Ok(0o660));
        assert!(parse_mode("999").is_err());
        assert!(parse_mode("1000").is_err());
    }
}
