//! `livecov collect`, end to end, really run: per-test collections over the
//! replicas of a "headless Service" (the fixture service with the agent on
//! loopback addresses sharing one port, named by dnsmasq on a loopback
//! port), over a coverage directory with an exited process, and over
//! targets that fail.

mod replicas;

use std::path::{Path, PathBuf};

use livecov_tests::disk::SmallDisk;
use replicas::*;

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn manifest(out: &Path) -> serde_json::Value {
    serde_json::from_str(&read(&out.join("manifest.json"))).expect("manifest.json is JSON")
}

/// The per-instance files of a collection, by file name.
fn instance_files(out: &Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(out.join("instances"))
        .expect("instances/")
        .map(|e| {
            let e = e.expect("entry");
            (e.file_name().into_string().expect("UTF-8"), read(&e.path()))
        })
        .collect();
    files.sort();
    files
}

fn collect_ok(args: &[&str]) -> String {
    let out = livecov(&[&["collect"], args].concat());
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "livecov collect {args:?} failed: {stderr}");
    assert!(!stderr.contains('\r'), "a progress bar on a stderr that is not a terminal: {stderr:?}");
    stderr
}

#[test]
fn per_test_collections_with_reset_attribute_each_tests_lines_to_it() {
    let dir = scratch("collect", "per-test");
    let port = free_port();
    let token = "replica-secret";
    let ips = ["127.0.0.2", "127.0.0.3"];
    let dns = Dns::start(&dir, &ips, port);
    let replicas: Vec<Replica> =
        ips.iter().map(|ip| Replica::start(ip, Some(port), Some(token), &dir.join(format!("cov-{ip}")), &[])).collect();
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let (dns_arg, by_a, by_srv) = (dns.arg(), format!("dns:{NAME}:{port}"), format!("srv:{SRV}"));
    let token_arg = token_file.to_str().unwrap();

    // Test "hello" hits /hello on both replicas; test "fib" /fib on one.
    for r in &replicas {
        r.get("/hello?name=x");
    }
    let hello = dir.join("out/hello");
    let stderr = collect_ok(&[
        "--replicas", &by_a, "--dns-server", &dns_arg, "--target-token-file", token_arg,
        "--test", "hello", "--reset", "--profraw", "-o", hello.to_str().unwrap(),
    ]);
    assert!(stderr.contains("collected 2 instance(s) from 2 target(s)"), "{stderr}");
    replicas[1].get("/fib?n=30");
    let fib = dir.join("out/fib");
    collect_ok(&[
        "--replicas", &by_srv, "--dns-server", &dns_arg, "--target-token-file", token_arg,
        "--test", "fib", "--reset", "-o", fib.to_str().unwrap(),
    ]);

    let hello_lcov = read(&hello.join("merged.lcov"));
    let fib_lcov = read(&fib.join("merged.lcov"));
    assert_eq!(test_names(&hello_lcov), ["hello"]);
    assert_eq!(test_names(&fib_lcov), ["fib"]);
    assert_eq!((function_count(&hello_lcov, HELLO), function_count(&hello_lcov, FIB)), (2, 0));
    assert_eq!((function_count(&fib_lcov, HELLO), function_count(&fib_lcov, FIB)), (0, 1));
    // What the handlers ran is in one test's report only.
    let handlers = |lcov: &str| {
        lines_hit(lcov).into_iter().find(|(f, _)| f.ends_with("handlers.rs")).map(|(_, l)| l).unwrap_or_default()
    };
    let (h, f) = (handlers(&hello_lcov), handlers(&fib_lcov));
    assert!(!h.is_empty() && !f.is_empty());
    assert!(h.iter().all(|l| !f.contains(l)), "hello's lines {h:?} and fib's {f:?} overlap");

    // Replicas of one build: the merged report is llvm-cov's over their
    // profiles merged (with --profraw, each instance's raw profile of that
    // moment is in instances/), named after the test.
    let mut profraws: Vec<PathBuf> = std::fs::read_dir(hello.join("instances")).unwrap().map(|e| e.unwrap().path()).collect();
    profraws.sort();
    let mut want: Vec<PathBuf> = replicas.iter().map(|r| hello.join(format!("instances/{}.profraw", r.instance()))).collect();
    want.sort();
    assert_eq!(profraws, want);
    assert_eq!(hello_lcov, llvm_cov(&profraws, &[], &dir).replace("SF:", "TN:hello\nSF:"));
    // Without --profraw, nothing per instance merged exactly.
    assert!(instance_files(&fib).is_empty());

    // The manifest: every target, its instance, runtime, program, build id, timing.
    let m = manifest(&hello);
    assert_eq!((m["test"].as_str(), m["reset"].as_bool(), m["instances"].as_u64()), (Some("hello"), Some(true), Some(2)));
    assert_eq!(m["targets_failed"], 0);
    let targets = m["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 2);
    for (t, r) in targets.iter().zip(&replicas) {
        assert_eq!(t["address"], format!("http://{}:{port}", r.ip).as_str(), "{t}");
        assert_eq!(t["source"], by_a.as_str());
        assert_eq!(t["state"], "running");
        assert_eq!(t["instance"], r.instance().as_str());
        assert_eq!(t["runtime"], "rust");
        assert_eq!(t["pid"], r.pid());
        assert!(t["program"].as_str().unwrap().ends_with("/service"), "{t}");
        assert!(t["build_id"].as_str().is_some_and(|b| b.len() >= 16), "{t}");
        assert!(t["duration_ms"].is_u64() && t["started"].is_string() && t["error"].is_null(), "{t}");
        // The agent's own part of it, as its Server-Timing said.
        let report_ms = t["report_ms"].as_f64().unwrap_or_else(|| panic!("no report_ms: {t}"));
        assert!(report_ms > 0.0 && report_ms <= t["duration_ms"].as_f64().unwrap() + 1.0, "{t}");
        assert_eq!(t["file"], format!("instances/{}.profraw", r.instance()).as_str());
        assert_eq!(t["group"], m["groups"][0]["group"], "{t}");
    }
    assert_eq!(m["groups"].as_array().map(Vec::len), Some(1), "one build, one exact group: {m}");
    assert_eq!(m["sources"][0]["source"], by_a.as_str());
    assert!(m["totals"]["lines_hit"].as_u64().unwrap() > 0);

    // After the reset, nothing ran: a collection without --reset is all zeros.
    let idle = dir.join("out/idle");
    collect_ok(&["--replicas", &by_a, "--dns-server", &dns_arg, "--target-token", token, "-o", idle.to_str().unwrap()]);
    let idle_lcov = read(&idle.join("merged.lcov"));
    assert!(!idle_lcov.is_empty() && lines_hit(&idle_lcov).is_empty(), "{idle_lcov}");
    assert!(test_names(&idle_lcov).is_empty());
}

#[test]
fn collect_over_a_directory_counts_exited_processes_until_a_reset() {
    let dir = scratch("collect", "dir");
    let cov = dir.join("cov");
    let live = Replica::start("127.0.0.1", None, None, &cov, &[]);
    let mut exited = Replica::start("127.0.0.1", None, None, &cov, &[]);
    live.get("/fib?n=5");
    exited.get("/primes?limit=10");
    let exited_instance = exited.instance();
    exited.quit();
    let exited_report = read(&exited.report(&exited_instance));
    let cov_arg = cov.to_str().unwrap();

    // The exited process left its counters beside its report, and the live
    // one, of the same build, gives the mapping: one exact group, what
    // llvm-cov prints over the live profile and the exited one's exit profile.
    assert!(exited.report(&exited_instance).with_extension("counters").exists());
    let first = dir.join("first");
    collect_ok(&["--dir", cov_arg, "-o", first.to_str().unwrap()]);
    let exit_profile = dir.join(format!("exit-127.0.0.1-{}.profraw", exited.pid()));
    let want = llvm_cov(&[profraw(&live, &dir), exit_profile], &[], &dir);
    assert_eq!(read(&first.join("merged.lcov")), want);
    assert_eq!(function_count(&want, PRIMES), 1);
    let m = manifest(&first);
    let rows = m["targets"].as_array().unwrap();
    let row = |instance: &str| rows.iter().find(|r| r["instance"] == instance).unwrap_or_else(|| panic!("no {instance} in {m}"));
    assert_eq!(row(&live.instance())["state"], "running");
    let gone = row(&exited_instance);
    assert_eq!(gone["state"], "gone");
    assert!(gone["address"].as_str().unwrap().ends_with(".lcov"));
    assert_eq!(gone["runtime"], "rust");
    assert_eq!(gone["pid"], exited.pid());
    assert!(gone["group"].is_string() && gone["group"] == row(&live.instance())["group"], "{m}");
    // Both merged exactly: no file of their own.
    assert!(instance_files(&first).is_empty());
    assert_eq!(row(&live.instance())["file"], serde_json::Value::Null);
    // Merged as LCOV: each instance's report is its file, and the merge is theirs.
    let lcov = dir.join("lcov");
    collect_ok(&["--dir", cov_arg, "--lcov-merge", "-o", lcov.to_str().unwrap()]);
    assert_eq!(read(&lcov.join("merged.lcov")), merge(&[&live.own_dump(), &exited_report]));
    assert_eq!(instance_files(&lcov).len(), 2);
    // --path-equivalence moves the files of the checkout, in the merge and
    // in each instance's file, and changes nothing else.
    let root = format!("{}/", livecov_tests::workspace_root().display());
    let equivalence = format!("{root},/src/livecov");
    let move_paths = |lcov: &str| lcov.replace(&format!("SF:{root}"), "SF:/src/livecov/");
    assert!(want.contains(&format!("SF:{root}fixtures/service/")), "{want}");
    let moved = dir.join("moved");
    collect_ok(&["--dir", cov_arg, "--path-equivalence", &equivalence, "-o", moved.to_str().unwrap()]);
    assert_eq!(read(&moved.join("merged.lcov")), move_paths(&want));
    let moved_lcov = dir.join("moved-lcov");
    collect_ok(&["--dir", cov_arg, "--lcov-merge", "--path-equivalence", &equivalence, "-o", moved_lcov.to_str().unwrap()]);
    assert_eq!(read(&moved_lcov.join("merged.lcov")), move_paths(&read(&lcov.join("merged.lcov"))));
    let files: Vec<(String, String)> = instance_files(&lcov).into_iter().map(|(name, text)| (name, move_paths(&text))).collect();
    assert_eq!(instance_files(&moved_lcov), files);

    // A per-test collection with --reset takes the exited process's report
    // one last time; later collections leave it out.
    let second = dir.join("second");
    collect_ok(&["--dir", cov_arg, "--reset", "--test", "t", "-o", second.to_str().unwrap()]);
    let second_lcov = read(&second.join("merged.lcov"));
    assert_eq!(second_lcov, want.replace("SF:", "TN:t\nSF:"));
    let third = dir.join("third");
    collect_ok(&["--dir", cov_arg, "-o", third.to_str().unwrap()]);
    assert!(instance_files(&third).is_empty());
    let third_lcov = read(&third.join("merged.lcov"));
    assert!(lines_hit(&third_lcov).is_empty(), "{third_lcov}");
    assert_eq!(manifest(&third)["targets"].as_array().unwrap().len(), 1);
    // The output folder is reused: stale instance files are gone.
    collect_ok(&["--dir", cov_arg, "-o", lcov.to_str().unwrap()]);
    assert!(instance_files(&lcov).is_empty());

    // With every process of the build exited, none can give the mapping:
    // the first to write its counters wrote it beside them, once, and the
    // merge is exact still: llvm-cov over their exit profiles.
    let alone = dir.join("alone");
    let mut only = Replica::start("127.0.0.1", None, None, &alone, &[]);
    let mut other = Replica::start("127.0.0.1", None, None, &alone, &[]);
    only.get("/fib?n=3");
    other.get("/primes?limit=10");
    let (only_instance, other_instance) = (only.instance(), other.instance());
    only.quit();
    other.quit();
    let counters = std::fs::read(only.report(&only_instance).with_extension("counters")).unwrap();
    let id = std::str::from_utf8(&counters[..32]).unwrap();
    let mapping_file = alone.join("reports").join(format!("{id}.mapping"));
    let reports: Vec<String> = std::fs::read_dir(alone.join("reports")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(reports.iter().filter(|name| name.ends_with(".mapping")).collect::<Vec<_>>(), [&format!("{id}.mapping")], "{reports:?}");
    let out = dir.join("alone-out");
    collect_ok(&["--dir", alone.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    let exit_profiles = [only.pid(), other.pid()].map(|pid| dir.join(format!("exit-127.0.0.1-{pid}.profraw")));
    assert_eq!(read(&out.join("merged.lcov")), llvm_cov(&exit_profiles, &[], &dir));
    assert!(instance_files(&out).is_empty());
    let m = manifest(&out);
    assert_eq!(m["groups"].as_array().map(Vec::len), Some(1), "{m}");
    assert_eq!(m["groups"][0]["group"], id, "{m}");
    // Without it, each report joins as LCOV: here, merged as they are.
    std::fs::remove_file(&mapping_file).unwrap();
    collect_ok(&["--dir", alone.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    let only_report = read(&only.report(&only_instance));
    let other_report = read(&other.report(&other_instance));
    assert_eq!(read(&out.join("merged.lcov")), merge(&[&only_report, &other_report]));
    assert_eq!(instance_files(&out).len(), 2);
    assert!(manifest(&out)["targets"][0]["group"].is_null());
    // A malformed mapping is an error of the reports that name it, which
    // says what to do.
    std::fs::write(&mapping_file, "not a mapping").unwrap();
    let run = livecov(&["collect", "--dir", alone.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(1), "{}", String::from_utf8_lossy(&run.stderr));
    let rows = manifest(&out)["targets"].as_array().unwrap().clone();
    assert!(rows.iter().all(|row| row["state"] == "error"), "{rows:?}");
    let error = rows[0]["error"].as_str().unwrap();
    assert!(error.contains(&format!("{id}.mapping")) && error.contains("remove it"), "{error}");
    std::fs::remove_file(&mapping_file).unwrap();
    // Malformed counters beside a report are that report's error.
    std::fs::write(only.report(&only_instance).with_extension("counters"), "not counters\n").unwrap();
    let run = livecov(&["collect", "--dir", alone.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(1), "{}", String::from_utf8_lossy(&run.stderr));
    let m = manifest(&out);
    let row = m["targets"].as_array().unwrap().iter().find(|r| r["instance"] == only_instance.as_str()).unwrap();
    assert_eq!(row["state"], "error", "{row}");
    assert!(row["error"].as_str().unwrap().contains("not a livecov counters file"), "{row}");
}

/// Every file under `dir` (but `filler`), by path from it, with its bytes.
fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut folders = vec![dir.to_owned()];
    while let Some(folder) = folders.pop() {
        for e in std::fs::read_dir(&folder).expect("list the folder").map(|e| e.expect("entry")) {
            if e.file_type().expect("file type").is_dir() {
                folders.push(e.path());
            } else if e.file_name() != "filler" {
                files.push((e.path().strip_prefix(dir).unwrap().to_owned(), std::fs::read(e.path()).unwrap()));
            }
        }
    }
    files.sort();
    files
}

/// A collection onto a full disk fails saying so, and loses nothing: the
/// last collection in the folder stays whole (its instance files too), no
/// temporary file is left, and `--reset` resets nothing.
#[test]
fn a_collection_onto_a_full_disk_keeps_the_last_one_and_resets_nothing() {
    let dir = scratch("collect", "full-disk");
    let cov = dir.join("cov");
    let live = Replica::start("127.0.0.1", None, None, &cov, &[]);
    let mut exited = Replica::start("127.0.0.1", None, None, &cov, &[]);
    live.get("/fib?n=5");
    exited.get("/primes?limit=10");
    exited.quit();
    let cov_arg = cov.to_str().unwrap();
    let out = dir.join("out");
    let disk = SmallDisk::mount(&out, "4m");
    // Each instance's report as its file, and their merge.
    collect_ok(&["--dir", cov_arg, "--lcov-merge", "-o", out.to_str().unwrap()]);
    let last = files_under(&out);
    let last_merged = read(&out.join("merged.lcov"));
    assert_eq!(instance_files(&out).len(), 2);
    assert!(lines_hit(&last_merged).len() > 1, "{last_merged}");

    disk.fill();
    // Without a reset, it fails as it writes; with one, before it resets.
    for reset in [&[][..], &["--reset"]] {
        let run = livecov(&[&["collect", "--dir", cov_arg, "--lcov-merge", "-o", out.to_str().unwrap()], reset].concat());
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success(), "{stderr}");
        assert!(stderr.contains("No space left on device"), "{stderr}");
        assert!(stderr.contains(&out.display().to_string()), "names where: {stderr}");
        // Nothing of the last collection lost, nothing left beside it.
        let now = files_under(&out);
        assert!(now == last, "{reset:?}: the last collection changed: {:?}", now.iter().map(|f| &f.0).collect::<Vec<_>>());
    }
    drop(disk);

    // Not reset: the exited process's report is still taken, the live
    // one's counts are still there.
    let again = dir.join("again");
    collect_ok(&["--dir", cov_arg, "--lcov-merge", "-o", again.to_str().unwrap()]);
    assert_eq!(read(&again.join("merged.lcov")), last_merged);
}

#[test]
fn processes_killed_before_their_final_report_are_lost_not_running() {
    let dir = scratch("collect", "lost");
    let cov = dir.join("cov");
    let exited_cleanly = {
        let mut r = Replica::start("127.0.0.1", None, None, &cov, &[]);
        let instance = r.instance();
        r.quit();
        instance
    };
    // Killed with a periodic report on disk, and killed with none.
    let mut periodic = Replica::start("127.0.0.1", None, None, &cov, &[("LIVECOV_FLUSH_SECS", "0.1")]);
    periodic.get("/primes?limit=10");
    let periodic_instance = periodic.instance();
    wait_for("a periodic report with /primes", || {
        let r = std::fs::read_to_string(periodic.report(&periodic_instance)).ok()?;
        (r.contains("SF:") && function_count(&r, PRIMES) == 1).then_some(())
    });
    periodic.kill();
    let mut silent = Replica::start("127.0.0.1", None, None, &cov, &[]);
    let silent_instance = silent.instance();
    silent.kill();
    let cov_arg = cov.to_str().unwrap();

    let out = dir.join("out");
    let stderr = collect_ok(&["--dir", cov_arg, "-o", out.to_str().unwrap()]);
    assert!(stderr.contains("2 instance(s) lost: ended without a final report"), "{stderr}");
    assert!(stderr.contains(&format!("instance {silent_instance} ended without a final report")), "{stderr}");
    let m = manifest(&out);
    let rows = m["targets"].as_array().unwrap();
    let state = |instance: &str| {
        let r = rows.iter().find(|r| r["instance"] == instance).unwrap_or_else(|| panic!("no {instance} in {m}"));
        r["state"].as_str().unwrap().to_owned()
    };
    assert_eq!(state(&exited_cleanly), "gone");
    assert_eq!(state(&periodic_instance), "lost");
    assert_eq!(state(&silent_instance), "lost");
    assert!(rows.iter().all(|r| r["state"] != "running"), "{m}");
    // What the killed process had reported still counts.
    assert_eq!(function_count(&read(&out.join("merged.lcov")), PRIMES), 1);

    // The sidecar says the same in /targets, /health and /metrics.
    let sidecar = Sidecar::start(&["--dir", cov_arg, "--listen", "127.0.0.1:0", "--poll-interval", "0.2"], None);
    let targets = wait_for("the sidecar's first round", || {
        let t = sidecar.targets();
        (t.len() >= 3).then_some(t)
    });
    let shown = |instance: &str| {
        targets.iter().filter(|t| t["instance"] == instance).map(|t| t["state"].as_str().unwrap().to_owned()).collect::<Vec<_>>()
    };
    assert_eq!(shown(&exited_cleanly), ["gone"], "{targets:?}");
    assert_eq!(shown(&periodic_instance), ["lost"], "{targets:?}");
    assert_eq!(shown(&silent_instance), ["lost"], "{targets:?}");
    let health: serde_json::Value = serde_json::from_slice(&sidecar.get("/health").body).expect("JSON");
    assert_eq!(health["targets"]["lost"], 2, "{health}");
    let metrics = String::from_utf8(sidecar.get("/metrics").body).expect("UTF-8");
    assert!(metrics.contains("livecov_sidecar_targets{state=\"lost\"} 2"), "{metrics}");
}

#[test]
fn failed_targets_are_in_the_manifest_and_fail_the_step_unless_partial_is_allowed() {
    let dir = scratch("collect", "bad");
    let agent_port = free_port();
    let good = Replica::start("127.0.0.1", Some(agent_port), None, &dir.join("cov"), &[]);
    good.get("/hello?name=ok");
    let garbage = Fake::start(Bad::Garbage);
    let hang = Fake::start(Bad::Hang);
    let endless = Fake::start(Bad::Endless);
    let refused = refused_url();
    let good_url = format!("http://127.0.0.1:{agent_port}");
    let out = dir.join("out");
    let args = [
        "collect", "--target", &good_url, "--target", &garbage.url(), "--target", &hang.url(), "--target", &endless.url(),
        "--target", &refused, "--timeout", "3", "--max-size", "4", "-o", out.to_str().unwrap(),
    ];
    let run = livecov(&args);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("4 of 5 target(s) failed") && stderr.contains("--allow-partial"), "{stderr}");
    // The good target is collected all the same (one instance of one build:
    // its own report, as llvm-cov prints it), and the manifest says what failed.
    assert_eq!(read(&out.join("merged.lcov")), good.own_dump());
    let m = manifest(&out);
    assert_eq!(m["targets_failed"], 4);
    let rows = m["targets"].as_array().unwrap();
    let error_of = |url: &str| -> String {
        let row = rows.iter().find(|r| r["address"] == url).unwrap_or_else(|| panic!("no {url} in {m}"));
        assert_eq!(row["state"], "error", "{row}");
        row["error"].as_str().unwrap().to_owned()
    };
    assert!(error_of(&garbage.url()).contains("did not answer as a livecov agent"));
    assert!(error_of(&hang.url()).contains("no complete answer"));
    assert!(error_of(&endless.url()).contains("larger than 4 MiB"));
    assert!(error_of(&refused).contains("refused the connection"));
    let hang_row = rows.iter().find(|r| r["address"] == hang.url().as_str()).unwrap();
    assert_eq!(hang_row["attempts"], 2, "one retry: {hang_row}");

    // --allow-partial: the same, exit 0.
    let mut partial = args.to_vec();
    partial.push("--allow-partial");
    let run = livecov(&partial);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(manifest(&out)["targets_failed"], 4);

    // No target at all (a name without records) is a failure too.
    let dns = Dns::start(&dir, &[], agent_port);
    let none = dir.join("none");
    let by_a = format!("dns:{NAME}:{agent_port}");
    let run = livecov(&["collect", "--replicas", &by_a, "--dns-server", &dns.arg(), "-o", none.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&run.stderr).contains("no target found"), "{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(manifest(&none)["targets"].as_array().unwrap().len(), 0);
    // Arguments are checked before anything is asked.
    let run = livecov(&["collect", "--replicas", "dns:nope", "-o", none.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(2));
    let run = livecov(&["collect", "-o", none.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&run.stderr).contains("no target"), "{}", String::from_utf8_lossy(&run.stderr));
}

#[test]
fn sidecar_and_collect_have_help_with_examples() {
    for cmd in ["sidecar", "collect"] {
        let out = livecov(&[cmd, "--help"]);
        assert!(out.status.success());
        let help = String::from_utf8(out.stdout).unwrap();
        assert!(help.contains("Examples:") && help.contains(&format!("livecov {cmd} --")), "{cmd}: {help}");
        for option in ["--dir", "--replicas", "--target ", "--dns-server", "--target-token", "--parallelism", "--timeout"] {
            assert!(help.contains(option), "{cmd} --help lacks {option}");
        }
    }
    let out = livecov(&["sidecar", "--dir", "/nonexistent"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing to listen on"));
}
