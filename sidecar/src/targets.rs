//! Where the sidecar and `livecov collect` find their targets.
//!
//! Any mix of:
//!
//! - `--dir DIR`: every agent socket in `DIR/sockets/*.sock`, and every
//!   report in `DIR/reports/*.lcov` (the periodic or final report of a
//!   process, so that exited processes still count);
//! - `--replicas dns:NAME:PORT`: the A/AAAA records of a headless Service,
//!   each address on `PORT`;
//! - `--replicas srv:NAME`: the SRV records of `NAME`, each target host's
//!   A/AAAA records on the record's port;
//! - `--target URL`: one agent or sidecar (`http://HOST:PORT`,
//!   `unix:PATH`, `PATH.sock`).
//!
//! [`Discovery::discover`] lists them all. DNS answers are re-resolved at
//! most once per resolve interval (the cache is cleared each time); when a
//! resolution fails (server down, timeout) the previous answer is kept and
//! the failure is reported on the source; a name that does not exist or has
//! no records is an empty list (scaled to zero), not an error.
//!
//! # Resets and reports
//!
//! A reset through the sidecar or `livecov collect --reset` forgets the
//! reports of processes that exited before it: it writes the reset time to
//! `DIR/.livecov-reset` (when the folder is writable; the time is also kept
//! in memory), and reports last written at or before that time are left out
//! from then on, by every sidecar and collect run over that folder.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hickory_resolver::config::{LookupIpStrategy, NameServerConfigGroup, ResolveHosts, ResolverConfig};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::TokioResolver;

use crate::client::Target;

/// `--replicas`: a DNS name to resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replicas {
    /// `dns:NAME:PORT`: A/AAAA records, each on `PORT`.
    Dns { name: String, port: u16 },
    /// `srv:NAME`: SRV records (ports from the records).
    Srv { name: String },
}

impl FromStr for Replicas {
    type Err = String;

    fn from_str(s: &str) -> Result<Replicas, String> {
        let usage = || {
            format!(
                "{s:?}: give dns:NAME:PORT (the A/AAAA records of a headless Service, e.g. \
                 dns:app-coverage.ns.svc.cluster.local:9464) or srv:NAME (SRV records, e.g. \
                 srv:_coverage._tcp.app-coverage.ns.svc.cluster.local)"
            )
        };
        if let Some(rest) = s.strip_prefix("dns:") {
            let (name, port) = rest.rsplit_once(':').ok_or_else(usage)?;
            let port: u16 = port.parse().ok().filter(|&p| p != 0).ok_or_else(usage)?;
            if name.is_empty() || name.contains(['/', ' ', ':']) {
                return Err(usage());
            }
            return Ok(Replicas::Dns { name: name.to_owned(), port });
        }
        if let Some(name) = s.strip_prefix("srv:") {
            if name.is_empty() || name.contains(['/', ' ', ':']) {
                return Err(usage());
            }
            return Ok(Replicas::Srv { name: name.to_owned() });
        }
        Err(usage())
    }
}

impl fmt::Display for Replicas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Replicas::Dns { name, port } => write!(f, "dns:{name}:{port}"),
            Replicas::Srv { name } => write!(f, "srv:{name}"),
        }
    }
}

/// Where targets come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Static(Target),
    Dir(PathBuf),
    Replicas(Replicas),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Static(t) => write!(f, "target:{t}"),
            Source::Dir(d) => write!(f, "dir:{}", d.display()),
            Source::Replicas(r) => r.fmt(f),
        }
    }
}

/// One agent or sidecar to ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub target: Target,
    /// The source that listed it (`dir:...`, `dns:...`, `target:...`).
    pub source: String,
    /// A socket of a `--dir`: a refused connection means its process is
    /// gone (a killed process leaves its socket file behind), not an error.
    pub from_dir: bool,
}

impl Endpoint {
    /// The key the target is known by: its address.
    pub fn address(&self) -> String {
        self.target.to_string()
    }
}

/// A report file in `DIR/reports/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportFile {
    pub instance: String,
    pub path: PathBuf,
    /// The later of the report's and its metadata's modification times.
    pub modified: SystemTime,
    pub size: u64,
    /// `DIR/reports/<instance>.json`, the instance's metadata, if present.
    pub metadata: Option<PathBuf>,
    /// `DIR/reports/<instance>.counters`, when written after the report
    /// (so the counters the report was computed from, or newer ones): what
    /// the process's `?format=counters` answered, for an exact merge.
    pub counters: Option<PathBuf>,
    pub source: String,
}

/// How a source fared in the last discovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceStatus {
    pub source: String,
    /// Targets (and reports) it lists now.
    pub targets: usize,
    pub last_resolved: Option<SystemTime>,
    /// The last failure; targets from the answer before it are kept.
    pub error: Option<String>,
}

/// Everything the sources list now.
#[derive(Debug, Clone, Default)]
pub struct Found {
    pub endpoints: Vec<Endpoint>,
    pub reports: Vec<ReportFile>,
    pub sources: Vec<SourceStatus>,
    /// Resolutions and listings that failed in this discovery.
    pub failures: usize,
}

struct DnsState {
    replicas: Replicas,
    last: Vec<Endpoint>,
    resolved_at: Option<Instant>,
    status: SourceStatus,
}

/// Lists the targets of a set of sources; keeps the last DNS answers.
pub struct Discovery {
    statics: Vec<Target>,
    dirs: Vec<PathBuf>,
    dns: Vec<DnsState>,
    resolver: Option<TokioResolver>,
    resolve_interval: Duration,
    /// Per dir: the last reset (also written to `DIR/.livecov-reset`).
    reset_at: BTreeMap<PathBuf, SystemTime>,
    /// Paths to leave out (the sidecar's own socket).
    exclude: Vec<PathBuf>,
}

/// The name of the reset marker in a `--dir`.
pub const RESET_MARKER: &str = ".livecov-reset";

impl Discovery {
    /// `dns_server`: ask this server (UDP and TCP) instead of the system's
    /// resolver configuration (`/etc/resolv.conf`).
    pub fn new(
        sources: Vec<Source>,
        dns_server: Option<SocketAddr>,
        resolve_interval: Duration,
    ) -> Result<Discovery, String> {
        let mut statics = Vec::new();
        let mut dirs = Vec::new();
        let mut dns = Vec::new();
        for s in sources {
            match s {
                Source::Static(t) => {
                    if !statics.contains(&t) {
                        statics.push(t)
                    }
                }
                Source::Dir(d) => {
                    if !dirs.contains(&d) {
                        dirs.push(d)
                    }
                }
                Source::Replicas(r) => {
                    let status = SourceStatus { source: r.to_string(), targets: 0, last_resolved: None, error: None };
                    dns.push(DnsState { replicas: r, last: Vec::new(), resolved_at: None, status });
                }
            }
        }
        let resolver = if dns.is_empty() { None } else { Some(make_resolver(dns_server)?) };
        Ok(Discovery { statics, dirs, dns, resolver, resolve_interval, reset_at: BTreeMap::new(), exclude: Vec::new() })
    }

    /// Leaves this path out of the sockets found in `--dir`s.
    pub fn exclude(&mut self, path: PathBuf) {
        self.exclude.push(path);
    }

    pub fn is_empty(&self) -> bool {
        self.statics.is_empty() && self.dirs.is_empty() && self.dns.is_empty()
    }

    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Lists every source. `force`: resolve DNS names even when the last
    /// answer is younger than the resolve interval.
    pub async fn discover(&mut self, force: bool) -> Found {
        let mut found = Found::default();
        for t in &self.statics {
            found.endpoints.push(Endpoint { target: t.clone(), source: format!("target:{t}"), from_dir: false });
        }
        let statics = found.endpoints.len();
        if statics > 0 {
            found.sources.push(SourceStatus {
                source: "target".into(),
                targets: statics,
                last_resolved: Some(SystemTime::now()),
                error: None,
            });
        }
        for dir in self.dirs.clone() {
            let reset = self.reset_time(&dir);
            let (sockets, reports, error) = list_dir(&dir, reset, &self.exclude);
            // A folder not made yet is no failure: no agent has started.
            if error.as_ref().is_some_and(|e| !e.contains("not a folder (yet)")) {
                found.failures += 1;
            }
            found.sources.push(SourceStatus {
                source: format!("dir:{}", dir.display()),
                targets: sockets.len() + reports.len(),
                last_resolved: Some(SystemTime::now()),
                error,
            });
            found.endpoints.extend(sockets);
            found.reports.extend(reports);
        }
        if let Some(resolver) = &self.resolver {
            let interval = self.resolve_interval;
            let due: Vec<usize> = (0..self.dns.len())
                .filter(|&i| force || self.dns[i].resolved_at.is_none_or(|t| t.elapsed() >= interval))
                .collect();
            if !due.is_empty() {
                resolver.clear_cache();
                let mut answers = Vec::with_capacity(due.len());
                for &i in &due {
                    answers.push(resolve(resolver, &self.dns[i].replicas).await);
                }
                for (i, answer) in due.into_iter().zip(answers) {
                    let state = &mut self.dns[i];
                    state.resolved_at = Some(Instant::now());
                    match answer {
                        Ok(endpoints) => {
                            state.last = endpoints;
                            state.status.error = None;
                            state.status.last_resolved = Some(SystemTime::now());
                        }
                        Err(e) => {
                            state.status.error = Some(e);
                            found.failures += 1;
                        }
                    }
                    state.status.targets = state.last.len();
                }
            }
            for state in &self.dns {
                found.endpoints.extend(state.last.iter().cloned());
                found.sources.push(state.status.clone());
            }
        }
        // The same address from two sources is asked once.
        let mut seen = std::collections::HashSet::new();
        found.endpoints.retain(|e| seen.insert(e.address()));
        found
    }

    /// Whether some DNS answer is older than the resolve interval.
    pub fn resolution_due(&self) -> bool {
        self.dns.iter().any(|d| d.resolved_at.is_none_or(|t| t.elapsed() >= self.resolve_interval))
    }

    /// The reports of a dir last written at or before this time are left out.
    pub fn reset_time(&self, dir: &Path) -> Option<SystemTime> {
        let marker = read_reset_marker(dir);
        match (marker, self.reset_at.get(dir).copied()) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// Records a reset at `at` in every dir: reports written until then are
    /// forgotten. Errors (a read-only volume) are returned per dir, the time
    /// being kept in memory anyway.
    pub fn mark_reset(&mut self, at: SystemTime) -> Vec<String> {
        let mut errors = Vec::new();
        for dir in &self.dirs {
            self.reset_at.insert(dir.clone(), at);
            if let Err(e) = write_reset_marker(dir, at) {
                errors.push(format!("cannot write {}: {e}", dir.join(RESET_MARKER).display()));
            }
        }
        errors
    }
}

fn make_resolver(dns_server: Option<SocketAddr>) -> Result<TokioResolver, String> {
    let mut builder = match dns_server {
        Some(addr) => {
            let group = NameServerConfigGroup::from_ips_clear(&[addr.ip()], addr.port(), true);
            let mut b = TokioResolver::builder_with_config(
                ResolverConfig::from_parts(None, vec![], group),
                TokioConnectionProvider::default(),
            );
            b.options_mut().use_hosts_file = ResolveHosts::Never;
            b
        }
        None => TokioResolver::builder_tokio().map_err(|e| {
            format!("cannot read the system's DNS configuration (/etc/resolv.conf): {e}; give --dns-server IP:PORT")
        })?,
    };
    let opts = builder.options_mut();
    opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    opts.timeout = Duration::from_secs(2);
    opts.attempts = 2;
    // Answers are wanted fresh at each resolution (the cache is also
    // cleared before each); replicas come and go.
    opts.positive_max_ttl = Some(Duration::from_secs(1));
    opts.negative_max_ttl = Some(Duration::from_secs(1));
    Ok(builder.build())
}

/// Whether a resolution error means "no such name / no records" (an empty
/// answer) rather than a failure.
fn is_empty_answer(e: &hickory_resolver::ResolveError) -> bool {
    e.is_nx_domain() || e.is_no_records_found()
}

async fn lookup_ips(resolver: &TokioResolver, name: &str) -> Result<Vec<IpAddr>, String> {
    match resolver.lookup_ip(name).await {
        Ok(answer) => {
            let mut ips: Vec<IpAddr> = answer.iter().collect();
            ips.sort();
            ips.dedup();
            Ok(ips)
        }
        Err(e) if is_empty_answer(&e) => Ok(Vec::new()),
        Err(e) => Err(format!("cannot resolve {name}: {e}")),
    }
}

async fn resolve(resolver: &TokioResolver, replicas: &Replicas) -> Result<Vec<Endpoint>, String> {
    let source = replicas.to_string();
    let endpoint = |ip: IpAddr, port: u16| Endpoint {
        target: Target::Http { host: ip.to_string(), port, prefix: String::new() },
        source: source.clone(),
        from_dir: false,
    };
    match replicas {
        Replicas::Dns { name, port } => Ok(lookup_ips(resolver, name).await?.into_iter().map(|ip| endpoint(ip, *port)).collect()),
        Replicas::Srv { name } => {
            let records = match resolver.srv_lookup(name.as_str()).await {
                Ok(answer) => answer.iter().map(|srv| (srv.target().to_utf8(), srv.port())).collect::<Vec<_>>(),
                Err(e) if is_empty_answer(&e) => Vec::new(),
                Err(e) => return Err(format!("cannot resolve the SRV records of {name}: {e}")),
            };
            let mut out = Vec::new();
            for (host, port) in records {
                if port == 0 {
                    continue;
                }
                for ip in lookup_ips(resolver, &host).await? {
                    out.push(endpoint(ip, port));
                }
            }
            out.sort_by_key(|e| e.address());
            out.dedup();
            Ok(out)
        }
    }
}

/// The sockets and (not forgotten) reports of a `--dir`.
fn list_dir(dir: &Path, reset: Option<SystemTime>, exclude: &[PathBuf]) -> (Vec<Endpoint>, Vec<ReportFile>, Option<String>) {
    let source = format!("dir:{}", dir.display());
    let mut sockets = Vec::new();
    let mut reports = Vec::new();
    let mut errors = Vec::new();
    if !dir.is_dir() {
        // Not yet made (no agent started): nothing there, and say so.
        return (sockets, reports, Some(format!("{} is not a folder (yet): no agent has started there", dir.display())));
    }
    match std::fs::read_dir(dir.join("sockets")) {
        Ok(entries) => {
            for e in entries.flatten() {
                let path = e.path();
                let name = e.file_name();
                let Some(name) = name.to_str() else { continue };
                if name.starts_with('.') || !name.ends_with(".sock") || exclude.contains(&path) {
                    continue;
                }
                sockets.push(Endpoint { target: Target::Unix(path), source: source.clone(), from_dir: true });
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => errors.push(format!("cannot list {}: {e}", dir.join("sockets").display())),
    }
    match std::fs::read_dir(dir.join("reports")) {
        Ok(entries) => {
            for e in entries.flatten() {
                let path = e.path();
                let name = e.file_name();
                let Some(name) = name.to_str() else { continue };
                let Some(instance) = name.strip_suffix(".lcov") else { continue };
                if name.starts_with('.') || instance.is_empty() {
                    continue;
                }
                let Ok(meta) = e.metadata() else { continue };
                if !meta.is_file() {
                    continue;
                }
                let json = path.with_extension("json");
                // The metadata is written after the report: a change of
                // either (`exited` after `running`) is a change to read.
                let json_modified = std::fs::metadata(&json).and_then(|m| m.modified()).ok();
                let report_modified = meta.modified().unwrap_or(UNIX_EPOCH);
                let counters = path.with_extension("counters");
                let counters_modified = std::fs::metadata(&counters)
                    .ok()
                    .filter(|m| m.is_file() && m.len() > 0)
                    .and_then(|m| m.modified().ok());
                // The agent writes its counters after its report: older
                // counters are those of an earlier report (or of one taken
                // with a reset), and the report stands alone.
                let counters_modified = counters_modified.filter(|&t| t >= report_modified);
                let modified = report_modified
                    .max(json_modified.unwrap_or(UNIX_EPOCH))
                    .max(counters_modified.unwrap_or(UNIX_EPOCH));
                if reset.is_some_and(|r| modified <= r) {
                    continue;
                }
                reports.push(ReportFile {
                    instance: instance.to_owned(),
                    metadata: json_modified.is_some().then_some(json),
                    counters: counters_modified.is_some().then_some(counters),
                    path,
                    modified,
                    size: meta.len(),
                    source: source.clone(),
                });
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => errors.push(format!("cannot list {}: {e}", dir.join("reports").display())),
    }
    sockets.sort_by_key(|e| e.address());
    reports.sort_by(|a, b| a.instance.cmp(&b.instance));
    (sockets, reports, (!errors.is_empty()).then(|| errors.join("; ")))
}

fn read_reset_marker(dir: &Path) -> Option<SystemTime> {
    let text = std::fs::read_to_string(dir.join(RESET_MARKER)).ok()?;
    let nanos: u128 = text.trim().parse().ok()?;
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    Some(UNIX_EPOCH + Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

fn write_reset_marker(dir: &Path, at: SystemTime) -> std::io::Result<()> {
    let nanos = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let path = dir.join(RESET_MARKER);
    let tmp = dir.join(format!("{RESET_MARKER}.tmp{}", std::process::id()));
    std::fs::write(&tmp, format!("{nanos}\n")).and_then(|()| std::fs::rename(&tmp, &path)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_parse() {
        assert_eq!("dns:cov.ns.svc:9464".parse(), Ok(Replicas::Dns { name: "cov.ns.svc".into(), port: 9464 }));
        assert_eq!("srv:_cov._tcp.x".parse(), Ok(Replicas::Srv { name: "_cov._tcp.x".into() }));
        for bad in ["", "dns:x", "dns::80", "dns:x:0", "dns:x:y", "srv:", "x:80", "http://x:80"] {
            let e = bad.parse::<Replicas>().expect_err(bad);
            assert!(e.contains("dns:NAME:PORT"), "{e}");
        }
        assert_eq!(Replicas::Dns { name: "a".into(), port: 1 }.to_string(), "dns:a:1");
    }

    #[test]
    fn dirs_list_sockets_and_reports_and_forget_after_a_reset() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sockets")).unwrap();
        std::fs::create_dir_all(dir.path().join("reports")).unwrap();
        let sock = dir.path().join("sockets/rust-1-a.sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        std::fs::write(dir.path().join("reports/rust-2-b.lcov"), "SF:x\nend_of_record\n").unwrap();
        std::fs::write(dir.path().join("reports/rust-2-b.json"), "{}").unwrap();
        std::fs::write(dir.path().join("reports/.rust-3.lcov.tmp1"), "").unwrap();
        let (s, r, e) = list_dir(dir.path(), None, &[]);
        assert_eq!(e, None);
        assert_eq!(s.len(), 1);
        assert!(s[0].from_dir);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].instance, "rust-2-b");
        assert!(r[0].metadata.is_some());
        // Excluded: the sidecar's own socket.
        assert!(list_dir(dir.path(), None, std::slice::from_ref(&sock)).0.is_empty());
        // A reset after the report: forgotten, by marker file.
        let at = SystemTime::now() + Duration::from_millis(1);
        write_reset_marker(dir.path(), at).unwrap();
        let back = read_reset_marker(dir.path()).unwrap();
        assert_eq!(back, at);
        assert!(list_dir(dir.path(), Some(back), &[]).1.is_empty());
        // Not a folder yet.
        let (s, r, e) = list_dir(&dir.path().join("none"), None, &[]);
        assert!(s.is_empty() && r.is_empty() && e.unwrap().contains("not a folder"));
    }
}
