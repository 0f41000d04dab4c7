//! dnsmasq, a real daemon that closes every descriptor it did not open as
//! it starts (its `close_fds`: a `close` for each entry of /proc/self/fd),
//! under `LD_PRELOAD=liblivecov.so`: dnsmasq from Debian's source package
//! built with clang-19 and coverage (tests/scripts/deps-dnsmasq.sh, which
//! `make test` runs), started as root (it then runs as nobody). It answers
//! DNS queries as without the agent; the agent answers dumps, which count
//! them, and takes no CPU while dnsmasq waits; SIGTERM ends dnsmasq as
//! without the agent, with its final report.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use livecov_tests::dns::{free_dns_port, query_a as query};
use livecov_tests::http::unix_request;
use livecov_tests::lcov::{file_ending, parse_lcov};
use livecov_tests::native::{clean_command, cpu_ticks, debian_build, liblivecov, Daemon};
use livecov_tests::service::find_instance;
use livecov_tests::workspace_root;

/// Longest wait for dnsmasq to answer, or to end after SIGTERM.
const WITHIN: Duration = Duration::from_secs(20);
/// The name the tests ask for, and the address dnsmasq answers.
const NAME: &str = "a.livecov.test";
const ADDRESS: [u8; 4] = [10, 1, 2, 3];
/// dnsmasq's function that answers a query from its own data, once a query.
const ANSWER: &str = "answer_request";

/// dnsmasq as deps-dnsmasq.sh built it (target/dnsmasq/current).
fn dnsmasq_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| debian_build("dnsmasq", "src/src/dnsmasq"))
}

/// dnsmasq on `port`, answering `NAME` from its own data, in `dir`, under
/// the agent (`LIVECOV_DIR=dir/cov`) when `agent`.
fn command(dir: &Path, port: u16, agent: bool) -> Command {
    std::fs::create_dir_all(dir).expect("create the run's folder");
    let mut command: Command = clean_command(dnsmasq_bin());
    command
        .args(["--bind-interfaces", "--listen-address=127.0.0.1", "--no-resolv", "--no-hosts", "--conf-file=/dev/null"])
        .arg(format!("--port={port}"))
        .arg(format!("--address=/livecov.test/{}", ADDRESS.map(|b| b.to_string()).join(".")))
        .current_dir(dir)
        // Its exit profile is not what is tested (and nobody could not write it here).
        .env("LLVM_PROFILE_FILE", "/dev/null")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("stderr")).expect("stderr file"));
    if agent {
        command.env("LD_PRELOAD", liblivecov()).env("LIVECOV_DIR", dir.join("cov"));
    }
    command
}

/// dnsmasq in the foreground, answering `NAME` from its own data; killed
/// when dropped.
struct Dnsmasq {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Dnsmasq {
    fn start(dir: &Path, agent: bool) -> Dnsmasq {
        let port = free_dns_port();
        let mut command = command(dir, port, agent);
        command.args(["--no-daemon", "--pid-file", "--log-facility=-"]);
        let child = command.spawn().expect("start dnsmasq");
        let mut dnsmasq = Dnsmasq { child, dir: dir.to_owned(), port };
        let deadline = Instant::now() + WITHIN;
        while query(port, NAME).is_none() {
            if let Some(status) = dnsmasq.child.try_wait().expect("wait") {
                panic!("dnsmasq ended ({status}) before it answered\n{}", dnsmasq.stderr());
            }
            assert!(Instant::now() < deadline, "dnsmasq did not answer within {WITHIN:?}\n{}", dnsmasq.stderr());
        }
        dnsmasq
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default()
    }

    /// SIGTERM, and how it ended.
    fn terminate(&mut self) -> ExitStatus {
        // Safety: a signal to our own child, not waited for yet.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) }, 0);
        let deadline = Instant::now() + WITHIN;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "dnsmasq still runs {WITHIN:?} after SIGTERM\n{}", self.stderr());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = workspace_root().join("target/tmp/dnsmasq").join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch folder");
    dir
}

/// How many times the dump counted dnsmasq's answers, and whether it
/// counted its `close_fds`.
fn answers_and_closes(lcov: &str) -> (Option<u64>, Option<u64>) {
    let files = parse_lcov(lcov);
    let answers = file_ending(&files, "rfc1035.c").functions.get(ANSWER).copied();
    (answers, file_ending(&files, "util.c").functions.get("close_fds").copied())
}

#[test]
fn dnsmasq_answers_and_the_agent_dumps_after_it_closed_every_descriptor() {
    // Safety: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "the dnsmasq tests start dnsmasq as root, as CI runs them");
    let dir = scratch("answers");
    let plain = {
        let mut d = Dnsmasq::start(&dir.join("plain"), false);
        assert_eq!(query(d.port, NAME), Some(ADDRESS));
        d.terminate()
    };

    let mut d = Dnsmasq::start(&dir.join("agent"), true);
    assert_eq!(query(d.port, NAME), Some(ADDRESS));
    let cov = d.dir.join("cov");
    let pid = d.child.id();
    let instance = livecov_tests::wait_for("the agent's socket", Duration::from_millis(20), || find_instance(&cov, "native", pid));
    let socket = cov.join("sockets").join(format!("{instance}.sock"));
    let dump = || {
        let r = unix_request(&socket, "GET", "/coverage", &[]);
        assert_eq!(r.status, 200, "{}\n{}", r.text(), d.stderr());
        r.text()
    };
    let first = dump();
    let (answered, closed) = answers_and_closes(&first);
    assert_eq!(closed, Some(1), "dnsmasq's close_fds ran once, before the dump:\n{first}");
    let answered = answered.unwrap_or_else(|| panic!("no {ANSWER} in the dump:\n{first}"));
    assert!(answered >= 2, "{answered} answers counted, at least 2 asked");
    assert_eq!(query(d.port, NAME), Some(ADDRESS));
    assert_eq!(answers_and_closes(&dump()).0, Some(answered + 1), "one more query, one more answer");

    // Waiting, dnsmasq and the agent take next to no CPU (clock ticks are
    // 10 ms; a thread that spun took 100 a second).
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks(pid) - before;
    assert!(used <= 20, "{used} clock ticks of CPU in a second of waiting");

    let status = d.terminate();
    assert_eq!(status.code(), plain.code(), "{status} under the agent, {plain} without");
    assert_eq!(status.signal(), plain.signal());
    let reports = cov.join("reports");
    let meta = std::fs::read_to_string(reports.join(format!("{instance}.json"))).expect("the metadata");
    assert!(meta.contains("\"state\":\"exited\""), "{meta}");
    let last = std::fs::read_to_string(reports.join(format!("{instance}.lcov"))).expect("the final report");
    assert_eq!(answers_and_closes(&last).0, Some(answered + 1), "{last}");
    let stderr = d.stderr();
    assert!(!stderr.contains("livecov"), "the agent said something:\n{stderr}");
    assert!(!socket.exists(), "socket left behind");
}

/// dnsmasq as a daemon (its default): it closes every descriptor first
/// thing in `main`, while the agent is still starting in the background,
/// then forks into the background. The daemon's agent answers dumps, and
/// SIGTERM ends the daemon with its final report; the processes of its
/// start, which end with `_exit`, leave theirs. Three starts: before
/// the program's closes waited for the agent's start, the agent lost the
/// race with dnsmasq's in one of four starts by hand (`close_all
/// at-start` of signals.rs loses it more often).
#[test]
fn dnsmasq_as_a_daemon_answers_and_its_agent_dumps() {
    let dir = scratch("daemon");
    for run in 0..3 {
        let dir = dir.join(run.to_string());
        let port = free_dns_port();
        let (pid_file, log) = (dir.join("dnsmasq.pid"), dir.join("dnsmasq.log"));
        let mut command = command(&dir, port, true);
        command.arg(format!("--pid-file={}", pid_file.display())).arg(format!("--log-facility={}", log.display()));
        // The process started returns once the daemon runs.
        let status = command.status().expect("start dnsmasq");
        let stderr = || std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
        assert!(status.success(), "dnsmasq: {status}\n{}", stderr());
        let pid: u32 = std::fs::read_to_string(&pid_file).expect("dnsmasq's pid file").trim().parse().expect("a pid");
        let daemon = Daemon(pid);
        let answered = livecov_tests::wait_for("an answer", Duration::from_millis(20), || query(port, NAME));
        assert_eq!(answered, ADDRESS);
        let cov = dir.join("cov");
        let instance = livecov_tests::wait_for("the daemon's agent", Duration::from_millis(20), || find_instance(&cov, "native", pid));
        let socket = cov.join("sockets").join(format!("{instance}.sock"));
        let r = unix_request(&socket, "GET", "/coverage", &[]);
        assert_eq!(r.status, 200, "run {run}: {}\n{}", r.text(), stderr());
        // (Its close_fds ran in the process that forked it: a forked
        // process counts from the fork.)
        let answers = answers_and_closes(&r.text()).0;
        assert!(answers.is_some_and(|a| a >= 1), "run {run}: {answers:?} answers counted");

        daemon.signal(libc::SIGTERM);
        livecov_tests::wait_for("the daemon's end", Duration::from_millis(20), || {
            (!Path::new(&format!("/proc/{pid}")).exists()).then_some(())
        });
        let meta = std::fs::read_to_string(cov.join("reports").join(format!("{instance}.json"))).expect("the metadata");
        assert!(meta.contains("\"state\":\"exited\""), "run {run}: {meta}");
        // Every process of its start (they end with `_exit`) left its final
        // report: together they count its close_fds once.
        let reports: Vec<PathBuf> = std::fs::read_dir(cov.join("reports")).expect("the reports").flatten().map(|e| e.path()).collect();
        let metadata = reports.iter().filter(|p| p.extension().is_some_and(|e| e == "json"));
        let states: Vec<String> = metadata.map(|p| std::fs::read_to_string(p).unwrap_or_default()).collect();
        assert!(states.len() > 1 && states.iter().all(|m| m.contains("\"state\":\"exited\"")), "run {run}: {states:#?}");
        let lcov = reports.iter().filter(|p| p.extension().is_some_and(|e| e == "lcov"));
        let closes: u64 = lcov.map(|p| answers_and_closes(&std::fs::read_to_string(p).unwrap_or_default()).1.unwrap_or(0)).sum();
        assert_eq!(closes, 1, "run {run}: close_fds counted in the final reports");
        assert!(!stderr().contains("livecov"), "run {run}: the agent said something:\n{}", stderr());
    }
}
