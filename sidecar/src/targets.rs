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
//! most once per resolve interval (the cache is cleared each time). Every
//! outcome of a resolution has a [`SourceState`] and a message saying what
//! to check: when the server does not answer, refuses or fails, nothing is
//! known of the replicas and the previous answer is kept; when the name does
//! not exist or has no records of the asked type, that is the answer (no
//! replica now: scaled to zero, or a wrong name) and the source lists none.
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

/// How a source's last listing or resolution went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceState {
    /// Listed, or resolved to records.
    Ok,
    /// The DNS server did not answer (nothing listens there, a firewall,
    /// a timeout).
    NoAnswer,
    /// The DNS server answered REFUSED: it does not serve the name.
    Refused,
    /// The name does not exist (NXDOMAIN).
    NxDomain,
    /// The name exists, without records of the asked type.
    NoRecords,
    /// Anything else: a server failure (SERVFAIL), a folder that cannot be
    /// listed.
    Failed,
}

impl SourceState {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceState::Ok => "ok",
            SourceState::NoAnswer => "no_answer",
            SourceState::Refused => "refused",
            SourceState::NxDomain => "nxdomain",
            SourceState::NoRecords => "no_records",
            SourceState::Failed => "failed",
        }
    }

    /// What went wrong, in a few words (the log of a name that came back).
    fn summary(self) -> &'static str {
        match self {
            SourceState::Ok => "resolved",
            SourceState::NoAnswer => "no answer from the DNS server",
            SourceState::Refused => "the DNS server refused (REFUSED)",
            SourceState::NxDomain => "the name did not exist (NXDOMAIN)",
            SourceState::NoRecords => "no records of the asked type",
            SourceState::Failed => "the DNS server failed",
        }
    }

    /// Nothing is known of the source's targets: its previous answer is kept.
    pub fn is_failure(self) -> bool {
        matches!(self, SourceState::NoAnswer | SourceState::Refused | SourceState::Failed)
    }

    /// An answer without targets: a name that does not exist or has no
    /// records of the asked type.
    pub fn is_empty_answer(self) -> bool {
        matches!(self, SourceState::NxDomain | SourceState::NoRecords)
    }
}

/// How a source fared in the last discovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceStatus {
    pub source: String,
    pub state: SourceState,
    /// Targets (and reports) it lists now.
    pub targets: usize,
    /// The last answer with records (a DNS source), or listing.
    pub last_resolved: Option<SystemTime>,
    /// What went wrong, and what to check; targets from the answer before
    /// a failure are kept.
    pub error: Option<String>,
    /// Since when `state` holds (DNS sources): when a name failed, or came back.
    pub since: Option<SystemTime>,
    /// For a DNS source resolved again after failing: what it failed with.
    pub previous_error: Option<String>,
}

/// Everything the sources list now.
#[derive(Debug, Clone, Default)]
pub struct Found {
    pub endpoints: Vec<Endpoint>,
    pub reports: Vec<ReportFile>,
    pub sources: Vec<SourceStatus>,
    /// Resolutions and listings that failed in this discovery.
    pub failures: usize,
    /// DNS sources whose state changed in this discovery, as messages (a
    /// name that fails, a name that comes back), for a long-running sidecar
    /// to log.
    pub changes: Vec<String>,
}

struct DnsState {
    replicas: Replicas,
    last: Vec<Endpoint>,
    resolved_at: Option<Instant>,
    status: SourceStatus,
}

impl DnsState {
    /// Takes a fresh answer: the targets (those of the last answer kept
    /// when nothing is known), the state and since when it holds; returns
    /// what to log when the state changed.
    fn update(&mut self, answer: Result<(Vec<Endpoint>, Option<String>), Unresolved>, every: Duration) -> Option<String> {
        let now = SystemTime::now();
        let first = self.resolved_at.replace(Instant::now()).is_none();
        let (before, before_error, before_since) = (self.status.state, self.status.error.take(), self.status.since);
        match answer {
            Ok((endpoints, note)) => {
                self.last = endpoints;
                self.status.state = SourceState::Ok;
                self.status.error = note;
                self.status.last_resolved = Some(now);
            }
            Err(unresolved) => {
                if unresolved.state.is_empty_answer() {
                    self.last.clear();
                }
                self.status.state = unresolved.state;
                self.status.error = Some(unresolved.message);
            }
        }
        self.status.targets = self.last.len();
        let changed = first || before != self.status.state;
        if changed {
            self.status.since = Some(now);
        }
        let source = &self.status.source;
        if self.status.state == SourceState::Ok {
            if !changed || first {
                return None;
            }
            let after = before_since.and_then(|t| now.duration_since(t).ok()).unwrap_or_default();
            self.status.previous_error = before_error;
            return Some(format!(
                "{source}: resolved again: {} target(s), after {} of: {}",
                self.status.targets,
                seconds(after),
                before.summary()
            ));
        }
        self.status.previous_error = None;
        if !changed {
            return None;
        }
        let kept = if self.status.state.is_failure() && !self.last.is_empty() {
            format!("; the {} target(s) of the last answer are kept", self.last.len())
        } else {
            String::new()
        };
        Some(format!(
            "{source}: {} (resolving again every {}{kept})",
            self.status.error.as_deref().unwrap_or(""),
            seconds(every)
        ))
    }
}

/// Lists the targets of a set of sources; keeps the last DNS answers.
pub struct Discovery {
    statics: Vec<Target>,
    dirs: Vec<PathBuf>,
    dns: Vec<DnsState>,
    resolver: Option<Resolver>,
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
                    let status = SourceStatus {
                        source: r.to_string(),
                        state: SourceState::Ok,
                        targets: 0,
                        last_resolved: None,
                        error: None,
                        since: None,
                        previous_error: None,
                    };
                    dns.push(DnsState { replicas: r, last: Vec::new(), resolved_at: None, status });
                }
            }
        }
        let resolver = if dns.is_empty() { None } else { Some(Resolver::new(dns_server)?) };
        Ok(Discovery { statics, dirs, dns, resolver, resolve_interval, reset_at: BTreeMap::new(), exclude: Vec::new() })
    }

    /// Leaves this path out of the sockets found in `--dir`s.
    pub fn exclude(&mut self, path: PathBuf) {
        self.exclude.push(path);
    }

    pub fn is_empty(&self) -> bool {
        self.statics.is_empty() && self.dirs.is_empty() && self.dns.is_empty()
    }

    /// Whether some source is a DNS name (`--replicas`).
    pub fn has_replicas(&self) -> bool {
        !self.dns.is_empty()
    }

    pub fn resolve_interval(&self) -> Duration {
        self.resolve_interval
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
                state: SourceState::Ok,
                targets: statics,
                last_resolved: Some(SystemTime::now()),
                error: None,
                since: None,
                previous_error: None,
            });
        }
        for dir in self.dirs.clone() {
            let reset = self.reset_time(&dir);
            let (sockets, reports, error) = list_dir(&dir, reset, &self.exclude);
            // A folder not made yet is no failure: no agent has started.
            let failed = error.as_ref().is_some_and(|e| !e.contains("not a folder (yet)"));
            if failed {
                found.failures += 1;
            }
            found.sources.push(SourceStatus {
                source: format!("dir:{}", dir.display()),
                state: if failed { SourceState::Failed } else { SourceState::Ok },
                targets: sockets.len() + reports.len(),
                last_resolved: Some(SystemTime::now()),
                error,
                since: None,
                previous_error: None,
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
                resolver.inner.clear_cache();
                let mut answers = Vec::with_capacity(due.len());
                for &i in &due {
                    answers.push(resolver.resolve(&self.dns[i].replicas).await);
                }
                for (i, answer) in due.into_iter().zip(answers) {
                    if answer.is_err() {
                        found.failures += 1;
                    }
                    found.changes.extend(self.dns[i].update(answer, self.resolve_interval));
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

/// A resolution that gave no target: its state and what to check.
#[derive(Debug)]
struct Unresolved {
    state: SourceState,
    message: String,
}

/// Why one lookup gave no record.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Miss {
    NxDomain,
    NoRecords,
    Refused,
    /// Nothing came back: the cause (timed out, connection refused).
    NoAnswer(String),
    /// An answer that is an error (SERVFAIL), or anything else.
    Failed(String),
}

impl Miss {
    fn of(e: &hickory_resolver::ResolveError) -> Miss {
        use hickory_resolver::proto::op::ResponseCode;
        use hickory_resolver::proto::ProtoErrorKind;
        let Some(proto) = e.proto() else { return Miss::Failed(e.to_string()) };
        match proto.kind() {
            ProtoErrorKind::NoRecordsFound { response_code: ResponseCode::NXDomain, .. } => Miss::NxDomain,
            ProtoErrorKind::NoRecordsFound { response_code: ResponseCode::NoError, .. } => Miss::NoRecords,
            ProtoErrorKind::NoRecordsFound { response_code: ResponseCode::Refused, .. } => Miss::Refused,
            ProtoErrorKind::NoRecordsFound { response_code, .. } => {
                Miss::Failed(format!("it answered {response_code} (rcode {})", u16::from(*response_code)))
            }
            ProtoErrorKind::Timeout => Miss::NoAnswer("timed out".into()),
            ProtoErrorKind::Io(io) => Miss::NoAnswer(io.to_string()),
            ProtoErrorKind::NoConnections | ProtoErrorKind::Busy => Miss::NoAnswer(proto.to_string()),
            _ => Miss::Failed(proto.to_string()),
        }
    }
}

/// The resolver, and what messages say of it.
struct Resolver {
    inner: TokioResolver,
    /// Whether the server is `--dns-server`'s (else /etc/resolv.conf's).
    given: bool,
    /// The servers asked, e.g. `127.0.0.1:5353`.
    servers: String,
    /// The search domains (and the domain) of /etc/resolv.conf, and how
    /// many labels a name needs to be asked as given first.
    search: Vec<String>,
    ndots: usize,
}

/// The steps of a lookup, for its messages.
const ATTEMPTS: usize = 2;
const TIMEOUT: Duration = Duration::from_secs(2);

impl Resolver {
    fn new(dns_server: Option<SocketAddr>) -> Result<Resolver, String> {
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
        opts.timeout = TIMEOUT;
        opts.attempts = ATTEMPTS;
        // Answers are wanted fresh at each resolution (the cache is also
        // cleared before each); replicas come and go.
        opts.positive_max_ttl = Some(Duration::from_secs(1));
        opts.negative_max_ttl = Some(Duration::from_secs(1));
        let inner = builder.build();
        let mut servers: Vec<String> = inner.config().name_servers().iter().map(|s| s.socket_addr.to_string()).collect();
        servers.dedup();
        let config = inner.config();
        let search =
            config.search().iter().chain(config.domain()).map(|n| n.to_utf8().trim_end_matches('.').to_owned()).collect();
        let ndots = inner.options().ndots;
        Ok(Resolver { given: dns_server.is_some(), servers: servers.join(", "), search, ndots, inner })
    }

    /// Who was asked: "--dns-server 127.0.0.1:5353", or /etc/resolv.conf's servers.
    fn server(&self) -> String {
        if self.given {
            format!("--dns-server {}", self.servers)
        } else if self.servers.is_empty() {
            "the DNS servers of /etc/resolv.conf (none listed)".to_owned()
        } else {
            format!("the DNS server {} of /etc/resolv.conf", self.servers)
        }
    }

    /// The names a name was tried as, in order, with the search domains of
    /// /etc/resolv.conf: as given first only when it has more than `ndots`
    /// labels (so `app.ns` is first tried as `app.ns.ns.svc.cluster.local`).
    fn tried_as(&self, name: &str) -> String {
        if self.given || self.search.is_empty() || name.ends_with('.') {
            return String::new();
        }
        let mut names: Vec<String> = self.search.iter().map(|d| format!("{name}.{d}")).collect();
        if name.split('.').count() > self.ndots {
            names.insert(0, name.to_owned());
        } else {
            names.push(name.to_owned());
        }
        format!("; tried with the search domains of /etc/resolv.conf as {}", names.join(", "))
    }

    async fn ips(&self, name: &str) -> Result<Vec<IpAddr>, Miss> {
        match self.inner.lookup_ip(name).await {
            Ok(answer) => {
                let mut ips: Vec<IpAddr> = answer.iter().collect();
                ips.sort();
                ips.dedup();
                if ips.is_empty() {
                    return Err(Miss::NoRecords);
                }
                Ok(ips)
            }
            Err(e) => Err(Miss::of(&e)),
        }
    }

    async fn srv(&self, name: &str) -> Result<Vec<(String, u16)>, Miss> {
        match self.inner.srv_lookup(name).await {
            Ok(answer) => {
                let records: Vec<(String, u16)> = answer.iter().map(|srv| (srv.target().to_utf8(), srv.port())).collect();
                if records.is_empty() {
                    return Err(Miss::NoRecords);
                }
                Ok(records)
            }
            Err(e) => Err(Miss::of(&e)),
        }
    }

    /// The targets of `replicas`, with a note when some SRV host was left
    /// out; or why there are none.
    async fn resolve(&self, replicas: &Replicas) -> Result<(Vec<Endpoint>, Option<String>), Unresolved> {
        let source = replicas.to_string();
        let endpoint = |ip: IpAddr, port: u16| Endpoint {
            target: Target::Http { host: ip.to_string(), port, prefix: String::new() },
            source: source.clone(),
            from_dir: false,
        };
        let clock = Instant::now();
        match replicas {
            Replicas::Dns { name, port } => match self.ips(name).await {
                Ok(ips) => Ok((ips.into_iter().map(|ip| endpoint(ip, *port)).collect(), None)),
                Err(Miss::NoRecords) => {
                    // The other form of --replicas may be the right one.
                    let other = match self.srv(name).await {
                        Ok(records) => format!(
                            "; it has SRV records ({}): give --replicas srv:{name}",
                            list(records.iter().map(|(h, p)| format!("{}:{p}", h.trim_end_matches('.'))))
                        ),
                        Err(_) => format!(
                            ", nor SRV records: check that the Service's selector matches pods and that they are \
                             ready (kubectl get endpointslices -l kubernetes.io/service-name=SERVICE -n NAMESPACE), \
                             or set publishNotReadyAddresses: true{}",
                            self.tried_as(name)
                        ),
                    };
                    let mut u = self.unresolved(name, Miss::NoRecords, clock.elapsed(), false);
                    u.message.push_str(&other);
                    Err(u)
                }
                Err(miss) => Err(self.unresolved(name, miss, clock.elapsed(), false)),
            },
            Replicas::Srv { name } => {
                let records = match self.srv(name).await {
                    Ok(records) => records,
                    Err(Miss::NoRecords) => {
                        let other = match self.ips(name).await {
                            Ok(ips) => format!(
                                "; it has A/AAAA records ({}): give --replicas dns:{name}:PORT",
                                list(ips.iter().map(IpAddr::to_string))
                            ),
                            Err(_) => format!(
                                ", nor A or AAAA records: the SRV records of a Service's port are named \
                                 _PORT-NAME._tcp.SERVICE.NAMESPACE.svc.cluster.local; check the port's name and that \
                                 the Service's selector matches ready pods{}",
                                self.tried_as(name)
                            ),
                        };
                        let mut u = self.unresolved(name, Miss::NoRecords, clock.elapsed(), true);
                        u.message.push_str(&other);
                        return Err(u);
                    }
                    Err(Miss::NxDomain) => {
                        // `_port._tcp.SERVICE`: whether SERVICE exists says
                        // whether the port's name or the Service is wrong.
                        let labels: Vec<&str> = name.splitn(3, '.').collect();
                        if let [port, "_tcp" | "_udp", service] = labels[..] {
                            if port.starts_with('_') && self.ips(service).await.is_ok() {
                                return Err(Unresolved {
                                    state: SourceState::NxDomain,
                                    message: format!(
                                        "{name} does not exist (NXDOMAIN from {}), but {service} does: the Service \
                                         has no port named {}; check its ports[].name",
                                        self.server(),
                                        &port[1..]
                                    ),
                                });
                            }
                        }
                        return Err(self.unresolved(name, Miss::NxDomain, clock.elapsed(), true));
                    }
                    Err(miss) => return Err(self.unresolved(name, miss, clock.elapsed(), true)),
                };
                let mut out = Vec::new();
                let mut left_out = Vec::new();
                for (host, port) in &records {
                    if *port == 0 {
                        continue;
                    }
                    let host_clock = Instant::now();
                    match self.ips(host).await {
                        Ok(ips) => out.extend(ips.into_iter().map(|ip| endpoint(ip, *port))),
                        Err(Miss::NxDomain) => left_out.push(format!("{} does not exist", host.trim_end_matches('.'))),
                        Err(Miss::NoRecords) => {
                            left_out.push(format!("{} has no A or AAAA records", host.trim_end_matches('.')))
                        }
                        Err(miss) => {
                            let mut u = self.unresolved(host, miss, host_clock.elapsed(), false);
                            u.message = format!("the SRV records of {name} name {host}, and: {}", u.message);
                            return Err(u);
                        }
                    }
                }
                out.sort_by_key(|e| e.address());
                out.dedup();
                let note = (!left_out.is_empty()).then(|| {
                    format!(
                        "the SRV records of {name} name hosts without an address, left out: {} ({})",
                        left_out.join(", "),
                        self.server()
                    )
                });
                if out.is_empty() {
                    return Err(Unresolved {
                        state: SourceState::NoRecords,
                        message: note.unwrap_or_else(|| format!("the SRV records of {name} all have port 0")),
                    });
                }
                Ok((out, note))
            }
        }
    }

    /// The message of a lookup of `name` that missed; `srv`: a SRV name.
    fn unresolved(&self, name: &str, miss: Miss, took: Duration, srv: bool) -> Unresolved {
        let server = self.server();
        let check_server = if self.given {
            "check that --dns-server is the address of a running DNS server, over UDP and TCP".to_owned()
        } else {
            "check the nameserver lines of /etc/resolv.conf (in a pod: the cluster DNS, e.g. kube-dns in \
             kube-system), or give --dns-server IP:PORT"
                .to_owned()
        };
        let check_name = if srv {
            "check the name: the SRV records of a Service's port are _PORT-NAME._tcp.SERVICE.NAMESPACE.svc.cluster.local \
             (a port named coverage: _coverage._tcp...), the Service and namespace spelled as kubectl get service -A \
             shows them"
        } else {
            "check the Service's name and namespace (SERVICE.NAMESPACE.svc.cluster.local, as kubectl get service -A \
             shows them), that it is headless (clusterIP: None) and that its selector matches ready pods (cluster DNS \
             may not know a headless Service without any)"
        };
        let (state, message) = match miss {
            Miss::NoAnswer(why) => (
                SourceState::NoAnswer,
                format!(
                    "no answer from {server} for {name} after {} ({why}; {ATTEMPTS} tries of {}): {check_server}",
                    seconds(took),
                    seconds(TIMEOUT)
                ),
            ),
            Miss::Refused => (
                SourceState::Refused,
                format!(
                    "{server} refused to resolve {name} (REFUSED: it does not serve that name and forwards it \
                     nowhere): {check_name}, and that {} is the cluster's DNS server",
                    if self.given { "--dns-server" } else { "/etc/resolv.conf's nameserver" }
                ),
            ),
            Miss::NxDomain => (
                SourceState::NxDomain,
                format!("{name} does not exist (NXDOMAIN from {server}{}): {check_name}", self.tried_as(name)),
            ),
            // What else the name has is the caller's to add.
            Miss::NoRecords => (
                SourceState::NoRecords,
                format!("{name} exists but has no {} records ({server})", if srv { "SRV" } else { "A or AAAA" }),
            ),
            Miss::Failed(why) => (
                SourceState::Failed,
                format!("{server} could not resolve {name}: {why}; {check_server}"),
            ),
        };
        Unresolved { state, message }
    }
}

/// "0.5 s", "10 s".
fn seconds(d: Duration) -> String {
    let text = format!("{:.1}", d.as_secs_f64());
    format!("{} s", text.strip_suffix(".0").unwrap_or(&text))
}

/// At most a few items, then how many more.
fn list(items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.collect();
    let mut text = items.iter().take(4).cloned().collect::<Vec<_>>().join(", ");
    if items.len() > 4 {
        text.push_str(&format!(" and {} more", items.len() - 4));
    }
    text
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
    fn resolution_errors_are_told_apart() {
        use hickory_resolver::proto::op::{Query, ResponseCode};
        use hickory_resolver::proto::{ProtoError, ProtoErrorKind};
        let answered = |response_code| {
            hickory_resolver::ResolveError::from(ProtoError::from(ProtoErrorKind::NoRecordsFound {
                query: Box::new(Query::default()),
                soa: None,
                ns: None,
                negative_ttl: None,
                response_code,
                trusted: true,
                authorities: None,
            }))
        };
        assert_eq!(Miss::of(&answered(ResponseCode::NXDomain)), Miss::NxDomain);
        assert_eq!(Miss::of(&answered(ResponseCode::NoError)), Miss::NoRecords);
        assert_eq!(Miss::of(&answered(ResponseCode::Refused)), Miss::Refused);
        assert_eq!(Miss::of(&answered(ResponseCode::ServFail)), Miss::Failed("it answered Server Failure (rcode 2)".into()));
        let timeout = hickory_resolver::ResolveError::from(ProtoError::from(ProtoErrorKind::Timeout));
        assert_eq!(Miss::of(&timeout), Miss::NoAnswer("timed out".into()));
        assert!(SourceState::NoAnswer.is_failure() && !SourceState::NoAnswer.is_empty_answer());
        assert!(SourceState::NxDomain.is_empty_answer() && !SourceState::NxDomain.is_failure());
    }

    #[tokio::test]
    async fn short_names_say_which_search_domains_were_tried() {
        let mut r = Resolver::new(Some("127.0.0.1:53".parse().unwrap())).unwrap();
        // --dns-server: names are asked as given.
        assert_eq!(r.tried_as("cov"), "");
        assert_eq!(r.server(), "--dns-server 127.0.0.1:53");
        // /etc/resolv.conf, as in a pod of namespace ci.
        r.given = false;
        r.search = vec!["ci.svc.cluster.local".into(), "svc.cluster.local".into()];
        r.ndots = 5;
        assert_eq!(
            r.tried_as("cov.ci"),
            "; tried with the search domains of /etc/resolv.conf as cov.ci.ci.svc.cluster.local, \
             cov.ci.svc.cluster.local, cov.ci"
        );
        assert_eq!(r.tried_as("cov.ci.svc.cluster.local."), "");
        r.ndots = 1;
        assert_eq!(
            r.tried_as("cov.ci"),
            "; tried with the search domains of /etc/resolv.conf as cov.ci, cov.ci.ci.svc.cluster.local, \
             cov.ci.svc.cluster.local"
        );
        assert_eq!(r.server(), "the DNS server 127.0.0.1:53 of /etc/resolv.conf");
        assert_eq!(seconds(Duration::from_millis(500)), "0.5 s");
        assert_eq!(seconds(Duration::from_secs(10)), "10 s");
        assert_eq!(list((1..=6).map(|i| i.to_string())), "1, 2, 3, 4 and 2 more");
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
