//! `livecov collect`: one-shot collection for a CI step. Asks every target
//! (a pod's `--dir`, the replicas behind a headless Service, static
//! targets), writes one LCOV per instance, the merged LCOV and a manifest.
//!
//! Also the target options shared with `livecov sidecar` ([`TargetArgs`]).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use hyper::body::Bytes;

use crate::client::{self, CoverageQuery, Target};
use crate::fanout::{fetch_all, report_ms, Ask, FetchOptions, Fetched, Mappings, Outcome, Progress};
use crate::output::{reserve, write_output, write_outputs, Output};
use crate::path_equivalence::PathEquivalence;
use livecov::fleet::BuildMapping;

use crate::snapshot::{self, file_name_for, rfc3339, Meta};
use crate::stderr::say;
use crate::targets::{Discovery, ReportFile, Replicas, Source, SourceStatus};

/// Where the targets are and how to ask them (shared by `sidecar` and `collect`).
#[derive(clap::Args, Debug, Clone)]
pub struct TargetArgs {
    /// A coverage directory (LIVECOV_DIR) shared with the processes: every
    /// agent socket in DIR/sockets/ and every report in DIR/reports/*.lcov
    /// (exited processes count too). Repeatable.
    #[arg(long = "dir", value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// Replicas behind a headless Service: dns:NAME:PORT (A/AAAA records) or
    /// srv:NAME (SRV records, ports from the records). Repeatable. A name
    /// that does not resolve is reported with why (no answer from the
    /// server, REFUSED, NXDOMAIN, no records of that type) and what to check.
    #[arg(long = "replicas", value_name = "dns:NAME:PORT|srv:NAME")]
    pub replicas: Vec<Replicas>,
    /// One agent or sidecar: http://HOST:PORT, unix:PATH or PATH.sock. Repeatable.
    #[arg(long = "target", value_name = "URL")]
    pub targets: Vec<Target>,
    /// Ask this DNS server (UDP, then TCP) instead of the system's resolver
    /// configuration (/etc/resolv.conf, its servers and search domains).
    #[arg(long, value_name = "IP:PORT")]
    pub dns_server: Option<SocketAddr>,
    /// Bearer token sent to TCP targets (their LIVECOV_TOKEN).
    #[arg(long, value_name = "TOKEN", env = "LIVECOV_TOKEN", hide_env_values = true)]
    pub target_token: Option<String>,
    /// Read the targets' bearer token from this file (its first line).
    #[arg(long, value_name = "PATH", env = "LIVECOV_TOKEN_FILE", hide_env_values = true)]
    pub target_token_file: Option<PathBuf>,
    /// Targets asked at once.
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub parallelism: u16,
    /// Give up on a target's answer after this many seconds (then once more).
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = parse_seconds)]
    pub timeout: Duration,
    /// Refuse answers larger than this many MiB (bounds memory per target).
    #[arg(long, value_name = "MIB", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub max_size: u64,
    /// Merge every instance by its LCOV report (union, counts summed), as
    /// before the exact merge. By default the instances of one build are
    /// merged exactly: their counters summed as llvm-profdata merges
    /// profiles, one LCOV computed from the sum as llvm-cov does (LLVM
    /// agents; others merge as LCOV).
    #[arg(long)]
    pub lcov_merge: bool,
}

/// Seconds, as a positive decimal number.
pub fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.parse().map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(format!("{s}: give between 0 and 86400 seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}

impl TargetArgs {
    pub fn sources(&self) -> Vec<Source> {
        let mut out: Vec<Source> = self.dirs.iter().cloned().map(Source::Dir).collect();
        out.extend(self.replicas.iter().cloned().map(Source::Replicas));
        out.extend(self.targets.iter().cloned().map(Source::Static));
        out
    }

    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty() && self.replicas.is_empty() && self.targets.is_empty()
    }

    pub fn fetch_options(&self) -> Result<FetchOptions> {
        let token = client::resolve_token(self.target_token.as_ref(), self.target_token_file.as_ref())?;
        Ok(FetchOptions {
            token,
            timeout: self.timeout,
            max_body: usize::try_from(self.max_size << 20).unwrap_or(usize::MAX),
            parallelism: usize::from(self.parallelism),
            retries: 1,
            mappings: (!self.lcov_merge).then(Arc::default),
        })
    }

    pub fn discovery(&self, resolve_interval: Duration) -> Result<Discovery> {
        if self.is_empty() {
            bail!("no target: give --dir DIR, --replicas dns:NAME:PORT / srv:NAME, or --target URL");
        }
        Discovery::new(self.sources(), self.dns_server, resolve_interval).map_err(anyhow::Error::msg)
    }
}

#[derive(clap::Args, Debug)]
#[command(
    about = "Collect the live coverage of every process and replica once, for a CI step",
    long_about = "Asks every target once (with bounded parallelism, a timeout and one retry each) \
                  and writes, into OUTDIR: merged.lcov (the instances of one build merged \
                  exactly, as llvm-cov reports their profiles merged; other builds and runtimes \
                  merged as LCOV), instances/<instance>.lcov (the report of each instance merged \
                  as LCOV; with --profraw, instances/<instance>.profraw of each one merged \
                  exactly) and manifest.json (every target: address, instance, runtime, program, \
                  build id, exact group, timing, error). Reports of exited processes in --dir \
                  count. The files are written in any case; exits 1 when a target failed or a \
                  DNS server did not answer (unless --allow-partial), or when a --replicas name \
                  has no records or nothing at all was found (unless --allow-empty).",
    after_help = "Examples:\n  \
                  livecov collect --replicas dns:app-coverage.ci.svc.cluster.local:9464 -o cov/\n  \
                  livecov collect --replicas srv:_coverage._tcp.app-coverage --test login --reset -o cov/login\n  \
                  livecov collect --dir /cov --target http://10.0.0.7:9464 --target-token-file token -o out"
)]
pub struct Args {
    #[command(flatten)]
    pub targets: TargetArgs,
    /// The output folder (made if missing).
    #[arg(short = 'o', long = "output", value_name = "OUTDIR")]
    pub output: PathBuf,
    /// Name the records (TN:NAME), e.g. after the test that just ran.
    #[arg(long, value_name = "NAME")]
    pub test: Option<String>,
    /// Reset every target in the same step (per-test coverage: each
    /// collection has what ran since the previous one). Reports of exited
    /// processes in --dir are forgotten after this collection.
    #[arg(long)]
    pub reset: bool,
    /// Exit 0 even when some targets failed, or a DNS server did not answer
    /// or refused (they are in the manifest), as long as some target was
    /// found (else --allow-empty).
    #[arg(long)]
    pub allow_partial: bool,
    /// Exit 0 even when a --replicas name does not exist or has no records
    /// (a Service scaled to zero), or when no target at all was found.
    #[arg(long)]
    pub allow_empty: bool,
    /// Also write each instance merged exactly as
    /// instances/<instance>.profraw, the raw profile its counters stand for
    /// (for llvm-profdata and llvm-cov; about a MiB each for a large C server).
    #[arg(long)]
    pub profraw: bool,
    /// Rewrite the source files' paths (SF:) that start with the folder
    /// FROM (inside the image) to start with TO instead (the checkout), in
    /// merged.lcov and instances/*.lcov, as llvm-cov's -path-equivalence;
    /// repeatable, the first that applies wins.
    #[arg(long, value_name = "FROM,TO", value_parser = PathEquivalence::parse)]
    pub path_equivalence: Vec<PathEquivalence>,
}

/// One row of the manifest.
struct Row {
    address: String,
    source: String,
    state: &'static str,
    instance: Option<String>,
    meta: Option<Meta>,
    /// The exact group (build mapping id) the instance was merged in.
    group: Option<String>,
    file: Option<String>,
    bytes: Option<usize>,
    started: SystemTime,
    duration: Duration,
    /// The target's own time to make its answer, when it says.
    report_time: Option<Duration>,
    attempts: u32,
    error: Option<String>,
}

impl Row {
    fn to_json(&self) -> serde_json::Value {
        let meta = self.meta.clone().unwrap_or_default();
        serde_json::json!({
            "address": self.address,
            "source": self.source,
            "state": self.state,
            "instance": self.instance,
            "runtime": meta.runtime,
            "program": meta.program,
            "build_id": meta.build_id,
            "pid": meta.pid,
            "group": self.group,
            "file": self.file,
            "bytes": self.bytes,
            "started": rfc3339(self.started),
            "duration_ms": (self.duration.as_secs_f64() * 1000.0).round() as u64,
            "report_ms": report_ms(self.report_time),
            "attempts": self.attempts,
            "error": self.error,
        })
    }
}

pub fn run(args: Args) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(collect(args))
}

async fn collect(args: Args) -> Result<()> {
    let options = args.targets.fetch_options()?;
    let mut discovery = args.targets.discovery(Duration::ZERO)?;
    let instances_dir = args.output.join("instances");
    // Made (and checked writable) first: a reset must not happen when the
    // result cannot be kept. With a reset, room is kept for the result,
    // as much as the last collection in the folder took: a reset's counts
    // are only in the result.
    std::fs::create_dir_all(&instances_dir).with_context(|| format!("cannot create {}", instances_dir.display()))?;
    drop(Output::open(Some(&args.output.join("manifest.json")))?);
    let reserved = match args.reset {
        true => Some(reserve(&args.output, collection_size(&args.output))?),
        false => None,
    };

    let started = SystemTime::now();
    let clock = Instant::now();
    let found = discovery.discover(true).await;
    let total = found.endpoints.len();
    let bar = ProgressBar::new(total);
    let progress: Option<Progress> = bar.as_ref().map(|b| {
        let b = b.clone();
        Arc::new(move |f: &Fetched| b.tick(f.error().is_some())) as Progress
    });
    let query = CoverageQuery { test: args.test.clone(), reset: args.reset, format: None };
    let fetched =
        fetch_all(&found.endpoints, &Ask::Coverage(query), &options, None, Arc::new(|_: &str| true), progress).await;
    if let Some(b) = &bar {
        b.finish();
    }

    // Instances: live answers first, then reports of instances without a
    // newer live answer.
    let mut rows = Vec::new();
    let mut texts: BTreeMap<String, Bytes> = BTreeMap::new();
    // Instances merged exactly: their build mapping and counters.
    let mut exact: BTreeMap<String, (Arc<BuildMapping>, Bytes)> = BTreeMap::new();
    let mut taken: BTreeMap<String, SystemTime> = BTreeMap::new();
    for f in &fetched {
        let mut row = Row {
            address: f.endpoint.address(),
            source: f.endpoint.source.clone(),
            state: "running",
            instance: None,
            meta: None,
            group: None,
            file: None,
            bytes: None,
            started: f.started,
            duration: f.duration,
            report_time: f.report_time,
            attempts: f.attempts,
            error: None,
        };
        match &f.outcome {
            Outcome::Snapshot { instance, body, meta } => {
                row.instance = Some(instance.clone());
                row.meta = meta.clone();
                row.bytes = Some(body.len());
                if texts.contains_key(instance) || exact.contains_key(instance) {
                    row.error = Some(format!("instance {instance} answered on another target too: counted once"));
                } else {
                    texts.insert(instance.clone(), body.clone());
                    taken.insert(instance.clone(), f.started);
                    row.file = Some(format!("instances/{}.lcov", file_name_for(instance)));
                }
            }
            Outcome::Counters { instance, counters, mapping, meta } => {
                row.instance = Some(instance.clone());
                row.meta = meta.clone();
                row.bytes = Some(counters.len());
                if texts.contains_key(instance) || exact.contains_key(instance) {
                    row.error = Some(format!("instance {instance} answered on another target too: counted once"));
                } else {
                    exact.insert(instance.clone(), (mapping.clone(), counters.clone()));
                    taken.insert(instance.clone(), f.started);
                    row.group = Some(mapping.id().to_owned());
                    row.file = args.profraw.then(|| format!("instances/{}.profraw", file_name_for(instance)));
                }
            }
            Outcome::Gone(why) => {
                row.state = "gone";
                row.error = Some(why.clone());
            }
            Outcome::Failed(e) => {
                row.state = "error";
                row.error = Some(e.clone());
            }
            Outcome::Reset { .. } => {}
        }
        rows.push(row);
    }
    for report in &found.reports {
        if taken.get(&report.instance).is_some_and(|&t| t >= report.modified) {
            continue; // the live answer is newer
        }
        let row_started = SystemTime::now();
        let t0 = Instant::now();
        let (body, meta, mut error) = read_report(report, options.max_body);
        // Its counters, when a live process of its build gave the mapping.
        let counters = match body.is_some().then(|| read_counters(report, options.mappings.as_deref(), options.max_body)) {
            Some(Ok(counters)) => counters,
            Some(Err(e)) => {
                error = Some(e);
                None
            }
            None => None,
        };
        let body = body.filter(|_| error.is_none());
        let ended = match meta.as_ref().and_then(|m| m.state.as_deref()) {
            // Its final report: the process exited.
            Some("exited") | None => "gone",
            // A periodic report newer than the live answer of this run.
            Some(_) if taken.contains_key(&report.instance) => "running",
            Some(_) => "lost",
        };
        let mut row = Row {
            address: report.path.display().to_string(),
            source: report.source.clone(),
            state: if error.is_some() { "error" } else { ended },
            instance: Some(report.instance.clone()),
            meta,
            group: None,
            file: None,
            bytes: body.as_ref().map(|b| b.len()),
            started: row_started,
            duration: t0.elapsed(),
            report_time: None,
            attempts: 1,
            error,
        };
        if let (Some((mapping, counters)), Some(_)) = (counters, &body) {
            // A live answer older than the report is replaced by it.
            texts.remove(&report.instance);
            for r in rows.iter_mut().filter(|r| r.instance.as_deref() == Some(report.instance.as_str())) {
                r.file = None;
                r.group = None;
            }
            row.group = Some(mapping.id().to_owned());
            row.file = args.profraw.then(|| format!("instances/{}.profraw", file_name_for(&report.instance)));
            exact.insert(report.instance.clone(), (mapping, counters));
        } else if let Some(body) = body {
            let body = match &args.test {
                Some(t) => Bytes::from(snapshot::retitle(&String::from_utf8_lossy(&body), t)),
                None => body,
            };
            // A live answer older than the report (the process exited
            // meanwhile) is replaced by the report.
            texts.insert(report.instance.clone(), body);
            exact.remove(&report.instance);
            row.file = Some(format!("instances/{}.lcov", file_name_for(&report.instance)));
            for r in rows.iter_mut().filter(|r| r.instance.as_deref() == Some(report.instance.as_str())) {
                r.file = None;
                r.group = None;
            }
        }
        rows.push(row);
    }

    // Write the instances and their merge.
    drop(reserved);
    let (merged, profraws) = {
        let inputs: Vec<(String, Bytes)> = texts.iter().map(|(i, b)| (i.clone(), b.clone())).collect();
        let exact = exact.clone();
        let (test, max_body, want_profraws) = (args.test.clone(), options.max_body, args.profraw);
        tokio::task::spawn_blocking(move || {
            // Rebuilt only when asked: names and data records make a raw
            // profile a hundred times the size of the counters it carries.
            let profraws = if want_profraws { exact_profraws(&exact, max_body) } else { BTreeMap::new() };
            let groups = snapshot::exact_groups(exact.iter().map(|(i, (m, c))| (i.as_str(), m, c)), test.as_deref(), max_body)?;
            let merged = snapshot::merge_all(&inputs, &groups, None)?;
            Ok::<_, String>((merged, profraws))
        })
        .await
        .context("the merge failed")?
        .map_err(anyhow::Error::msg)?
    };
    // Paths are rewritten in what is written, after the merge: a path
    // rewritten twice could move twice (FROM /, TO /src).
    let lcovs: Vec<(PathBuf, std::borrow::Cow<[u8]>)> = texts
        .iter()
        .map(|(instance, body)| {
            (
                instances_dir.join(format!("{}.lcov", file_name_for(instance))),
                PathEquivalence::rewrite_lcov(&args.path_equivalence, body),
            )
        })
        .collect();
    let mut files: Vec<(PathBuf, &[u8])> = lcovs.iter().map(|(path, text)| (path.clone(), text.as_ref())).collect();
    for (instance, profraw) in &profraws {
        files.push((instances_dir.join(format!("{}.profraw", file_name_for(instance))), &profraw[..]));
    }
    let totals = snapshot::totals(&merged);
    let merged_path = args.output.join("merged.lcov");
    let merged_text = PathEquivalence::rewrite_lcov(&args.path_equivalence, merged.as_bytes());
    files.push((merged_path, &merged_text));
    // All written before any replaces the last collection's, and that
    // one's other instance files removed after: a collection that cannot
    // be written (a full disk) leaves the last one whole.
    write_outputs(&files)?;
    remove_other_instance_files(&instances_dir, &files);
    for r in rows.iter_mut().filter(|r| r.group.is_some()) {
        if !r.instance.as_ref().is_some_and(|i| profraws.contains_key(i)) {
            r.file = None;
        }
    }

    let mut reset_errors = Vec::new();
    if args.reset {
        reset_errors = discovery.mark_reset(SystemTime::now());
    }
    settle_left_over_sockets(&mut rows);
    let failed = rows.iter().filter(|r| r.state == "error").count();
    let lost = rows.iter().filter(|r| r.state == "lost").count();
    let no_target = rows.is_empty();
    let sources_failed = found.sources.iter().filter(|s| s.state.is_failure()).count();
    let manifest = serde_json::json!({
        "livecov_version": env!("CARGO_PKG_VERSION"),
        "test": args.test,
        "reset": args.reset,
        "started": rfc3339(started),
        "duration_ms": (clock.elapsed().as_secs_f64() * 1000.0).round() as u64,
        "merged": "merged.lcov",
        "instances": texts.len() + exact.len(),
        "groups": groups_json(&exact),
        "targets_failed": failed,
        "sources_failed": sources_failed,
        "totals": {
            "records": totals.records,
            "lines": totals.summary.lines, "lines_hit": totals.summary.lines_hit,
            "functions": totals.summary.functions, "functions_hit": totals.summary.functions_hit,
            "branches": totals.summary.branches, "branches_hit": totals.summary.branches_hit,
        },
        "sources": found.sources.iter().map(source_json).collect::<Vec<_>>(),
        "reset_errors": reset_errors,
        "targets": rows.iter().map(Row::to_json).collect::<Vec<_>>(),
    });
    let mut text = serde_json::to_string_pretty(&manifest).expect("JSON");
    text.push('\n');
    write_output(Some(&args.output.join("manifest.json")), text.as_bytes())?;

    say(format_args!(
        "livecov: collected {} instance(s) from {} target(s) into {}: {}{}",
        texts.len() + exact.len(),
        rows.len(),
        args.output.display(),
        totals.summary,
        [(failed, "target(s) failed"), (lost, "instance(s) lost: ended without a final report")]
            .iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, what)| format!("; {n} {what}"))
            .collect::<String>()
    ));
    for r in rows.iter().filter(|r| r.state == "error") {
        match &r.error {
            Some(e) => say(format_args!("livecov: {e}")),
            None => say(format_args!("livecov: {}: failed", r.address)),
        }
    }
    for r in rows.iter().filter(|r| r.state == "lost") {
        say(format_args!(
            "livecov: {}: lost: instance {} ended without a final report (killed, or it could not write one: \
             see its stderr); {}",
            r.address,
            r.instance.as_deref().unwrap_or("?"),
            if r.file.is_some() && r.bytes.unwrap_or(0) > 0 {
                "its last periodic report is in the merge"
            } else {
                "nothing of it is in the merge"
            }
        ));
    }
    // With no target, the sources' errors are the reason, given once in
    // the error line.
    if no_target && !args.allow_empty {
        let why: Vec<String> = found
            .sources
            .iter()
            .map(|s| format!("{}: {}", s.source, s.error.as_deref().unwrap_or("nothing there")))
            .collect();
        bail!(
            "no target found: {}; the manifest is in {} (--allow-empty to accept a collection without targets)",
            why.join("; "),
            args.output.display()
        );
    }
    for s in found.sources.iter().filter(|s| s.error.is_some()) {
        say(format_args!("livecov: {}: {}", s.source, s.error.as_deref().unwrap_or("")));
    }
    let mut partial = Vec::new();
    if failed > 0 {
        partial.push(format!("{failed} of {} target(s) failed", rows.len()));
    }
    if sources_failed > 0 {
        partial.push(format!("{sources_failed} source(s) could not be resolved or listed"));
    }
    if !partial.is_empty() && !args.allow_partial {
        bail!("{} (see manifest.json; --allow-partial to accept this)", partial.join(" and "));
    }
    let empty: Vec<&str> =
        found.sources.iter().filter(|s| s.state.is_empty_answer()).map(|s| s.source.as_str()).collect();
    if !empty.is_empty() && !args.allow_empty {
        bail!(
            "no target from {} (see above; --allow-empty to accept names without records)",
            empty.join(", ")
        );
    }
    Ok(())
}

/// The bytes of the collection in `output`: its merge, manifest and
/// instance files.
fn collection_size(output: &Path) -> u64 {
    let size = |path: PathBuf| std::fs::metadata(path).map_or(0, |m| m.len());
    let instances = std::fs::read_dir(output.join("instances")).into_iter().flatten().flatten();
    size(output.join("merged.lcov")) + size(output.join("manifest.json")) + instances.map(|e| size(e.path())).sum::<u64>()
}

/// Removes the instance files (`.lcov`, `.profraw`) of `instances` that
/// are not among `written`: those of a last collection's instances that
/// this one does not have.
fn remove_other_instance_files(instances: &Path, written: &[(PathBuf, &[u8])]) {
    let Ok(entries) = std::fs::read_dir(instances) else { return };
    for e in entries.flatten() {
        let instance_file = e.file_name().to_str().is_some_and(|n| n.ends_with(".lcov") || n.ends_with(".profraw"));
        if instance_file && !written.iter().any(|(path, _)| *path == e.path()) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Each exact instance's counters as a raw profile (what its
/// `?format=profraw` would have been), for `instances/`; an instance whose
/// modules livecov does not write as profraw has no file.
fn exact_profraws(exact: &BTreeMap<String, (Arc<BuildMapping>, Bytes)>, max_body: usize) -> BTreeMap<String, Vec<u8>> {
    exact
        .iter()
        .filter_map(|(instance, (mapping, counters))| {
            let document = livecov::fleet::gunzip("counters", counters, max_body).ok()?;
            Some((instance.clone(), mapping.profraw(&document).ok()?))
        })
        .collect()
}

/// The exact groups of the manifest: each build mapping, its modules and
/// the instances merged in it.
fn groups_json(exact: &BTreeMap<String, (Arc<BuildMapping>, Bytes)>) -> Vec<serde_json::Value> {
    let mut groups: BTreeMap<&str, (&BuildMapping, Vec<&str>)> = BTreeMap::new();
    for (instance, (mapping, _)) in exact {
        groups.entry(mapping.id()).or_insert_with(|| (mapping, Vec::new())).1.push(instance);
    }
    groups
        .into_iter()
        .map(|(id, (mapping, instances))| {
            serde_json::json!({ "group": id, "modules": mapping.modules(), "instances": instances })
        })
        .collect()
}

/// A left-over socket of a `--dir` where nothing answers (`gone`) is a
/// process that ended without removing it: when a report of its instance
/// was read, that report's row stands for it; else it is `lost`.
fn settle_left_over_sockets(rows: &mut Vec<Row>) {
    let reported: std::collections::HashSet<String> =
        rows.iter().filter(|r| r.address.ends_with(".lcov")).filter_map(|r| r.instance.clone()).collect();
    rows.retain_mut(|row| {
        if row.state != "gone" || row.instance.is_some() || !row.source.starts_with("dir:") {
            return true;
        }
        let instance = Path::new(&row.address).file_stem().and_then(|s| s.to_str()).map(str::to_owned);
        if instance.as_ref().is_some_and(|i| reported.contains(i)) {
            return false;
        }
        row.state = "lost";
        row.instance = instance;
        true
    });
}

pub fn source_json(s: &SourceStatus) -> serde_json::Value {
    serde_json::json!({
        "source": s.source,
        "state": s.state.as_str(),
        "targets": s.targets,
        "last_resolved": s.last_resolved.map(rfc3339),
        "since": s.since.map(rfc3339),
        "error": s.error,
        "previous_error": s.previous_error,
    })
}

/// Reads a report file (bounded) and its metadata; an unreadable or
/// malformed report is an error.
pub fn read_report(report: &ReportFile, max_body: usize) -> (Option<Bytes>, Option<Meta>, Option<String>) {
    let meta = report.metadata.as_deref().and_then(|p| std::fs::read(p).ok()).map(|j| Meta::from_json(&j));
    let body = match read_bounded(&report.path, max_body) {
        Ok(b) => b,
        Err(e) => return (None, meta, Some(e)),
    };
    match snapshot::check_lcov(&report.path.display().to_string(), &body) {
        Ok(()) => (Some(body), meta, None),
        Err(e) => (None, meta, Some(format!("{}: {e}", report.path.display()))),
    }
}

/// The counters a process wrote beside its report (`ReportFile::counters`),
/// checked, with their build mapping (given by a target of that build, or
/// read from its file beside them): `Ok(None)` when there are none, or
/// when neither has the mapping, and the report joins as LCOV.
pub fn read_counters(
    report: &ReportFile,
    mappings: Option<&Mappings>,
    max_body: usize,
) -> Result<Option<(Arc<BuildMapping>, Bytes)>, String> {
    let (Some(path), Some(mappings)) = (&report.counters, mappings) else { return Ok(None) };
    let bytes = read_bounded(path, max_body)?;
    let not_counters = || format!("{}: not a livecov counters file (a mapping id line, then gzip data)", path.display());
    let newline = bytes.iter().position(|&b| b == b'\n').ok_or_else(not_counters)?;
    let id = std::str::from_utf8(&bytes[..newline])
        .ok()
        .filter(|id| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(not_counters)?;
    let mapping = match mappings.known(id) {
        Some(mapping) => mapping,
        None => {
            let file = path.with_file_name(livecov::fleet::mapping_file_name(id));
            if !file.exists() {
                return Ok(None);
            }
            let document = read_bounded(&file, max_body)?;
            mappings.add(id, document, max_body).map_err(|e| {
                format!("{}: {e} (remove it: the next report of a process of that build writes it again)", file.display())
            })?
        }
    };
    let counters = bytes.slice(newline + 1..);
    let document = livecov::fleet::gunzip("counters", &counters, max_body).map_err(|e| format!("{}: {e}", path.display()))?;
    mapping.profiles(&document).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Some((mapping, counters)))
}

fn read_bounded(path: &Path, max: usize) -> Result<Bytes, String> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut buf = Vec::new();
    f.take(max as u64 + 1).read_to_end(&mut buf).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if buf.len() > max {
        return Err(format!("{} is larger than {} MiB: raise --max-size", path.display(), max.div_ceil(1 << 20)));
    }
    Ok(Bytes::from(buf))
}

/// A progress bar on standard error, only when it is a terminal.
#[derive(Clone)]
struct ProgressBar {
    total: usize,
    done: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
}

impl ProgressBar {
    fn new(total: usize) -> Option<ProgressBar> {
        if total == 0 || !std::io::stderr().is_terminal() {
            return None;
        }
        let bar = ProgressBar { total, done: Arc::default(), failed: Arc::default() };
        bar.draw();
        Some(bar)
    }

    fn tick(&self, failed: bool) {
        self.done.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        self.draw();
    }

    fn draw(&self) {
        const WIDTH: usize = 30;
        let done = self.done.load(Ordering::Relaxed).min(self.total);
        let failed = self.failed.load(Ordering::Relaxed);
        let filled = done * WIDTH / self.total;
        let mut line = format!(
            "\rlivecov: collecting [{}{}] {done}/{} targets",
            "#".repeat(filled),
            " ".repeat(WIDTH - filled),
            self.total
        );
        if failed > 0 {
            line.push_str(&format!(", {failed} failed"));
        }
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(line.as_bytes());
        let _ = err.flush();
    }

    fn finish(&self) {
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(b"\r\x1b[2K");
        let _ = err.flush();
    }
}
