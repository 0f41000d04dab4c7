//! `make demo` (tests/scripts/demo.sh), really run: it must merge what
//! every replica and the Node process served, print its table, and leave
//! no process behind, also when interrupted half-way.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};

use livecov_tests::lcov::{file_ending, parse_lcov};
use livecov_tests::workspace_root;

fn demo() -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg(workspace_root().join("tests/scripts/demo.sh"));
    // The demo builds with its own settings, as from a plain shell.
    for (name, _) in std::env::vars() {
        if (name.starts_with("CARGO") && name != "CARGO_HOME") || name.starts_with("RUSTC") || name == "RUSTFLAGS" {
            cmd.env_remove(name);
        }
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// Every process the demo started (it lists them in target/demo/pids) has ended.
fn assert_nothing_left(work: &Path) {
    let pids = std::fs::read_to_string(work.join("pids")).expect("the demo lists the processes it starts");
    assert!(!pids.trim().is_empty(), "the demo started no process?");
    for pid in pids.lines() {
        let pid: i32 = pid.parse().expect("a pid");
        // Safety: signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0;
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')))
            .unwrap_or(false);
        assert!(!alive || zombie, "process {pid} started by the demo is still running");
    }
    // Also those it may have failed to list: every process that names the
    // demo's folder, its coverage folders or DNS name in its arguments or
    // environment.
    let marks = [work.display().to_string(), "/livecov-demo.".to_owned(), "service.demo.livecov.test".to_owned()];
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if pid == std::process::id() {
            continue;
        }
        let read = |what: &str| std::fs::read(entry.path().join(what)).unwrap_or_default();
        let (cmdline, environ, stat) = (read("cmdline"), read("environ"), read("stat"));
        let zombie = String::from_utf8_lossy(&stat).rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
        let names_demo = |bytes: &[u8]| marks.iter().any(|m| String::from_utf8_lossy(bytes).contains(m.as_str()));
        assert!(
            zombie || !(names_demo(&cmdline) || names_demo(&environ)),
            "process {pid} ({}) of the demo is still running",
            String::from_utf8_lossy(&cmdline).replace('\0', " ")
        );
    }
}

#[test]
fn the_demo_merges_every_replica_and_cleans_up_also_when_interrupted() {
    let work = workspace_root().join("target/demo");

    let out = demo().output().expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the demo failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_nothing_left(&work);

    // Each replica served one endpoint: the merge has all three.
    let merged = std::fs::read_to_string(work.join("merged.lcov")).expect("merged.lcov");
    let files = parse_lcov(&merged);
    let handlers = file_ending(&files, "fixtures/service/src/handlers.rs");
    for function in ["hello", "fib", "primes"] {
        let hits: u64 = handlers.functions.iter().filter(|(name, _)| name.ends_with(&format!("::{function}"))).map(|(_, c)| c).sum();
        assert!(hits > 0, "{function} (served by one replica) is not covered in the merge: {:?}", handlers.functions);
    }
    // The Node process, collected over its directory, is in the merge too.
    let node = file_ending(&files, "fixtures/node/http/server.js");
    assert!(node.functions.get("hello").is_some_and(|&c| c > 0), "the Node service's hello: {:?}", node.functions);
    // The table: a row per file with the report's numbers, and the total.
    let lf: u64 = merged.lines().filter_map(|l| l.strip_prefix("LF:")).map(|v| v.parse::<u64>().expect("LF")).sum();
    let lh: u64 = merged.lines().filter_map(|l| l.strip_prefix("LH:")).map(|v| v.parse::<u64>().expect("LH")).sum();
    let total = stdout.lines().find(|l| l.starts_with("total ")).unwrap_or_else(|| panic!("no total row:\n{stdout}"));
    let numbers: Vec<&str> = total.split_whitespace().collect();
    assert_eq!(numbers[1..3], [lf.to_string(), lh.to_string()], "{total}");
    assert!(stdout.lines().any(|l| l.starts_with("fixtures/service/src/handlers.rs ")), "{stdout}");
    assert!(stdout.contains(&format!("merged LCOV: {}", work.join("merged.lcov").display())), "{stdout}");

    // Interrupted once the replicas run: it ends them all, and says so.
    let mut child = demo().stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run the demo");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let reached = lines.by_ref().map_while(Result::ok).any(|l| l.contains("livecov sidecar as the aggregator"));
    assert!(reached, "the demo ended before starting the aggregator");
    // Safety: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().expect("wait for the demo");
    let mut stderr = String::new();
    let _ = child.stderr.take().expect("stderr").read_to_string(&mut stderr);
    assert_eq!(status.code(), Some(130), "an interrupted demo exits with 130; it said:\n{stderr}");
    assert_nothing_left(&work);
}
