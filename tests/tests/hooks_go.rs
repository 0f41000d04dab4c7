//! The Go hook (hooks/go), end to end: the fixture service of
//! fixtures/go/service (HTTP over net/http, goroutines, packages of its
//! own) built by a real Go toolchain with `-cover -covermode=atomic
//! -coverpkg=./...,net/http` and the hook's blank import, really requested,
//! dumped over its socket and TCP, reset and signalled. The oracle is Go's
//! own `go tool covdata` over the `?format=covdata` snapshot of the same
//! moment, under the rule of docs/formats.md ("Go").

mod replicas;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::Duration;

use livecov_tests::go::{self, Build};
use livecov_tests::http::{connect_unix, exchange, get_report, parse_response, unix_request, Response};
use livecov_tests::lcov::{file_ending, parse_lcov};
use livecov_tests::service::{find_instance, Service};
use replicas::scratch;
use livecov_tests::{livecov_bin, run_checked, wait_for, Killed};

const GROUP: &str = "go";

fn poll<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    wait_for(what, Duration::from_millis(20), f)
}

/// The fixture service under the hook, in `target/tmp/go/<name>-<pid>`:
/// `LIVECOV_DIR` is its `cov`, its stderr goes to `stderr.txt` beside it.
/// The port of the service's `listening on ADDR` line.
fn port_of(line: &str) -> u16 {
    line.trim()
        .strip_prefix("listening on ")
        .and_then(|addr| addr.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("the service said {line:?}, not `listening on ADDR`"))
}

struct Shop {
    child: Child,
    stdout: BufReader<ChildStdout>,
    dir: PathBuf,
    cov: PathBuf,
    port: u16,
}

impl Shop {
    fn start(name: &str, build: Build, args: &[&str], env: &[(&str, &str)]) -> Shop {
        let dir = scratch(GROUP, name);
        Shop::start_in(&dir, &dir.join("cov"), build, args, env)
    }

    /// The service with `LIVECOV_DIR=cov` (none when `env` sets `LIVECOV_DIR` to "").
    fn start_in(dir: &Path, cov: &Path, build: Build, args: &[&str], env: &[(&str, &str)]) -> Shop {
        let mut cmd = Command::new(go::service(build));
        go::clean_env(&mut cmd);
        cmd.args(args).env("LIVECOV_DIR", cov);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let stderr = File::create(dir.join(format!("stderr-{}.txt", std::process::id()))).expect("stderr file");
        Shop::spawn(cmd, dir, cov, stderr.into())
    }

    /// `cmd` (the service, its arguments and environment) with `stderr`.
    fn spawn(mut cmd: Command, dir: &Path, cov: &Path, stderr: Stdio) -> Shop {
        let mut child = cmd.stdout(Stdio::piped()).stderr(stderr).spawn().unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read the service's first line");
        let port = port_of(&line);
        Shop { child, stdout, dir: dir.to_owned(), cov: cov.to_owned(), port }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join(format!("stderr-{}.txt", std::process::id()))).unwrap_or_default()
    }

    fn instance(&self) -> String {
        poll("the hook's socket", || find_instance(&self.cov, "go", self.child.id()))
    }

    fn socket(&self) -> PathBuf {
        self.cov.join("sockets").join(format!("{}.sock", self.instance()))
    }

    fn request(&self, method: &str, path: &str) -> Response {
        unix_request(&self.socket(), method, path, &[])
    }

    /// `GET /coverage<query>` on the socket; must be a 200 that says how
    /// long it took.
    fn coverage(&self, query: &str) -> Vec<u8> {
        get_report(&self.socket(), &format!("/coverage{query}")).body
    }

    fn lcov(&self, query: &str) -> String {
        String::from_utf8(self.coverage(query)).expect("LCOV is UTF-8")
    }

    /// A request to the service's own API; must be a 200.
    fn get(&self, path: &str) -> String {
        let r = livecov_tests::node::get(self.port, path);
        assert_eq!(r.status, 200, "GET {path}: {}", r.text());
        r.text()
    }

    /// The LCOV once two dumps in a row agree: the server goroutines of the
    /// requests just answered have ended (net/http is covered).
    fn settled_lcov(&self) -> String {
        let mut last = self.lcov("");
        poll("two equal dumps in a row", || {
            std::thread::sleep(Duration::from_millis(50));
            let now = self.lcov("");
            let same = now == last;
            last = now;
            same.then(|| last.clone())
        })
    }

    fn report(&self, ext: &str) -> PathBuf {
        self.report_of(&self.instance(), ext)
    }

    /// A report of `instance`, also once its socket is gone.
    fn report_of(&self, instance: &str, ext: &str) -> PathBuf {
        self.cov.join("reports").join(format!("{instance}.{ext}"))
    }

    fn wait(&mut self) -> ExitStatus {
        let child = &mut self.child;
        poll("the service to exit", || child.try_wait().expect("wait for the service"))
    }

    fn signal(&self, signal: i32) {
        // Safety: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0, "kill {}", self.child.id());
    }
}

impl Drop for Shop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `?format=covdata` answer unpacked into `dir` (with tar, as a user would).
fn unpack(tar: &[u8], dir: &Path) -> Vec<String> {
    std::fs::create_dir_all(dir).expect("a folder for the snapshot");
    let archive = dir.with_extension("tar");
    std::fs::write(&archive, tar).expect("write the tar");
    run_checked(Command::new("tar").arg("-xf").arg(&archive).arg("-C").arg(dir), "tar -x of ?format=covdata");
    let mut names: Vec<String> =
        std::fs::read_dir(dir).expect("the snapshot").flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

/// The rule of docs/formats.md over `go tool covdata textfmt`: per file, per
/// line from each block's start line to its end line, the largest count.
fn rule_over_textfmt(profile: &str) -> BTreeMap<String, BTreeMap<u32, u64>> {
    let mut lines = profile.lines();
    assert_eq!(lines.next(), Some("mode: atomic"), "a text profile of an atomic build");
    let mut files: BTreeMap<String, BTreeMap<u32, u64>> = BTreeMap::new();
    for block in lines {
        let parse = || -> Option<(String, u32, u32, u64)> {
            let (file, rest) = block.rsplit_once(':')?;
            let mut fields = rest.split(' ');
            let (start, end) = fields.next()?.split_once(',')?;
            let _statements = fields.next()?;
            let count = fields.next()?.parse().ok()?;
            Some((file.to_owned(), start.split_once('.')?.0.parse().ok()?, end.split_once('.')?.0.parse().ok()?, count))
        };
        let (file, start, end, count) = parse().unwrap_or_else(|| panic!("not a text profile line: {block:?}"));
        let file = files.entry(file).or_default();
        for line in start..=end.max(start) {
            let c = file.entry(line).or_insert(0);
            *c = (*c).max(count);
        }
    }
    files
}

/// The FN lines of a report: per file, (line, name).
fn fn_lines(lcov: &str) -> BTreeMap<String, Vec<(u32, String)>> {
    let mut out: BTreeMap<String, Vec<(u32, String)>> = BTreeMap::new();
    let mut file = String::new();
    for line in lcov.lines() {
        if let Some(f) = line.strip_prefix("SF:") {
            file = f.to_owned();
        } else if let Some((l, name)) = line.strip_prefix("FN:").and_then(|f| f.split_once(',')) {
            out.entry(file.clone()).or_default().push((l.parse().expect("an FN line"), name.to_owned()));
        }
    }
    out
}

/// Traffic that runs each package of the fixture and goroutines.
fn some_traffic(shop: &Shop) {
    assert!(shop.get("/items/Milk").contains("\"price\":85"));
    assert_eq!(shop.get("/sum?workers=4").trim(), "500500");
    assert_eq!(shop.get("/fib?n=6").trim(), "8");
}

#[test]
fn the_live_report_is_go_tool_covdata_of_the_same_moment_under_the_rule() {
    let shop = Shop::start("oracle", Build::Atomic, &[], &[]);
    some_traffic(&shop);
    // The covdata snapshot between two equal dumps is of their moment.
    let (live, tar) = poll("a covdata snapshot between two equal dumps", || {
        let before = shop.settled_lcov();
        let tar = shop.coverage("?format=covdata");
        (shop.lcov("") == before).then_some((before, tar))
    });
    let snapshot = shop.dir.join("snapshot");
    let names = unpack(&tar, &snapshot);
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names[0].starts_with("covcounters.") && names[1].starts_with("covmeta."), "{names:?}");

    let oracle = rule_over_textfmt(&go::covdata_textfmt(&snapshot));
    let files = parse_lcov(&live);
    assert_eq!(files.keys().collect::<Vec<_>>(), oracle.keys().collect::<Vec<_>>(), "the same files");
    for (file, lines) in &oracle {
        assert_eq!(&files[file].lines, lines, "DA lines of {file}");
    }
    assert!(files.keys().any(|f| f.starts_with("net/http/")), "net/http is covered");
    let compute = file_ending(&files, "shop/compute/compute.go");
    assert_eq!(compute.functions["Fib"], 25, "Fib(6) calls itself 25 times");
    assert_eq!(compute.functions["ParallelSum"], 1);
    let loop_body = (1 + std::fs::read_to_string(go::service_dir().join("compute/compute.go"))
        .expect("compute.go")
        .lines()
        .position(|l| l.contains("parts[w] += i"))
        .expect("the goroutines' loop")) as u32;
    assert_eq!(compute.lines[&loop_body], 1000, "the goroutines' loop body ran 1000 times in all");

    // `go tool covdata func` (what `go tool cover -func` prints): a function
    // is covered in its table when it is hit in the report.
    let func = run_checked(&mut go::go(&["tool", "covdata", "func", "-i", &snapshot.display().to_string()]), "go tool covdata func");
    let func = String::from_utf8(func.stdout).expect("UTF-8");
    let mut compared = 0;
    for row in func.lines().filter(|l| !l.starts_with("total")) {
        let fields: Vec<&str> = row.split_whitespace().collect();
        let [place, name, percent] = fields[..] else { panic!("a covdata func row: {row:?}") };
        let (file, line) = place.trim_end_matches(':').rsplit_once(':').expect("file:line:");
        let record = &files[file];
        // A name repeated in a file (`init`) is made unique with its line.
        let hits = record
            .functions
            .get(&format!("{name} (line {line})"))
            .or_else(|| record.functions.get(name))
            .unwrap_or_else(|| panic!("{file}:{line} {name} is not in the report"));
        let covered = percent != "0.0%";
        assert!((*hits > 0) == covered, "{file}:{line} {name}: {percent} in covdata func, FNDA {hits}");
        compared += 1;
    }
    assert!(compared > 100, "{compared} functions compared");

    // `go tool cover -func` over the text profile, which reads the sources:
    // it names a function by its declaration's line and its bare name
    // (`Write`, not `*chunkWriter.Write`); the report's FN line is its first
    // block's, at or after the declaration. Covered in its table when hit in
    // the report, function by function.
    let profile = snapshot.with_extension("txt");
    let cover = run_checked(
        go::go(&["tool", "cover", &format!("-func={}", profile.display())]).current_dir(go::service_dir()),
        "go tool cover -func",
    );
    let cover = String::from_utf8(cover.stdout).expect("UTF-8");
    let fn_lines = fn_lines(&live);
    let mut agreed = 0;
    for row in cover.lines().filter(|l| !l.starts_with("total:")) {
        let fields: Vec<&str> = row.split_whitespace().collect();
        let [place, name, percent] = fields[..] else { panic!("a cover -func row: {row:?}") };
        let (file, line) = place.trim_end_matches(':').rsplit_once(':').expect("file:line:");
        let line: u32 = line.parse().expect("a line number");
        let bare = |ours: &str| ours.split(" (line").next().unwrap_or(ours).rsplit('.').next().unwrap_or(ours).to_owned();
        let ours = fn_lines[file]
            .iter()
            .filter(|(fn_line, ours)| *fn_line >= line && bare(ours) == name)
            .min_by_key(|(fn_line, _)| *fn_line)
            .unwrap_or_else(|| panic!("{file}:{line} {name} of cover -func is not in the report"));
        let hits = files[file].functions[&ours.1];
        assert!((hits > 0) == (percent != "0.0%"), "{file}:{line} {name}: {percent} in cover -func, FNDA {hits} ({})", ours.1);
        agreed += 1;
    }
    assert!(agreed > 100, "{agreed} functions compared with cover -func");

    // livecov convert over the same snapshot, with no Go tool: the same report.
    let converted = shop.dir.join("converted.lcov");
    let out = Command::new(livecov_bin())
        .args(["convert", "--go-coverdir"])
        .arg(&snapshot)
        .arg("-o")
        .arg(&converted)
        .output()
        .expect("run livecov convert");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read_to_string(&converted).expect("the converted report") == live, "convert --go-coverdir is the live report");
}

#[test]
fn the_hooks_own_go_tests_and_vet_pass() {
    let hook = livecov_tests::workspace_root().join("hooks/go");
    for args in [&["vet", "./..."][..], &["test", "-count=1", "./..."]] {
        let out = go::go(args).current_dir(&hook).output().expect("run go");
        assert!(out.status.success(), "go {args:?}:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    let unformatted = run_checked(Command::new(go::gofmt()).arg("-l").arg(&hook), "gofmt -l hooks/go");
    assert!(unformatted.stdout.is_empty(), "not gofmt'ed: {}", String::from_utf8_lossy(&unformatted.stdout));
}

#[test]
fn reset_dump_and_reset_and_test_names() {
    let shop = Shop::start("reset", Build::Atomic, &[], &[]);
    let fib = |lcov: &str| file_ending(&parse_lcov(lcov), "shop/compute/compute.go").functions["Fib"];
    let lookup = |lcov: &str| file_ending(&parse_lcov(lcov), "shop/inventory/inventory.go").functions["Lookup"];
    shop.get("/fib?n=3");
    shop.get("/items/pear");
    let named = shop.lcov("?test=checkout+page");
    assert!(named.lines().filter(|l| l.starts_with("SF:")).count() > 3);
    assert_eq!(
        named.lines().filter(|l| l.starts_with("TN:")).count(),
        named.lines().filter(|l| l.starts_with("SF:")).count(),
        "a TN: line before each record"
    );
    assert!(named.lines().filter(|l| l.starts_with("TN:")).all(|l| l == "TN:checkout page"));

    // Dump and reset: what it returns, and nothing of it again.
    let first = shop.lcov("?reset=1");
    assert_eq!((fib(&first), lookup(&first)), (5, 1));
    shop.get("/fib?n=2");
    let second = shop.lcov("?reset=1");
    assert_eq!((fib(&second), lookup(&second)), (3, 0), "counted from the reset");
    // Two callers that both reset get disjoint parts: no call is in both or neither.
    shop.get("/fib?n=4");
    let mut parts = Vec::new();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|_| s.spawn(|| shop.lcov("?reset=1"))).collect();
        parts = handles.into_iter().map(|h| h.join().expect("a dump")).collect();
    });
    assert_eq!(parts.iter().map(|p| fib(p)).sum::<u64>(), 9, "Fib(4) is 9 calls in all");

    shop.get("/fib?n=1");
    let r = shop.request("POST", "/reset");
    assert_eq!(r.status, 204);
    assert_eq!(r.header("livecov-instance"), Some(shop.instance().as_str()));
    let after = shop.lcov("");
    assert_eq!(fib(&after), 0, "POST /reset: later dumps count from then");

    // The JSON summary counts the same report.
    let r = shop.request("GET", "/coverage?format=json");
    assert_eq!(r.header("content-type"), Some("application/json"));
    let summary = r.json();
    let files = parse_lcov(&shop.lcov(""));
    let lines: usize = files.values().map(|f| f.lines.len()).sum();
    assert_eq!(summary["totals"]["lines"].as_u64(), Some(lines as u64));
    assert_eq!(summary["files"].as_array().map(Vec::len), Some(files.len()));
}

#[test]
fn health_and_the_metadata_files() {
    let shop = Shop::start("health", Build::Atomic, &[], &[("LIVECOV_SOCKET_MODE", "0660")]);
    let health = shop.request("GET", "/health").json();
    assert_eq!(health["runtime"], "go");
    assert_eq!(health["pid"], shop.child.id());
    assert_eq!(health["instance"], shop.instance().as_str());
    assert_eq!(health["state"], "running");
    assert!(health["go"].as_str().is_some_and(|v| v.starts_with("go1.")), "{health}");
    assert!(health["modules"].as_array().is_some_and(|m| m.iter().any(|p| p == "net/http")), "{health}");
    let keys = |v: &serde_json::Value| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
    let on_disk: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(shop.report("json")).expect("the metadata file")).expect("JSON");
    assert_eq!(keys(&on_disk), keys(&health));
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(shop.socket()).expect("the socket").permissions().mode() & 0o777;
    assert_eq!(mode, 0o660, "LIVECOV_SOCKET_MODE");
}

#[test]
fn sigterm_without_a_handler_leaves_the_final_report_and_the_signal_status() {
    for (signal, name) in [(libc::SIGTERM, "sigterm"), (libc::SIGINT, "sigint")] {
        let mut shop = Shop::start(name, Build::Atomic, &[], &[]);
        shop.get("/items/apple");
        let socket = shop.socket();
        let (lcov, json) = (shop.report("lcov"), shop.report("json"));
        shop.signal(signal);
        let status = shop.wait();
        assert_eq!(status.signal(), Some(signal), "{name}: killed by the signal, as without the hook ({status:?})");
        let report = std::fs::read_to_string(&lcov).expect("the final report");
        assert_eq!(file_ending(&parse_lcov(&report), "shop/inventory/inventory.go").functions["Lookup"], 1, "{name}");
        let meta: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("metadata")).expect("JSON");
        assert_eq!(meta["state"], "exited", "{name}");
        assert!(!socket.exists(), "{name}: the socket is removed");
    }
    // Without the hook, the status is the same.
    let dir = scratch(GROUP, "sigterm-plain");
    let mut plain = Shop::start_in(&dir, Path::new(""), Build::Atomic, &[], &[]);
    plain.signal(libc::SIGTERM);
    assert_eq!(plain.wait().signal(), Some(libc::SIGTERM));
}

/// A program that runs itself again in its place (`syscall.Exec`): the
/// next program's hook ends the instance the first one left running, which
/// no goroutine served any longer. Before, its socket stayed, where
/// nothing answered, and its metadata said `running`.
#[test]
fn a_program_that_runs_itself_again_in_place_ends_its_last_instance() {
    let mut shop = Shop::start("reexec", Build::Atomic, &[], &[("LIVECOV_FLUSH_SECS", "0.1")]);
    shop.get("/items/apple");
    let first = shop.instance();
    poll("a periodic report", || std::fs::metadata(shop.report_of(&first, "lcov")).is_ok_and(|m| m.len() > 0).then_some(()));
    assert_eq!(shop.get("/reexec").trim(), "again");
    let mut line = String::new();
    shop.stdout.read_line(&mut line).expect("the program's line, run again");
    shop.port = port_of(&line);
    let pid = shop.child.id();
    poll("the new instance's socket", || find_instance(&shop.cov, "go", pid).filter(|i| *i != first));
    let meta: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(shop.report_of(&first, "json")).expect("metadata")).expect("JSON");
    assert_eq!(meta["state"], "exited", "{meta}");
    let program = std::fs::canonicalize(go::service(Build::Atomic)).expect("the program");
    assert_eq!(meta["exec"].as_str().map(PathBuf::from), Some(program), "{meta}");
    let sockets: Vec<_> = std::fs::read_dir(shop.cov.join("sockets")).expect("sockets").flatten().map(|e| e.file_name()).collect();
    assert_eq!(sockets.len(), 1, "only the new instance's socket: {sockets:?}");
    assert!(shop.lcov("").contains("inventory.go"), "the new instance answers");
    assert_eq!(shop.get("/quit").trim(), "bye");
    assert!(shop.wait().success(), "{}", shop.stderr());
    assert!(shop.stderr().is_empty(), "{}", shop.stderr());
}

#[test]
fn a_program_that_takes_sigterm_itself_behaves_as_without_the_hook() {
    let mut outcomes = Vec::new();
    for hook in [false, true] {
        let dir = scratch(GROUP, &format!("handler-{hook}"));
        let cov = if hook { dir.join("cov") } else { PathBuf::new() };
        let mut shop = Shop::start_in(&dir, &cov, Build::Atomic, &["-handle-signals", "-stop-after", "500ms"], &[]);
        shop.get("/fib?n=2");
        let instance = hook.then(|| shop.instance());
        shop.signal(libc::SIGTERM);
        let status = shop.wait();
        let mut rest = String::new();
        shop.stdout.read_to_string(&mut rest).expect("the rest of its output");
        if hook {
            // The reports written while it stopped have its handler's lines.
            let report = std::fs::read_to_string(shop.report_of(&instance.expect("the instance"), "lcov")).expect("the last report");
            let main = std::fs::read_to_string(go::service_dir().join("main.go")).expect("main.go");
            let printf = 1 + main.lines().position(|l| l.contains(r#"fmt.Printf("stopping on"#)).expect("the handler's line") as u32;
            assert_eq!(file_ending(&parse_lcov(&report), "shop/main.go").lines[&printf], 1, "the handler ran before the last report");
        }
        outcomes.push((status.code(), status.signal(), rest));
    }
    assert_eq!(outcomes[0], (Some(3), None, "stopping on terminated\n".to_owned()), "without the hook");
    assert_eq!(outcomes[1], outcomes[0], "with the hook");
}

#[test]
fn a_normal_exit_leaves_gos_own_counters_and_a_race_build_no_race_report() {
    for build in [Build::Atomic, Build::Race] {
        let mut shop = Shop::start(&format!("exit-{build:?}"), build, &[], &[]);
        let instance = shop.instance();
        shop.get("/items/milk");
        // The program's environment is as it set it: GOCOVERDIR is the
        // hook's only until the runtime has read it.
        let environ = std::fs::read(format!("/proc/{}/environ", shop.child.id())).expect("the environment");
        assert!(!environ.split(|&b| b == 0).any(|v| v.starts_with(b"GOCOVERDIR=")), "{build:?}");
        assert!(!shop.lcov("").is_empty());
        assert_eq!(shop.get("/quit").trim(), "bye");
        let status = shop.wait();
        assert_eq!(status.code(), Some(0), "{build:?}: main returned ({status:?}); stderr: {}", shop.stderr());
        assert!(!shop.stderr().contains("DATA RACE"), "{build:?}: {}", shop.stderr());
        // Go wrote its counters at exit beside the meta-data; one copy of
        // the meta-data for the build.
        let dir = shop.cov.join("go").join(&instance);
        let out = Command::new(livecov_bin()).arg("convert").arg("--go-coverdir").arg(&dir).output().expect("run livecov convert");
        assert!(out.status.success(), "{build:?}: {}", String::from_utf8_lossy(&out.stderr));
        let lcov = String::from_utf8(out.stdout).expect("UTF-8");
        assert_eq!(file_ending(&parse_lcov(&lcov), "shop/inventory/inventory.go").functions["discount"], 1, "{build:?}");
        let shared: Vec<_> = std::fs::read_dir(shop.cov.join("go"))
            .expect("LIVECOV_DIR/go")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("covmeta."))
            .collect();
        assert_eq!(shared.len(), 1, "{build:?}");
        use std::os::unix::fs::MetadataExt;
        assert!(shared[0].metadata().expect("the shared meta-data").nlink() >= 2, "{build:?}: a hard link");
    }
}

#[test]
fn builds_the_hook_cannot_serve_get_one_line_on_stderr_and_no_server() {
    for (build, line) in [
        (Build::Plain, "livecov: not started: this program was not built with -cover (build it with go build -cover -covermode=atomic)"),
        (
            Build::Set,
            "livecov: not started: this program was built with -covermode=set; the hook needs -covermode=atomic (go build -cover -covermode=atomic)",
        ),
    ] {
        let shop = Shop::start(&format!("{build:?}"), build, &[], &[]);
        assert_eq!(shop.get("/fib?n=3").trim(), "2", "{build:?}: the program serves");
        let stderr = poll("the hook's line", || {
            let s = shop.stderr();
            s.contains("livecov:").then_some(s)
        });
        let ours: Vec<&str> = stderr.lines().filter(|l| l.starts_with("livecov:")).collect();
        assert_eq!(ours, [line], "{build:?}: {stderr}");
        assert!(!shop.cov.join("sockets").exists(), "{build:?}: no socket");
    }
    // A bad setting: one line, no server.
    let shop = Shop::start("bad-setting", Build::Atomic, &[], &[("LIVECOV_FLUSH_SECS", "soon")]);
    shop.get("/fib?n=1");
    assert_eq!(
        shop.stderr().lines().filter(|l| l.starts_with("livecov:")).collect::<Vec<_>>(),
        ["livecov: not started: LIVECOV_FLUSH_SECS=\"soon\" is not a positive number of seconds"]
    );
    assert!(!shop.cov.join("sockets").exists());
}

/// Where stderr takes nothing, the line is lost and the program runs on
/// (through os.Stderr, a pipe nobody reads ended it with SIGPIPE).
#[test]
fn a_line_the_hook_cannot_write_does_not_stop_the_program() {
    for (how, stderr) in livecov_tests::output_taking_nothing() {
        let dir = scratch(GROUP, "stderr-taking-nothing");
        let mut cmd = Command::new(go::service(Build::Plain));
        go::clean_env(&mut cmd);
        cmd.env("LIVECOV_DIR", dir.join("cov"));
        let shop = Shop::spawn(cmd, &dir, &dir.join("cov"), stderr);
        assert_eq!(shop.get("/fib?n=3").trim(), "2", "stderr {how}: the program serves");
    }
}

#[test]
fn bad_requests_limits_hostile_clients_and_the_token() {
    let shop = Shop::start("protocol", Build::Atomic, &[], &[("LIVECOV_LISTEN", "127.0.0.1:0"), ("LIVECOV_TOKEN", "s3cret")]);
    let status = |method: &str, path: &str, headers: &[&str]| unix_request(&shop.socket(), method, path, headers).status;
    assert_eq!(status("GET", "/coverage?format=xml", &[]), 400);
    assert_eq!(status("GET", "/coverage?format=profraw", &[]), 400);
    assert_eq!(status("GET", "/coverage?format=counters", &[]), 400, "a sidecar asks, then takes LCOV");
    assert_eq!(status("GET", "/coverage?colour=red", &[]), 400);
    assert_eq!(status("GET", "/coverage?reset=1&reset=0", &[]), 400);
    assert_eq!(status("GET", "/coverage?test=%0A", &[]), 400);
    assert_eq!(status("GET", "/coverage?test=%FF", &[]), 400);
    assert_eq!(status("GET", "/metrics", &[]), 404);
    assert_eq!(status("POST", "/coverage", &[]), 405);
    assert_eq!(status("GET", "/reset", &[]), 405);
    let big = "x".repeat(20_000);
    assert_eq!(status("GET", "/health", &[&format!("x-big: {big}")]), 431);
    let many: Vec<String> = (0..70).map(|i| format!("x-{i}: y")).collect();
    assert_eq!(status("GET", "/health", &many.iter().map(String::as_str).collect::<Vec<_>>()), 431);

    let r = shop.request("GET", "/coverage?format=xml");
    assert_eq!(r.text(), r#"{"error":"invalid format \"xml\" (valid: lcov, json, covdata)"}"#);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    let r = shop.request("POST", "/coverage");
    assert_eq!(r.header("allow"), Some("GET"));
    assert_eq!(r.text(), r#"{"error":"method POST not allowed on /coverage (allowed: GET)"}"#);

    // POST /reset bodies: read and dropped, up to 64 KiB.
    let post = |body: &[u8], extra: &str| {
        let mut s = connect_unix(&shop.socket());
        write!(s, "POST /reset HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{extra}\r\n").expect("send");
        s.write_all(body).expect("send the body");
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).expect("read");
        parse_response(&raw).status
    };
    assert_eq!(post(b"hello", "content-length: 5\r\n"), 204);
    assert_eq!(post(b"5\r\nhello\r\n0\r\n\r\n", "transfer-encoding: chunked\r\n"), 204);
    assert_eq!(post(&[], "content-length: 70000\r\n"), 413);

    // Garbage, a half request left open, a client that goes away: the
    // program and the hook serve on.
    let mut garbage = connect_unix(&shop.socket());
    garbage.write_all(b"\x00\x01\x02 not http\r\n\r\n").expect("send garbage");
    let mut raw = Vec::new();
    garbage.read_to_end(&mut raw).expect("read");
    assert!(raw.starts_with(b"HTTP/1.1 400"), "{:?}", String::from_utf8_lossy(&raw));
    let mut half = connect_unix(&shop.socket());
    half.write_all(b"GET /coverage HTTP/1.1\r\nhost: x\r\n").expect("send half a head");
    drop(connect_unix(&shop.socket()));
    assert_eq!(shop.get("/fib?n=2").trim(), "1");
    assert_eq!(status("GET", "/health", &[]), 200);
    drop(half);

    // TCP: the token on every route, compared whole.
    let health = shop.request("GET", "/health").json();
    let addr = health["tcp"].as_str().expect("the TCP address in the metadata").to_owned();
    let tcp = |headers: &[&str]| {
        let s = std::net::TcpStream::connect(&addr).expect("connect to the hook's TCP port");
        exchange(s, "GET", "/coverage", headers)
    };
    let r = tcp(&[]);
    assert_eq!((r.status, r.header("www-authenticate")), (401, Some("Bearer")));
    assert_eq!(tcp(&["authorization: Bearer wrong"]).status, 401);
    assert_eq!(tcp(&["authorization: Bearer s3cre"]).status, 401);
    assert_eq!(tcp(&["authorization: Bearer s3cret"]).status, 200);

    let mut garbage = std::net::TcpStream::connect(&addr).expect("connect to the hook's TCP port");
    garbage.write_all(b"\xff\xfe GET\r\n\r\n").expect("send garbage");
    let mut raw = Vec::new();
    garbage.read_to_end(&mut raw).expect("read");
    assert!(raw.starts_with(b"HTTP/1.1 400"), "{:?}", String::from_utf8_lossy(&raw));

    // Over 256 connections at once: a 503 for the next one, the others kept.
    let idle: Vec<_> = (0..256).map(|_| connect_unix(&shop.socket())).collect();
    let over = poll("a 503 once 256 connections are open", || {
        let r = unix_request(&shop.socket(), "GET", "/health", &[]);
        (r.status == 503).then_some(r)
    });
    assert!(over.text().contains("over 256 connections at once"), "{}", over.text());
    drop(idle);
    poll("the hook serving again", || (status("GET", "/health", &[]) == 200).then_some(()));

    // Keep-alive: two requests on one connection.
    let mut s = connect_unix(&shop.socket());
    s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\nGET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    assert_eq!(String::from_utf8_lossy(&raw).matches("HTTP/1.1 200 OK").count(), 2);
}

#[test]
fn path_map_ignore_and_periodic_reports_that_survive_sigkill() {
    let mut shop = Shop::start(
        "settings",
        Build::Atomic,
        &[],
        &[("LIVECOV_PATH_MAP", "example.com/shop/="), ("LIVECOV_IGNORE", "^net/"), ("LIVECOV_FLUSH_SECS", "0.2")],
    );
    shop.get("/items/milk");
    let files: Vec<String> = parse_lcov(&shop.lcov("")).into_keys().collect();
    assert_eq!(files, ["compute/compute.go", "inventory/inventory.go", "main.go"]);
    let report = shop.report("lcov");
    poll("a periodic report with the request", || {
        let text = std::fs::read_to_string(&report).ok()?;
        (parse_lcov(&text).get("inventory/inventory.go")?.functions.get("discount") == Some(&1)).then_some(())
    });
    shop.signal(libc::SIGKILL);
    shop.wait();
    assert!(std::fs::read_to_string(&report).expect("the last periodic report").contains("SF:inventory/inventory.go"));
}

#[test]
fn a_sidecar_merges_go_processes_with_rust_and_node_ones() {
    let dir = scratch(GROUP, "pod");
    let cov = dir.join("cov");
    let shops = [
        Shop::start_in(&dir, &cov, Build::Atomic, &[], &[("LIVECOV_IGNORE", "^net/")]),
        Shop::start_in(&dir, &cov, Build::Atomic, &[], &[("LIVECOV_IGNORE", "^net/")]),
    ];
    let mut rust = Service::spawn(
        {
            let mut cmd = Command::new(livecov_tests::service::service_bin());
            cmd.args(["--addr", "127.0.0.1:0"]).env("LIVECOV_DIR", &cov).env("LLVM_PROFILE_FILE", dir.join("exit-%p.profraw"));
            cmd
        },
        cov.clone(),
    );
    let mut node = Killed(
        livecov_tests::node::node_with_hook(&livecov_tests::node::fixture_dir().join("http/server.js"), &[], &cov)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the Node service"),
    );
    let node_port: u16 = {
        let mut line = String::new();
        BufReader::new(node.0.stdout.as_mut().expect("stdout")).read_line(&mut line).expect("its first line");
        line.trim().rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("Node said {line:?}"))
    };
    shops[0].get("/fib?n=5");
    shops[1].get("/items/apple");
    rust.get("/hello?name=pod");
    assert_eq!(livecov_tests::node::get(node_port, "/hello?name=pod").status, 200);
    let node_socket = cov.join("sockets").join(format!("{}.sock", livecov_tests::node::node_instance(&cov, node.0.id())));
    let own: Vec<String> = shops
        .iter()
        .map(|s| s.lcov(""))
        .chain([rust.coverage(""), unix_request(&node_socket, "GET", "/coverage", &[]).text()])
        .collect();
    let sidecar = replicas::Sidecar::start(&["--dir", &cov.display().to_string(), "--listen", "127.0.0.1:0"], None);
    let merged = sidecar.coverage("");
    assert_eq!(merged, replicas::merge(&own.iter().map(String::as_str).collect::<Vec<_>>()), "the merge of the four own dumps");
    let files = parse_lcov(&merged);
    let compute = file_ending(&files, "shop/compute/compute.go");
    assert_eq!(compute.functions["Fib"], 15);
    assert_eq!(file_ending(&files, "shop/inventory/inventory.go").functions["Lookup"], 1);
    let mut runtimes: Vec<String> =
        sidecar.targets().iter().map(|t| t["runtime"].as_str().unwrap_or("?").to_owned()).collect();
    runtimes.sort();
    assert_eq!(runtimes, ["go", "go", "node", "rust"]);

    // A Go process ends on SIGTERM: its final report stands in for it, in
    // the sidecar's merge and in a collect of the folder.
    let [first, mut second] = shops;
    let gone = second.instance();
    second.get("/items/pear");
    second.signal(libc::SIGTERM);
    assert_eq!(second.wait().signal(), Some(libc::SIGTERM));
    let after = poll("the ended Go process gone from the sidecar's targets", || {
        let merged = sidecar.coverage("");
        sidecar.targets().iter().any(|t| t["instance"] == gone.as_str() && t["state"] == "gone").then_some(merged)
    });
    let files = parse_lcov(&after);
    assert_eq!(file_ending(&files, "shop/inventory/inventory.go").functions["Lookup"], 2, "apple, then pear before SIGTERM");
    assert_eq!(file_ending(&files, "shop/compute/compute.go").functions["Fib"], 15);

    let out = dir.join("collected");
    let collect = replicas::livecov(&["collect", "--dir", &cov.display().to_string(), "-o", &out.display().to_string()]);
    assert!(collect.status.success(), "{}", String::from_utf8_lossy(&collect.stderr));
    let collected = std::fs::read_to_string(out.join("merged.lcov")).expect("merged.lcov");
    let files = parse_lcov(&collected);
    assert_eq!(file_ending(&files, "shop/inventory/inventory.go").functions["Lookup"], 2);
    assert_eq!(file_ending(&files, "shop/compute/compute.go").functions["Fib"], 15);
    drop((first, node));
    rust.kill();
}
