//! The Python hook (hooks/python), end to end: installed into a venv with pip
//! as users install it (its .pth file in site-packages), real interpreters
//! running the fixtures of fixtures/python, a Flask app under gunicorn with
//! four pre-forked sync workers, really requested over the hook's socket and
//! TCP, really forked and signalled. The hook's merged reports are compared
//! with coverage.py's own `coverage run` + `coverage lcov` of the same
//! requests served by one process.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::Duration;

use livecov_tests::http::{exchange, get_report, parse_response, unix_request, Response};
use livecov_tests::lcov::{file_ending, lines_hit, parse_lcov};
use livecov_tests::python::{self, Python};
use livecov_tests::service::{find_instance, scratch};
use livecov_tests::{livecov_bin, run_checked, wait_for};

const GROUP: &str = "py";

/// The tests that depend on the interpreter, once per Python the hook is
/// tested on: `system::NAME`, `python3_12::NAME`, `python3_13::NAME`.
macro_rules! on_every_python {
    ($($test:ident),* $(,)?) => {
        on_every_python!(@one system, System, $($test),*);
        on_every_python!(@one python3_12, V3_12, $($test),*);
        on_every_python!(@one python3_13, V3_13, $($test),*);
    };
    (@one $module:ident, $python:ident, $($test:ident),*) => {
        mod $module {
            $(#[test] fn $test() { super::$test(super::Python::$python) })*
        }
    };
}

on_every_python!(
    the_hook_is_off_without_livecov_dir_and_on_with_it,
    a_function_is_uncovered_before_its_call_and_covered_after,
    reset_and_test_names_give_per_test_reports,
    a_forked_child_is_an_instance_of_its_own_counting_from_zero,
    a_program_with_threads_of_its_own_still_gets_pythons_fork_warning,
    multiprocessing_children_forked_leave_their_final_reports_at_os_exit,
    a_program_run_through_subprocess_with_a_preexec_fn_leaves_no_instance,
    a_forked_child_that_runs_another_program_leaves_its_final_report,
    os_exit_of_the_program_leaves_the_final_report_and_its_status,
    sigterm_and_sigint_without_a_handler_leave_the_final_report_and_the_signal_status,
    a_program_with_its_own_sigterm_handler_keeps_it,
    a_signal_the_program_blocks_and_waits_for_reaches_its_sigwait,
    periodic_reports_survive_sigkill,
    socket_mode_path_map_and_ignore_settings,
    gunicorn_workers_merged_equal_coverage_run_of_the_same_requests,
    sigterm_to_the_gunicorn_master_leaves_the_final_reports_of_every_worker,
);

fn poll<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    wait_for(what, Duration::from_millis(20), f)
}

/// The statement lines of `def NAME(` in a fixture: the indented lines after
/// it, up to the first line that is not.
fn body_lines(fixture: &str, name: &str) -> Vec<u32> {
    let source = std::fs::read_to_string(python::fixture_dir().join(fixture)).expect("read the fixture");
    let lines: Vec<&str> = source.lines().collect();
    let def = lines
        .iter()
        .position(|l| l.starts_with(&format!("def {name}(")))
        .unwrap_or_else(|| panic!("no def {name} in {fixture}"));
    let body: Vec<u32> = lines[def + 1..]
        .iter()
        .take_while(|l| l.starts_with("    "))
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|(i, _)| (def + 2 + i) as u32)
        .collect();
    assert!(!body.is_empty(), "def {name} in {fixture} has no body");
    body
}

/// The number of the line of `fixture` that is `text` (indentation aside).
fn line_of(fixture: &str, text: &str) -> u32 {
    let source = std::fs::read_to_string(python::fixture_dir().join(fixture)).expect("read the fixture");
    let index = source.lines().position(|l| l.trim() == text).unwrap_or_else(|| panic!("no line {text:?} in {fixture}"));
    index as u32 + 1
}

/// The DA counts of `lines` in the record of the file ending with `file`.
fn counts(lcov: &str, file: &str, lines: &[u32]) -> Vec<u64> {
    let files = parse_lcov(lcov);
    let coverage = file_ending(&files, file);
    lines
        .iter()
        .map(|l| *coverage.lines.get(l).unwrap_or_else(|| panic!("no DA for line {l} of {file} in\n{lcov}")))
        .collect()
}

fn reports(cov: &Path, instance: &str) -> (PathBuf, PathBuf) {
    let dir = cov.join("reports");
    (dir.join(format!("{instance}.lcov")), dir.join(format!("{instance}.json")))
}

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON ({e}): {text}", path.display()))
}

fn wait_exit(child: &mut Child, what: &str) -> ExitStatus {
    poll(what, || child.try_wait().expect("wait for the process"))
}

/// The blocked-signal mask (SigBlk) of every thread of `pid` but its main
/// thread, by thread id.
fn other_threads_blocked(pid: u32) -> BTreeMap<u32, u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("/proc/PID/task");
    tasks
        .flatten()
        .filter_map(|task| {
            let tid: u32 = task.file_name().to_str()?.parse().ok()?;
            let status = std::fs::read_to_string(task.path().join("status")).ok()?; // a thread that just ended
            let mask = status.lines().find_map(|l| l.strip_prefix("SigBlk:"))?.trim();
            (tid != pid).then(|| (tid, u64::from_str_radix(mask, 16).expect("SigBlk in hex")))
        })
        .collect()
}

/// Every thread of `pid` but its main thread (they are the hook's in the
/// fixtures that call this) blocks every asynchronous signal, and none of
/// the synchronous ones (a fault must reach the thread that made it).
fn assert_hook_threads_block_signals(pid: u32, at_least: usize) {
    let threads = other_threads_blocked(pid);
    assert!(threads.len() >= at_least, "process {pid}: threads {threads:?}, wanted at least {at_least}");
    let bit = |signal: i32| 1u64 << (signal - 1);
    let synchronous = [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGSYS];
    // SIGKILL and SIGSTOP cannot be blocked; glibc keeps the two signals
    // below SIGRTMIN for itself.
    let asynchronous: Vec<i32> = (1..32)
        .filter(|s| !synchronous.contains(s) && *s != libc::SIGKILL && *s != libc::SIGSTOP)
        .chain(libc::SIGRTMIN()..=libc::SIGRTMAX())
        .collect();
    for (tid, mask) in threads {
        let unblocked: Vec<i32> = asynchronous.iter().copied().filter(|&s| mask & bit(s) == 0).collect();
        assert!(unblocked.is_empty(), "thread {tid} of {pid} (SigBlk {mask:016x}) leaves signals {unblocked:?} unblocked");
        let blocked: Vec<i32> = synchronous.iter().copied().filter(|&s| mask & bit(s) != 0).collect();
        assert!(blocked.is_empty(), "thread {tid} of {pid} (SigBlk {mask:016x}) blocks the synchronous {blocked:?}");
    }
}

// ---------------------------------------------------------------- a script

/// A fixture script under the hook, in `target/tmp/py/<name>-<pid>`:
/// `LIVECOV_DIR` is its `cov`, its stderr goes to `stderr.txt` beside it.
struct Script {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    dir: PathBuf,
    cov: PathBuf,
}

impl Script {
    fn start(py: Python, name: &str, args: &[&str], env: &[(&str, &str)]) -> Script {
        let dir = scratch(GROUP, &format!("{name}-{}", py.label()));
        let cov = dir.join("cov");
        let mut cmd = py.command("python");
        cmd.args(args).env("LIVECOV_DIR", &cov);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Script::spawn(cmd, dir, cov)
    }

    fn spawn(cmd: Command, dir: PathBuf, cov: PathBuf) -> Script {
        let stderr = File::create(dir.join("stderr.txt")).expect("stderr file");
        Script::spawn_with(cmd, dir, cov, stderr.into())
    }

    fn spawn_with(mut cmd: Command, dir: PathBuf, cov: PathBuf, stderr: Stdio) -> Script {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Script { child, stdin, stdout, dir, cov }
    }

    /// `plain.py` with `args`, once it said `ready`.
    fn plain(py: Python, name: &str, args: &[&str], env: &[(&str, &str)]) -> Script {
        let mut all = vec!["plain.py"];
        all.extend_from_slice(args);
        let mut script = Script::start(py, name, &all, env);
        let line = script.line();
        assert!(line.starts_with("ready "), "plain.py said {line:?}; stderr: {}", script.stderr());
        script
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read the script's output");
        line.trim_end().to_owned()
    }

    fn send(&mut self, command: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        writeln!(stdin, "{command}").and_then(|()| stdin.flush()).expect("write to the script");
    }

    /// Runs `later` in the script and waits for its answer.
    fn call_later(&mut self) {
        self.send("call");
        assert_eq!(self.line(), "later 14");
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr.txt")).unwrap_or_default()
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn instance_of(&self, pid: u32) -> String {
        poll("the hook's socket", || find_instance(&self.cov, "python", pid))
    }

    fn instance(&self) -> String {
        self.instance_of(self.pid())
    }

    fn socket_of(&self, pid: u32) -> PathBuf {
        self.cov.join("sockets").join(format!("{}.sock", self.instance_of(pid)))
    }

    fn socket(&self) -> PathBuf {
        self.socket_of(self.pid())
    }

    fn get(&self, path: &str) -> Response {
        unix_request(&self.socket(), "GET", path, &[])
    }

    /// `GET /coverage<query>` of process `pid`; must be a 200 that says how
    /// long it took.
    fn coverage_of(&self, pid: u32, query: &str) -> String {
        get_report(&self.socket_of(pid), &format!("/coverage{query}")).text()
    }

    fn coverage(&self, query: &str) -> String {
        self.coverage_of(self.pid(), query)
    }

    fn socket_path_exists(&self, instance: &str) -> bool {
        self.cov.join("sockets").join(format!("{instance}.sock")).exists()
    }

    fn wait(&mut self) -> ExitStatus {
        self.stdin.take();
        wait_exit(&mut self.child, "the script to end")
    }

    fn signal(&self, signal: i32) {
        // Safety: kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(self.pid() as i32, signal) }, 0, "kill");
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------- plain scripts

fn the_hook_is_off_without_livecov_dir_and_on_with_it(py: Python) {
    let site = std::fs::read_dir(py.venv().join("lib"))
        .expect("the venv's lib folder")
        .flatten()
        .map(|e| e.path().join("site-packages/livecov_hook.pth"))
        .find(|p| p.is_file());
    assert!(site.is_some(), "pip did not install livecov_hook.pth into the venv's site-packages");

    let probe = "import sys; print(sorted(m for m in ('coverage', 'livecov_hook') if m in sys.modules))";
    let off = run_checked(py.command("python").args(["-c", probe]), "python without LIVECOV_DIR");
    assert_eq!(String::from_utf8_lossy(&off.stdout).trim(), "[]", "the hook imported something while off");
    assert!(off.stderr.is_empty(), "{}", String::from_utf8_lossy(&off.stderr));

    let dir = scratch(GROUP, &format!("on-{}", py.label()));
    let cov = dir.join("cov");
    let on = run_checked(py.command("python").args(["-c", probe]).env("LIVECOV_DIR", &cov), "python with LIVECOV_DIR");
    assert_eq!(String::from_utf8_lossy(&on.stdout).trim(), "['coverage', 'livecov_hook']");
    let metadata: Vec<_> = std::fs::read_dir(cov.join("reports"))
        .expect("reports/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    assert_eq!(metadata.len(), 1, "one instance, one metadata file: {metadata:?}");
    let meta = read_json(&metadata[0]);
    assert_eq!(meta["runtime"], "python");
    if let Some(version) = py.version() {
        assert!(meta["python"].as_str().is_some_and(|v| v.starts_with(&format!("{version}."))), "{meta}");
    }
    assert_eq!(meta["state"], "exited");
    let instance = meta["instance"].as_str().expect("instance");
    assert!(instance.starts_with(&format!("python-{}-", meta["pid"])), "{instance}");
    assert_eq!(instance.rsplit('-').next().map(str::len), Some(16), "{instance}");
    assert!(std::fs::read_dir(cov.join("sockets")).expect("sockets/").next().is_none(), "socket left behind");
}

fn a_function_is_uncovered_before_its_call_and_covered_after(py: Python) {
    let later = body_lines("plain.py", "later");
    let mut script = Script::plain(py, "lines", &[], &[]);
    let instance = script.instance();
    let before = script.coverage("");
    assert!(counts(&before, "/plain.py", &later).iter().all(|&c| c == 0), "later ran already:\n{before}");
    let functions = parse_lcov(&before);
    assert_eq!(file_ending(&functions, "/plain.py").functions.get("later"), Some(&0));

    script.call_later();
    let after = script.coverage("");
    assert!(counts(&after, "/plain.py", &later).iter().all(|&c| c == 1), "later's lines after its call:\n{after}");
    assert_eq!(file_ending(&parse_lcov(&after), "/plain.py").functions.get("later"), Some(&1));
    let (lcov_path, json_path) = reports(&script.cov, &instance);
    assert_eq!(read_json(&json_path)["state"], "running");
    assert!(!lcov_path.exists(), "a report before any flush or exit");

    script.send("exit");
    assert!(script.wait().success(), "stderr: {}", script.stderr());
    let last = std::fs::read_to_string(&lcov_path).expect("the final report");
    assert!(counts(&last, "/plain.py", &later).iter().all(|&c| c == 1), "{last}");
    assert_eq!(read_json(&json_path)["state"], "exited");
    assert!(!script.socket_path_exists(&instance), "the socket outlived the process");
    assert!(script.stderr().is_empty(), "the hook said something: {}", script.stderr());
}

fn reset_and_test_names_give_per_test_reports(py: Python) {
    let later = body_lines("plain.py", "later");
    let mut script = Script::plain(py, "reset", &[], &[]);
    script.call_later();

    let first = script.coverage("?test=first&reset=1");
    let records = first.lines().filter(|l| l.starts_with("SF:")).count();
    assert!(records > 0);
    assert_eq!(first.lines().filter(|l| *l == "TN:first").count(), records, "a TN: before every record:\n{first}");
    assert!(counts(&first, "/plain.py", &later).iter().all(|&c| c == 1));

    // Nothing ran since but the script's return from its answer to its loop
    // (the arc from the print to the `for` may come just after the answer):
    // every other line is back to zero.
    let zero = script.coverage("");
    let return_arc = [line_of("plain.py", "for line in sys.stdin:"), line_of("plain.py", "print(\"later\", later(4), flush=True)")];
    let hit: BTreeMap<_, _> = lines_hit(&zero)
        .into_iter()
        .map(|(file, lines)| {
            let others: Vec<u32> =
                lines.into_iter().filter(|l| !(file.ends_with("/plain.py") && return_arc.contains(l))).collect();
            (file, others)
        })
        .filter(|(_, l)| !l.is_empty())
        .collect();
    assert!(hit.is_empty(), "lines hit after the reset: {hit:?}");

    script.call_later();
    let second = script.coverage("?test=second");
    assert!(second.lines().any(|l| l == "TN:second"));
    assert!(counts(&second, "/plain.py", &later).iter().all(|&c| c == 1), "{second}");

    let r = unix_request(&script.socket(), "POST", "/reset", &[]);
    assert_eq!(r.status, 204);
    assert!(r.body.is_empty());
    assert_eq!(r.header("livecov-instance"), Some(script.instance().as_str()));
    let after = script.coverage("");
    assert!(counts(&after, "/plain.py", &later).iter().all(|&c| c == 0), "{after}");
    let summary = script.get("/coverage?format=json").json();
    assert!(summary["totals"]["lines_hit"].as_u64() <= Some(return_arc.len() as u64), "{summary}");
}

#[test]
fn health_errors_and_limits() {
    let script = Script::plain(Python::System, "health", &[], &[]);
    let instance = script.instance();
    let socket = script.socket();
    let mode = std::fs::metadata(&socket).expect("socket").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode");

    let health = script.get("/health");
    assert_eq!(health.status, 200);
    assert_eq!(health.header("content-type"), Some("application/json"));
    assert_eq!(health.header("livecov-instance"), Some(instance.as_str()));
    let h = health.json();
    assert_eq!(h["instance"], instance.as_str());
    assert_eq!(h["runtime"], "python");
    assert_eq!(h["pid"], script.pid());
    assert_eq!(h["ppid"], std::process::id());
    assert_eq!(h["state"], "running");
    assert_eq!(h["tcp"], serde_json::Value::Null);
    assert!(h["livecov_version"].as_str().is_some_and(|v| !v.is_empty()), "{h}");
    assert!(h["program"].as_str().is_some_and(|p| p.ends_with("/plain.py")), "{h}");
    assert!(h["uptime_secs"].as_f64().is_some() && h["start_time"].as_u64().is_some_and(|t| t > 0), "{h}");
    let modules: Vec<&str> = h["modules"].as_array().expect("modules").iter().filter_map(|m| m.as_str()).collect();
    assert!(modules.iter().any(|m| m.ends_with("/plain.py")), "{modules:?}");

    let json = script.get("/coverage?format=json");
    assert_eq!(json.status, 200);
    assert_eq!(json.header("content-type"), Some("application/json"));
    let summary = json.json();
    let plain = summary["files"].as_array().expect("files").iter().find(|f| f["file"].as_str().is_some_and(|p| p.ends_with("/plain.py")));
    assert!(plain.is_some_and(|f| f["lines"].as_u64() > Some(0)), "{summary}");
    assert!(summary["totals"]["functions"].as_u64() >= Some(2), "{summary}");
    assert_eq!(script.get("/coverage").header("content-type"), Some("text/plain; charset=utf-8"));

    let error = |r: &Response, status: u16, needle: &str| {
        assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.header("livecov-instance"), Some(instance.as_str()));
        assert_eq!(r.header("content-type"), Some("application/json"));
        let message = r.json()["error"].as_str().expect("{\"error\": ...}").to_owned();
        assert!(message.contains(needle), "{message:?} does not say {needle:?}");
    };
    error(&script.get("/nowhere"), 404, "no route /nowhere");
    let wrong_method = script.get("/reset");
    error(&wrong_method, 405, "allowed: POST");
    assert_eq!(wrong_method.header("allow"), Some("POST"));
    error(&unix_request(&socket, "POST", "/coverage", &[]), 405, "allowed: GET");
    error(&script.get("/coverage?format=profraw"), 400, "profraw");
    error(&script.get("/coverage?format=xml"), 400, "lcov, json");
    error(&script.get("/coverage?colour=red"), 400, "unknown query parameter");
    error(&script.get("/coverage?reset=maybe"), 400, "reset");
    error(&script.get("/coverage?test=a%0Ab"), 400, "control characters");
    error(&script.get("/coverage?test=%zz"), 400, "percent-encoding");
    error(&unix_request(&socket, "POST", "/reset", &["content-length: 100000"]), 413, "body");

    // Bad clients get an answer and the program does not notice.
    let raw = |bytes: &[u8]| {
        let mut s = livecov_tests::http::connect_unix(&socket);
        s.write_all(bytes).expect("send");
        let mut out = Vec::new();
        s.read_to_end(&mut out).expect("read");
        parse_response(&out)
    };
    error(&raw(b"NOT HTTP\r\n\r\n"), 400, "malformed");
    let mut huge = b"GET /health HTTP/1.1\r\nx-filler: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 20_000));
    huge.extend_from_slice(b"\r\n\r\n");
    error(&raw(&huge), 431, "head");
    // Two requests on one kept-alive connection.
    let mut s = livecov_tests::http::connect_unix(&socket);
    s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\nGET /coverage HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").expect("send");
    let mut both = String::new();
    s.read_to_string(&mut both).expect("read");
    assert_eq!(both.matches("HTTP/1.1 200 OK").count(), 2, "{both}");

    // Concurrent dumps all answer, with the same report (nothing runs meanwhile).
    let bodies: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8).map(|_| scope.spawn(|| script.coverage(""))).collect();
        handles.into_iter().map(|h| h.join().expect("dump thread")).collect()
    });
    assert!(bodies.windows(2).all(|w| w[0] == w[1]), "concurrent dumps differ");
    assert_eq!(script.get("/health").status, 200);
}

#[test]
fn tcp_needs_the_bearer_token_and_the_socket_does_not() {
    let dir = scratch(GROUP, "tcp-token");
    let token_file = dir.join("token");
    std::fs::write(&token_file, "s3cret\n").expect("token file");
    let token_env = token_file.display().to_string();
    let script = Script::plain(Python::System, "tcp", &[], &[("LIVECOV_LISTEN", "127.0.0.1:0"), ("LIVECOV_TOKEN_FILE", &token_env)]);
    let instance = script.instance();
    let address = script.get("/health").json()["tcp"].as_str().expect("the TCP address in /health").to_owned();
    assert!(address.starts_with("127.0.0.1:") && !address.ends_with(":0"), "{address}");
    let tcp = |headers: &[&str]| {
        exchange(std::net::TcpStream::connect(&address).expect("connect over TCP"), "GET", "/coverage", headers)
    };
    for headers in [&[][..], &["authorization: Bearer wrong"], &["authorization: Basic s3cret"]] {
        let r = tcp(headers);
        assert_eq!(r.status, 401, "{headers:?}");
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        assert_eq!(r.header("livecov-instance"), Some(instance.as_str()));
        assert!(r.json()["error"].as_str().is_some_and(|e| e.contains("bearer token")));
    }
    let ok = tcp(&["authorization: Bearer s3cret"]);
    assert_eq!(ok.status, 200);
    assert!(ok.text().contains("/plain.py"), "{}", ok.text());
    assert_eq!(script.get("/coverage").status, 200, "the Unix socket wants no token");
}

// ---------------------------------------------------------------- fork and signals

fn a_forked_child_is_an_instance_of_its_own_counting_from_zero(py: Python) {
    let before = body_lines("forker.py", "before_fork");
    let child_lines = body_lines("forker.py", "in_child");
    let parent_lines = body_lines("forker.py", "in_parent");
    let mut script = Script::start(py, "fork", &["forker.py"], &[]);
    let mut pids = BTreeMap::new();
    for _ in 0..2 {
        let line = script.line();
        let (who, pid) = line.split_once(' ').unwrap_or_else(|| panic!("forker.py said {line:?}"));
        pids.insert(who.to_owned(), pid.parse::<u32>().expect("pid"));
    }
    let (parent, child) = (pids["parent"], pids["child"]);
    assert_eq!(parent, script.pid());
    let parent_instance = script.instance_of(parent);
    let child_instance = script.instance_of(child);
    assert_ne!(parent_instance, child_instance);
    let health = unix_request(&script.socket_of(child), "GET", "/health", &[]).json();
    assert_eq!(health["ppid"], parent);
    assert_eq!(health["pid"], child);
    // The child's threads, started by the fork's hook, block the signals as the parent's do.
    assert_hook_threads_block_signals(parent, 2);
    assert_hook_threads_block_signals(child, 2);

    let in_child = script.coverage_of(child, "");
    assert!(counts(&in_child, "/forker.py", &child_lines).iter().all(|&c| c == 1), "{in_child}");
    assert!(counts(&in_child, "/forker.py", &before).iter().all(|&c| c == 0), "the parent's lines in the child:\n{in_child}");
    assert!(counts(&in_child, "/forker.py", &parent_lines).iter().all(|&c| c == 0));
    let in_parent = script.coverage_of(parent, "");
    assert!(counts(&in_parent, "/forker.py", &before).iter().all(|&c| c == 1), "{in_parent}");
    assert!(counts(&in_parent, "/forker.py", &parent_lines).iter().all(|&c| c == 1));
    assert!(counts(&in_parent, "/forker.py", &child_lines).iter().all(|&c| c == 0));

    assert!(script.wait().success(), "stderr: {}", script.stderr());
    let finals: Vec<PathBuf> = [&parent_instance, &child_instance]
        .iter()
        .map(|instance| {
            let (lcov, json) = reports(&script.cov, instance);
            assert_eq!(read_json(&json)["state"], "exited", "{instance}");
            lcov
        })
        .collect();
    // Parent and child add up to what ran: each line once.
    let merged = run_checked(Command::new(livecov_bin()).arg("merge").args(&finals), "livecov merge");
    let merged = String::from_utf8(merged.stdout).expect("LCOV");
    for lines in [&before, &child_lines, &parent_lines] {
        assert!(counts(&merged, "/forker.py", lines).iter().all(|&c| c == 1), "{merged}");
    }
    // Python 3.12+ warns at a fork with threads: the hook's must not make it so.
    assert!(script.stderr().is_empty(), "{}", script.stderr());
}

/// Whether the interpreter warns at a fork in a multi-threaded process (3.12+).
fn warns_at_fork_with_threads(py: Python) -> bool {
    let out = run_checked(py.command("python").args(["-c", "import sys; print(sys.version_info >= (3, 12))"]), "python -c");
    String::from_utf8_lossy(&out.stdout).trim() == "True"
}

fn a_program_with_threads_of_its_own_still_gets_pythons_fork_warning(py: Python) {
    let mut script = Script::start(py, "fork-thread", &["forker.py", "--thread"], &[]);
    let lines = [script.line(), script.line()];
    assert!(lines.iter().any(|l| l.starts_with("child ")), "forker.py said {lines:?}; stderr: {}", script.stderr());
    assert!(script.wait().success(), "stderr: {}", script.stderr());
    let stderr = script.stderr();
    let warned = stderr.contains("DeprecationWarning: This process") && stderr.contains("is multi-threaded, use of fork()");
    assert_eq!(warned, warns_at_fork_with_threads(py), "stderr: {stderr}");
    assert!(!stderr.contains("livecov:"), "{stderr}");
}

/// subprocess forks to run a program with a preexec_fn, and the fork hooks
/// run in the child, which execs at once: an instance started there went
/// with the exec, its socket left behind and its metadata `running` (three
/// runs: three sockets, three instances `running`). No instance is started.
fn a_program_run_through_subprocess_with_a_preexec_fn_leaves_no_instance(py: Python) {
    let mut script = Script::start(py, "spawner", &["spawner.py"], &[]);
    let said: Vec<String> = (0..4).map(|_| script.line()).collect();
    assert_eq!(said, ["0", "0", "0", "done"], "stderr: {}", script.stderr());
    assert!(script.wait().success(), "stderr: {}", script.stderr());
    assert!(script.stderr().is_empty(), "{}", script.stderr());
    let mut instances = Vec::new();
    for entry in std::fs::read_dir(script.cov.join("reports")).expect("reports/").flatten() {
        if entry.path().extension().is_some_and(|x| x == "json") {
            let meta = read_json(&entry.path());
            assert_eq!(meta["state"], "exited", "{meta}");
            instances.push(meta["pid"].as_u64().expect("pid") as u32);
        }
    }
    assert_eq!(instances, [script.pid()], "only the program's own instance");
    let sockets_left: Vec<_> = std::fs::read_dir(script.cov.join("sockets")).expect("sockets/").flatten().collect();
    assert!(sockets_left.is_empty(), "{sockets_left:?}");
}

/// A child forked by the program's own `os.fork()` that then runs another
/// program (`os.execvp`, whose first try fails): its final report, with
/// what it ran before, `exited` with that program, and no socket left.
fn a_forked_child_that_runs_another_program_leaves_its_final_report(py: Python) {
    let in_child = body_lines("exec_child.py", "in_child");
    let mut script = Script::start(py, "exec-child", &["exec_child.py"], &[]);
    let said = script.line();
    assert_eq!(script.line(), "done", "stderr: {}", script.stderr());
    assert!(script.wait().success(), "stderr: {}", script.stderr());
    assert!(script.stderr().is_empty(), "{}", script.stderr());
    let (child, status) = said.split_once(' ').unwrap_or_else(|| panic!("exec_child.py said {said:?}"));
    assert_eq!(status, "0", "the child ran `true`");
    let child: u64 = child.parse().expect("the child's pid");
    let mut by_pid = BTreeMap::new();
    for entry in std::fs::read_dir(script.cov.join("reports")).expect("reports/").flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|x| x == "json") {
            let meta = read_json(&path);
            assert_eq!(meta["state"], "exited", "{meta}");
            let report = std::fs::read_to_string(path.with_extension("lcov")).expect("the final report");
            by_pid.insert(meta["pid"].as_u64().expect("pid"), (meta, report));
        }
    }
    let parent = u64::from(script.pid());
    assert_eq!(by_pid.keys().copied().collect::<BTreeSet<_>>(), BTreeSet::from([parent, child]));
    let (meta, report) = &by_pid[&child];
    // Named at each try: the last is the one that ran.
    let path = std::env::var_os("PATH").unwrap_or_default();
    let ran = std::env::split_paths(&path).map(|d| d.join("true")).find(|p| p.is_file()).expect("true on PATH");
    let named = meta["exec"].as_str().unwrap_or_else(|| panic!("no exec in {meta}"));
    assert_eq!(Path::new(named), ran, "the program that ran: {meta}");
    assert!(counts(report, "/exec_child.py", &in_child).iter().all(|&c| c == 1), "the child's report:\n{report}");
    let (meta, report) = &by_pid[&parent];
    assert!(meta.get("exec").is_none(), "{meta}");
    assert!(counts(report, "/exec_child.py", &in_child).iter().all(|&c| c == 0), "the parent's report:\n{report}");
    let sockets_left: Vec<_> = std::fs::read_dir(script.cov.join("sockets")).expect("sockets/").flatten().collect();
    assert!(sockets_left.is_empty(), "{sockets_left:?}");
}

fn multiprocessing_children_forked_leave_their_final_reports_at_os_exit(py: Python) {
    let square = body_lines("pool.py", "square");
    let alone = body_lines("pool.py", "alone");
    let mut script = Script::start(py, "pool", &["pool.py"], &[]);
    let line = script.line();
    let out: serde_json::Value = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("pool.py said {line:?} ({e}); stderr: {}", script.stderr()));
    let parent = script.pid();
    assert!(script.wait().success(), "stderr: {}", script.stderr());
    assert!(script.stderr().is_empty(), "{}", script.stderr());
    // sys.exit(7) in the child becomes os._exit(7): the hook passes it on.
    assert_eq!(out["exitcode"], 7, "{out}");
    let pids = |key: &str| -> BTreeSet<u32> {
        out[key].as_array().expect("pids").iter().map(|p| p.as_u64().expect("pid") as u32).collect()
    };
    let (workers, squared_in) = (pids("workers"), pids("squared_in"));
    let process = out["process"].as_u64().expect("pid") as u32;
    assert_eq!(workers.len(), 2, "{out}");
    assert!(!squared_in.is_empty() && squared_in.is_subset(&workers), "{out}");

    // One final report per process: the children's written at os._exit, the parent's at exit.
    let mut by_pid = BTreeMap::new();
    for entry in std::fs::read_dir(script.cov.join("reports")).expect("reports/").flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|x| x == "json") {
            let meta = read_json(&path);
            let pid = meta["pid"].as_u64().expect("pid") as u32;
            assert_eq!(meta["state"], "exited", "{meta}");
            let lcov = path.with_extension("lcov");
            let report = std::fs::read_to_string(&lcov).unwrap_or_else(|e| panic!("{}: {e}", lcov.display()));
            assert!(by_pid.insert(pid, (meta, report)).is_none(), "two instances of {pid}");
        }
    }
    let expected: BTreeSet<u32> = workers.iter().copied().chain([parent, process]).collect();
    assert_eq!(by_pid.keys().copied().collect::<BTreeSet<_>>(), expected);
    for (pid, (meta, report)) in &by_pid {
        let (squared, ran_alone) = (counts(report, "/pool.py", &square), counts(report, "/pool.py", &alone));
        if *pid == parent {
            assert!(squared.iter().chain(&ran_alone).all(|&c| c == 0), "the parent ran no child's code:\n{report}");
            continue;
        }
        assert_eq!(meta["ppid"], parent, "{meta}");
        let want_square = u64::from(squared_in.contains(pid));
        assert!(squared.iter().all(|&c| c == want_square), "worker {pid} (squared: {want_square}):\n{report}");
        let want_alone = u64::from(*pid == process);
        assert!(ran_alone.iter().all(|&c| c == want_alone), "child {pid}:\n{report}");
    }
    let sockets_left: Vec<_> = std::fs::read_dir(script.cov.join("sockets")).expect("sockets/").flatten().collect();
    assert!(sockets_left.is_empty(), "{sockets_left:?}");
}

fn os_exit_of_the_program_leaves_the_final_report_and_its_status(py: Python) {
    let later = body_lines("plain.py", "later");
    let mut script = Script::plain(py, "os-exit", &[], &[]);
    let instance = script.instance();
    script.call_later();
    script.send("os-exit");
    let status = wait_exit(&mut script.child, "os._exit");
    assert_eq!(status.code(), Some(5), "{status:?}; stderr: {}", script.stderr());
    let (lcov, json) = reports(&script.cov, &instance);
    let last = std::fs::read_to_string(&lcov).expect("the final report (os._exit)");
    assert!(counts(&last, "/plain.py", &later).iter().all(|&c| c == 1), "{last}");
    assert!(counts(&last, "/plain.py", &[line_of("plain.py", "os._exit(5)")]) == [1], "{last}");
    assert_eq!(read_json(&json)["state"], "exited");
    assert!(!script.socket_path_exists(&instance), "socket left behind");
    assert!(script.stderr().is_empty(), "{}", script.stderr());
}

fn a_signal_the_program_blocks_and_waits_for_reaches_its_sigwait(py: Python) {
    let work = body_lines("sigwait.py", "work");
    // SIGUSR1 has no handler (its default ends the process); SIGTERM has the hook's.
    for (signal, name) in [(libc::SIGUSR1, "SIGUSR1"), (libc::SIGTERM, "SIGTERM")] {
        for hooked in [false, true] {
            let dir = scratch(GROUP, &format!("sigwait-{name}-{hooked}-{}", py.label()));
            let cov = dir.join("cov");
            let mut cmd = py.command("python");
            cmd.args(["sigwait.py", name]);
            if hooked {
                cmd.env("LIVECOV_DIR", &cov);
            }
            let mut script = Script::spawn(cmd, dir, cov);
            let line = script.line();
            assert_eq!(line, format!("waiting {}", script.pid()), "stderr: {}", script.stderr());
            // Kept open, so that a connection thread is there too.
            let mut connection = None;
            let mut instance = None;
            if hooked {
                instance = Some(script.instance());
                let mut stream = livecov_tests::http::connect_unix(&script.socket());
                stream.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n").expect("send");
                let mut answer = [0u8; 12];
                stream.read_exact(&mut answer).expect("the start of the answer");
                assert_eq!(&answer, b"HTTP/1.1 200");
                connection = Some(stream);
                // The engine, accept and connection threads.
                assert_hook_threads_block_signals(script.pid(), 3);
            } else {
                assert!(other_threads_blocked(script.pid()).is_empty(), "threads without the hook");
            }
            script.signal(signal);
            assert_eq!(script.line(), format!("got {name}"), "hook: {hooked}; stderr: {}", script.stderr());
            drop(connection);
            let status = script.wait();
            assert!(status.success(), "hook: {hooked}; {status:?}; stderr: {}", script.stderr());
            if let Some(instance) = instance {
                let (lcov, json) = reports(&script.cov, &instance);
                let last = std::fs::read_to_string(&lcov).expect("the final report");
                assert!(counts(&last, "/sigwait.py", &work).iter().all(|&c| c == 1), "{last}");
                assert_eq!(read_json(&json)["state"], "exited");
            }
        }
    }
}

fn sigterm_and_sigint_without_a_handler_leave_the_final_report_and_the_signal_status(py: Python) {
    let later = body_lines("plain.py", "later");
    for (signal, name) in [(libc::SIGTERM, "sigterm"), (libc::SIGINT, "sigint")] {
        let mut script = Script::plain(py, name, &[], &[]);
        let instance = script.instance();
        script.call_later();
        script.signal(signal);
        let status = wait_exit(&mut script.child, "the script to die of its signal");
        assert_eq!(status.signal(), Some(signal), "{name}: {status:?}; stderr: {}", script.stderr());
        let (lcov, json) = reports(&script.cov, &instance);
        let last = std::fs::read_to_string(&lcov).unwrap_or_else(|e| panic!("{name}: no final report: {e}"));
        assert!(counts(&last, "/plain.py", &later).iter().all(|&c| c == 1), "{name}:\n{last}");
        assert_eq!(read_json(&json)["state"], "exited", "{name}");
        assert!(!script.socket_path_exists(&instance), "{name}: socket left behind");
    }
}

fn a_program_with_its_own_sigterm_handler_keeps_it(py: Python) {
    let later = body_lines("plain.py", "later");
    let mut script = Script::plain(py, "own-handler", &["--own-handler"], &[]);
    let instance = script.instance();
    script.call_later();
    script.signal(libc::SIGTERM);
    assert_eq!(script.line(), "own handler");
    let status = wait_exit(&mut script.child, "the script's own exit");
    assert_eq!(status.code(), Some(3), "{status:?}; stderr: {}", script.stderr());
    let (lcov, json) = reports(&script.cov, &instance);
    let last = std::fs::read_to_string(&lcov).expect("the final report (atexit)");
    assert!(counts(&last, "/plain.py", &later).iter().all(|&c| c == 1), "{last}");
    assert!(counts(&last, "/plain.py", &body_lines("plain.py", "on_term")).iter().all(|&c| c == 1), "{last}");
    assert_eq!(read_json(&json)["state"], "exited");
}

fn periodic_reports_survive_sigkill(py: Python) {
    let later = body_lines("plain.py", "later");
    let mut script = Script::plain(py, "flush", &[], &[("LIVECOV_FLUSH_SECS", "0.1")]);
    let instance = script.instance();
    script.call_later();
    let (lcov, json) = reports(&script.cov, &instance);
    poll("a periodic report with later's lines", || {
        let text = std::fs::read_to_string(&lcov).ok()?;
        let files = parse_lcov(&text);
        let plain = files.iter().find(|(name, _)| name.ends_with("/plain.py"))?.1;
        later.iter().all(|l| plain.lines.get(l) == Some(&1)).then_some(())
    });
    script.signal(libc::SIGKILL);
    assert_eq!(script.wait().signal(), Some(libc::SIGKILL));
    let last = std::fs::read_to_string(&lcov).expect("the last periodic report");
    assert!(counts(&last, "/plain.py", &later).iter().all(|&c| c == 1), "{last}");
    assert_eq!(read_json(&json)["state"], "running", "nobody could say it ended");
}

fn socket_mode_path_map_and_ignore_settings(py: Python) {
    let fixtures = python::fixture_dir().display().to_string();
    let map = format!("{fixtures}/=/src/");
    let script = Script::plain(py, "settings", &[], &[("LIVECOV_SOCKET_MODE", "0660"), ("LIVECOV_PATH_MAP", &map)]);
    let mode = std::fs::metadata(script.socket()).expect("socket").permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);
    let mapped = script.coverage("");
    assert!(mapped.lines().any(|l| l == "SF:/src/plain.py"), "{mapped}");
    assert!(!mapped.contains(&fixtures), "{mapped}");

    // LIVECOV_IGNORE replaces the default: the stdlib is measured now, the
    // script left out; the hook and coverage.py are never in a report.
    let ignoring = Script::plain(py, "ignore", &[], &[("LIVECOV_IGNORE", r"/plain\.py$")]);
    let report = ignoring.coverage("");
    let files: Vec<&str> = report.lines().filter_map(|l| l.strip_prefix("SF:")).collect();
    assert!(!files.iter().any(|f| f.ends_with("/plain.py")), "{files:?}");
    assert!(files.iter().any(|f| f.ends_with("/signal.py")), "the stdlib's signal.py is measured then: {files:?}");
    assert!(!files.iter().any(|f| f.contains("/livecov_hook/") || f.contains("/coverage/")), "{files:?}");
}

#[test]
fn a_bad_setting_is_one_line_on_stderr_and_the_program_runs_on() {
    let mut script = Script::plain(Python::System, "bad-setting", &[], &[("LIVECOV_FLUSH_SECS", "soon")]);
    script.call_later();
    script.send("exit");
    assert!(script.wait().success());
    let stderr = script.stderr();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("livecov: not started: LIVECOV_FLUSH_SECS='soon'"), "{stderr}");
    assert!(!script.cov.exists(), "the hook made its directory anyway");
}

/// A source removed while the program runs is left out of reports, with
/// one line on stderr; where stderr takes nothing, the line is lost and
/// the dump answers all the same.
#[test]
fn a_source_removed_is_left_out_with_one_line_even_one_that_cannot_be_written() {
    let file = |dir: &Path| Stdio::from(File::create(dir.join("stderr.txt")).expect("stderr file"));
    let [gone, full] = livecov_tests::output_taking_nothing();
    for (how, stderr) in [("a file", None), (gone.0, Some(gone.1)), (full.0, Some(full.1))] {
        let dir = scratch(GROUP, "source-removed");
        let source = dir.join("removed.py");
        std::fs::copy(python::fixture_dir().join("plain.py"), &source).expect("copy plain.py");
        let mut cmd = Python::System.command("python");
        cmd.arg(&source).env("LIVECOV_DIR", dir.join("cov"));
        let stderr = stderr.unwrap_or_else(|| file(&dir));
        let mut script = Script::spawn_with(cmd, dir.clone(), dir.join("cov"), stderr);
        assert!(script.line().starts_with("ready "), "{how}");
        script.call_later();
        assert!(script.coverage("").contains("removed.py"), "{how}");
        std::fs::remove_file(&source).expect("remove the source");
        let dump = script.get("/coverage");
        assert_eq!(dump.status, 200, "stderr {how}: {}", dump.text());
        assert!(!dump.text().contains("removed.py"), "stderr {how}");
        script.call_later();
        if how == "a file" {
            let said = script.stderr();
            assert!(said.starts_with(&format!("livecov: {} left out of reports: ", source.display())), "{said}");
        }
        script.send("exit");
        assert!(script.wait().success(), "stderr {how}");
    }
}

#[test]
fn tcp_beyond_loopback_without_a_token_is_refused_unless_asked_for() {
    // Refused: one line, and the socket serves.
    let mut refused = Script::plain(Python::System, "tcp-refused", &[], &[("LIVECOV_LISTEN", "0.0.0.0:0")]);
    assert_eq!(refused.get("/health").json()["tcp"], serde_json::Value::Null);
    refused.send("exit");
    assert!(refused.wait().success());
    let stderr = refused.stderr();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("livecov: not listening on 0.0.0.0:0: it is reachable from other hosts and no token is set")
            && stderr.contains("LIVECOV_LISTEN_WITHOUT_TOKEN=1"),
        "{stderr}"
    );
    // Asked for: served without a token.
    let open = Script::plain(
        Python::System,
        "tcp-open",
        &[],
        &[("LIVECOV_LISTEN", "0.0.0.0:0"), ("LIVECOV_LISTEN_WITHOUT_TOKEN", "1")],
    );
    let tcp = open.get("/health").json()["tcp"].as_str().expect("a TCP address").to_owned();
    let port = tcp.rsplit(':').next().expect("a port");
    let s = std::net::TcpStream::connect(format!("127.0.0.1:{port}")).expect("connect to LIVECOV_LISTEN");
    assert_eq!(livecov_tests::http::exchange(s, "GET", "/health", &[]).status, 200);
}

// ---------------------------------------------------------------- gunicorn

/// The requests of the comparison: every route but the one no test calls,
/// with arguments that take different paths through the app.
const WORKLOAD: &[(&str, &str)] = &[
    ("GET", "/"),
    ("GET", "/items/apple"),
    ("GET", "/items/plum"),
    ("GET", "/price/pear?region=us"),
    ("GET", "/price/pear?region=mars"),
    ("GET", "/price/plum"),
    ("POST", "/order?apple=2&pear=1"),
    ("POST", "/order?bread=20"),
    ("POST", "/order?apple=x"),
    ("POST", "/order?plum=1"),
    ("GET", "/nowhere"),
];

/// Sends the workload three times (over several workers) and returns the
/// statuses of the first round.
fn send_workload(app_socket: &Path) -> Vec<u16> {
    let mut statuses = Vec::new();
    for round in 0..3 {
        for (method, path) in WORKLOAD {
            let r = unix_request(app_socket, method, path, &[]);
            if round == 0 {
                statuses.push(r.status);
            }
        }
    }
    statuses
}

/// gunicorn with four sync workers on a Unix socket, the hook in every process.
struct Gunicorn {
    child: Child,
    dir: PathBuf,
    cov: PathBuf,
    app_socket: PathBuf,
}

impl Gunicorn {
    fn start(py: Python, name: &str) -> Gunicorn {
        let dir = scratch(GROUP, &format!("{name}-{}", py.label()));
        let cov = dir.join("cov");
        let app_socket = dir.join("app.sock");
        let log = File::create(dir.join("gunicorn.log")).expect("log file");
        let child = py.command("gunicorn")
            // A group of its own: dropping the handle ends the workers too.
            .process_group(0)
            .args(["--workers", "4", "--worker-class", "sync", "--no-control-socket", "--graceful-timeout", "20"])
            .arg("--bind")
            .arg(format!("unix:{}", app_socket.display()))
            .arg("app:app")
            .env("LIVECOV_DIR", &cov)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start gunicorn");
        let g = Gunicorn { child, dir, cov, app_socket };
        poll("gunicorn to serve", || {
            let s = livecov_tests::http::try_connect_unix(&g.app_socket).ok()?;
            (exchange(s, "GET", "/", &[]).status == 200).then_some(())
        });
        g
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("gunicorn.log")).unwrap_or_default()
    }

    /// The master's and the four workers' sockets, once every worker has
    /// imported the app (its report names app.py).
    fn instances(&self) -> (PathBuf, Vec<PathBuf>) {
        let master = self.child.id();
        poll("the master and four workers with the app loaded", || {
            let mut master_socket = None;
            let mut workers = Vec::new();
            for entry in std::fs::read_dir(self.cov.join("sockets")).ok()?.flatten() {
                let socket = entry.path();
                let health = std::panic::catch_unwind(|| unix_request(&socket, "GET", "/health", &[])).ok()?;
                let health = health.json();
                if health["pid"] == master {
                    master_socket = Some(socket);
                } else if health["ppid"] == master {
                    let lcov = unix_request(&socket, "GET", "/coverage", &[]).text();
                    if !lcov.lines().any(|l| l.starts_with("SF:") && l.ends_with("/app.py")) {
                        return None;
                    }
                    workers.push(socket);
                }
            }
            (workers.len() == 4).then_some((master_socket?, workers))
        })
    }
}

impl Drop for Gunicorn {
    fn drop(&mut self) {
        // Safety: killpg(2) on the group this test made; the master leads it.
        unsafe { libc::killpg(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// Dumps every socket into `<dir>/<n>.lcov` and merges them with `livecov merge`.
fn dump_and_merge(dir: &Path, sockets: &[PathBuf]) -> String {
    let files: Vec<PathBuf> = sockets
        .iter()
        .enumerate()
        .map(|(i, socket)| {
            let r = unix_request(socket, "GET", "/coverage", &[]);
            assert_eq!(r.status, 200);
            let path = dir.join(format!("{i}.lcov"));
            std::fs::write(&path, &r.body).expect("write a dump");
            path
        })
        .collect();
    merge(&files)
}

fn merge(files: &[PathBuf]) -> String {
    let out = run_checked(Command::new(livecov_bin()).arg("merge").args(files), "livecov merge");
    String::from_utf8(out.stdout).expect("LCOV")
}

/// What the comparison looks at in one file's records: every line (hit or
/// not), the lines hit, every branch and the branches taken, the functions hit.
#[derive(Debug, PartialEq)]
struct Shape {
    lines: BTreeSet<u32>,
    lines_hit: BTreeSet<u32>,
    branches: BTreeSet<(u32, String)>,
    branches_taken: BTreeSet<(u32, String)>,
    functions_hit: BTreeSet<String>,
}

fn shape(lcov: &str, file: &Path) -> Shape {
    let wanted = format!("SF:{}", file.display());
    let mut shape = Shape {
        lines: BTreeSet::new(),
        lines_hit: BTreeSet::new(),
        branches: BTreeSet::new(),
        branches_taken: BTreeSet::new(),
        functions_hit: BTreeSet::new(),
    };
    let mut inside = false;
    let mut seen = false;
    for line in lcov.lines() {
        if line.starts_with("SF:") {
            inside = line == wanted;
            seen |= inside;
            continue;
        }
        if !inside {
            continue;
        }
        if let Some(da) = line.strip_prefix("DA:") {
            let mut parts = da.split(',');
            let number: u32 = parts.next().and_then(|n| n.parse().ok()).expect("DA line");
            shape.lines.insert(number);
            if parts.next().is_some_and(|c| c != "0") {
                shape.lines_hit.insert(number);
            }
        } else if let Some(brda) = line.strip_prefix("BRDA:") {
            // BRDA:line,block,description,taken; coverage.py's descriptions may hold commas.
            let (line_no, rest) = brda.split_once(',').expect("BRDA line");
            let (_, rest) = rest.split_once(',').expect("BRDA block");
            let (description, taken) = rest.rsplit_once(',').expect("BRDA taken");
            let key = (line_no.parse().expect("BRDA line number"), description.to_owned());
            if taken != "-" && taken != "0" {
                shape.branches_taken.insert(key.clone());
            }
            shape.branches.insert(key);
        } else if let Some(fnda) = line.strip_prefix("FNDA:") {
            let (count, name) = fnda.split_once(',').expect("FNDA");
            if count != "0" {
                shape.functions_hit.insert(name.to_owned());
            }
        }
    }
    assert!(seen, "no record of {} in\n{lcov}", file.display());
    shape
}

/// coverage.py's own report of the workload served by one process:
/// `coverage run --branch serve_single.py`, then `coverage lcov`.
fn coverage_run_oracle(py: Python, dir: &Path) -> (String, Vec<u16>) {
    let data = dir.join("oracle.coverage");
    let socket = dir.join("single.sock");
    let mut cmd = py.command("coverage");
    cmd.args(["run", "--branch"])
        .arg(format!("--data-file={}", data.display()))
        .arg(python::fixture_dir().join("serve_single.py"))
        .arg(&socket)
        .current_dir(dir);
    let mut server = Script::spawn(cmd, dir.to_owned(), dir.join("unused"));
    assert_eq!(server.line(), "ready", "serve_single.py; stderr: {}", server.stderr());
    let statuses = send_workload(&socket);
    assert!(server.wait().success(), "coverage run serve_single.py: {}", server.stderr());
    let lcov = dir.join("oracle.lcov");
    run_checked(
        py.command("coverage")
            .arg("lcov")
            .arg(format!("--data-file={}", data.display()))
            .arg("-o")
            .arg(&lcov)
            .current_dir(dir),
        "coverage lcov",
    );
    (std::fs::read_to_string(&lcov).expect("oracle.lcov"), statuses)
}

fn gunicorn_workers_merged_equal_coverage_run_of_the_same_requests(py: Python) {
    let gunicorn = Gunicorn::start(py, "gun-merge");
    let (master, workers) = gunicorn.instances();
    let statuses = send_workload(&gunicorn.app_socket);
    let mut sockets = workers.clone();
    sockets.push(master);
    let merged = dump_and_merge(&gunicorn.dir, &sockets);
    let (oracle, oracle_statuses) = coverage_run_oracle(py, &gunicorn.dir);
    assert_eq!(statuses, oracle_statuses, "gunicorn and the single process answered differently");

    let fixtures = python::fixture_dir();
    for file in ["app.py", "inventory.py"] {
        let path = fixtures.join(file);
        let (ours, theirs) = (shape(&merged, &path), shape(&oracle, &path));
        assert_eq!(ours, theirs, "{file}: the workers' merged report differs from coverage run");
        // A comparison that could fail: some lines and branches are hit, some are not.
        assert!(!ours.lines_hit.is_empty() && ours.lines_hit.len() < ours.lines.len(), "{file}: {ours:?}");
        assert!(!ours.branches_taken.is_empty() && !ours.functions_hit.is_empty(), "{file}: {ours:?}");
    }
    let inventory = shape(&merged, &fixtures.join("inventory.py"));
    assert!(inventory.branches_taken.len() < inventory.branches.len(), "{inventory:?}");
    let restock = body_lines("inventory.py", "restock");
    assert!(counts(&merged, "/inventory.py", &restock).iter().all(|&c| c == 0), "no route calls restock");
    let discount = body_lines("inventory.py", "bulk_discount");
    assert!(counts(&merged, "/inventory.py", &discount[..1]).iter().all(|&c| c >= 1), "an order over 50.00 ran");
    // The SF lines of the workers' files are those of coverage.py.
    let ours: BTreeSet<_> = merged.lines().filter(|l| l.starts_with("SF:") && l.contains("fixtures/python")).collect();
    let theirs: BTreeSet<_> = oracle
        .lines()
        .filter(|l| l.starts_with("SF:") && l.contains("fixtures/python") && !l.ends_with("serve_single.py"))
        .collect();
    assert_eq!(ours, theirs, "log: {}", gunicorn.log());
}

fn sigterm_to_the_gunicorn_master_leaves_the_final_reports_of_every_worker(py: Python) {
    let mut gunicorn = Gunicorn::start(py, "gun-term");
    let (master, workers) = gunicorn.instances();
    send_workload(&gunicorn.app_socket);
    let mut sockets = workers.clone();
    sockets.push(master);
    let instances: Vec<String> = sockets
        .iter()
        .map(|s| s.file_stem().and_then(|n| n.to_str()).expect("instance").to_owned())
        .collect();
    let live = dump_and_merge(&gunicorn.dir, &sockets);

    // Safety: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(gunicorn.child.id() as i32, libc::SIGTERM) }, 0);
    let status = wait_exit(&mut gunicorn.child, "gunicorn to stop");
    assert!(status.success(), "gunicorn's master after SIGTERM: {status:?}\n{}", gunicorn.log());

    let mut finals = Vec::new();
    for instance in &instances {
        let (lcov, json) = reports(&gunicorn.cov, instance);
        assert_eq!(read_json(&json)["state"], "exited", "{instance}\n{}", gunicorn.log());
        assert!(lcov.is_file(), "{instance} left no final report\n{}", gunicorn.log());
        finals.push(lcov);
    }
    for worker in &finals[..4] {
        let text = std::fs::read_to_string(worker).expect("a worker's final report");
        assert!(text.lines().any(|l| l.starts_with("SF:") && l.ends_with("/app.py")), "{}", worker.display());
    }
    let sockets_left: Vec<_> = std::fs::read_dir(gunicorn.cov.join("sockets")).expect("sockets/").flatten().collect();
    assert!(sockets_left.is_empty(), "{sockets_left:?}");
    // Nothing ran between the live dumps and the SIGTERM: the final reports say the same.
    let merged_finals = merge(&finals);
    let fixtures = python::fixture_dir();
    for file in ["app.py", "inventory.py"] {
        let path = fixtures.join(file);
        assert_eq!(shape(&merged_finals, &path), shape(&live, &path), "{file}");
    }
}
