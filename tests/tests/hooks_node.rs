//! The Node.js hook (hooks/node/livecov-hook.cjs), end to end: the Node
//! fixtures (fixtures/node) run with `NODE_OPTIONS=--require <hook>`, really
//! requested, signalled and clustered, their live and final reports checked
//! against the fixtures' sources and against c8 over the same requests.

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use livecov_tests::http::{exchange, get_report, unix_request};
use livecov_tests::lcov::{file_ending, parse_lcov};
use livecov_tests::node::{fixture_dir, get, node_instance, node_tool, node_with_hook, span};
use livecov_tests::service::{scratch, Service};
use livecov_tests::{livecov_bin, run_checked, wait_for};

// ---------------------------------------------------------------- running

fn http_app() -> PathBuf {
    fixture_dir().join("http/server.js")
}

/// `script` with the hook, in a scratch folder `target/tmp/hooks_node/<name>-<pid>` (its `cov` is `LIVECOV_DIR`).
fn start(name: &str, script: &Path, args: &[&str], env: &[(&str, &str)]) -> Service {
    let dir = scratch("hooks_node", name);
    let cov = dir.join("cov");
    let mut cmd = node_with_hook(script, args, &cov);
    cmd.current_dir(&dir);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Service::spawn(cmd, cov)
}

fn socket(app: &Service) -> PathBuf {
    let instance = node_instance(&app.cov, app.child.id());
    app.cov.join("sockets").join(format!("{instance}.sock"))
}

/// `GET /coverage<query>` on the hook's socket; must be a 200 that says
/// how long it took.
fn dump(socket: &Path, query: &str) -> String {
    get_report(socket, &format!("/coverage{query}")).text()
}

fn report(cov: &Path, instance: &str, extension: &str) -> Option<String> {
    std::fs::read_to_string(cov.join("reports").join(format!("{instance}.{extension}"))).ok()
}

fn metadata(cov: &Path, instance: &str) -> serde_json::Value {
    let text = report(cov, instance, "json").expect("the instance's metadata");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("metadata is not JSON ({e}): {text}"))
}

/// Waits (30 s at most) for the process to end.
fn wait_exit(app: &mut Service) -> ExitStatus {
    wait_for("the program to end", Duration::from_millis(20), || app.child.try_wait().expect("wait for the program"))
}

fn sigterm(pid: u32) {
    // Safety: a signal to a child of ours.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0, "kill -TERM {pid}");
}

fn source(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn line_of(source: &str, needle: &str) -> u32 {
    source.lines().position(|l| l.contains(needle)).unwrap_or_else(|| panic!("no line contains {needle:?}")) as u32 + 1
}

fn body(r: &livecov_tests::http::Response) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

// ---------------------------------------------------------------- c8

/// The requests both runs of a comparison make, ending with `/quit`.
const HTTP_WORKLOAD: &[&str] =
    &["/hello?name=x", "/items?n=2", "/items?n=0&sort=desc", "/total?codes=a1,b2", "/fail", "/nope", "/total?codes=zz", "/hello", "/quit"];
const TS_WORKLOAD: &[&str] = &["/greet?who=ts", "/price?sku=apple&qty=3", "/nope", "/greet", "/quit"];

/// The final report of `script` run with the hook over `workload` (ending
/// with `/quit`), with a live dump after every request so that the report
/// adds up many takes of V8's coverage.
fn hook_run(name: &str, script: &Path, workload: &[&str]) -> String {
    let mut app = start(name, script, &[], &[]);
    let socket = socket(&app);
    let instance = node_instance(&app.cov, app.child.id());
    for path in workload {
        get(app.port, path);
        if *path != "/quit" {
            dump(&socket, "");
        }
    }
    let status = wait_exit(&mut app);
    assert!(status.success(), "{name}: {status}");
    report(&app.cov, &instance, "lcov").expect("a final report")
}

/// c8's LCOV for `script` over `workload`, paths made absolute (c8 writes
/// them relative to its working directory, fixtures/node).
fn c8_run(name: &str, script: &Path, workload: &[&str]) -> String {
    let dir = scratch("hooks_node", name);
    let mut cmd = Command::new(node_tool("c8"));
    cmd.args(["--reporter=lcov", "--allowExternal", "--report-dir"])
        .arg(dir.join("report"))
        .arg("--temp-directory")
        .arg(dir.join("v8"))
        .arg("node")
        .arg(script)
        .current_dir(fixture_dir());
    livecov_tests::node::clean_env(&mut cmd);
    let mut app = Service::spawn(cmd, dir.join("cov"));
    for path in workload {
        get(app.port, path);
    }
    let status = wait_exit(&mut app);
    assert!(status.success(), "c8 {name}: {status}");
    let lcov = source(&dir.join("report/lcov.info"));
    let root = fixture_dir();
    lcov.lines()
        .map(|l| match l.strip_prefix("SF:") {
            Some(p) if !p.starts_with('/') => format!("SF:{}\n", root.join(p).display()),
            _ => format!("{l}\n"),
        })
        .collect()
}

/// Per file: (every DA line, the DA lines with a count > 0).
fn line_sets(lcov: &str) -> BTreeMap<String, (BTreeSet<u32>, BTreeSet<u32>)> {
    parse_lcov(lcov)
        .into_iter()
        .map(|(file, f)| {
            let all = f.lines.keys().copied().collect();
            let hit = f.lines.iter().filter(|(_, c)| **c > 0).map(|(l, _)| *l).collect();
            (file, (all, hit))
        })
        .collect()
}

/// The hook's and c8's reports name the same files, with the same lines and
/// the same covered lines; the counts may differ on lines that straddle two
/// V8 ranges (docs/node.md says why), which is printed.
fn assert_same_lines_as_c8(hook: &str, c8: &str) {
    let (ours, theirs) = (line_sets(hook), line_sets(c8));
    assert_eq!(ours.keys().collect::<Vec<_>>(), theirs.keys().collect::<Vec<_>>(), "files\nhook:\n{hook}\nc8:\n{c8}");
    let uncovered: usize = ours.values().map(|(all, hit)| all.len() - hit.len()).sum();
    assert!(uncovered > 0 && ours.values().all(|(_, hit)| !hit.is_empty()), "a workload that tells lines apart: {ours:?}");
    for (file, (all, hit)) in &ours {
        let (c8_all, c8_hit) = &theirs[file];
        assert_eq!(all, c8_all, "{file}: DA lines");
        assert_eq!(hit, c8_hit, "{file}: covered lines (hook, c8)");
        let (a, b) = (parse_lcov(hook), parse_lcov(c8));
        let differ: Vec<_> =
            a[file].lines.iter().filter(|(l, c)| b[file].lines[l] != **c).map(|(l, c)| (*l, *c, b[file].lines[l])).collect();
        eprintln!("{file}: {} lines, {} covered; counts (line, hook, c8) that differ: {differ:?}", all.len(), hit.len());
    }
}

/// The TypeScript fixture compiled by tsc (with source maps), once per test
/// process: its `server.js`.
fn typescript_app() -> &'static Path {
    static SERVER: OnceLock<PathBuf> = OnceLock::new();
    SERVER.get_or_init(|| {
        let dist = scratch("hooks_node", "tsc").join("dist");
        run_checked(
            Command::new(node_tool("tsc")).arg("-p").arg(fixture_dir().join("ts")).arg("--outDir").arg(&dist),
            "tsc -p fixtures/node/ts",
        );
        assert!(dist.join("server.js.map").is_file(), "tsc wrote no source map");
        dist.join("server.js")
    })
}

/// Runs the HTTP app (`cmd`, its stderr kept) through `/hello` and `/quit`:
/// its exit status and its stderr.
fn hello_and_quit(mut cmd: Command) -> (ExitStatus, String) {
    use std::io::Read;
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start node");
    let status = serve_hello_and_quit(&mut child);
    let mut stderr = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("read stderr");
    (status, stderr)
}

/// Asks `child` (`http_app`, its standard output piped) for `/hello`, then
/// `/quit`; its exit status.
fn serve_hello_and_quit(child: &mut Child) -> ExitStatus {
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read the first line");
    let port: u16 = line.trim().rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("first line {line:?}"));
    assert_eq!(body(&get(port, "/hello")), "hello\n");
    assert_eq!(body(&get(port, "/quit")), "bye\n");
    wait_for("the program to end", Duration::from_millis(20), || child.try_wait().expect("wait for node"))
}

// ---------------------------------------------------------------- tests

#[test]
fn a_route_s_lines_are_uncovered_until_it_is_called_then_covered() {
    let app = start("route", &http_app(), &[], &[]);
    let socket = socket(&app);
    let server = source(&http_app());
    let inventory = source(&fixture_dir().join("http/inventory.js"));
    let total = span(&server, "function total(", "}");
    let price = span(&inventory, "function price(", "}");
    let throw_line = line_of(&inventory, "throw new Error(`no item");

    let before = parse_lcov(&dump(&socket, ""));
    let (s, i) = (file_ending(&before, "http/server.js"), file_ending(&before, "http/inventory.js"));
    for l in &total {
        assert_eq!(s.lines[l], 0, "server.js:{l} before /total");
    }
    for l in &price {
        assert_eq!(i.lines[l], 0, "inventory.js:{l} before /total");
    }
    assert_eq!(s.functions["total"], 0);

    let r = get(app.port, "/total?codes=a1,c3");
    assert_eq!(body(&r), "19.50\n");
    let after = parse_lcov(&dump(&socket, ""));
    let (s, i) = (file_ending(&after, "http/server.js"), file_ending(&after, "http/inventory.js"));
    for l in &total {
        assert_eq!(s.lines[l], 1, "server.js:{l} after one /total");
    }
    for l in &price {
        let expected = if *l == throw_line || *l == throw_line + 1 { 0 } else { 1 };
        assert_eq!(i.lines[l].min(1), expected, "inventory.js:{l} after /total with known codes");
    }
    assert_eq!(s.functions["total"], 1);
    assert_eq!(i.functions["price"], 1);
    // Other routes' lines are still uncovered.
    for l in span(&server, "function items(", "}") {
        assert_eq!(s.lines[&l], 0, "server.js:{l} (/items) was never requested");
    }
}

#[test]
fn the_http_app_s_covered_lines_are_those_c8_reports() {
    let hook = hook_run("c8-http-hook", &http_app(), HTTP_WORKLOAD);
    let c8 = c8_run("c8-http", &http_app(), HTTP_WORKLOAD);
    assert_same_lines_as_c8(&hook, &c8);
}

#[test]
fn the_typescript_app_s_covered_lines_are_those_c8_reports() {
    let hook = hook_run("c8-ts-hook", typescript_app(), TS_WORKLOAD);
    let c8 = c8_run("c8-ts", typescript_app(), TS_WORKLOAD);
    assert_same_lines_as_c8(&hook, &c8);
}

#[test]
fn typescript_is_reported_on_its_ts_sources() {
    let app = start("ts", typescript_app(), &[], &[]);
    let socket = socket(&app);
    let src = fixture_dir().join("ts/src");
    let (server, pricing) = (source(&src.join("server.ts")), source(&src.join("pricing.ts")));
    assert_eq!(body(&get(app.port, "/greet?who=ts")), "hello, ts\n");

    let lcov = dump(&socket, "");
    let files = parse_lcov(&lcov);
    let names: Vec<PathBuf> = files.keys().map(PathBuf::from).collect();
    assert_eq!(names, vec![src.join("pricing.ts"), src.join("server.ts")], "{lcov}");
    let (s, p) = (&files[&src.join("server.ts").display().to_string()], &files[&src.join("pricing.ts").display().to_string()]);
    assert_eq!(s.lines.len(), server.trim_end().lines().count(), "a DA line for each line of server.ts");
    for l in span(&server, "function greet(", "}") {
        assert!(s.lines[&l] > 0, "server.ts:{l} (greet) after /greet");
    }
    for l in span(&server, "function price(", "}") {
        assert_eq!(s.lines[&l], 0, "server.ts:{l} (price) before /price");
    }
    for l in span(&pricing, "export function quote(", "}") {
        assert_eq!(p.lines[&l], 0, "pricing.ts:{l} before /price");
    }
    assert_eq!((s.functions["greet"], s.functions["price"], p.functions["quote"]), (1, 0, 0));

    assert_eq!(body(&get(app.port, "/price?sku=apple&qty=10")), "4.50\n");
    let files = parse_lcov(&dump(&socket, ""));
    let (s, p) = (&files[&src.join("server.ts").display().to_string()], &files[&src.join("pricing.ts").display().to_string()]);
    let unknown = line_of(&pricing, "return { known: false");
    for l in span(&pricing, "export function quote(", "}") {
        assert_eq!(p.lines[&l] > 0, l != unknown && l != unknown + 1, "pricing.ts:{l} after a known sku");
    }
    assert_eq!(s.lines[&line_of(&server, "return { status: 404, body: 'unknown sku")], 0);
    assert!(s.lines[&line_of(&server, "const qty = Number(")] > 0);
    assert_eq!((s.functions["price"], p.functions["quote"]), (1, 1));
}

#[test]
fn cluster_workers_are_instances_whose_merge_covers_what_each_served() {
    let mut app = start("cluster", &fixture_dir().join("cluster/app.js"), &[], &[("WORKERS", "4")]);
    let primary = app.child.id();
    let sockets = wait_for("five sockets", Duration::from_millis(50), || {
        let names: Vec<String> = std::fs::read_dir(app.cov.join("sockets"))
            .ok()?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        (names.len() == 5).then_some(names)
    });
    assert!(sockets.iter().all(|s| s.starts_with("node-")), "{sockets:?}");
    let instances: Vec<String> = sockets.iter().map(|s| s.trim_end_matches(".sock").to_owned()).collect();

    // Which worker served which route, from the answers.
    let mut served: BTreeMap<u32, BTreeMap<String, u64>> = BTreeMap::new();
    for round in 0..3 {
        for route in ["alpha", "beta", "gamma", "delta"] {
            let text = body(&get(app.port, &format!("/{route}")));
            let (pid, name) = text.trim().split_once(' ').unwrap_or_else(|| panic!("answer {text:?} (round {round})"));
            assert_eq!(name, route);
            *served.entry(pid.parse().expect("a pid")).or_default().entry(route.to_owned()).or_default() += 1;
        }
    }
    let workers: BTreeSet<u32> = instances
        .iter()
        .map(|i| i.split('-').nth(1).and_then(|p| p.parse().ok()).expect("node-<pid>-<hex>"))
        .filter(|pid| *pid != primary)
        .collect();
    assert_eq!(workers.len(), 4, "4 workers besides the primary: {instances:?}");
    assert!(served.keys().all(|pid| workers.contains(pid)), "served by {:?}, workers {workers:?}", served.keys());

    // Each worker's own coverage counts what it served, and nothing else.
    for instance in &instances {
        let pid: u32 = instance.split('-').nth(1).unwrap().parse().unwrap();
        let socket = app.cov.join("sockets").join(format!("{instance}.sock"));
        let health = unix_request(&socket, "GET", "/health", &[]).json();
        assert_eq!(health["pid"], pid);
        let files = parse_lcov(&dump(&socket, ""));
        let f = file_ending(&files, "cluster/app.js");
        for route in ["alpha", "beta", "gamma", "delta"] {
            let expected = served.get(&pid).and_then(|s| s.get(route)).copied().unwrap_or(0);
            assert_eq!(f.functions[route], expected, "{route} in {instance} (primary {primary})");
        }
        if pid == primary {
            assert_eq!((f.functions["primary"], f.functions["worker"]), (1, 0), "the primary's own code");
        } else {
            assert_eq!(health["ppid"], primary, "a worker's parent is the primary");
            assert_eq!((f.functions["primary"], f.functions["worker"]), (0, 1), "{instance}: a worker's own code");
        }
    }

    // The primary dies of SIGTERM; its workers follow; every instance leaves a final report.
    sigterm(primary);
    let status = wait_exit(&mut app);
    assert_eq!(status.signal(), Some(libc::SIGTERM), "the primary's exit: {status}");
    for instance in &instances {
        wait_for("a worker's final report", Duration::from_millis(50), || {
            let done = report(&app.cov, instance, "json")?;
            done.contains("\"state\":\"exited\"").then_some(())
        });
    }
    let reports: Vec<PathBuf> = instances.iter().map(|i| app.cov.join("reports").join(format!("{i}.lcov"))).collect();
    let merged = app.dir.join("merged.lcov");
    run_checked(Command::new(livecov_bin()).arg("merge").args(&reports).arg("-o").arg(&merged), "livecov merge");
    let files = parse_lcov(&source(&merged));
    let f = file_ending(&files, "cluster/app.js");
    for route in ["alpha", "beta", "gamma", "delta"] {
        assert_eq!(f.functions[route], 3, "{route}: 3 requests over all workers");
    }
    assert_eq!((f.functions["primary"], f.functions["worker"]), (1, 4));
}

#[test]
fn the_protocol_routes_answer_as_the_native_agents_do() {
    let app = start("protocol", &http_app(), &[], &[]);
    let socket = socket(&app);
    let instance = node_instance(&app.cov, app.child.id());
    let mode = std::fs::metadata(&socket).expect("the socket").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(std::fs::metadata(&socket).unwrap().file_type().is_socket());

    // GET /health
    let r = unix_request(&socket, "GET", "/health", &[]);
    assert_eq!((r.status, r.header("content-type")), (200, Some("application/json")));
    assert_eq!(r.header("livecov-instance"), Some(instance.as_str()));
    let h = r.json();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    assert_eq!(h["instance"], instance.as_str());
    assert_eq!(h["pid"], app.child.id());
    assert_eq!(h["ppid"], std::process::id());
    assert_eq!(h["runtime"], "node");
    assert_eq!(h["livecov_version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(h["program"], http_app().display().to_string());
    assert_eq!((&h["build_id"], &h["modules"], &h["tcp"]), (&serde_json::Value::Null, &serde_json::json!([]), &serde_json::Value::Null));
    assert!(h["start_time"].as_u64().is_some_and(|t| t <= now && t + 60 > now), "{h}");
    assert!(h["uptime_secs"].as_f64().is_some_and(|u| u > 0.0), "{h}");
    assert_eq!(h["state"], "running");
    assert_eq!(metadata(&app.cov, &instance)["instance"], instance.as_str());

    // ?reset=1 dumps and resets in one step.
    get(app.port, "/hello");
    let first = parse_lcov(&dump(&socket, "?reset=1"));
    assert_eq!(file_ending(&first, "http/server.js").functions["hello"], 1);
    let second = parse_lcov(&dump(&socket, ""));
    let s = file_ending(&second, "http/server.js");
    assert_eq!(s.functions["hello"], 0, "counted before the reset");
    assert!(s.lines.values().all(|c| *c == 0), "nothing ran since the reset: {:?}", s.lines);
    get(app.port, "/hello");
    get(app.port, "/hello");
    assert_eq!(file_ending(&parse_lcov(&dump(&socket, "")), "http/server.js").functions["hello"], 2);

    // POST /reset
    let r = unix_request(&socket, "POST", "/reset", &["content-length: 0"]);
    assert_eq!(r.status, 204);
    assert_eq!(r.header("livecov-instance"), Some(instance.as_str()));
    assert_eq!(file_ending(&parse_lcov(&dump(&socket, "")), "http/server.js").functions["hello"], 0);

    // ?test=NAME: a TN: line before each record.
    get(app.port, "/items?n=1");
    let named = dump(&socket, "?test=login%20flow");
    let records = named.lines().filter(|l| l.starts_with("SF:")).count();
    assert_eq!(named.lines().filter(|l| *l == "TN:login flow").count(), records);
    assert!(records >= 2 && named.starts_with("TN:login flow\nSF:"), "{named}");

    // ?format=json: the counts of the LCOV.
    let lcov = dump(&socket, "");
    let r = unix_request(&socket, "GET", "/coverage?format=json", &[]);
    assert_eq!((r.status, r.header("content-type")), (200, Some("application/json")));
    let json = r.json();
    let hit: usize = parse_lcov(&lcov).values().map(|f| f.lines.values().filter(|c| **c > 0).count()).sum();
    assert_eq!(json["totals"]["lines_hit"], hit);
    assert_eq!(json["files"].as_array().map(Vec::len), Some(records));

    // Errors: JSON, with the instance header.
    let cases: &[(&str, &str, u16, &str)] = &[
        ("GET", "/nope", 404, "no route /nope"),
        ("GET", "/coverage?format=xml", 400, "invalid format"),
        ("GET", "/coverage?format=profraw", 400, "profraw"),
        ("GET", "/coverage?colour=red", 400, "unknown query parameter"),
        ("GET", "/coverage?reset=maybe", 400, "invalid reset value"),
        ("GET", "/coverage?test=a%0Ab", 400, "control characters"),
        ("POST", "/coverage", 405, "not allowed"),
        ("GET", "/reset", 405, "not allowed"),
    ];
    for (method, path, status, message) in cases {
        let r = unix_request(&socket, method, path, &["content-length: 0"]);
        assert_eq!(r.status, *status, "{method} {path}: {}", body(&r));
        assert_eq!(r.header("livecov-instance"), Some(instance.as_str()), "{method} {path}");
        assert_eq!(r.header("content-type"), Some("application/json"), "{method} {path}");
        let error = r.json()["error"].as_str().map(str::to_owned).unwrap_or_default();
        assert!(error.contains(message), "{method} {path}: {error}");
    }
    let r = unix_request(&socket, "POST", "/coverage", &["content-length: 0"]);
    assert_eq!(r.header("allow"), Some("GET"));
    let r = unix_request(&socket, "POST", "/reset", &["content-length: 100000"]);
    assert_eq!(r.status, 413, "{}", body(&r));
    let big = format!("x-padding: {}", "a".repeat(20 * 1024));
    let r = unix_request(&socket, "GET", "/health", &[&big]);
    assert_eq!(r.status, 431, "a request head over 16 KiB: {}", body(&r));
    assert_eq!(r.header("livecov-instance"), Some(instance.as_str()));
    // Garbage is a 400, and the program runs on.
    let s = livecov_tests::http::connect_unix(&socket);
    let r = {
        use std::io::{Read, Write};
        let mut s = s;
        s.write_all(b"NOT HTTP AT ALL\r\n\r\n").unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        livecov_tests::http::parse_response(&raw)
    };
    assert_eq!(r.status, 400);
    assert_eq!(r.header("livecov-instance"), Some(instance.as_str()));
    assert_eq!(body(&get(app.port, "/hello?name=still")), "hello, still\n");
}

#[test]
fn tcp_requires_the_bearer_token_and_the_socket_does_not() {
    let dir = scratch("hooks_node", "tcp-token-file");
    let token_file = dir.join("token");
    std::fs::write(&token_file, "s3cret\n").unwrap();
    let env = [
        ("LIVECOV_LISTEN", "127.0.0.1:0"),
        ("LIVECOV_TOKEN_FILE", token_file.to_str().unwrap()),
        ("LIVECOV_SOCKET_MODE", "0660"),
    ];
    let app = start("tcp", &http_app(), &[], &env);
    let socket = socket(&app);
    assert_eq!(std::fs::metadata(&socket).expect("the socket").permissions().mode() & 0o777, 0o660);
    let tcp = wait_for("the TCP address", Duration::from_millis(20), || {
        unix_request(&socket, "GET", "/health", &[]).json()["tcp"].as_str().map(str::to_owned)
    });
    let request = |headers: &[&str]| {
        let s = std::net::TcpStream::connect(&tcp).expect("connect to LIVECOV_LISTEN");
        exchange(s, "GET", "/coverage", headers)
    };
    for headers in [&[][..], &["authorization: Bearer wrong"][..], &["authorization: Basic s3cret"][..]] {
        let r = request(headers);
        assert_eq!(r.status, 401, "{headers:?}");
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        assert!(r.json()["error"].as_str().unwrap().contains("bearer token"));
        assert!(r.header("livecov-instance").is_some_and(|i| i.starts_with("node-")));
    }
    let r = request(&["authorization: Bearer s3cret"]);
    assert_eq!(r.status, 200);
    assert!(r.text().contains("SF:") && r.text().contains("http/server.js"));
    assert_eq!(unix_request(&socket, "GET", "/coverage", &[]).status, 200, "the socket needs no token");
}

#[test]
fn sigterm_to_a_program_without_a_handler_leaves_a_final_report_and_kills_it() {
    let mut app = start("sigterm", &http_app(), &[], &[]);
    let socket = socket(&app);
    let instance = node_instance(&app.cov, app.child.id());
    get(app.port, "/items?n=2");
    sigterm(app.child.id());
    let status = wait_exit(&mut app);
    assert_eq!(status.signal(), Some(libc::SIGTERM), "the exit status is the signal's: {status}");
    let final_report = report(&app.cov, &instance, "lcov").expect("a final report");
    assert_eq!(file_ending(&parse_lcov(&final_report), "http/server.js").functions["items"], 1);
    assert_eq!(metadata(&app.cov, &instance)["state"], "exited");
    assert!(!socket.exists(), "the socket is removed");
}

#[test]
fn a_program_s_own_sigterm_handler_keeps_its_behaviour() {
    let mut app = start("own-sigterm", &http_app(), &["--own-sigterm"], &[]);
    let instance = node_instance(&app.cov, app.child.id());
    get(app.port, "/hello");
    sigterm(app.child.id());
    let status = wait_exit(&mut app);
    assert_eq!(status.code(), Some(0), "the handler closed the server and the program ended normally: {status}");
    let mut rest = String::new();
    while app.stdout.read_line(&mut rest).expect("read stdout") > 0 {}
    assert!(rest.contains("graceful shutdown"), "the program's handler ran: {rest:?}");
    let final_report = report(&app.cov, &instance, "lcov").expect("a final report");
    assert_eq!(file_ending(&parse_lcov(&final_report), "http/server.js").functions["hello"], 1);
    assert_eq!(metadata(&app.cov, &instance)["state"], "exited");
}

#[test]
fn a_program_that_ends_by_itself_leaves_a_final_report() {
    let mut app = start("normal-exit", &http_app(), &[], &[]);
    let socket = socket(&app);
    let instance = node_instance(&app.cov, app.child.id());
    get(app.port, "/quit");
    // The hook's server and timers must not keep the program alive.
    let status = wait_exit(&mut app);
    assert_eq!(status.code(), Some(0), "{status}");
    let server = source(&http_app());
    let files = parse_lcov(&report(&app.cov, &instance, "lcov").expect("a final report"));
    let s = file_ending(&files, "http/server.js");
    assert_eq!(s.lines[&line_of(&server, "server.close();")], 1, "the /quit branch ran once");
    assert_eq!(s.lines[&line_of(&server, "const route = routes[url.pathname];")], 0);
    assert_eq!(metadata(&app.cov, &instance)["state"], "exited");
    assert!(!socket.exists(), "the socket is removed");
}

#[test]
fn livecov_merge_reads_the_hook_s_lcov_as_it_is_and_sums_instances() {
    let app = start("merge", &http_app(), &[], &[]);
    let socket = socket(&app);
    for path in ["/hello?name=a", "/items?n=3", "/total?codes=zz", "/nope"] {
        get(app.port, path);
    }
    let lcov = dump(&socket, "?test=merge");
    assert!(lcov.contains("BRDA:") && lcov.contains("FN:"), "{lcov}");
    let input = app.dir.join("hook.lcov");
    std::fs::write(&input, &lcov).unwrap();
    let out = app.dir.join("merged.lcov");
    run_checked(Command::new(livecov_bin()).arg("merge").arg(&input).arg("-o").arg(&out), "livecov merge");
    assert_eq!(source(&out), lcov, "livecov merge of one hook report is that report");

    let twice = app.dir.join("twice.lcov");
    run_checked(Command::new(livecov_bin()).arg("merge").arg(&input).arg(&input).arg("-o").arg(&twice), "livecov merge");
    let (one, two) = (parse_lcov(&lcov), parse_lcov(&source(&twice)));
    for (file, f) in &one {
        for (line, count) in &f.lines {
            assert_eq!(two[file].lines[line], 2 * count, "{file}:{line}");
        }
        for (name, count) in &f.functions {
            assert_eq!(two[file].functions[name], 2 * count, "{file}: {name}");
        }
    }
}

#[test]
fn without_livecov_dir_the_hook_does_nothing() {
    let dir = scratch("hooks_node", "off");
    let mut cmd = node_with_hook(&http_app(), &[], &dir.join("cov"));
    cmd.env_remove("LIVECOV_DIR").current_dir(&dir);
    let (status, stderr) = hello_and_quit(cmd);
    assert!(status.success(), "{status}");
    assert_eq!(stderr, "");
    assert!(!dir.join("cov").exists(), "nothing written");
}

#[test]
fn a_bad_setting_is_one_line_on_stderr_and_the_program_runs_without_the_hook() {
    let dir = scratch("hooks_node", "bad-setting");
    let mut cmd = node_with_hook(&http_app(), &[], &dir.join("cov"));
    cmd.env("LIVECOV_FLUSH_SECS", "soon").current_dir(&dir);
    let (status, stderr) = hello_and_quit(cmd);
    assert!(status.success(), "{status}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("livecov: not started: LIVECOV_FLUSH_SECS=\"soon\""), "{stderr}");
    assert!(!dir.join("cov/sockets").exists());

    // A coverage directory that cannot be made.
    std::fs::write(dir.join("file"), "").unwrap();
    let mut cmd = node_with_hook(&http_app(), &[], &dir.join("file/cov"));
    cmd.current_dir(&dir);
    let (status, stderr) = hello_and_quit(cmd);
    assert!(status.success(), "{status}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("livecov: not started: ENOTDIR"), "{stderr}");
}

/// Where stderr takes nothing, the line is lost and the program runs on
/// (process.stderr made it an 'error' event, which ended the program).
#[test]
fn a_line_the_hook_cannot_write_does_not_stop_the_program() {
    let dir = scratch("hooks_node", "stderr-taking-nothing");
    for (how, stderr) in livecov_tests::output_taking_nothing() {
        let mut cmd = node_with_hook(&http_app(), &[], &dir.join("cov"));
        cmd.env("LIVECOV_FLUSH_SECS", "soon").current_dir(&dir);
        let mut child = cmd.stdout(Stdio::piped()).stderr(stderr).spawn().expect("start node");
        let status = serve_hello_and_quit(&mut child);
        assert!(status.success(), "stderr {how}: {status}");
    }
}

#[test]
fn tcp_beyond_loopback_without_a_token_is_refused_unless_asked_for() {
    let dir = scratch("hooks_node", "tcp-refused");
    let refusal = "livecov: not listening on 0.0.0.0:0: it is reachable from other hosts and no token is set";
    // With LIVECOV_DIR: one line, and the socket serves.
    let mut cmd = node_with_hook(&http_app(), &[], &dir.join("cov"));
    cmd.env("LIVECOV_LISTEN", "0.0.0.0:0").current_dir(&dir);
    let (status, stderr) = hello_and_quit(cmd);
    assert!(status.success(), "{status}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with(refusal) && stderr.contains("LIVECOV_LISTEN_WITHOUT_TOKEN=1"), "{stderr}");
    let reports: Vec<_> = std::fs::read_dir(dir.join("cov/reports")).expect("reports").flatten().collect();
    assert!(reports.iter().any(|e| e.path().extension().is_some_and(|x| x == "lcov")), "no final report");
    // Without it: not started.
    let mut cmd = node_with_hook(&http_app(), &[], &dir.join("cov"));
    cmd.env_remove("LIVECOV_DIR").env("LIVECOV_LISTEN", "0.0.0.0:0").current_dir(&dir);
    let (_, stderr) = hello_and_quit(cmd);
    assert!(stderr.starts_with(&format!("livecov: not started: {}", &refusal["livecov: ".len()..])), "{stderr}");
    // Asked for: served without a token.
    let app = start("tcp-open", &http_app(), &[], &[("LIVECOV_LISTEN", "0.0.0.0:0"), ("LIVECOV_LISTEN_WITHOUT_TOKEN", "1")]);
    let socket = socket(&app);
    let tcp = wait_for("the TCP address", Duration::from_millis(20), || {
        unix_request(&socket, "GET", "/health", &[]).json()["tcp"].as_str().map(str::to_owned)
    });
    let port = tcp.rsplit(':').next().expect("a port");
    let s = std::net::TcpStream::connect(format!("127.0.0.1:{port}")).expect("connect to LIVECOV_LISTEN");
    assert_eq!(exchange(s, "GET", "/health", &[]).status, 200);
}

#[test]
fn reports_are_written_every_livecov_flush_secs() {
    let app = start("flush", &http_app(), &[], &[("LIVECOV_FLUSH_SECS", "0.2")]);
    let instance = node_instance(&app.cov, app.child.id());
    get(app.port, "/total?codes=b2");
    wait_for("a periodic report with /total", Duration::from_millis(50), || {
        let lcov = report(&app.cov, &instance, "lcov")?;
        let files = parse_lcov(&lcov);
        (file_ending(&files, "http/server.js").functions["total"] == 1).then_some(())
    });
    assert_eq!(app.child.id(), metadata(&app.cov, &instance)["pid"].as_u64().unwrap() as u32);
    assert_eq!(metadata(&app.cov, &instance)["state"], "running");
}

#[test]
fn node_modules_are_left_out_unless_livecov_ignore_says_otherwise_and_paths_are_mapped() {
    let dir = scratch("hooks_node", "ignore");
    std::fs::create_dir_all(dir.join("node_modules/pad")).unwrap();
    std::fs::write(dir.join("node_modules/pad/index.js"), "module.exports = (s, n) => s.padStart(n);\n").unwrap();
    std::fs::write(dir.join("main.js"), "const pad = require('pad');\nconsole.log(pad('x', 3));\n").unwrap();
    let run = |env: &[(&str, &str)]| {
        let cov = dir.join(format!("cov{}", env.len()));
        let mut cmd = node_with_hook(&dir.join("main.js"), &[], &cov);
        cmd.current_dir(&dir);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = run_checked(&mut cmd, "node main.js");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "  x\n");
        let reports: Vec<PathBuf> = std::fs::read_dir(cov.join("reports"))
            .expect("reports")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "lcov"))
            .collect();
        assert_eq!(reports.len(), 1);
        parse_lcov(&source(&reports[0])).into_keys().collect::<Vec<_>>()
    };
    let main = dir.join("main.js").display().to_string();
    let pad = dir.join("node_modules/pad/index.js").display().to_string();
    assert_eq!(run(&[]), vec![main.clone()]);
    assert_eq!(run(&[("LIVECOV_IGNORE", "^$")]), vec![main.clone(), pad]);
    let map = format!("{}=/src", dir.display());
    assert_eq!(run(&[("LIVECOV_IGNORE", r"/main\.js$"), ("LIVECOV_PATH_MAP", &map)]), vec![
        "/src/node_modules/pad/index.js".to_owned()
    ]);
}

// ---------------------------------------------------------------- worker threads

fn workers_app() -> PathBuf {
    fixture_dir().join("workers/server.js")
}

/// `GET /square?n=N` on the workers fixture: its answer, and the pool's thread that computed it.
fn square(port: u16, n: u32) -> u32 {
    let text = body(&get(port, &format!("/square?n={n}")));
    let parity = if n.is_multiple_of(2) { "even" } else { "odd" };
    let thread = text
        .strip_prefix(&format!("{} {parity} (thread ", n * n))
        .and_then(|rest| rest.strip_suffix(")\n"))
        .unwrap_or_else(|| panic!("/square?n={n} answered {text:?}"));
    thread.parse().unwrap_or_else(|e| panic!("thread id {thread:?}: {e}"))
}

/// `GET /once?n=N`: a worker that doubles n and ends before the answer.
fn once(port: u16, n: u32) {
    assert_eq!(body(&get(port, &format!("/once?n={n}"))), format!("{} (exit 0)\n", 2 * n));
}

/// The counts of the workers' modules in a report that must have them: pool-task.js and once.js.
struct WorkerCounts(BTreeMap<String, livecov_tests::lcov::FileCoverage>);

fn worker_counts(lcov: &str) -> WorkerCounts {
    WorkerCounts(parse_lcov(lcov))
}

impl WorkerCounts {
    fn pool(&self) -> &livecov_tests::lcov::FileCoverage {
        file_ending(&self.0, "workers/pool-task.js")
    }

    fn once(&self) -> &livecov_tests::lcov::FileCoverage {
        file_ending(&self.0, "workers/once.js")
    }

    /// Checks the counts that `squares` (the n of each /square since the
    /// last reset) and `onces` (/once requests since then) give: functions,
    /// the loop's body (run n times per request), both arms of the parity,
    /// and the modules' top levels (run once per thread that loaded them
    /// since then: `pool_loads` for the pool's two workers).
    fn assert_traffic(&self, squares: &[u32], onces: u64, pool_loads: u64, what: &str) {
        let task = source(&fixture_dir().join("workers/pool-task.js"));
        let once = source(&fixture_dir().join("workers/once.js"));
        let jobs = squares.len() as u64;
        let even = squares.iter().filter(|n| *n % 2 == 0).count() as u64;
        let p = self.pool();
        assert_eq!(p.functions["square"], jobs, "{what}: square() in pool-task.js");
        assert_eq!(p.functions["parity"], jobs, "{what}: parity() in pool-task.js");
        assert_eq!(p.lines[&line_of(&task, "sum += n;")], squares.iter().map(|n| u64::from(*n)).sum::<u64>(), "{what}: loop body");
        assert_eq!(p.lines[&line_of(&task, "return 'even';")], even, "{what}: even arm");
        assert_eq!(p.lines[&line_of(&task, "return 'odd';")], jobs - even, "{what}: odd arm");
        assert_eq!(p.lines[&line_of(&task, "parentPort.postMessage({ id")], jobs, "{what}: the message handler");
        assert_eq!(p.lines[&line_of(&task, "const { parentPort, threadId }")], pool_loads, "{what}: pool-task.js top level");
        let o = self.once();
        assert_eq!(o.functions["double"], onces, "{what}: double() in once.js");
        assert_eq!(o.functions["unused"], 0, "{what}: unused() in once.js");
        assert_eq!(o.lines[&line_of(&once, "return 2 * n;")], onces, "{what}: double()'s body");
        assert_eq!(o.lines[&line_of(&once, "return 'never called';")], 0, "{what}: unused()'s body");
        assert_eq!(o.lines[&line_of(&once, "module.exports")], onces, "{what}: once.js top level (once per worker)");
    }
}

#[test]
fn worker_threads_counts_are_summed_into_the_process_s_live_report() {
    let app = start("workers-live", &workers_app(), &[], &[]);
    let socket = socket(&app);
    let before = worker_counts(&dump(&socket, ""));
    assert_eq!(before.pool().functions["square"], 0, "pool-task.js is in the report before any job: the pool's workers loaded it");

    let squares = [2, 3, 4, 7, 6];
    let threads: BTreeSet<u32> = squares.iter().map(|n| square(app.port, *n)).collect();
    assert_eq!(threads.len(), 2, "both pool workers computed: {threads:?}");
    once(app.port, 5);
    once(app.port, 6);
    let live = dump(&socket, "");
    worker_counts(&live).assert_traffic(&squares, 2, 2, "live, 2 pool workers running and 2 workers that ended");
    // The main thread's own code is in the same report.
    let files = parse_lcov(&live);
    let s = file_ending(&files, "workers/server.js");
    assert_eq!((s.functions["square"], s.functions["once"]), (5, 2), "server.js: {:?}", s.functions);

    // Successive dumps add up the workers' successive takes.
    let more = [9, 1];
    for n in more {
        square(app.port, n);
        dump(&socket, "");
    }
    once(app.port, 1);
    let all: Vec<u32> = squares.iter().chain(&more).copied().collect();
    worker_counts(&dump(&socket, "?format=lcov")).assert_traffic(&all, 3, 2, "after more dumps");
}

#[test]
fn resets_cut_the_worker_threads_counts_too() {
    let app = start("workers-reset", &workers_app(), &[], &[]);
    let socket = socket(&app);
    square(app.port, 2);
    square(app.port, 3);
    once(app.port, 1);

    // ?reset=1: the report has everything so far, the next one nothing of it.
    worker_counts(&dump(&socket, "?reset=1")).assert_traffic(&[2, 3], 1, 2, "the resetting dump");
    worker_counts(&dump(&socket, "")).assert_traffic(&[], 0, 0, "right after ?reset=1");
    square(app.port, 4);
    once(app.port, 2);
    worker_counts(&dump(&socket, "")).assert_traffic(&[4], 1, 0, "one job and one worker after ?reset=1");

    // POST /reset, while the pool runs and after a worker ended.
    let r = unix_request(&socket, "POST", "/reset", &["content-length: 0"]);
    assert_eq!(r.status, 204);
    worker_counts(&dump(&socket, "")).assert_traffic(&[], 0, 0, "right after POST /reset");
    square(app.port, 5);
    square(app.port, 6);

    // ?test=NAME names the workers' records as the others.
    let named = dump(&socket, "?test=pool&reset=true");
    let records = named.lines().filter(|l| l.starts_with("SF:")).count();
    assert_eq!(named.lines().filter(|l| *l == "TN:pool").count(), records, "{named}");
    assert!(named.contains("TN:pool\nSF:") && named.contains("workers/pool-task.js"), "{named}");
    worker_counts(&named).assert_traffic(&[5, 6], 0, 0, "?test=pool&reset=true");
    worker_counts(&dump(&socket, "")).assert_traffic(&[], 0, 0, "after ?test=pool&reset=true");
}

#[test]
fn the_final_report_has_the_counts_of_workers_still_running_at_exit_and_on_sigterm() {
    // The program ends by itself while its pool's workers run (unref'ed).
    let mut app = start("workers-exit", &workers_app(), &[], &[]);
    let socket = socket(&app);
    let instance = node_instance(&app.cov, app.child.id());
    square(app.port, 2);
    dump(&socket, "");
    // Counted since the last dump: the final report takes them at exit.
    square(app.port, 3);
    square(app.port, 8);
    once(app.port, 4);
    assert_eq!(body(&get(app.port, "/quit")), "bye\n");
    let status = wait_exit(&mut app);
    assert_eq!(status.code(), Some(0), "{status}");
    let final_report = report(&app.cov, &instance, "lcov").expect("a final report");
    worker_counts(&final_report).assert_traffic(&[2, 3, 8], 1, 2, "final report at exit");
    assert_eq!(metadata(&app.cov, &instance)["state"], "exited");

    // SIGTERM, the program without a handler of its own.
    let mut app = start("workers-sigterm", &workers_app(), &[], &[]);
    let instance = node_instance(&app.cov, app.child.id());
    square(app.port, 5);
    once(app.port, 3);
    sigterm(app.child.id());
    let status = wait_exit(&mut app);
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}");
    let final_report = report(&app.cov, &instance, "lcov").expect("a final report");
    worker_counts(&final_report).assert_traffic(&[5], 1, 2, "final report on SIGTERM");
}

#[test]
fn the_workers_app_s_covered_lines_are_those_c8_reports() {
    const WORKLOAD: &[&str] = &["/square?n=2", "/once?n=3", "/square?n=5", "/square?n=4", "/once?n=1", "/nope", "/quit"];
    let hook = hook_run("c8-workers-hook", &workers_app(), WORKLOAD);
    let c8 = c8_run("c8-workers", &workers_app(), WORKLOAD);
    assert_same_lines_as_c8(&hook, &c8);
}

/// Each thread's blocked signals (SigBlk of /proc/PID/task/*/status), sorted.
fn blocked_signals(pid: u32) -> Vec<String> {
    let mut masks: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the program's threads")
        .flatten()
        .map(|t| {
            let status = source(&t.path().join("status"));
            status.lines().find_map(|l| l.strip_prefix("SigBlk:")).expect("SigBlk").trim().to_owned()
        })
        .collect();
    masks.sort();
    masks
}

#[test]
fn the_hook_starts_no_thread_and_the_threads_block_the_signals_they_block_without_it() {
    let with_hook = start("workers-threads", &workers_app(), &[], &[]);
    let socket = socket(&with_hook);
    square(with_hook.port, 3);
    once(with_hook.port, 3);
    dump(&socket, "");

    let dir = scratch("hooks_node", "workers-threads-off");
    let mut cmd = livecov_tests::node::node(&workers_app(), &[]);
    cmd.current_dir(&dir);
    let without = Service::spawn(cmd, dir.join("cov"));
    square(without.port, 3);
    once(without.port, 3);

    let (ours, theirs) = (blocked_signals(with_hook.child.id()), blocked_signals(without.child.id()));
    assert_eq!(ours, theirs, "threads (their SigBlk) with the hook and without it");
    assert!(ours.len() >= 3, "the main thread and the pool's two workers at least: {ours:?}");
}

#[test]
fn a_worker_s_typescript_is_reported_on_its_ts_sources() {
    // pricing.js is loaded in the worker only: its source map is the worker's Node.js's, not the main thread's.
    let dir = scratch("hooks_node", "workers-ts");
    let pricing = typescript_app().with_file_name("pricing.js");
    let code = format!("require({:?}).quote('apple', 12);", pricing.display().to_string());
    let main = format!("new (require('node:worker_threads').Worker)({code:?}, {{ eval: true }});\n");
    std::fs::write(dir.join("main.js"), main).unwrap();
    let cov = dir.join("cov");
    let mut cmd = node_with_hook(&dir.join("main.js"), &[], &cov);
    run_checked(cmd.current_dir(&dir), "node main.js");
    let reports: Vec<PathBuf> = std::fs::read_dir(cov.join("reports"))
        .expect("reports")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "lcov"))
        .collect();
    assert_eq!(reports.len(), 1, "{reports:?}");
    let files = parse_lcov(&source(&reports[0]));
    let ts = fixture_dir().join("ts/src/pricing.ts");
    let p = files.get(&ts.display().to_string()).unwrap_or_else(|| panic!("{} in {:?}", ts.display(), files.keys()));
    let text = source(&ts);
    assert_eq!(p.functions["quote"], 1);
    assert_eq!(p.lines[&line_of(&text, "return { known: true")], 1, "the known item's line");
    assert_eq!(p.lines[&line_of(&text, "return { known: false")], 0, "the unknown item's line");
    assert!(!files.keys().any(|f| f.ends_with("pricing.js")), "no generated file: {:?}", files.keys());
}

#[test]
fn a_worker_busy_at_exit_delays_the_final_report_a_bounded_time_and_is_named_on_stderr() {
    let dir = scratch("hooks_node", "workers-busy");
    // The worker never returns to its event loop; the main thread ends the process.
    let main = "const { Worker } = require('node:worker_threads');\n\
                const w = new Worker('for (;;) {}', { eval: true });\n\
                function bye() { process.exit(7); }\n\
                w.on('online', () => setTimeout(bye, 200));\n";
    std::fs::write(dir.join("main.js"), main).unwrap();
    let cov = dir.join("cov");
    let mut cmd = node_with_hook(&dir.join("main.js"), &[], &cov);
    let started = std::time::Instant::now();
    let out = cmd.current_dir(&dir).output().expect("run node main.js");
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(7), "the program's exit code: {:?}", out.status);
    assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(10), "the final report waited 2 s for the worker: {took:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("livecov: worker thread 1 did not send its counts in time (busy?)"), "{stderr}");
    let reports: Vec<PathBuf> = std::fs::read_dir(cov.join("reports"))
        .expect("reports")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "lcov"))
        .collect();
    assert_eq!(reports.len(), 1, "{reports:?}");
    let files = parse_lcov(&source(&reports[0]));
    assert_eq!(files[&dir.join("main.js").display().to_string()].functions["bye"], 1, "the main thread's counts are in");
}
