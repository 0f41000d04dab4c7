//! The agent takes none of the program's signals. Real C programs of
//! `fixtures/native`, built with clang-19 and coverage, that wait for the
//! signals they block, as daemons do (a master loop in sigsuspend, a thread
//! in sigwait), behave under `LD_PRELOAD=liblivecov.so` exactly as without
//! it: same output, same exit status, no hang. Each runs 20 times each way,
//! with its signals sent while it works, when only a thread that does not
//! block them could take them. The agent's threads are seen blocking every
//! asynchronous signal in /proc, and SIGTERM still ends a program that
//! leaves its signals alone, with its final report; on a full disk too,
//! where the report it cannot write leaves the last one whole. A daemon
//! that closes every descriptor at start keeps its files, and the agent
//! its own. A daemon whose processes end with `_exit` (after each fork of
//! its start, and in its SIGTERM handler) leaves each one's final report.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use livecov_tests::disk::SmallDisk;
use livecov_tests::http::unix_request;
use livecov_tests::lcov::{file_ending, parse_lcov};
use livecov_tests::native::{clang19_programs, clean_command, cpu_ticks, liblivecov, Daemon};
use livecov_tests::service::find_instance;
use livecov_tests::{wait_for, workspace_root};

/// Runs of each program, each way (without and with the agent).
const RUNS: usize = 20;
/// Runs at once: the programs mostly wait, but 2 cores run their work.
const AT_ONCE: usize = 10;
/// Longest wait for one line or for the exit: a program that takes longer
/// hangs (the programs answer in milliseconds; the margin is for a loaded
/// machine).
const STEP: Duration = Duration::from_secs(10);
/// How long the programs work with their signals blocked.
const WORK_MS: &str = "200";

struct Programs {
    sigsuspend: PathBuf,
    sigwait: PathBuf,
    pause: PathBuf,
    close_all: PathBuf,
    daemonize: PathBuf,
}

fn programs() -> &'static Programs {
    static BUILT: OnceLock<Programs> = OnceLock::new();
    BUILT.get_or_init(|| {
        let built = clang19_programs(
            "signals",
            &[
                ("sigsuspend", "sigsuspend.c"),
                ("sigwait", "sigwait.c"),
                ("pause", "pause.c"),
                ("close_all", "close_all.c"),
                ("daemonize", "daemonize.c"),
            ],
        );
        let program = |i: usize| built[i].clone();
        Programs {
            sigsuspend: program(0),
            sigwait: program(1),
            pause: program(2),
            close_all: program(3),
            daemonize: program(4),
        }
    })
}

fn scratch(name: &str) -> PathBuf {
    let dir = workspace_root().join("target/tmp/signals").join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch folder");
    dir
}

/// A fixture running in `dir`, its standard output read line by line on
/// a thread of the test (so that every wait has a deadline), its standard
/// error in `dir/stderr`; killed when dropped.
struct Running {
    child: Child,
    lines: Receiver<String>,
    printed: Vec<String>,
    dir: PathBuf,
}

/// Why a run did not behave: `hang` when it stopped answering.
struct Failure {
    hang: bool,
    what: String,
}

impl Running {
    /// `program args`, under the agent (`LIVECOV_DIR=dir/cov`) when `preload`.
    fn start(program: &Path, args: &[&str], dir: &Path, preload: bool, env: &[(&str, &str)]) -> Running {
        std::fs::create_dir_all(dir).expect("create the run's folder");
        let mut command = clean_command(program);
        command
            .args(args)
            .current_dir(dir)
            .env("LLVM_PROFILE_FILE", dir.join("exit.profraw"))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("stderr")).expect("create the run's stderr file"));
        if preload {
            command.env("LD_PRELOAD", liblivecov()).env("LIVECOV_DIR", dir.join("cov"));
        }
        let mut child = command.spawn().unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let (send, lines) = channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    return;
                }
            }
        });
        Running { child, lines, printed: Vec::new(), dir: dir.to_owned() }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default()
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The next line is `want`, within [`STEP`].
    fn expect(&mut self, want: &str) -> Result<(), Failure> {
        match self.lines.recv_timeout(STEP) {
            Ok(line) if line == want => {
                self.printed.push(line);
                Ok(())
            }
            Ok(line) => Err(Failure { hang: false, what: format!("printed {line:?} where {want:?} was due") }),
            Err(RecvTimeoutError::Timeout) => Err(Failure { hang: true, what: format!("hung: no {want:?} within {STEP:?}") }),
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.wait().map(|s| format!("{s}")).unwrap_or_default();
                Err(Failure { hang: false, what: format!("ended ({status}) before printing {want:?}") })
            }
        }
    }

    fn signal(&self, signal: i32) {
        // Safety: a signal to our own child, which has not been waited for.
        assert_eq!(unsafe { libc::kill(self.pid(), signal) }, 0, "kill {signal}");
    }

    /// The exit status, within [`STEP`].
    fn wait(&mut self) -> Option<ExitStatus> {
        let deadline = Instant::now() + STEP;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Exits 0 having printed nothing more, within [`STEP`].
    fn expect_success(&mut self) -> Result<(), Failure> {
        match self.wait() {
            None => Err(Failure { hang: true, what: format!("hung: still running {STEP:?} after its last line") }),
            Some(status) if !status.success() => Err(Failure { hang: false, what: format!("ended with {status}") }),
            Some(_) => match self.lines.recv_timeout(STEP) {
                Ok(line) => Err(Failure { hang: false, what: format!("printed {line:?} at the end") }),
                Err(_) => Ok(()),
            },
        }
    }

    /// Under the agent: the final report, written at exit.
    fn expect_final_report(&self) -> Result<(), Failure> {
        let reports = self.dir.join("cov/reports");
        let meta = std::fs::read_dir(&reports)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "json"))
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default();
        if meta.contains("\"state\":\"exited\"") {
            Ok(())
        } else {
            Err(Failure { hang: false, what: format!("no final report in {}: {meta:?}", reports.display()) })
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `run(i)` for i in 0..RUNS, [`AT_ONCE`] at a time; panics listing the
/// failures by kind (`hung: ...`, `ended with ...`) and how many of the
/// runs they were.
fn runs(what: &str, run: impl Fn(usize) -> Result<(), Failure> + Sync) {
    let mut failures: BTreeMap<String, usize> = BTreeMap::new();
    let mut hangs = 0;
    let run = &run;
    for batch in (0..RUNS).collect::<Vec<_>>().chunks(AT_ONCE) {
        let results: Vec<Result<(), Failure>> = std::thread::scope(|scope| {
            let handles: Vec<_> = batch.iter().map(|&i| scope.spawn(move || run(i))).collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
        });
        for failure in results.into_iter().filter_map(Result::err) {
            hangs += usize::from(failure.hang);
            *failures.entry(failure.what).or_default() += 1;
        }
    }
    let failed: usize = failures.values().sum();
    assert!(failed == 0, "{what}: {failed} of {RUNS} runs failed, {hangs} of {RUNS} hung: {failures:#?}");
}

// ---------------------------------------------------------------- sigsuspend

/// One run of `sigsuspend`: SIGHUP while it works (pending until its
/// sigsuspend), then SIGUSR1, then SIGQUIT, each once the previous one
/// was acted on.
fn sigsuspend_run(dir: &Path, preload: bool) -> Result<(), Failure> {
    let mut p = Running::start(&programs().sigsuspend, &[WORK_MS], dir, preload, &[]);
    p.expect("ready")?;
    p.signal(libc::SIGHUP);
    p.expect("worked")?;
    p.expect("hup 1")?;
    p.signal(libc::SIGUSR1);
    p.expect("usr1 1")?;
    p.signal(libc::SIGQUIT);
    p.expect("quit")?;
    p.expect_success()?;
    if preload {
        p.expect_final_report()?;
    }
    Ok(())
}

#[test]
fn a_sigsuspend_master_loop_behaves_the_same_under_the_agent() {
    let dir = scratch("sigsuspend");
    runs("sigsuspend without the agent", |i| sigsuspend_run(&dir.join(format!("plain-{i}")), false));
    runs("sigsuspend under the agent", |i| sigsuspend_run(&dir.join(format!("agent-{i}")), true));
}

// ---------------------------------------------------------------- sigwait

/// One run of `sigwait`: two SIGUSR1 and a SIGTERM while it works, each
/// once the previous one was taken.
fn sigwait_run(dir: &Path, preload: bool) -> Result<(), Failure> {
    let mut p = Running::start(&programs().sigwait, &[WORK_MS], dir, preload, &[]);
    p.expect("ready")?;
    p.signal(libc::SIGUSR1);
    p.expect("usr1 1")?;
    p.signal(libc::SIGUSR1);
    p.expect("usr1 2")?;
    p.signal(libc::SIGTERM);
    p.expect("term")?;
    p.expect("worked 1")?;
    p.expect_success()?;
    if preload {
        p.expect_final_report()?;
    }
    Ok(())
}

#[test]
fn a_sigwait_thread_behaves_the_same_under_the_agent() {
    let dir = scratch("sigwait");
    runs("sigwait without the agent", |i| sigwait_run(&dir.join(format!("plain-{i}")), false));
    runs("sigwait under the agent", |i| sigwait_run(&dir.join(format!("agent-{i}")), true));
}

// ---------------------------------------------------------------- the agent's threads

/// The signals a thread blocks, from the `SigBlk` mask of
/// /proc/PID/task/TID/status (bit N-1 for signal N).
fn blocked_signals(status: &str) -> Vec<i32> {
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigBlk:"))
        .map(|hex| u64::from_str_radix(hex.trim(), 16).expect("a hexadecimal SigBlk"))
        .expect("a SigBlk line");
    (1..=64).filter(|s| mask & (1u64 << (s - 1)) != 0).collect()
}

#[test]
fn the_agents_threads_block_every_asynchronous_signal() {
    let dir = scratch("sigblk");
    // A periodic flush, so that the flush thread runs too.
    let mut p = Running::start(&programs().sigsuspend, &["0"], &dir, true, &[("LIVECOV_FLUSH_SECS", "1")]);
    p.expect("ready").unwrap_or_else(|f| panic!("{}", f.what));
    p.expect("worked").unwrap_or_else(|f| panic!("{}", f.what));
    let cov = dir.join("cov");
    let instance = wait_for("the agent's socket", Duration::from_millis(10), || find_instance(&cov, "native", p.child.id()));
    // A dump, so that the threads it starts are there too.
    let socket = cov.join("sockets").join(format!("{instance}.sock"));
    let dump = unix_request(&socket, "GET", "/coverage", &[]);
    assert_eq!(dump.status, 200, "{}", dump.text());
    assert!(file_ending(&parse_lcov(&dump.text()), "sigsuspend.c").functions.contains_key("sigsuspend.c:on_signal"));

    // Every signal but SIGKILL and SIGSTOP (which cannot be blocked), the
    // synchronous ones (a fault of the thread itself) and glibc's own 32
    // and 33 (cancellation and setuid across threads, which
    // pthread_sigmask leaves unblocked).
    let synchronous = [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGSYS];
    let asynchronous: Vec<i32> = (1..=64)
        .filter(|s| ![libc::SIGKILL, libc::SIGSTOP, 32, 33].contains(s) && !synchronous.contains(s))
        .collect();
    let tasks = PathBuf::from(format!("/proc/{}/task", p.pid()));
    let threads: BTreeMap<String, Vec<i32>> = std::fs::read_dir(&tasks)
        .expect("/proc/PID/task")
        .flatten()
        .filter_map(|task| {
            let name = std::fs::read_to_string(task.path().join("comm")).ok()?.trim().to_owned();
            let status = std::fs::read_to_string(task.path().join("status")).ok()?;
            name.starts_with("livecov").then(|| (format!("{name} ({})", task.file_name().to_string_lossy()), blocked_signals(&status)))
        })
        .collect();
    for name in ["livecov-agent", "livecov-flush"] {
        assert!(threads.keys().any(|t| t.starts_with(&format!("{name} "))), "no thread {name}: {threads:?}");
    }
    for (thread, blocked) in &threads {
        let open: Vec<&i32> = asynchronous.iter().filter(|s| !blocked.contains(s)).collect();
        assert!(open.is_empty(), "thread {thread} takes the signals {open:?} (it blocks {blocked:?})");
    }
}

/// A thread's nice value, field 19 of /proc/PID/task/TID/stat.
fn nice_of(stat: &str) -> i32 {
    let fields: Vec<&str> = stat.rsplit_once(')').expect("a stat line").1.split_whitespace().collect();
    fields[16].parse().expect("a nice value")
}

#[test]
fn dumps_are_computed_at_the_programs_priority_and_periodic_reports_below_it() {
    let dir = scratch("nice");
    let mut p = Running::start(&programs().sigsuspend, &["0"], &dir, true, &[("LIVECOV_FLUSH_SECS", "1")]);
    p.expect("ready").unwrap_or_else(|f| panic!("{}", f.what));
    let cov = dir.join("cov");
    let instance = wait_for("the agent's socket", Duration::from_millis(10), || find_instance(&cov, "native", p.child.id()));
    let socket = cov.join("sockets").join(format!("{instance}.sock"));
    // An LCOV dump is computed on the server's thread, a raw profile on a
    // thread of its blocking pool.
    assert_eq!(unix_request(&socket, "GET", "/coverage", &[]).status, 200);
    assert_eq!(unix_request(&socket, "GET", "/coverage?format=profraw", &[]).status, 200);
    let tasks = PathBuf::from(format!("/proc/{}/task", p.pid()));
    let nice_values = || -> BTreeMap<String, i32> {
        std::fs::read_dir(&tasks)
            .expect("/proc/PID/task")
            .flatten()
            .filter_map(|task| {
                let name = std::fs::read_to_string(task.path().join("comm")).ok()?.trim().to_owned();
                Some((name, nice_of(&std::fs::read_to_string(task.path().join("stat")).ok()?)))
            })
            .collect()
    };
    // The flush thread lowers its priority once the agent has started,
    // which can be after the socket answers (on a busy machine, well after).
    let started = Instant::now();
    let mut nice = nice_values();
    while nice.get("livecov-flush").is_some_and(|&n| n < 10) && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
        nice = nice_values();
    }
    let program = nice.get("sigsuspend").copied().expect("the program's main thread");
    for (thread, want) in [("livecov-agent", program), ("livecov-agent-b", program), ("livecov-flush", program.max(10))] {
        assert_eq!(nice.get(thread), Some(&want), "the nice value of {thread}: {nice:?}");
    }
}

// ---------------------------------------------------------------- a program that leaves signals alone

#[test]
fn sigterm_still_ends_a_plain_program_with_its_final_report() {
    let dir = scratch("sigterm");
    let plain = {
        let mut p = Running::start(&programs().pause, &[], &dir.join("plain"), false, &[]);
        p.expect("ready 55").unwrap_or_else(|f| panic!("{}", f.what));
        p.signal(libc::SIGTERM);
        p.wait().expect("pause ends on SIGTERM")
    };
    assert_eq!(plain.signal(), Some(libc::SIGTERM), "{plain}");

    let mut p = Running::start(&programs().pause, &[], &dir.join("agent"), true, &[]);
    p.expect("ready 55").unwrap_or_else(|f| panic!("{}", f.what));
    let cov = p.dir.join("cov");
    let instance = wait_for("the agent's socket", Duration::from_millis(10), || find_instance(&cov, "native", p.child.id()));
    p.signal(libc::SIGTERM);
    let status = p.wait().expect("pause ends on SIGTERM under the agent");
    // Killed by the signal as without the agent: 143 in a shell.
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}");
    let reports = cov.join("reports");
    let report = std::fs::read_to_string(reports.join(format!("{instance}.lcov"))).expect("the final report");
    let files = parse_lcov(&report);
    assert_eq!(file_ending(&files, "pause.c").functions.get("pause.c:count"), Some(&1), "{report}");
    let meta = std::fs::read_to_string(reports.join(format!("{instance}.json"))).expect("the metadata");
    assert!(meta.contains("\"state\":\"exited\""), "{meta}");
    assert!(!cov.join("sockets").join(format!("{instance}.sock")).exists(), "socket left behind");
}

/// `pause` under the agent, with a periodic report every 0.2 s, and a
/// small disk at its run's folder (its stderr and `LIVECOV_DIR` on it) or
/// at `LIVECOV_DIR` alone; once a periodic report is written.
struct PauseOnASmallDisk {
    disk: SmallDisk,
    p: Running,
    cov: PathBuf,
    instance: String,
    /// The instance's report, and its text then.
    report: PathBuf,
    last: String,
}

impl PauseOnASmallDisk {
    fn start(name: &str, stderr_on_it: bool) -> PauseOnASmallDisk {
        let run = scratch(name).join("agent");
        let disk = SmallDisk::mount(&if stderr_on_it { run.clone() } else { run.join("cov") }, "4m");
        let mut p = Running::start(&programs().pause, &[], &run, true, &[("LIVECOV_FLUSH_SECS", "0.2")]);
        p.expect("ready 55").unwrap_or_else(|f| panic!("{}", f.what));
        let cov = p.dir.join("cov");
        let instance = wait_for("the agent's socket", Duration::from_millis(10), || find_instance(&cov, "native", p.child.id()));
        let report = cov.join("reports").join(format!("{instance}.lcov"));
        let last = wait_for("a periodic report", Duration::from_millis(20), || {
            std::fs::read_to_string(&report).ok().filter(|r| r.ends_with("end_of_record\n"))
        });
        PauseOnASmallDisk { disk, p, cov, instance, report, last }
    }
}

#[test]
fn on_a_full_disk_sigterm_still_ends_the_program_and_its_last_report_stays_whole() {
    let PauseOnASmallDisk { disk, mut p, cov, instance, report, last } = PauseOnASmallDisk::start("full-disk", false);
    disk.fill();
    let cannot = format!("livecov: cannot write {}: No space left on device", report.display());
    wait_for("a periodic report refused", Duration::from_millis(20), || p.stderr().contains(&cannot).then_some(()));
    p.signal(libc::SIGTERM);
    let status = p.wait().expect("pause ends on SIGTERM with a full disk");
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}");
    // The report it could not write is said, and the last one is whole.
    let stderr = p.stderr();
    assert!(stderr.lines().all(|l| l.starts_with("livecov: cannot write ") && l.ends_with("No space left on device (os error 28)")), "{stderr}");
    assert_eq!(std::fs::read_to_string(&report).expect("the last report"), last);
    let files = parse_lcov(&last);
    assert!(file_ending(&files, "pause.c").functions.contains_key("main"), "{last}");
    // Nothing half written left behind, and no socket.
    let reports = cov.join("reports");
    let mut left: Vec<String> = std::fs::read_dir(&reports).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    left.sort();
    let counters = std::fs::read(reports.join(format!("{instance}.counters"))).expect("the counters");
    let mapping = format!("{}.mapping", String::from_utf8_lossy(&counters[..32]));
    assert_eq!(left, [mapping, format!("{instance}.counters"), format!("{instance}.json"), format!("{instance}.lcov")]);
    assert!(!cov.join("sockets").join(format!("{instance}.sock")).exists(), "socket left behind");
    drop(disk);
}

/// The program's stderr on the full disk too: the agent's lines are lost,
/// and nothing else. (`eprintln!` panicked there, on the thread of periodic
/// and final reports, which then wrote no report again.)
#[test]
fn with_stderr_on_the_full_disk_too_the_reports_go_on_once_there_is_room() {
    let PauseOnASmallDisk { disk, mut p, cov, instance, report, .. } = PauseOnASmallDisk::start("full-disk-stderr", true);
    disk.fill();
    // Periodic reports refused, each said where nothing fits.
    std::thread::sleep(Duration::from_secs(1));
    disk.empty();
    p.signal(libc::SIGTERM);
    let status = p.wait().expect("pause ends on SIGTERM");
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}");
    let meta = std::fs::read_to_string(cov.join("reports").join(format!("{instance}.json"))).expect("the metadata");
    assert!(meta.contains("\"state\":\"exited\""), "no final report: {meta}");
    let last = std::fs::read_to_string(&report).expect("the final report");
    assert_eq!(file_ending(&parse_lcov(&last), "pause.c").functions.get("pause.c:count"), Some(&1), "{last}");
    drop(disk);
}

// ---------------------------------------------------------------- a daemon that closes every descriptor

/// The files `pid` has open, by the names their descriptors point at.
fn open_files(pid: i32) -> Vec<String> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("the process's descriptors");
    let mut files: Vec<String> = fds.flatten().filter_map(|e| std::fs::read_link(e.path()).ok()).map(|t| t.display().to_string()).collect();
    files.sort();
    files
}

/// Of the files `pid` has open, the agent's kinds: sockets, its runtime's
/// `epoll` and `eventfd`, report files. Read until two readings a little
/// apart agree: a periodic report replaces its files meanwhile (the old
/// one closed, once renamed over, after the new one is open), and a
/// reading of /proc that lists a descriptor which is closed before its
/// name is read misses it.
fn agents_files(pid: i32) -> Vec<String> {
    let report_file = |f: &str| f.contains("/cov/reports/") && [".json", ".lcov", ".counters"].iter().any(|e| f.ends_with(e));
    let kept = |f: &String| f.starts_with("socket:") || f.starts_with("anon_inode:") || report_file(f);
    let read = || open_files(pid).into_iter().filter(kept).collect::<Vec<_>>();
    let mut last = read();
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(30));
        let now = read();
        if now.len() == last.len() {
            return now;
        }
        last = now;
    }
    last
}

/// A daemon that closes every descriptor at start (dnsmasq loops `close`
/// over all of them; others call `close_range` or `closefrom`), and whose
/// next files take the numbers the agent's had: once the agent runs, or
/// first thing in `main`, while the agent starts in the background. Under
/// the agent its closes leave the agent's descriptors open, and its files
/// take other numbers: the agent still answers dumps, writes to, reads
/// from and closes none of the program's files, takes no CPU, and SIGTERM
/// still ends the program, by the signal, with its final report.
#[test]
fn a_daemon_that_closes_every_descriptor_keeps_its_files_and_the_agent() {
    let dir = scratch("close-all");
    let ways = [("loop", "on-usr1"), ("close_range", "on-usr1"), ("closefrom", "on-usr1"), ("loop", "at-start")];
    for (way, when) in ways {
        let how = format!("{way} {when}");
        let run = dir.join(format!("{way}-{when}"));
        let mut p = Running::start(&programs().close_all, &[way, when], &run, true, &[("LIVECOV_FLUSH_SECS", "0.2")]);
        p.expect("ready").unwrap_or_else(|f| panic!("{how}: {}", f.what));
        let cov = p.dir.join("cov");
        let instance = wait_for("the agent's socket", Duration::from_millis(10), || find_instance(&cov, "native", p.child.id()));
        let report = cov.join("reports").join(format!("{instance}.lcov"));
        wait_for("a periodic report", Duration::from_millis(20), || std::fs::read_to_string(&report).ok().filter(|r| r.ends_with("end_of_record\n")));
        let agents = agents_files(p.pid());

        p.signal(libc::SIGUSR1);
        p.expect("opened").unwrap_or_else(|f| panic!("{how}: {}", f.what));
        let data: Vec<String> = (0..16).map(|i| p.dir.join(format!("data-{i}")).display().to_string()).collect();
        // A second of periodic reports, each of which replaces the report
        // files.
        let before = cpu_ticks(p.pid() as u32);
        std::thread::sleep(Duration::from_secs(1));
        let used = cpu_ticks(p.pid() as u32) - before;
        // Clock ticks are 10 ms: a thread that spun took 100.
        assert!(used <= 20, "{how}: {used} clock ticks of CPU in a second of waiting");
        let open = open_files(p.pid());
        assert!(data.iter().all(|d| open.contains(d)), "{how}: the program's files are not all open: {open:?}");
        // The agent's sockets, runtime and report files are still open.
        let now = agents_files(p.pid());
        assert_eq!(now.len(), agents.len(), "{how}: {agents:?} then {now:?}");
        let socket = cov.join("sockets").join(format!("{instance}.sock"));
        let dump = unix_request(&socket, "GET", "/coverage", &[]);
        assert_eq!(dump.status, 200, "{how}: {}", dump.text());
        let files = parse_lcov(&dump.text());
        assert_eq!(file_ending(&files, "close_all.c").functions.get("close_all.c:close_every_descriptor"), Some(&1), "{how}");

        p.signal(libc::SIGTERM);
        let status = p.wait().expect("close_all ends on SIGTERM under the agent");
        assert_eq!(status.signal(), Some(libc::SIGTERM), "{how}: {status}");
        for d in &data {
            assert_eq!(std::fs::read_to_string(d).unwrap(), "program\n", "{how}: {d} holds what the program wrote, and nothing else");
        }
        p.expect_final_report().unwrap_or_else(|f| panic!("{how}: {}", f.what));
        let last = parse_lcov(&std::fs::read_to_string(&report).expect("the final report"));
        assert_eq!(file_ending(&last, "close_all.c").functions.get("close_all.c:close_every_descriptor"), Some(&1), "{how}");
        assert!(!socket.exists(), "{how}: socket left behind");
        assert_eq!(p.stderr(), "", "{how}: the agent said something");
    }
}

// ---------------------------------------------------------------- a daemon that ends its processes with _exit

/// Whether `pid` ended (gone, or a zombie no one reaped yet).
fn ended(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| stat.rsplit(") ").next().is_some_and(|s| s.starts_with('Z')))
}

/// The metadata of every instance in `cov`, by pid: its instance and state.
fn instances(cov: &Path) -> BTreeMap<u64, (String, String)> {
    let entries = std::fs::read_dir(cov.join("reports")).into_iter().flatten().flatten();
    let metadata = entries.filter(|e| e.path().extension().is_some_and(|x| x == "json"));
    metadata
        .filter_map(|e| serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(e.path()).ok()?).ok())
        .filter_map(|m| Some((m["pid"].as_u64()?, (m["instance"].as_str()?.to_owned(), m["state"].as_str()?.to_owned()))))
        .collect()
}

/// A daemon's start: its first process forks and `_exit`s, the second
/// `setsid`s, forks and `_exit`s, and the daemon's SIGTERM handler ends it
/// with `_exit(7)`; a `vfork` child of the daemon `_exit`s too. `_exit`
/// runs no `atexit` hook: each of the three processes still leaves its
/// final report (what it ran, since the fork that made it), the `vfork`
/// child none, and no socket is left.
#[test]
fn a_daemon_whose_processes_end_with_exit_leaves_each_ones_final_report() {
    let run = scratch("daemonize");
    let mut p = Running::start(&programs().daemonize, &[], &run, true, &[]);
    let cov = run.join("cov");
    let first = p.pid() as u64;
    let status = p.wait().expect("the first process ends at once");
    assert_eq!(status.code(), Some(0), "the first process: {status}");
    let line = p.lines.recv_timeout(STEP).expect("the daemon's pid");
    let daemon: i32 = line.strip_prefix("daemon ").and_then(|pid| pid.parse().ok()).unwrap_or_else(|| panic!("printed {line:?}"));
    let guard = Daemon(daemon as u32);
    p.expect("vfork 3").unwrap_or_else(|f| panic!("{}", f.what));
    p.expect("ready").unwrap_or_else(|f| panic!("{}", f.what));
    wait_for("the daemon's agent", Duration::from_millis(10), || find_instance(&cov, "native", daemon as u32));
    let started = wait_for("the three instances", Duration::from_millis(10), || {
        let all = instances(&cov);
        (all.len() == 3 && all.values().filter(|(_, state)| state == "exited").count() == 2).then_some(all)
    });
    assert!(started.contains_key(&first) && started.contains_key(&(daemon as u64)), "{started:?}");
    let counts = |pid: u64| {
        let (instance, _) = &instances(&cov)[&pid];
        let report = std::fs::read_to_string(cov.join("reports").join(format!("{instance}.lcov"))).unwrap_or_default();
        assert!(report.ends_with("end_of_record\n"), "pid {pid}: no final report: {report:?}");
        let files = parse_lcov(&report);
        let functions = &file_ending(&files, "daemonize.c").functions;
        let count = |f: &str| functions.get(&format!("daemonize.c:{f}")).copied().unwrap_or_else(|| panic!("no {f} in {functions:?}"));
        ["first_stage", "second_stage", "daemon_stage", "on_term"].map(count)
    };
    let second = *started.keys().find(|&&pid| pid != first && pid != daemon as u64).expect("the second process");
    assert_eq!(counts(first), [1, 0, 0, 0], "the first process's report");
    assert_eq!(counts(second), [0, 1, 0, 0], "the second process's report");

    guard.signal(libc::SIGTERM);
    wait_for("the daemon to end", Duration::from_millis(10), || ended(daemon).then_some(()));
    drop(guard);
    assert_eq!(instances(&cov)[&(daemon as u64)].1, "exited", "the daemon's metadata");
    assert_eq!(counts(daemon as u64), [0, 0, 1, 1], "the daemon's report");
    let sockets: Vec<_> = std::fs::read_dir(cov.join("sockets")).expect("the sockets folder").flatten().map(|e| e.file_name()).collect();
    assert!(sockets.is_empty(), "sockets left behind: {sockets:?}");
    assert_eq!(p.stderr(), "", "the agent said something");
}
