//! The in-process agent, end to end: the fixture service (fixtures/service)
//! built with `-C instrument-coverage` and the livecov agent, really run,
//! really requested, really signalled and forked, checked against LLVM 22's
//! own tools where they can judge.

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use livecov_tests::http::{get_report, parse_response, unix_request};
use livecov_tests::lcov::{file_ending, parse_lcov, FileCoverage};
use livecov_tests::service::{plugin, service_bin, Service};
use livecov_tests::{regex_escape, rust_agent_oracle, workspace_root};

// ---------------------------------------------------------------- running

/// The service with the agent, in a scratch folder `target/tmp/agent/<name>-<pid>`.
fn start(name: &str, args: &[&str], env: &[(&str, &str)]) -> Service {
    Service::start("agent", name, args, env)
}

fn wait_for<T>(f: impl FnMut() -> Option<T>) -> T {
    livecov_tests::wait_for("the agent", Duration::from_millis(20), f)
}

// ---------------------------------------------------------------- LCOV

fn function_count(lcov: &str, suffix: &str, function: &str) -> u64 {
    let files = parse_lcov(lcov);
    let f = file_ending(&files, suffix);
    f.functions
        .iter()
        .filter(|(name, _)| name.contains(function))
        .map(|(_, c)| *c)
        .max()
        .unwrap_or_else(|| panic!("no function {function} in {suffix}: {:?}", f.functions.keys().collect::<Vec<_>>()))
}

/// The LCOV llvm-cov 22 computes from raw profiles of the service, filtered
/// as the agent filters.
fn llvm_cov_lcov(profraws: &[PathBuf], objects: &[&Path], dir: &Path) -> String {
    rust_agent_oracle("lcov", service_bin(), objects, profraws, dir)
}

// ---------------------------------------------------------------- tests

#[test]
fn an_endpoint_is_uncovered_before_its_call_and_covered_after() {
    let s = start("endpoint", &[], &[]);
    let before = s.coverage("");
    assert_eq!(function_count(&before, "handlers.rs", "handlers3fib"), 0);
    // fib's body, but for its early return (line 15) for n > 90.
    let fib_lines: Vec<u32> =
        file_ending(&parse_lcov(&before), "handlers.rs").lines.range(12..=24).map(|(l, _)| *l).filter(|&l| l != 15).collect();
    assert!(fib_lines.len() > 8, "{fib_lines:?}");
    assert!(fib_lines.iter().all(|l| file_ending(&parse_lcov(&before), "handlers.rs").lines[l] == 0));

    assert!(s.get("/fib?n=20").ends_with("6765"));
    let after = s.coverage("");
    assert_eq!(function_count(&after, "handlers.rs", "handlers3fib"), 1);
    let files = parse_lcov(&after);
    let handlers = file_ending(&files, "handlers.rs");
    assert!(fib_lines.iter().all(|l| handlers.lines[l] > 0), "fib's lines are not all covered: {:?}", handlers.lines);
    assert_eq!(handlers.lines[&15], 0, "the early return did not run");
    // The loop body ran 20 times.
    assert!(handlers.lines.values().any(|&c| c == 20), "{:?}", handlers.lines);
    // Another endpoint's lines stay uncovered.
    assert_eq!(function_count(&after, "handlers.rs", "handlers6primes"), 0);
    // Neither the agent nor its dependencies appear.
    assert!(!after.contains("agent-rust/"), "the agent's own code is in the report");
    assert!(!after.contains(".cargo/registry"), "dependencies are in the report");
}

#[test]
fn profraw_of_a_snapshot_gives_the_same_lcov_through_llvm_cov() {
    let s = start("profraw", &["--plugin", plugin().to_str().expect("utf-8 path")], &[]);
    // A first dump, so that the one compared is computed incrementally
    // (only the records of files whose counts changed are recomputed).
    s.coverage("");
    s.get("/hello?name=x");
    s.get("/plugin?x=-4");
    s.get("/primes?limit=30");
    // The service's thread may still be finishing the last request after
    // the client has its answer: take the snapshot once two dumps agree.
    let (lcov, profraw) = wait_for(|| {
        let before = s.coverage("");
        let r = unix_request(&s.socket(), "GET", "/coverage?format=profraw", &[]);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some("application/octet-stream"));
        (s.coverage("") == before).then_some((before, r.body))
    });
    let path = s.dir.join("snapshot.profraw");
    std::fs::write(&path, &profraw).expect("write the snapshot");
    let expected = llvm_cov_lcov(&[path], &[plugin()], &s.dir);
    assert_eq!(lcov, expected, "the agent's LCOV differs from llvm-cov over its own profraw");
    assert!(lcov.contains("plugin.c"), "the dlopen'ed plugin is not reported");
}

/// `?format=llvm-json` is llvm-cov's JSON export over the raw profile of
/// the same moment, byte for byte; with `reset=1` the counts start again.
#[test]
fn llvm_json_is_llvm_cov_s_export_of_the_same_moment() {
    let s = start("llvm-json", &["--plugin", plugin().to_str().expect("utf-8 path")], &[]);
    s.get("/fib?n=9");
    s.get("/plugin?x=5");
    let json = |query: &str| {
        let r = unix_request(&s.socket(), "GET", &format!("/coverage?format=llvm-json{query}"), &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("content-type"), Some("application/json"));
        r.text()
    };
    let (ours, profraw) = wait_for(|| {
        let before = json("");
        let r = unix_request(&s.socket(), "GET", "/coverage?format=profraw", &[]);
        (json("") == before).then_some((before, r.body))
    });
    let path = s.dir.join("moment.profraw");
    std::fs::write(&path, &profraw).expect("write the snapshot");
    // llvm-cov lists every function; the agent leaves out those with no
    // file in its report (its own code, the standard library's).
    let mut expected: serde_json::Value =
        serde_json::from_str(&rust_agent_oracle("text", service_bin(), &[plugin()], &[path], &s.dir)).expect("llvm-cov's JSON");
    let ignored = [regex_lite::Regex::new(livecov::agent::DEFAULT_IGNORE).unwrap(), regex_lite::Regex::new(&regex_escape(&format!("{}/", workspace_root().join("agent-rust/src").display()))).unwrap()];
    let functions = expected["data"][0]["functions"].as_array_mut().expect("functions");
    let before = functions.len();
    functions.retain(|f| f["filenames"].as_array().unwrap().iter().any(|n| !ignored.iter().any(|re| re.is_match(n.as_str().unwrap()))));
    assert!(functions.len() < before, "nothing of llvm-cov's was left out: the check shows nothing");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&ours).expect("the agent's JSON"), expected);
    assert!(ours.contains("handlers.rs") && ours.contains("plugin.c"), "{}", &ours[..ours.len().min(300)]);
    // A dump-and-reset answers the counts so far, then they start again.
    let fib_count = |doc: &str| {
        let v: serde_json::Value = serde_json::from_str(doc).expect("JSON");
        v["data"][0]["functions"].as_array().expect("functions").iter().find(|f| f["name"].as_str().is_some_and(|n| n.contains("handlers3fib"))).map(|f| f["count"].as_u64().unwrap_or(0))
    };
    assert_eq!(fib_count(&json("&reset=1")), Some(1));
    assert_eq!(fib_count(&json("")), Some(0));
}

#[test]
fn a_dlopened_shared_object_is_reported() {
    let s = start("plugin", &["--plugin", plugin().to_str().expect("utf-8 path")], &[]);
    assert!(s.get("/plugin?x=3").ends_with("10"));
    let files = parse_lcov(&s.coverage(""));
    let plugin = file_ending(&files, "plugin.c");
    assert_eq!(plugin.functions.get("plugin_compute"), Some(&1), "{:?}", plugin.functions);
    assert_eq!(plugin.functions.get("plugin.c:halve").copied().unwrap_or(0), 0);
}

#[test]
fn reset_and_test_names_give_per_test_reports() {
    let s = start("pertest", &[], &[]);
    s.get("/fib?n=5");
    let first = s.coverage("?test=first&reset=1");
    assert!(first.lines().all(|l| !l.starts_with("SF:") || first.contains("TN:first")));
    assert_eq!(function_count(&first, "handlers.rs", "handlers3fib"), 1);
    s.get("/hello?name=a");
    let second = s.coverage("?test=second");
    assert!(second.starts_with("TN:second\n"), "{}", &second[..40.min(second.len())]);
    assert_eq!(function_count(&second, "handlers.rs", "handlers3fib"), 0, "fib ran before the reset");
    assert_eq!(function_count(&second, "handlers.rs", "handlers5hello"), 1);
    // POST /reset: nothing since.
    let r = unix_request(&s.socket(), "POST", "/reset", &[]);
    assert_eq!(r.status, 204);
    assert_eq!(function_count(&s.coverage(""), "handlers.rs", "handlers5hello"), 0);
}

#[test]
fn sigterm_leaves_a_final_report_equal_to_the_last_dump_and_the_signal_status() {
    let mut s = start("sigterm", &[], &[]);
    s.get("/primes?limit=50");
    let dump = s.coverage("");
    let instance = s.instance();
    // Safety: signalling our own child.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    let status = s.child.wait().expect("wait");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGTERM), "exit status {status:?}");
    let report = std::fs::read_to_string(s.cov_dir().join("reports").join(format!("{instance}.lcov"))).expect("final report");
    assert_eq!(report, dump);
    let meta = std::fs::read_to_string(s.cov_dir().join("reports").join(format!("{instance}.json"))).expect("metadata");
    assert!(meta.contains("\"state\":\"exited\""), "{meta}");
    assert!(!s.cov_dir().join("sockets").join(format!("{instance}.sock")).exists(), "socket left behind");
}

#[test]
fn sigkill_leaves_the_last_periodic_report() {
    let mut s = start("sigkill", &[], &[("LIVECOV_FLUSH_SECS", "0.2")]);
    let instance = s.instance();
    s.get("/echo-not-found");
    s.get("/fib?n=3");
    let report = s.cov_dir().join("reports").join(format!("{instance}.lcov"));
    wait_for(|| {
        // Empty until the first periodic report when the test runs as root
        // (the agent then makes it at start: see agent/reports.rs).
        let r = std::fs::read_to_string(&report).ok().filter(|r| r.contains("SF:"))?;
        (function_count(&r, "handlers.rs", "handlers3fib") == 1).then_some(())
    });
    s.child.kill().expect("SIGKILL");
    s.child.wait().expect("wait");
    let r = std::fs::read_to_string(&report).expect("the periodic report survives");
    assert_eq!(function_count(&r, "handlers.rs", "handlers3fib"), 1);
}

#[test]
fn prefork_workers_are_instances_that_sum_to_the_exit_profiles() {
    let mut s = start("prefork", &["--prefork", "3"], &[]);
    let mut line = String::new();
    s.stdout.read_line(&mut line).expect("workers line");
    let workers: Vec<u32> = line.trim().strip_prefix("workers ").expect("workers line").split(' ').map(|p| p.parse().expect("pid")).collect();
    assert_eq!(workers.len(), 3);
    let parent = s.instance();
    let instances: Vec<String> = workers.iter().map(|&pid| s.instance_of(pid)).collect();
    for i in &instances {
        assert_ne!(*i, parent);
    }
    // Requests go to whichever worker accepts; then every worker quits.
    for n in 1..=12 {
        s.get(&format!("/fib?n={n}"));
    }
    for _ in 0..3 {
        s.get("/quit");
    }
    assert!(s.child.wait().expect("wait").success());

    // Reports of the parent and the workers, written at exit.
    let mut sum: BTreeMap<String, FileCoverage> = BTreeMap::new();
    for instance in instances.iter().chain([&parent]) {
        let path = s.cov_dir().join("reports").join(format!("{instance}.lcov"));
        let report = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for (file, cov) in parse_lcov(&report) {
            let total = sum.entry(file).or_default();
            for (l, c) in cov.lines {
                *total.lines.entry(l).or_default() += c;
            }
            for (f, c) in cov.functions {
                *total.functions.entry(f).or_default() += c;
            }
        }
    }
    let profraws: Vec<PathBuf> = std::fs::read_dir(&s.dir)
        .expect("scratch dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "profraw"))
        .collect();
    assert_eq!(profraws.len(), 4, "one exit profile per process");
    let expected = parse_lcov(&llvm_cov_lcov(&profraws, &[], &s.dir));
    assert_eq!(sum.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>());
    for (file, want) in &expected {
        let got = &sum[file];
        // Function counts add up exactly: nothing counted twice or lost.
        assert_eq!(got.functions, want.functions, "{file}");
        // A line's count is a maximum over its regions, so sums of counts
        // may exceed it; which lines ran must agree exactly.
        let covered = |m: &BTreeMap<u32, u64>| m.iter().filter(|(_, c)| **c > 0).map(|(l, _)| *l).collect::<Vec<_>>();
        assert_eq!(covered(&got.lines), covered(&want.lines), "{file}");
        assert_eq!(got.lines.keys().collect::<Vec<_>>(), want.lines.keys().collect::<Vec<_>>(), "{file}");
    }
    assert_eq!(sum.values().flat_map(|f| f.functions.iter()).find(|(n, _)| n.contains("handlers3fib")).map(|(_, c)| *c), Some(12));
}

#[test]
fn the_socket_is_private_and_every_response_names_the_instance() {
    let s = start("socket", &[], &[]);
    let socket = s.socket();
    let mode = std::fs::metadata(&socket).expect("socket").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let r = unix_request(&socket, "GET", "/health", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("livecov-instance"), Some(s.instance().as_str()));
    let health = String::from_utf8_lossy(&r.body);
    assert!(health.contains("\"runtime\":\"rust\"") && health.contains(&format!("\"pid\":{}", s.child.id())), "{health}");
    let r = unix_request(&socket, "GET", "/coverage?format=xml", &[]);
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("\"error\""));
    assert_eq!(r.header("livecov-instance"), Some(s.instance().as_str()));
}

#[test]
fn a_dump_says_how_long_the_agent_took_to_make_it() {
    let s = start("timing", &[], &[]);
    let socket = s.socket();
    // The first dump (cold), then one that updates the last.
    for n in [10, 20] {
        assert!(s.get(&format!("/fib?n={n}")).starts_with("HTTP/1.1 200"));
        get_report(&socket, "/coverage");
    }
    // Errors are not reports.
    assert_eq!(unix_request(&socket, "GET", "/coverage?format=xml", &[]).header("server-timing"), None);
}

#[test]
fn bad_clients_and_concurrent_dumps_do_not_hurt_the_service() {
    let s = start("abuse", &[], &[("LIVECOV_LISTEN", "127.0.0.1:0"), ("LIVECOV_TOKEN", "s3cret")]);
    let socket = s.socket();
    // Garbage, a 1 MiB header, and a client that never finishes.
    let mut garbage = livecov_tests::http::connect_unix(&socket);
    garbage.write_all(&[0xde, 0xad, 0xbe, 0xef, b'\r', b'\n', b'\r', b'\n']).expect("send garbage");
    let mut huge = livecov_tests::http::connect_unix(&socket);
    let _ = huge.write_all(format!("GET /coverage HTTP/1.1\r\nx-big: {}\r\n\r\n", "a".repeat(1 << 20)).as_bytes());
    let mut stalled = livecov_tests::http::connect_unix(&socket);
    stalled.write_all(b"GET /cover").expect("send half a request");

    // 100 concurrent dumps while the service serves its own traffic.
    std::thread::scope(|scope| {
        let load = scope.spawn(|| {
            for n in 0..200 {
                assert!(s.get(&format!("/fib?n={}", n % 30)).starts_with("HTTP/1.1 200"));
            }
        });
        let dumps: Vec<_> = (0..100)
            .map(|_| scope.spawn(|| unix_request(&socket, "GET", "/coverage", &[]).status))
            .collect();
        for d in dumps {
            assert_eq!(d.join().expect("dump thread"), 200);
        }
        load.join().expect("load thread");
    });
    let mut answer = Vec::new();
    let _ = garbage.read_to_end(&mut answer);
    assert!(answer.is_empty() || answer.starts_with(b"HTTP/1.1 400"), "{:?}", String::from_utf8_lossy(&answer));
    drop((huge, stalled));
    assert_eq!(function_count(&s.coverage(""), "handlers.rs", "handlers3fib"), 200);

    // TCP: the token is required, and enough.
    let meta = std::fs::read_to_string(s.cov_dir().join("reports").join(format!("{}.json", s.instance()))).expect("metadata");
    let tcp = meta.split("\"tcp\":\"").nth(1).and_then(|r| r.split('"').next()).expect("tcp address in the metadata");
    let tcp_request = |auth: &str| {
        let mut c = TcpStream::connect(tcp).expect("connect to the agent over TCP");
        write!(c, "GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{auth}\r\n").expect("send");
        let mut raw = Vec::new();
        c.read_to_end(&mut raw).expect("read");
        parse_response(&raw)
    };
    assert_eq!(tcp_request("").status, 401);
    assert_eq!(tcp_request("authorization: Bearer wrong\r\n").status, 401);
    assert_eq!(tcp_request("authorization: Bearer s3cret\r\n").status, 200);
    assert!(s.get("/hello").starts_with("HTTP/1.1 200"), "the service stopped serving");
}

#[test]
fn tcp_beyond_loopback_without_a_token_is_refused_unless_asked_for() {
    let metadata_tcp = |s: &Service| -> serde_json::Value {
        let path = s.cov_dir().join("reports").join(format!("{}.json", s.instance()));
        let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(path).expect("metadata")).expect("JSON");
        meta["tcp"].clone()
    };
    let health_over_tcp = |address: &str| {
        let mut c = TcpStream::connect(address).expect("connect to the agent over TCP");
        write!(c, "GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").expect("send");
        let mut raw = Vec::new();
        c.read_to_end(&mut raw).expect("read");
        parse_response(&raw).status
    };

    // Refused: one line on stderr that says what to set; the socket serves.
    let dir = livecov_tests::service::scratch("agent", "tcp-refused");
    let stderr = dir.join("stderr");
    let mut cmd = Command::new(service_bin());
    cmd.env("LIVECOV_DIR", dir.join("cov"))
        .env("LIVECOV_LISTEN", "0.0.0.0:0")
        .env("LLVM_PROFILE_FILE", dir.join("exit-%p.profraw"))
        .stderr(std::fs::File::create(&stderr).expect("stderr file"));
    let refused = Service::spawn(cmd, dir.join("cov"));
    assert!(refused.coverage("").contains("SF:"));
    assert_eq!(metadata_tcp(&refused), serde_json::Value::Null);
    let said = std::fs::read_to_string(&stderr).expect("stderr");
    assert!(
        said.contains("not listening on 0.0.0.0:0") && said.contains("LIVECOV_TOKEN") && said.contains("LIVECOV_LISTEN_WITHOUT_TOKEN=1"),
        "{said}"
    );

    // Asked for: served without a token.
    let open = start("tcp-open", &[], &[("LIVECOV_LISTEN", "0.0.0.0:0"), ("LIVECOV_LISTEN_WITHOUT_TOKEN", "1")]);
    let tcp = metadata_tcp(&open);
    let port = tcp.as_str().and_then(|a| a.rsplit(':').next()).expect("the TCP address in the metadata");
    assert_eq!(health_over_tcp(&format!("127.0.0.1:{port}")), 200);

    // Loopback needs neither.
    let local = start("tcp-loopback", &[], &[("LIVECOV_LISTEN", "127.0.0.1:0")]);
    assert_eq!(health_over_tcp(metadata_tcp(&local).as_str().expect("TCP address")), 200);
}

/// `livecov::start()` says why it did not start on the program's stderr:
/// where that takes nothing, the line is lost and the program runs on (a
/// Rust program ignores SIGPIPE, so a pipe nobody reads fails the write).
#[test]
fn a_line_the_agent_cannot_write_does_not_stop_the_program() {
    for (how, stderr) in livecov_tests::output_taking_nothing() {
        let dir = livecov_tests::service::scratch("agent", "stderr-taking-nothing");
        let mut cmd = Command::new(service_bin());
        cmd.env("LIVECOV_DIR", dir.join("cov")).env("LIVECOV_FLUSH_SECS", "soon").stderr(stderr);
        let s = Service::spawn(cmd, dir.join("cov"));
        assert!(s.get("/fib?n=10").ends_with("55"), "stderr {how}");
        assert!(!dir.join("cov").join("sockets").exists(), "stderr {how}: the agent started");
    }
}

/// A program that puts descriptors at small numbers itself once its agent
/// started (`dup2`, as a daemon does with those it hands to what it runs)
/// keeps its agent: started from `main` before any other thread of the
/// program, the agent builds its server's runtime with those numbers held,
/// so that its `epoll` and `eventfd` are past them.
#[test]
fn a_program_that_puts_descriptors_at_small_numbers_keeps_its_agent() {
    let dir = livecov_tests::service::scratch("agent", "null-low");
    let cov = dir.join("cov");
    let stderr = dir.join("stderr");
    let mut cmd = Command::new(service_bin());
    cmd.arg("--null-low")
        .env("LIVECOV_DIR", &cov)
        .env("LIVECOV_DEMANGLE", "0")
        .env("LLVM_PROFILE_FILE", dir.join("exit-%p.profraw"))
        .stderr(std::fs::File::create(&stderr).expect("a file for stderr"));
    let mut s = Service::spawn(cmd, cov);
    for n in [10, 20] {
        assert!(s.get(&format!("/fib?n={n}")).starts_with("HTTP/1.1 200"));
        assert!(function_count(&s.coverage(""), "handlers.rs", "handlers3fib") > 0);
    }
    // Below 64, the program's /dev/null (and the service's listener, made
    // after), none of the agent's runtime.
    let fds = std::fs::read_dir(format!("/proc/{}/fd", s.child.id())).expect("the service's descriptors");
    let mut low: Vec<(i32, String)> = fds
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, std::fs::read_link(e.path()).ok()?.display().to_string())))
        .filter(|&(fd, _)| (3..64).contains(&fd))
        .collect();
    low.sort();
    assert!(low.iter().filter(|(_, target)| target == "/dev/null").count() >= 60, "{low:?}");
    assert!(!low.iter().any(|(_, target)| target.starts_with("anon_inode:")), "{low:?}");
    assert!(s.get("/quit").starts_with("HTTP/1.1 200"));
    assert!(s.child.wait().expect("the service ends").success());
    let said = std::fs::read_to_string(&stderr).expect("its stderr");
    assert!(said.is_empty(), "{said}");
}

/// A child forked after the parent's dumps takes the parent's engine as
/// their last dump left it, and updates it: its report is still exactly its
/// own counts (llvm-cov over its exit profile), the parent's work at zero
/// (in the program and in its dlopen'ed plugin); the parent's next dump
/// still counts its own.
#[test]
fn a_child_forked_after_dumps_reports_exactly_its_own_counts() {
    let s = start("fork-warm", &["--plugin", plugin().to_str().expect("utf-8 path")], &[]);
    for limit in [10, 50] {
        assert!(s.get(&format!("/primes?limit={limit}")).starts_with("HTTP/1.1 200"));
        assert!(s.get("/plugin?x=3").ends_with("10"));
        assert!(function_count(&s.coverage(""), "handlers.rs", "handlers6primes") > 0);
    }
    // A child that runs a handler, and one that runs none: its record of
    // handlers.rs is the parent's with every count zero, as that of the
    // plugin (another object) in both.
    for (path, fib) in [("/fork?n=9", true), ("/fork", false)] {
        let answer = s.get(path);
        let pid: u32 = answer.rsplit("\r\n\r\n").next().and_then(|b| b.trim().parse().ok()).unwrap_or_else(|| panic!("{answer}"));
        let reports = s.cov_dir().join("reports");
        let report = std::fs::read_dir(&reports)
            .expect("reports/")
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                name.starts_with(&format!("rust-{pid}-")) && name.ends_with(".lcov")
            })
            .unwrap_or_else(|| panic!("no report of the child {pid}"));
        let report = std::fs::read_to_string(report).expect("the child's report");
        assert_eq!(report, llvm_cov_lcov(&[s.dir.join(format!("exit-{pid}.profraw"))], &[plugin()], &s.dir), "{path}");
        assert_eq!(function_count(&report, "handlers.rs", "handlers3fib") > 0, fib, "{path}: {report}");
        assert_eq!(function_count(&report, "handlers.rs", "handlers6primes"), 0, "{path}: {report}");
        assert_eq!(function_count(&report, "plugin.c", "plugin_compute"), 0, "{path}: {report}");
    }
    let parent = s.coverage("");
    assert_eq!(function_count(&parent, "handlers.rs", "handlers6primes"), 2);
    assert_eq!(function_count(&parent, "handlers.rs", "handlers3fib"), 0);
    assert_eq!(function_count(&parent, "plugin.c", "plugin_compute"), 2);
}
