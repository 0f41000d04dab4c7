//! The in-process agent: a program's live coverage over a Unix socket and
//! HTTP, and reports written to disk periodically, at exit, and on SIGTERM.
//!
//! [`start`] is the one line a coverage build adds to `main`. It reads the
//! `LIVECOV_*` environment (see [`Config`]) and does nothing when it is not
//! set. The agent keeps to two threads of its own: the HTTP server (a
//! current-thread tokio runtime) and the flush thread (periodic reports and
//! the final report on a signal). It never panics into the program: every
//! failure is a message on stderr or an error response.

mod children;
mod config;
pub mod connection;
pub mod descriptors;
mod engine;
pub(crate) mod modules;
mod process;
mod reports;
pub mod server;
pub mod stderr;
mod threads;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use regex_lite::Regex;

pub use config::{Config, DEFAULT_IGNORE};
use crate::fleet::ReportSettings;
use engine::{Engine, ReportOptions};
use stderr::say;
use server::{ApiError, Body, CoverageQuery, Format, Limits, Listen, Server, Service};

/// The running agent of this process (a forked child gets its own).
static AGENT: AtomicPtr<Agent> = AtomicPtr::new(std::ptr::null_mut());
/// Process-wide hooks (atexit, atfork) are installed once.
static HOOKS: AtomicBool = AtomicBool::new(false);
/// The engine of a stopped agent, rebased at the stop: the next agent of
/// this process takes it, so that its counts start at the stop.
static PARKED: Mutex<Option<Engine>> = Mutex::new(None);

/// One instance: this process's agent.
pub struct Agent {
    config: Config,
    instance: String,
    /// The process it runs in: a `vfork` child shares its memory, not its
    /// exit.
    pid: u32,
    started: SystemTime,
    clock: Instant,
    /// The configured ignore pattern and the agent's own sources, compiled
    /// at the first dump.
    ignore: std::sync::OnceLock<Vec<Regex>>,
    /// Its metadata and report in `LIVECOV_DIR/reports/`.
    files: Option<reports::InstanceFiles>,
    engine: Mutex<Engine>,
    server: Mutex<Option<Server>>,
    /// Set once the final report is written: later ones would be stale.
    finished: AtomicBool,
    /// The flush thread, joined by [`stop`].
    flush_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Set once the agent listens and wrote its metadata (at once for a
    /// start in the foreground; by the flush thread for one in the
    /// background): the final report waits for it.
    ready: (Mutex<bool>, std::sync::Condvar),
    /// When the engine last worked (milliseconds since `clock`, plus one),
    /// or 0 once the agent has rested since (see `Config::at_rest`).
    worked_at: AtomicU64,
    /// Work whose answer the server sends left memory to give back once it
    /// is sent (see [`Agent::engine_to_answer`]).
    release_due: AtomicBool,
    /// The build mapping id last written beside the counters, or tried:
    /// a process that cannot create the file does not compute the mapping
    /// again at each report (see [`Agent::mapping_beside`]).
    mapping_tried: Mutex<Option<String>>,
    /// Set at the program's first fork after one of its children reported
    /// (see [`Agent::prepare_for_children`]).
    children_prepared: AtomicBool,
}

/// How long the engine is left without work before `Config::at_rest`:
/// dumps that follow each other closer than this (a test suite's, a
/// collector's) keep what makes them fast; a service dumped now and then
/// holds no more than it needs between dumps. The engine's own state
/// stays: dropping its records in parts and decoded functions at rest gave
/// back 0.3-0.4 MiB on redis (their small blocks stay in the agent thread's
/// malloc arena as free holes, which only `malloc_trim`, taking the
/// program's arenas' locks, returns), and the next dump took 40-68 ms
/// against 3, computing every record it touched whole.
pub const REST_AFTER: Duration = Duration::from_secs(1);

/// The byte that tells the flush thread the engine worked (not a signal
/// number, nor 0, which asks it to end).
const WORKED: u8 = 255;
/// The byte that asks the flush thread for the final report of a thread in
/// `_exit` (below 64, as signal numbers, but not one the agent handles).
const EXITING: u8 = 61;
/// The byte that tells the flush thread the program forked for the first
/// time since one of its children reported (see
/// [`Agent::prepare_for_children`]): below 64 too, and taken
/// after `EXITING` (see `process::take_pending`).
const FORKED: u8 = 62;

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
        Ok(Some(config)) => {
            end_replaced_instances(&config);
            start_with(config)
                .map_err(|e| say(format_args!("not started: {e}")))
                .ok()
        }
        Err(e) => {
            say(format_args!("not started: {e}"));
            None
        }
    }
}

/// Ends the instances of this process that an earlier program of it left
/// running in `config`'s directory: a forked child that ran this program
/// (`exec`) lost its agent and left its socket (see
/// `reports::end_replaced_instances`). [`start`] does it; the C shim, for
/// every program it is preloaded into.
pub fn end_replaced_instances(config: &Config) {
    // Not those of an agent of this program (a second copy of livecov in
    // it): the claim of an earlier program was closed at its `exec`.
    if process::agent_runs_here() {
        return;
    }
    if let Some(dir) = &config.dir {
        reports::end_replaced_instances(dir);
    }
}

/// Starts the agent with a configuration made in code. Returns the running
/// agent if one is already running.
pub fn start_with(config: Config) -> Result<&'static Agent, String> {
    if let Some(agent) = current() {
        return Ok(agent);
    }
    // Started at the top of `main`, before the program made a thread: the
    // server's runtime is built here with the numbers programs use held,
    // as the C shim's constructor does (see `server::prebuild_runtime`).
    // With another thread running, that thread's descriptors would land
    // past them too, and a `dup2` of its onto a held one would be undone.
    if descriptors::only_thread() {
        server::prebuild_runtime();
    }
    std::panic::catch_unwind(|| launch(config, false))
        .unwrap_or_else(|_| Err("internal error while starting (please report it)".into()))
}

/// Starts the agent without waiting for it to listen, for a start that
/// must cost the program next to nothing (the C shim's ELF constructor):
/// the calling thread claims the process, installs the hooks and spawns
/// the agent's thread; that thread makes the directories, binds the socket
/// and writes the metadata, and says on stderr when it cannot (the agent
/// then withdraws). Returns the running agent if one is already running.
pub fn start_in_background(config: Config) -> Result<&'static Agent, String> {
    if let Some(agent) = current() {
        return Ok(agent);
    }
    std::panic::catch_unwind(|| launch(config, true))
        .unwrap_or_else(|_| Err("internal error while starting (please report it)".into()))
}

/// Stops the running agent: it stops serving, writes its final report
/// (state `exited`, counts since its start or last reset), removes its
/// socket and restores SIGTERM/SIGINT to their default action if it had
/// installed its handler. A later start makes a new instance whose counts
/// begin at this stop (the instances sum to what ran). Returns false when
/// no agent was running. Waits for in-flight requests (at most 2 s).
pub fn stop() -> bool {
    let Some(agent) = current() else { return false };
    let ptr = agent as *const Agent as *mut Agent;
    if AGENT.compare_exchange(ptr, std::ptr::null_mut(), Ordering::AcqRel, Ordering::Acquire).is_err() {
        return false;
    }
    let result = std::panic::catch_unwind(|| agent.shutdown());
    if result.is_err() {
        say(format_args!("internal error while stopping (please report it)"));
    }
    true
}

/// The paths of the loaded modules that carry LLVM coverage counters (the
/// executable first), found from their section headers only: cheap enough
/// to call before starting, e.g. to leave a program that is not
/// instrumented alone.
pub fn instrumented_modules() -> Vec<PathBuf> {
    let ids = modules::loaded_modules();
    ids.iter().enumerate().filter(|(i, id)| modules::has_counters(id, *i == 0)).map(|(_, id)| id.path.clone()).collect()
}

/// Whether a loaded module carries LLVM coverage counters: as
/// [`instrumented_modules`], but stops at the first (usually the
/// executable, so one file's section headers are read).
pub fn has_instrumented_module() -> bool {
    modules::loaded_modules().iter().enumerate().any(|(i, id)| modules::has_counters(id, i == 0))
}

/// The running agent, if any.
pub fn current() -> Option<&'static Agent> {
    let agent = AGENT.load(Ordering::Acquire);
    // Safety: agents are leaked, never freed.
    (!agent.is_null()).then(|| unsafe { &*agent })
}

/// The final report of a process about to end with `_exit`, which runs no
/// `atexit` hook: written by the flush thread while the calling thread
/// waits (10 s at most), as on SIGTERM. Daemons end so the processes they
/// start as (after each fork of their start, the parent `_exit`s), and so
/// do signal handlers (`_exit` is safe in one), forked workers and the
/// children of pre-fork servers. The C shim calls it in its `_exit`; a
/// Rust program that calls `libc::_exit` may call it first.
///
/// Does nothing in a process that is not the agent's (a `vfork` child,
/// which shares the agent's memory), on the agent's own threads, or once
/// the final report is written.
pub fn finish_before_exit() {
    let Some(agent) = current() else { return };
    // Safety: getpid cannot fail.
    let own = agent.pid == unsafe { libc::getpid() } as u32;
    if own && !descriptors::on_agent_thread() && !agent.finished.load(Ordering::Acquire) {
        process::wait_for_final_report(EXITING);
    }
}

fn launch(config: Config, background: bool) -> Result<&'static Agent, String> {
    if !background {
        make_dirs(&config)?;
    }
    // One agent per process, even when two copies of livecov are in it
    // (a Rust program with the agent, run with the C shim preloaded).
    process::claim_process()?;
    let parked = lock(&PARKED).take();
    let instance = new_instance_id(config.runtime);
    let agent: &'static Agent = Box::leak(Box::new(Agent {
        ignore: std::sync::OnceLock::new(),
        files: config.dir.as_deref().map(|dir| reports::InstanceFiles::new(dir, &instance)),
        instance,
        pid: std::process::id(),
        config,
        started: SystemTime::now(),
        clock: Instant::now(),
        engine: Mutex::new(parked.unwrap_or_default()),
        server: Mutex::new(None),
        finished: AtomicBool::new(false),
        flush_thread: Mutex::new(None),
        ready: (Mutex::new(false), std::sync::Condvar::new()),
        worked_at: AtomicU64::new(0),
        release_due: AtomicBool::new(false),
        children_prepared: AtomicBool::new(false),
        mapping_tried: Mutex::new(None),
    }));
    if AGENT
        .compare_exchange(std::ptr::null_mut(), agent as *const Agent as *mut Agent, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        // Another thread started one meanwhile: use that.
        *lock(&PARKED) = Some(std::mem::take(&mut *lock(&agent.engine)));
        return current().ok_or_else(|| "agent disappeared".to_owned());
    }
    let wake = process::Wakeup::new();
    // From here a SIGTERM waits for the flush thread.
    process::install_signal_handlers();
    if !HOOKS.swap(true, Ordering::AcqRel) {
        process::install_exit_and_fork_hooks(at_exit, before_fork, after_fork_in_parent, after_fork_in_child);
    }
    if !background {
        if let Err(e) = agent.run() {
            agent.withdraw();
            process::close_wakeup();
            return Err(e);
        }
        agent.set_ready();
    }
    if background {
        // Until it is done (`set_ready`), the program's closes wait.
        descriptors::starting(true);
    }
    if let Err(e) = agent.spawn_flush_thread(wake, background) {
        agent.withdraw();
        return Err(e);
    }
    Ok(agent)
}

fn make_dirs(config: &Config) -> Result<(), String> {
    if let Some(dir) = &config.dir {
        for sub in ["sockets", "reports"] {
            std::fs::create_dir_all(dir.join(sub))
                .map_err(|e| format!("cannot create {}: {e}", dir.join(sub).display()))?;
        }
    }
    Ok(())
}

/// `<runtime>-<pid>-<16 hex digits>` (e.g. `rust-4711-9f2c3a1b0d4e5f60`):
/// unique for the process's lifetime, and new in a forked child.
fn new_instance_id(runtime: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    format!("{runtime}-{}-{:016x}", std::process::id(), h.finish())
}

impl Agent {
    /// Starts the server and writes the metadata.
    fn run(&'static self) -> Result<(), String> {
        let mut listen = Listen {
            unix: self.config.dir.as_ref().map(|d| (self.socket_path(d), self.config.socket_mode)),
            tcp: self.config.listen,
            token: self.config.token.clone(),
        };
        if let Some(refusal) = self.config.tcp_refusal() {
            if listen.unix.is_none() {
                return Err(refusal);
            }
            say(format_args!("{refusal} (the socket in LIVECOV_DIR serves)"));
            listen.tcp = None;
        }
        // Without a socket or TCP address, the program dumps through the
        // API only (the C shim's `livecov_start("")`).
        if listen.unix.is_some() || listen.tcp.is_some() {
            let server = Server::start(Arc::new(Handle(self)), listen, Limits::default())
                .map_err(|e| format!("cannot listen: {e}"))?;
            *lock(&self.server) = Some(server);
        }
        self.write_metadata("running");
        if let Some(files) = &self.files {
            files.prepare_if_privileged();
        }
        modules::keep_module_files();
        Ok(())
    }

    /// The flush thread: periodic reports, the final report on a signal.
    /// Started in the background, it first does what [`Agent::run`] does.
    fn spawn_flush_thread(&'static self, wake: process::Wakeup, background: bool) -> Result<(), String> {
        let thread = threads::spawn("livecov-flush", move || {
            if background {
                let started = make_dirs(&self.config).and_then(|()| self.run());
                if let Err(e) = started {
                    say(format_args!("not started: {e}"));
                    self.withdraw();
                    process::close_wakeup();
                    return;
                }
                self.set_ready();
            }
            // Only now: the server's threads, started above, keep the
            // program's priority (see `threads::lower_priority`).
            threads::lower_priority();
            // What starting ran (the runtime, the socket, the metadata) is
            // given back as a dump's is, once the agent rests: a program
            // may run for long before its first dump, or never have one.
            self.worked();
            let mut next_flush = self.config.flush_every.map(|every| Instant::now() + every);
            loop {
                let until = |at: Instant| at.saturating_duration_since(Instant::now());
                let rest_due = self.rest_due(self.worked_at.load(Ordering::Acquire));
                let timeout = match (next_flush.map(until), rest_due.map(until)) {
                    (Some(flush), Some(rest)) => Some(flush.min(rest)),
                    (flush, rest) => flush.or(rest),
                };
                match wake.wait(timeout) {
                    // `stop` asks the thread to end.
                    Some(0) => {
                        process::close_wakeup();
                        return;
                    }
                    Some(b) if b == i32::from(WORKED) => {}
                    Some(b) if b == i32::from(FORKED) => self.prepare_for_children(),
                    Some(b) if b == i32::from(EXITING) => {
                        self.finish("exited");
                        process::final_report_written();
                    }
                    Some(signal) => {
                        self.finish("exited");
                        process::reraise(signal);
                    }
                    None => {}
                }
                if let (Some(at), Some(every)) = (next_flush, self.config.flush_every) {
                    if Instant::now() >= at {
                        if !self.finished.load(Ordering::Acquire) {
                            self.write_report();
                        }
                        next_flush = Some(Instant::now() + every);
                    }
                }
                self.rest_if_due();
            }
        })
        .map_err(|e| {
            process::close_wakeup();
            format!("cannot start the flush thread: {e}")
        })?;
        *lock(&self.flush_thread) = Some(thread);
        Ok(())
    }

    /// Undoes a start that failed: no longer the current agent, signals
    /// back to their default, nothing listening. A later start may try
    /// again.
    fn withdraw(&'static self) {
        let _ = AGENT.compare_exchange(self as *const Agent as *mut Agent, std::ptr::null_mut(), Ordering::AcqRel, Ordering::Acquire);
        process::restore_signal_handlers();
        if let Some(server) = lock(&self.server).take() {
            server.stop();
        }
        *lock(&PARKED) = Some(std::mem::take(&mut *lock(&self.engine)));
        process::release_process();
        self.finished.store(true, Ordering::Release);
        self.set_ready();
    }

    fn set_ready(&self) {
        descriptors::starting(false);
        *lock(&self.ready.0) = true;
        self.ready.1.notify_all();
    }

    /// Waits (a few seconds at most) for a start in the background to
    /// be done.
    fn wait_ready(&self) {
        let guard = lock(&self.ready.0);
        let _ = self.ready.1.wait_timeout_while(guard, Duration::from_secs(5), |ready| !*ready);
    }

    /// What [`stop`] does once this agent is no longer the current one.
    fn shutdown(&self) {
        process::restore_signal_handlers();
        if process::wake_flush_thread(0) {
            if let Some(thread) = lock(&self.flush_thread).take() {
                let _ = thread.join();
            }
        }
        if let Some(server) = lock(&self.server).take() {
            server.stop();
        }
        self.finish_and_rebase();
        process::release_process();
        *lock(&PARKED) = Some(std::mem::take(&mut *lock(&self.engine)));
    }

    /// The configuration the agent runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// `reports/<instance>.lcov` in the coverage directory, where periodic
    /// and final reports go (`None` without `LIVECOV_DIR`).
    pub fn report_file(&self) -> Option<PathBuf> {
        self.files.as_ref().map(|f| f.report.path().to_owned())
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

    /// The LCOV report of the counts since start or the last reset.
    pub fn lcov(&self, test_name: Option<&str>, reset: bool) -> crate::Result<String> {
        let report = self.report(test_name, reset)?;
        Ok(report.text())
    }

    /// [`Self::lcov`], shared with the agent's own copy (no copy of a
    /// report of megabytes per answer).
    fn report(&self, test_name: Option<&str>, reset: bool) -> crate::Result<server::Chunks> {
        self.report_by(self.engine(), test_name, reset)
    }

    /// [`Self::report`] by `engine` (see [`Self::engine_to_answer`]).
    fn report_by(&self, mut engine: EngineAtWork<'_>, test_name: Option<&str>, reset: bool) -> crate::Result<server::Chunks> {
        let report = engine.lcov(&self.report_options(test_name), reset);
        if report.is_ok() {
            children::note_report();
        }
        report
    }

    fn report_options<'a>(&'a self, test_name: Option<&'a str>) -> ReportOptions<'a> {
        ReportOptions {
            ignore: self.ignore.get_or_init(|| config::ignore_patterns(self.config.ignore.as_ref())),
            demangle: self.config.demangle,
            test_name,
            path_map: &self.config.path_map,
        }
    }

    /// Makes the current counts the zero of later reports (as `POST /reset`).
    pub fn reset(&self) -> crate::Result<()> {
        self.engine().reset()
    }

    /// The engine, for a report, a reset or a snapshot.
    fn engine(&self) -> EngineAtWork<'_> {
        self.at_work(lock(&self.engine), false)
    }

    /// [`Self::engine`] for work whose result the server sends: what a
    /// warm dump leaves to give back is given back once its answer is sent
    /// ([`Self::release_if_due`]). Unmapping and dropping pages ahead of
    /// it took 0.1 ms of a dump's 2.4 on redis under traffic. Other work
    /// gives back as it ends: a first dump reads most of the binary and
    /// cuts megabytes of scratch memory, which would otherwise be resident
    /// beside its answer, for a saving of a few percent of its time.
    fn engine_to_answer(&self) -> EngineAtWork<'_> {
        self.at_work(lock(&self.engine), true)
    }

    /// [`Self::engine_to_answer`], unless another thread has the engine.
    fn try_engine_to_answer(&self) -> Option<EngineAtWork<'_>> {
        Some(self.at_work(try_lock(&self.engine)?, true))
    }

    fn at_work<'a>(&'a self, mut engine: MutexGuard<'a, Engine>, answered: bool) -> EngineAtWork<'a> {
        engine.scratch = self.config.scratch;
        engine.warm = false;
        EngineAtWork { engine, agent: self, answered }
    }

    /// Gives back what the engine's work left and no longer uses
    /// ([`Engine::tidy`]: what a dump decoded, the pages of the files it
    /// read), and (`Config::after_engine_work`) the memory the C agent's
    /// allocator kept for it.
    fn after_work(&self, engine: &mut Engine) {
        engine.tidy();
        if let Some(after) = self.config.after_engine_work {
            after();
        }
    }

    /// [`Self::after_work`] of work whose answer is sent, if not done yet.
    /// When another thread has the engine, its work does it when done.
    fn release_if_due(&self) {
        if self.release_due.swap(false, Ordering::AcqRel) {
            if let Some(mut engine) = try_lock(&self.engine) {
                self.after_work(&mut engine);
            }
        }
    }

    /// The engine has worked: the flush thread is to rest the agent later
    /// (woken to count the time from the first work since it last did).
    fn worked(&self) {
        if self.config.at_rest.is_none() {
            return;
        }
        let now = self.clock.elapsed().as_millis() as u64 + 1;
        if self.worked_at.swap(now, Ordering::AcqRel) == 0 {
            process::wake_flush_thread(WORKED);
        }
    }

    /// When the agent is to rest, if it has worked since it last did
    /// (`worked_at` as read from [`Agent::worked_at`]).
    fn rest_due(&self, worked_at: u64) -> Option<Instant> {
        let at = worked_at.checked_sub(1)?;
        Some(self.clock + Duration::from_millis(at) + REST_AFTER)
    }

    /// Calls `Config::at_rest` once the engine has not worked for
    /// [`REST_AFTER`] (and not again before it works again). A dump longer
    /// than that may be under way: what it gives back is then mapped again
    /// as the dump goes on, as in the next dump.
    fn rest_if_due(&self) {
        let Some(rest) = self.config.at_rest else { return };
        let worked_at = self.worked_at.load(Ordering::Acquire);
        let Some(due) = self.rest_due(worked_at) else { return };
        if Instant::now() >= due
            && self.worked_at.compare_exchange(worked_at, 0, Ordering::AcqRel, Ordering::Acquire).is_ok()
        {
            // An answer that never went out (its client gone) left it due.
            self.release_if_due();
            rest();
        }
    }

    /// Writes the report to `reports/<instance>.lcov` (atomically where
    /// the folder allows it, see `reports.rs`).
    pub fn write_report(&self) {
        let Some(files) = &self.files else { return };
        self.report_or_complain(&files.report, false);
        // After the report: a collector takes counters for an exact merge
        // only when they are at least as new as the report beside them.
        self.counters_or_complain(&files.counters);
    }

    /// The settings a build mapping carries: the agent's report options.
    fn report_settings(&self) -> ReportSettings<'_> {
        ReportSettings {
            ignore: self.ignore.get_or_init(|| config::ignore_patterns(self.config.ignore.as_ref())),
            demangle: self.config.demangle,
            path_map: &self.config.path_map,
        }
    }

    /// Writes `reports/<instance>.counters`: the mapping id, a newline, and
    /// the counters as `?format=counters` answers them.
    fn counters_or_complain(&self, file: &reports::InstanceFile) {
        let counters = std::panic::catch_unwind(|| self.engine().counters(false, &self.report_settings()));
        match counters {
            Ok(Ok((gzip, id))) => {
                let mut bytes = Vec::with_capacity(id.len() + 1 + gzip.len());
                bytes.extend_from_slice(id.as_bytes());
                bytes.push(b'\n');
                bytes.extend_from_slice(&gzip);
                if let Err(e) = file.write(&[&bytes]) {
                    say(format_args!("cannot write {}: {e}", file.path().display()));
                    return;
                }
                self.mapping_beside(file.path(), &id);
            }
            Ok(Err(e)) => say(format_args!("no counters beside the report (an exact merge takes the report): {e}")),
            Err(_) => say(format_args!("internal error while writing the counters (please report it)")),
        }
    }

    /// Writes the build mapping `id` beside the `counters` file, as
    /// `reports/<id>.mapping` (what `?format=mapping` answers), unless a
    /// process of the build did already: a collector then merges exactly
    /// the counters of processes that all exited, which cannot give it.
    /// Once per build and folder (2 MB uncompressed, 20 ms, for redis).
    /// A process that cannot create it (one that gave up root) leaves it
    /// to another: without it, its report joins a merge as LCOV.
    fn mapping_beside(&self, counters: &Path, id: &str) {
        let path = counters.with_file_name(crate::fleet::mapping_file_name(id));
        let mut tried = lock(&self.mapping_tried);
        if tried.as_deref() == Some(id) || path.exists() {
            return;
        }
        *tried = Some(id.to_owned());
        drop(tried);
        let mapping = std::panic::catch_unwind(|| self.engine().mapping(&self.report_settings()));
        // The modules changed since the counters were read: the next
        // report writes it.
        if let Ok(Ok((gzip, mapping_id))) = mapping {
            if mapping_id == id {
                let _ = reports::write_atomically(&path, &[&gzip]);
            }
        }
    }

    /// Writes the report (counts since start or the last reset) to `path`,
    /// atomically: to a temporary name beside it, then renamed.
    pub fn write_report_to(&self, path: &Path) -> crate::Result<()> {
        let report = self.report(None, false)?;
        reports::write_atomically(path, &report.slices())
            .map_err(|source| crate::Error::Io { path: path.display().to_string(), source })
    }

    fn report_or_complain(&self, file: &reports::InstanceFile, reset: bool) {
        match std::panic::catch_unwind(|| self.report(None, reset)) {
            Ok(Ok(report)) => {
                if let Err(e) = file.write(&report.slices()) {
                    say(format_args!("cannot write {}: {e}", file.path().display()));
                }
            }
            Ok(Err(e)) => say(format_args!("no report: {e}")),
            Err(_) => say(format_args!("internal error while writing the report (please report it)")),
        }
    }

    /// At the program's first fork after one of its children reported (see
    /// `children`), on the flush thread (at its low priority): what a
    /// forked child's final report starts from, made once, when no report
    /// made it yet. A child takes the parent's engine
    /// as it is at the fork (see `after_fork_in_child`): with the records
    /// of a report, its own report takes the parent's code it never ran as
    /// it was with every count zero, and with the build mapping's id, its
    /// counters file does not make the mapping again. Without them, every
    /// child of a parent never dumped computed every file, and made the
    /// mapping, at its exit (redis's `BGSAVE` children: 65-95 ms and 7-9 ms
    /// of CPU each, against 34-52 ms and under 1 ms).
    fn prepare_for_children(&self) {
        if self.finished.load(Ordering::Acquire) {
            return;
        }
        let prepared = std::panic::catch_unwind(|| {
            let mut engine = self.engine();
            if !engine.has_records() {
                engine.lcov(&self.report_options(None), false)?;
            }
            engine.mapping_id(&self.report_settings()).map(drop)
        });
        match prepared {
            Ok(Ok(())) => {}
            // The children then make their own.
            Ok(Err(e)) => say(format_args!("nothing prepared for the program's children: {e}")),
            Err(_) => say(format_args!("internal error while preparing for the program's children (please report it)")),
        }
    }

    /// The final report: once, then the metadata says the process ended.
    fn finish(&self, state: &str) {
        self.wait_ready();
        if self.finished.swap(true, Ordering::AcqRel) {
            return;
        }
        self.write_report();
        self.end(state);
    }

    /// The final report of a stopped agent, taken with a reset so that the
    /// next agent's counts begin here.
    fn finish_and_rebase(&self) {
        if self.finished.swap(true, Ordering::AcqRel) {
            let _ = std::panic::catch_unwind(|| lock(&self.engine).reset());
            return;
        }
        match &self.files {
            Some(files) => self.report_or_complain(&files.report, true),
            None => {
                let _ = std::panic::catch_unwind(|| lock(&self.engine).reset());
            }
        }
        self.end("exited");
    }

    fn end(&self, state: &str) {
        self.write_metadata(state);
        if let Some(dir) = &self.config.dir {
            let _ = std::fs::remove_file(self.socket_path(dir));
        }
    }

    fn write_metadata(&self, state: &str) {
        let Some(files) = &self.files else { return };
        let json = self.metadata(state);
        if let Err(e) = files.metadata.write(&[json.as_bytes()]) {
            say(format_args!("cannot write {}: {e}", files.metadata.path().display()));
        }
    }

    fn metadata(&self, state: &str) -> String {
        let engine = lock(&self.engine);
        let modules: Vec<String> = engine.modules().iter().map(|m| m.id.path.display().to_string()).collect();
        let build_id = engine.modules().first().and_then(|m| m.build_id.as_deref()).map(hex);
        drop(engine);
        // Read once: after a chroot, /proc/self/exe leads nowhere.
        let program = modules::executable_path().display().to_string();
        serde_json::json!({
            "instance": self.instance,
            "pid": std::process::id(),
            // Safety: getppid cannot fail.
            "ppid": unsafe { libc::getppid() },
            "runtime": self.config.runtime,
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

/// The engine locked for some work; when it is let go, what the work
/// left is given back ([`Agent::after_work`], the lock still held: no
/// other work has begun), or, for a warm dump, once its answer is sent.
struct EngineAtWork<'a> {
    engine: MutexGuard<'a, Engine>,
    agent: &'a Agent,
    answered: bool,
}

impl std::ops::Deref for EngineAtWork<'_> {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        &self.engine
    }
}

impl std::ops::DerefMut for EngineAtWork<'_> {
    fn deref_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }
}

impl Drop for EngineAtWork<'_> {
    fn drop(&mut self) {
        if self.answered && self.engine.warm {
            self.agent.release_due.store(true, Ordering::Release);
        } else {
            self.agent.after_work(&mut self.engine);
        }
        self.agent.worked();
    }
}

/// The API, served by `server`.
struct Handle(&'static Agent);

fn internal(e: crate::Error) -> ApiError {
    ApiError { status: 500, message: e.to_string() }
}

fn lcov_body(bytes: server::Chunks) -> Body {
    Body { content_type: "text/plain; charset=utf-8", bytes, mapping: None }
}

impl Service for Handle {
    fn coverage(&self, query: &CoverageQuery) -> Result<Body, ApiError> {
        let agent = self.0;
        let report = || agent.report_by(agent.engine_to_answer(), query.test.as_deref(), query.reset);
        match query.format {
            Format::Lcov => report().map(lcov_body).map_err(internal),
            Format::Profraw => Ok(Body {
                content_type: "application/octet-stream",
                bytes: agent.engine_to_answer().profraw(query.reset).map_err(internal)?.into(),
                mapping: None,
            }),
            Format::Json => {
                let lcov = report().map_err(internal)?;
                let lcov = lcov.text();
                let bytes = summary_json(&lcov, serde_json::Map::new()).into_bytes();
                Ok(Body { content_type: "application/json", bytes: bytes.into(), mapping: None })
            }
            Format::LlvmJson => {
                let options = agent.report_options(query.test.as_deref());
                let bytes = agent.engine_to_answer().llvm_json(&options, query.reset).map_err(internal)?;
                Ok(Body { content_type: "application/json", bytes: bytes.into(), mapping: None })
            }
            Format::Counters | Format::Mapping => {
                let settings = agent.report_settings();
                let mut engine = agent.engine_to_answer();
                let (bytes, id) = if query.format == Format::Counters {
                    engine.counters(query.reset, &settings)
                } else {
                    engine.mapping(&settings)
                }
                .map_err(internal)?;
                Ok(Body { content_type: "application/gzip", bytes: bytes.into(), mapping: Some(id) })
            }
        }
    }

    /// An LCOV report, unless another thread has the engine. A first
    /// report too: computed on the blocking pool, its records were left in
    /// that thread's `malloc` arena and the next ones in this thread's,
    /// both resident (on redis, 0.3 MiB more after 100 dumps).
    fn coverage_at_once(&self, query: &CoverageQuery) -> Option<Result<Body, ApiError>> {
        let agent = self.0;
        if query.format != Format::Lcov || query.reset {
            return None;
        }
        let engine = agent.try_engine_to_answer()?;
        Some(agent.report_by(engine, query.test.as_deref(), false).map(lcov_body).map_err(internal))
    }

    fn reset(&self) -> Result<(), ApiError> {
        self.0.reset().map_err(internal)
    }

    fn answer_sent(&self) {
        self.0.release_if_due();
    }

    fn after_answers(&self) {
        if let Some(after) = self.0.config.after_answers {
            after();
        }
    }

    fn health(&self) -> String {
        self.0.metadata(if self.0.finished.load(Ordering::Acquire) { "exited" } else { "running" })
    }

    fn instance(&self) -> String {
        self.0.instance.clone()
    }
}

/// Per-file and total line, function and branch counts of an LCOV report
/// (the agent's `?format=json`), plus `extra` fields at the top.
pub fn summary_json(lcov: &str, extra: serde_json::Map<String, serde_json::Value>) -> String {
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
    let mut doc = extra;
    doc.insert("files".into(), serde_json::Value::Array(files));
    doc.insert(
        "totals".into(),
        serde_json::json!({
            "lines": totals[0], "lines_hit": totals[1], "functions": totals[2],
            "functions_hit": totals[3], "branches": totals[4], "branches_hit": totals[5],
        }),
    );
    serde_json::Value::Object(doc).to_string()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A poisoned lock only means an earlier request panicked (and was turned
/// into an error): the data is still usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// [`lock`], unless another thread has it.
fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Before a fork, in the parent: makes sure the counter sections the child
/// will zero are those of the modules loaded now (looked up again only when
/// the set of modules changed since the last look); holds the list of the
/// server's open connections, for the child to close its copies of them.
extern "C" fn before_fork() {
    if current().is_some() {
        let _ = std::panic::catch_unwind(modules::refresh_counter_ranges);
        children::share_before_fork();
    }
    descriptors::hold_for_fork();
}

/// After a fork, in the parent: the first one after a child reported wakes
/// the flush thread to prepare what the next children's reports start from.
extern "C" fn after_fork_in_parent() {
    descriptors::release_after_fork();
    if let Some(agent) = current() {
        if agent.files.is_some() && children::one_reported() && !agent.children_prepared.swap(true, Ordering::AcqRel) {
            process::wake_flush_thread(FORKED);
        }
    }
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
    descriptors::close_connections_in_child();
    let Some(parent) = current() else { return };
    children::in_child();
    // The parent's agent's descriptors are not this child's agent's.
    descriptors::forget_all();
    server::forget_prebuilt_in_child();
    // Safety: we are the only thread of a fresh child.
    unsafe { modules::zero_all_known() };
    if let Some(files) = &parent.files {
        files.close_in_child();
    }
    process::forget_claim_in_child();
    process::close_wakeup();
    // The parent's engine as its last dump left it, unless a thread of the
    // parent had it at the fork: the child's first report takes the records
    // of the files where nothing counts any more as they were with every
    // count zero, and updates the others (the functions whose counts
    // differ from that dump's), where it would compute every file again.
    // Its reset goes: the child's counts begin at zero.
    if let (Ok(mut engine), Ok(mut parked)) = (parent.engine.try_lock(), PARKED.try_lock()) {
        if parked.is_none() {
            let mut engine = std::mem::take(&mut *engine);
            engine.count_from_zero();
            *parked = Some(engine);
        }
    }
    let config = parent.config.clone();
    AGENT.store(std::ptr::null_mut(), Ordering::Release);
    let held = descriptors::hold_program_numbers();
    let launched = std::panic::catch_unwind(|| launch(config, false)).unwrap_or_else(|_| Err("internal error".into()));
    drop(held);
    if let Err(e) = launched {
        say(format_args!("not started in forked child {}: {e}", std::process::id()));
    }
}
