//! The in-process agent: a program's live coverage over a Unix socket and
//! HTTP, and reports written to disk periodically, at exit, and on SIGTERM.
//!
//! [`start`] is the one line a coverage build adds to `main`. It reads the
//! `LIVECOV_*` environment (see [`Config`]) and does nothing when it is not
//! set. The agent keeps to two threads of its own: the HTTP server (a
//! current-thread tokio runtime) and the flush thread (periodic reports and
//! the final report on a signal). It never panics into the program: every
//! failure is a message on stderr or an error response.

mod config;
mod engine;
pub(crate) mod modules;
mod process;
pub mod server;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use regex::Regex;

pub use config::{Config, DEFAULT_IGNORE};
use engine::{Engine, ReportOptions};
use server::{ApiError, Body, CoverageQuery, Format, Limits, Listen, Server, Service};

/// The running agent of this process (a forked child gets its own).
static AGENT: AtomicPtr<Agent> = AtomicPtr::new(std::ptr::null_mut());
/// Process-wide hooks (signals, atexit, atfork) are installed once.
static HOOKS: AtomicBool = AtomicBool::new(false);

/// One instance: this process's agent.
pub struct Agent {
    config: Config,
    instance: String,
    started: SystemTime,
    clock: Instant,
    ignore: Vec<Regex>,
    engine: Mutex<Engine>,
    server: Mutex<Option<Server>>,
    /// Set once the final report is written: later ones would be stale.
    finished: AtomicBool,
}

/// Starts the agent as the environment says (`LIVECOV_DIR`,
/// `LIVECOV_LISTEN`, ...). Does nothing when neither is set, and nothing the
/// second time. Never panics: a bad configuration is reported on stderr and
/// the program runs on without the agent.
///
/// The first line of `main`:
///
/// ```no_run
/// livecov::start();
/// ```
pub fn start() -> Option<&'static Agent> {
    if let Some(agent) = current() {
        return Some(agent);
    }
    match Config::from_env() {
        Ok(None) => None,
        Ok(Some(config)) => start_with(config)
            .map_err(|e| eprintln!("livecov: not started: {e}"))
            .ok(),
        Err(e) => {
            eprintln!("livecov: not started: {e}");
            None
        }
    }
}

/// Starts the agent with a configuration made in code. Returns the running
/// agent if one is already running.
pub fn start_with(config: Config) -> Result<&'static Agent, String> {
    if let Some(agent) = current() {
        return Ok(agent);
    }
    std::panic::catch_unwind(|| launch(config))
        .unwrap_or_else(|_| Err("internal error while starting (please report it)".into()))
}

/// The running agent, if any.
pub fn current() -> Option<&'static Agent> {
    let agent = AGENT.load(Ordering::Acquire);
    // Safety: agents are leaked, never freed.
    (!agent.is_null()).then(|| unsafe { &*agent })
}

fn launch(config: Config) -> Result<&'static Agent, String> {
    if let Some(dir) = &config.dir {
        for sub in ["sockets", "reports"] {
            std::fs::create_dir_all(dir.join(sub))
                .map_err(|e| format!("cannot create {}: {e}", dir.join(sub).display()))?;
        }
    }
    let agent: &'static Agent = Box::leak(Box::new(Agent {
        ignore: vec![config.ignore.clone(), config::agent_sources()],
        config,
        instance: new_instance_id(),
        started: SystemTime::now(),
        clock: Instant::now(),
        engine: Mutex::new(Engine::default()),
        server: Mutex::new(None),
        finished: AtomicBool::new(false),
    }));
    if AGENT
        .compare_exchange(std::ptr::null_mut(), agent as *const Agent as *mut Agent, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        // Another thread started one meanwhile: use that.
        return current().ok_or_else(|| "agent disappeared".to_owned());
    }
    agent.run()?;
    if !HOOKS.swap(true, Ordering::AcqRel) {
        process::install_signal_handlers();
        process::install_exit_and_fork_hooks(at_exit, after_fork_in_child);
    }
    Ok(agent)
}

/// `rust-<pid>-<16 hex digits>`: unique for the process's lifetime, and new
/// in a forked child.
fn new_instance_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    format!("rust-{}-{:016x}", std::process::id(), h.finish())
}

impl Agent {
    /// Starts the server and the flush thread, and writes the metadata.
    fn run(&'static self) -> Result<(), String> {
        let listen = Listen {
            unix: self.config.dir.as_ref().map(|d| (self.socket_path(d), self.config.socket_mode)),
            tcp: self.config.listen,
            token: self.config.token.clone(),
        };
        let server = Server::start(Arc::new(Handle(self)), listen, Limits::default())
            .map_err(|e| format!("cannot listen: {e}"))?;
        *lock(&self.server) = Some(server);
        self.write_metadata("running");

        let wake = process::WakePipe::new().map_err(|e| format!("cannot create a pipe: {e}"))?;
        std::thread::Builder::new()
            .name("livecov-flush".into())
            .spawn(move || loop {
                match wake.wait(self.config.flush_every) {
                    Some(signal) => {
                        self.finish("exited");
                        process::reraise(signal);
                    }
                    None if self.config.flush_every.is_some() && !self.finished.load(Ordering::Acquire) => {
                        self.write_report();
                    }
                    None => {}
                }
            })
            .map_err(|e| format!("cannot start the flush thread: {e}"))?;
        Ok(())
    }

    /// The instance id, as in `Livecov-Instance`.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The TCP address the API listens on, when `LIVECOV_LISTEN` is set.
    pub fn tcp_addr(&self) -> Option<std::net::SocketAddr> {
        lock(&self.server).as_ref().and_then(Server::tcp_addr)
    }

    fn socket_path(&self, dir: &std::path::Path) -> PathBuf {
        dir.join("sockets").join(format!("{}.sock", self.instance))
    }

    fn report_path(&self, extension: &str) -> Option<PathBuf> {
        let dir = self.config.dir.as_ref()?;
        Some(dir.join("reports").join(format!("{}.{extension}", self.instance)))
    }

    /// The LCOV report of the counts since start or the last reset.
    pub fn lcov(&self, test_name: Option<&str>, reset: bool) -> crate::Result<String> {
        let options = ReportOptions {
            ignore: &self.ignore,
            demangle: self.config.demangle,
            test_name,
            path_map: &self.config.path_map,
        };
        lock(&self.engine).lcov(&options, reset)
    }

    /// Writes the report to `reports/<instance>.lcov` (atomically).
    pub fn write_report(&self) {
        let Some(path) = self.report_path("lcov") else { return };
        let result = std::panic::catch_unwind(|| self.lcov(None, false));
        match result {
            Ok(Ok(report)) => {
                if let Err(e) = write_atomically(&path, report.as_bytes()) {
                    eprintln!("livecov: cannot write {}: {e}", path.display());
                }
            }
            Ok(Err(e)) => eprintln!("livecov: no report: {e}"),
            Err(_) => eprintln!("livecov: internal error while writing the report (please report it)"),
        }
    }

    /// The final report: once, then the metadata says the process ended.
    fn finish(&self, state: &str) {
        if self.finished.swap(true, Ordering::AcqRel) {
            return;
        }
        self.write_report();
        self.write_metadata(state);
        if let Some(dir) = &self.config.dir {
            let _ = std::fs::remove_file(self.socket_path(dir));
        }
    }

    fn write_metadata(&self, state: &str) {
        let Some(path) = self.report_path("json") else { return };
        let json = self.metadata(state);
        if let Err(e) = write_atomically(&path, json.as_bytes()) {
            eprintln!("livecov: cannot write {}: {e}", path.display());
        }
    }

    fn metadata(&self, state: &str) -> String {
        let engine = lock(&self.engine);
        let modules: Vec<String> = engine.modules().iter().map(|m| m.id.path.display().to_string()).collect();
        let build_id = engine.modules().first().and_then(|m| m.build_id.as_deref()).map(hex);
        drop(engine);
        let program = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default();
        serde_json::json!({
            "instance": self.instance,
            "pid": std::process::id(),
            // Safety: getppid cannot fail.
            "ppid": unsafe { libc::getppid() },
            "runtime": "rust",
            "livecov_version": env!("CARGO_PKG_VERSION"),
            "program": program,
            "build_id": build_id,
            "modules": modules,
            "tcp": self.tcp_addr().map(|a| a.to_string()),
            "start_time": self.started.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            "uptime_secs": self.clock.elapsed().as_secs_f64(),
            "state": state,
        })
        .to_string()
    }
}

/// The API, served by `server`.
struct Handle(&'static Agent);

impl Service for Handle {
    fn coverage(&self, query: &CoverageQuery) -> Result<Body, ApiError> {
        let agent = self.0;
        let internal = |e: crate::Error| ApiError { status: 500, message: e.to_string() };
        match query.format {
            Format::Lcov => Ok(Body {
                content_type: "text/plain; charset=utf-8",
                bytes: agent.lcov(query.test.as_deref(), query.reset).map_err(internal)?.into_bytes(),
            }),
            Format::Profraw => Ok(Body {
                content_type: "application/octet-stream",
                bytes: lock(&agent.engine).profraw(query.reset).map_err(internal)?,
            }),
            Format::Json => {
                let lcov = agent.lcov(query.test.as_deref(), query.reset).map_err(internal)?;
                Ok(Body { content_type: "application/json", bytes: summary_json(&lcov).into_bytes() })
            }
        }
    }

    fn reset(&self) -> Result<(), ApiError> {
        lock(&self.0.engine).reset().map_err(|e| ApiError { status: 500, message: e.to_string() })
    }

    fn health(&self) -> String {
        self.0.metadata(if self.0.finished.load(Ordering::Acquire) { "exited" } else { "running" })
    }

    fn instance(&self) -> String {
        self.0.instance.clone()
    }
}

/// Per-file and total line, function and branch counts of an LCOV report.
fn summary_json(lcov: &str) -> String {
    let mut files = Vec::new();
    let mut totals = [0u64; 6];
    let mut current: Option<(String, [u64; 6])> = None;
    for line in lcov.lines() {
        if let Some(path) = line.strip_prefix("SF:") {
            current = Some((path.to_owned(), [0; 6]));
            continue;
        }
        let Some((_, counts)) = current.as_mut() else { continue };
        for (i, tag) in ["LF:", "LH:", "FNF:", "FNH:", "BRF:", "BRH:"].iter().enumerate() {
            if let Some(v) = line.strip_prefix(tag).and_then(|v| v.parse::<u64>().ok()) {
                counts[i] = v;
            }
        }
        if line == "end_of_record" {
            if let Some((path, c)) = current.take() {
                totals.iter_mut().zip(c).for_each(|(t, v)| *t += v);
                files.push(serde_json::json!({
                    "file": path, "lines": c[0], "lines_hit": c[1], "functions": c[2],
                    "functions_hit": c[3], "branches": c[4], "branches_hit": c[5],
                }));
            }
        }
    }
    serde_json::json!({
        "files": files,
        "totals": {
            "lines": totals[0], "lines_hit": totals[1], "functions": totals[2],
            "functions_hit": totals[3], "branches": totals[4], "branches_hit": totals[5],
        },
    })
    .to_string()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A poisoned lock only means an earlier request panicked (and was turned
/// into an error): the data is still usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Writes to a temporary name beside `path`, then renames: readers never
/// see a torn file.
fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

extern "C" fn at_exit() {
    if let Some(agent) = current() {
        let _ = std::panic::catch_unwind(|| agent.finish("exited"));
    }
}

/// In a forked child: the counters are the parent's, so zero them (parent
/// and child then sum to what ran); the agent's threads did not survive the
/// fork, so start a new instance. The parent's agent is left as it is
/// (leaked): its locks may have been held by threads that no longer exist.
unsafe extern "C" fn after_fork_in_child() {
    // Safety: we are the only thread of a fresh child.
    unsafe { modules::zero_all_known() };
    let Some(parent) = current() else { return };
    let config = parent.config.clone();
    AGENT.store(std::ptr::null_mut(), Ordering::Release);
    if let Err(e) = std::panic::catch_unwind(|| launch(config)).unwrap_or_else(|_| Err("internal error".into())) {
        eprintln!("livecov: not started in forked child {}: {e}", std::process::id());
    }
}
