//! `livecov sidecar`, end to end, really run: as an aggregator over the
//! replicas of a "headless Service" (the fixture service with the agent on
//! 127.0.0.2, 127.0.0.3, ... sharing one port, named by a real DNS server,
//! dnsmasq, on a loopback port); as a pod sidecar over a coverage directory
//! shared by several processes (one exited, one killed); over targets that
//! misbehave.

mod replicas;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use livecov_tests::http::get_report;
use replicas::*;

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn an_aggregator_merges_the_replicas_of_a_headless_service_as_they_come_and_go() {
    let dir = scratch("sidecar", "aggregator");
    let port = free_port();
    let token = "replica-secret";
    let ips = ["127.0.0.2", "127.0.0.3", "127.0.0.4"];
    let dns = Dns::start(&dir, &ips, port);
    let cov = |ip: &str| dir.join(format!("cov-{ip}"));
    let mut replicas: Vec<Replica> = ips.iter().map(|ip| Replica::start(ip, Some(port), Some(token), &cov(ip), &[])).collect();
    replicas[0].get("/hello?name=a");
    replicas[1].get("/fib?n=10");
    replicas[1].get("/fib?n=20");
    replicas[2].get("/primes?limit=30");

    let replicas_arg = format!("dns:{NAME}:{port}");
    let dns_arg = dns.arg();
    let sidecar = Sidecar::start(
        &[
            "--replicas", &replicas_arg, "--dns-server", &dns_arg, "--target-token", token,
            "--listen", "127.0.0.1:0", "--poll-interval", "1", "--resolve-interval", "0.5", "--timeout", "10",
        ],
        Some("aggregator-secret"),
    );

    // Replicas of one build: the merge is llvm-cov's over their raw
    // profiles merged.
    let profiles = dir.join("profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    let own: Vec<PathBuf> = replicas.iter().map(|r| profraw(r, &profiles)).collect();
    let want = llvm_cov(&own, &[], &dir);
    let merged = sidecar.coverage("");
    assert_eq!(merged, want);
    assert_eq!((function_count(&merged, HELLO), function_count(&merged, FIB), function_count(&merged, PRIMES)), (1, 2, 1));

    // Every replica is a running target, with its instance and metadata.
    for r in &replicas {
        let row = sidecar.target(&format!("{}:{port}", r.ip)).expect("a row per replica");
        assert_eq!(row["state"], "running", "{row}");
        assert_eq!(row["instance"], r.instance().as_str(), "{row}");
        assert_eq!(row["runtime"], "rust", "{row}");
        assert!(row["program"].as_str().is_some_and(|p| p.ends_with("service")), "{row}");
        assert!(row["last_snapshot"].is_string() && row["last_error"].is_null(), "{row}");
    }

    // The SRV record gives the same replicas (ports from the record).
    let srv_arg = format!("srv:{SRV}");
    let by_srv = Sidecar::start(
        &["--replicas", &srv_arg, "--dns-server", &dns_arg, "--target-token", token, "--listen", "127.0.0.1:0"],
        None,
    );
    assert_eq!(by_srv.coverage(""), want);
    assert_eq!(by_srv.targets().len(), 3);
    drop(by_srv);

    // Clients need the token on TCP, on every route.
    let addr = sidecar.addr.expect("TCP");
    for (method, path) in [("GET", "/coverage"), ("POST", "/reset"), ("GET", "/targets"), ("GET", "/metrics"), ("GET", "/health")] {
        for token in [None, Some("wrong")] {
            let r = tcp_request(addr, method, path, token);
            assert_eq!(r.status, 401, "{method} {path} with {token:?}");
            assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        }
    }
    // Bad requests are refused with a JSON error.
    assert_eq!(sidecar.get("/coverage?format=profraw").status, 400);
    assert_eq!(sidecar.get("/coverage?format=xml").status, 400);
    assert_eq!(sidecar.get("/nope").status, 404);
    assert_eq!(sidecar.post("/coverage").status, 405);
    let health = sidecar.get("/health").json();
    assert_eq!((health["runtime"].as_str(), health["instance"].as_str()), (Some("sidecar"), Some(sidecar.instance.as_str())));

    // A replica killed mid-test (and dropped from DNS) stays in the merge, gone.
    let mut killed = replicas.remove(1);
    let killed_instance = killed.instance();
    let killed_profile = own[1].clone();
    killed.kill();
    dns.set(&["127.0.0.2", "127.0.0.4"]);
    let row = wait_for("the killed replica to be gone", || {
        sidecar.target("127.0.0.3").filter(|row| row["state"] == "gone")
    });
    assert_eq!(row["instance"], killed_instance.as_str());
    assert_eq!(row["in_merge"], true, "{row}");
    assert_eq!(sidecar.coverage(""), want);
    let metrics = sidecar.get("/metrics").text();
    for line in [
        "livecov_sidecar_targets{state=\"running\"} 2\n",
        "livecov_sidecar_targets{state=\"gone\"} 1\n",
        "livecov_sidecar_instances 3\n",
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }

    // A replica added to DNS is picked up.
    let added = Replica::start("127.0.0.5", Some(port), Some(token), &cov("127.0.0.5"), &[]);
    added.get("/primes?limit=50");
    added.get("/hello");
    dns.set(&["127.0.0.2", "127.0.0.4", "127.0.0.5"]);
    let added_instance = added.instance();
    wait_for("the added replica to be running", || {
        sidecar.target("127.0.0.5").filter(|row| row["state"] == "running" && row["instance"] == added_instance.as_str())
    });
    let now = [profraw(&replicas[0], &profiles), killed_profile, profraw(&replicas[1], &profiles), profraw(&added, &profiles)];
    let want = llvm_cov(&now, &[], &dir);
    let merged = sidecar.coverage("");
    assert_eq!(merged, want);
    assert_eq!((function_count(&merged, HELLO), function_count(&merged, PRIMES)), (2, 2));
    replicas.push(added);

    // JSON totals over the merge.
    let json = sidecar.get("/coverage?format=json").json();
    assert_eq!(json["instances"], 4);
    assert!(json["totals"]["lines_hit"].as_u64().unwrap() > 0, "{json}");

    // A reset resets every live replica and forgets the gone one.
    let r = sidecar.post("/reset");
    assert_eq!(r.status, 204, "{}", String::from_utf8_lossy(&r.body));
    assert!(sidecar.target("127.0.0.3").is_none(), "the gone replica is still listed after a reset");
    let after = sidecar.coverage("");
    assert!(!after.is_empty() && lines_hit(&after).is_empty(), "hits after a reset:\n{after}");
    for r in &replicas {
        assert!(lines_hit(&r.own_dump()).is_empty(), "replica {} was not reset", r.ip);
    }

    // Per-test coverage through the sidecar: dump-and-reset, named.
    replicas[0].get("/hello?name=b");
    replicas[2].get("/fib?n=3");
    let t1 = sidecar.coverage("?test=t1&reset=1");
    assert_eq!(test_names(&t1), ["t1"]);
    assert_eq!((function_count(&t1, HELLO), function_count(&t1, FIB), function_count(&t1, PRIMES)), (1, 1, 0));
    replicas[1].get("/primes?limit=10");
    let t2 = sidecar.coverage("?test=t2&reset=1");
    assert_eq!(test_names(&t2), ["t2"]);
    assert_eq!((function_count(&t2, HELLO), function_count(&t2, FIB), function_count(&t2, PRIMES)), (0, 0, 1));
    // Both tests together are what ran since the reset.
    let both = merge(&[&t1.replace("TN:t1\n", ""), &t2.replace("TN:t2\n", "")]);
    assert_eq!((function_count(&both, HELLO), function_count(&both, FIB), function_count(&both, PRIMES)), (1, 1, 1));
    drop(dns);
}

#[test]
fn a_pod_sidecar_merges_every_process_of_its_directory_and_an_aggregator_merges_pods() {
    let dir = scratch("sidecar", "pod");
    let cov = dir.join("cov");
    // Four processes of one pod on one coverage directory.
    let p1 = Replica::start("127.0.0.1", None, None, &cov, &[]);
    let p2 = Replica::start("127.0.0.1", None, None, &cov, &[]);
    let mut p3 = Replica::start("127.0.0.1", None, None, &cov, &[]);
    let mut p4 = Replica::start("127.0.0.1", None, None, &cov, &[("LIVECOV_FLUSH_SECS", "0.2")]);
    p1.get("/hello?name=one");
    p2.get("/fib?n=7");
    p3.get("/primes?limit=20");
    p4.get("/fib?n=9");
    p4.get("/hello");
    let (i1, i2, i3, i4) = (p1.instance(), p2.instance(), p3.instance(), p4.instance());
    // p3 exits (its final report stays); p4 is killed once its periodic
    // report has its traffic (its socket file stays behind).
    p3.quit();
    let p4_dump = p4.own_dump();
    let p4_profile = profraw(&p4, &dir);
    let p4_report = p4.report(&i4);
    let p4_counters = p4_report.with_extension("counters");
    let periodic = || Some(std::fs::metadata(&p4_counters).ok()?.modified().ok()? >= std::fs::metadata(&p4_report).ok()?.modified().ok()?);
    wait_for("p4's periodic report and counters", || {
        (std::fs::read_to_string(&p4_report).ok()? == p4_dump && periodic()?).then_some(())
    });
    p4.kill();
    assert!(p4.socket().exists(), "a killed process leaves its socket");
    // One build: the live processes, the exited one's final counters and the
    // killed one's last periodic counters, summed; the oracle is llvm-cov
    // over their profiles of those moments (p3's exit profile, p4's own
    // profile when its periodic report had its traffic).
    let p3_profile = dir.join(format!("exit-127.0.0.1-{}.profraw", p3.pid()));
    let want = llvm_cov(&[profraw(&p1, &dir), profraw(&p2, &dir), p3_profile, p4_profile], &[], &dir);

    // The pod's sidecar: on a Unix socket (no token) and on TCP (token).
    let socket = dir.join("sidecar.sock");
    let cov_arg = cov.to_str().unwrap();
    let pod = Sidecar::start(
        &["--dir", cov_arg, "--socket", socket.to_str().unwrap(), "--listen", "127.0.0.1:0", "--poll-interval", "1"],
        Some("pod-secret"),
    );
    // As an agent's, its answer says how long the merge took to make.
    let r = get_report(&socket, "/coverage");
    assert_eq!(r.header("livecov-instance"), Some(pod.instance.as_str()));
    assert_eq!(r.text(), want);
    assert_eq!(pod.coverage(""), want);
    assert_eq!(tcp_request(pod.addr.unwrap(), "GET", "/coverage", None).status, 401);

    let rows = pod.targets();
    let state_of = |instance: &str| -> Vec<String> {
        rows.iter().filter(|r| r["instance"] == instance).map(|r| r["state"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(state_of(&i1), ["running"]);
    assert_eq!(state_of(&i2), ["running"]);
    // What each agent said its last answer took it to make.
    for row in rows.iter().filter(|r| r["state"] == "running") {
        assert!(row["last_report_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{row}");
    }
    assert_eq!(state_of(&i3), ["gone"], "{rows:?}");
    // Killed: its periodic report is in the merge, its last moments are not.
    assert_eq!(state_of(&i4), ["lost"], "{rows:?}");
    let p3_row = rows.iter().find(|r| r["instance"] == i3.as_str()).unwrap();
    assert_eq!(p3_row["kind"], "report");
    let p1_row = rows.iter().find(|r| r["instance"] == i1.as_str()).unwrap();
    assert!(p3_row["group"].is_string() && p3_row["group"] == p1_row["group"], "the exited process in its build's group: {rows:?}");
    assert_eq!(p3_row["runtime"], "rust");
    // Of the time its requests took, the agents' own, as they said it.
    let metrics = pod.get("/metrics").text();
    let total = |name: &str| -> f64 {
        let value = metrics.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok());
        value.unwrap_or_else(|| panic!("no {name} in {metrics}"))
    };
    let asked = total("livecov_sidecar_dump_duration_seconds_total");
    let made = total("livecov_sidecar_target_report_duration_seconds_total");
    assert!(made > 0.0 && made < asked, "{made} s made of {asked} s asked");

    // An aggregator over pods merges per instance: the pod answers as one.
    let pod_url = format!("http://{}", pod.addr.unwrap());
    let aggregator = Sidecar::start(&["--target", &pod_url, "--target-token", "pod-secret", "--listen", "127.0.0.1:0"], None);
    assert_eq!(aggregator.coverage(""), want);
    let rows = aggregator.targets();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["instance"], pod.instance.as_str());
    assert_eq!(rows[0]["runtime"], "sidecar");
    // What the pod's sidecar said its merge took it to make.
    assert!(rows[0]["last_report_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{rows:?}");
    // With --path-equivalence, the files of the checkout are elsewhere in
    // all it serves (it merged the pod's counters exactly), and nothing else changed.
    let root = format!("{}/", livecov_tests::workspace_root().display());
    let equivalence = format!("{root},/src/livecov");
    let moved = Sidecar::start(
        &["--target", &pod_url, "--target-token", "pod-secret", "--listen", "127.0.0.1:0", "--path-equivalence", &equivalence],
        None,
    );
    assert!(want.contains(&format!("SF:{root}fixtures/service/")), "{want}");
    assert_eq!(moved.coverage(""), want.replace(&format!("SF:{root}"), "SF:/src/livecov/"));
    let files = moved.get("/coverage?format=json").json()["files"].clone();
    let names: Vec<&str> = files.as_array().unwrap().iter().map(|f| f["file"].as_str().unwrap()).collect();
    assert!(names.contains(&"/src/livecov/fixtures/service/src/handlers.rs"), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with(&root)), "{names:?}");
    drop(moved);

    // A reset through the aggregator reaches the pod's processes and
    // forgets the exited and killed ones (for every later reader too).
    let r = aggregator.post("/reset");
    assert_eq!(r.status, 204, "{}", String::from_utf8_lossy(&r.body));
    assert!(cov.join(".livecov-reset").exists());
    let after = pod.coverage("");
    assert!(!after.is_empty() && lines_hit(&after).is_empty(), "{after}");
    assert_eq!(pod.get("/health").json()["instances"], 2);
    assert!(pod.targets().iter().all(|r| r["state"] == "running"), "{:?}", pod.targets());
    assert_eq!(aggregator.coverage(""), after);
    p1.get("/fib?n=4");
    let r = unix_request(&socket, "GET", "/coverage?test=later");
    assert_eq!(function_count(&r.text(), FIB), 1);
    assert_eq!(test_names(&r.text()), ["later"]);

    // A restarted pod sidecar is the same instance (it serves the same
    // processes and reports): aggregators replace its snapshot.
    let again = Sidecar::start(&["--dir", cov_arg, "--listen", "127.0.0.1:0"], None);
    assert_eq!(again.instance, pod.instance);
    drop(again);

    // The sidecar's socket must not be where it looks for agents.
    let inside = cov.join("sockets/sidecar.sock");
    let out = livecov(&["sidecar", "--dir", cov_arg, "--socket", inside.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("where the sidecar looks for agents"));
    drop((p1, p2));
}

/// Lines the sidecar cannot write (a full disk, a pipe nobody reads) are
/// lost and stop nothing. Its log is its standard error: with `eprintln!`,
/// the warning of a `--listen` without `--token` ended it (status 101)
/// before it listened. Its addresses on standard output are for whoever
/// started it: they then go to its log; before, it ended at its start.
#[test]
fn lines_the_sidecar_cannot_write_stop_nothing() {
    let dir = scratch("sidecar", "unwritten");
    let replica = Replica::start("127.0.0.1", None, None, &dir.join("cov"), &[]);
    replica.get("/fib?n=12");
    let want = replica.own_dump();
    let cov = dir.join("cov").display().to_string();
    for (what, stderr) in livecov_tests::output_taking_nothing() {
        let mut sidecar = Sidecar::start_logging(&["--dir", &cov, "--listen", "127.0.0.1:0"], None, stderr);
        assert_eq!(sidecar.coverage(""), want, "stderr {what}");
        assert!(sidecar.alive(), "stderr {what}");
    }
    for (k, (what, stdout)) in livecov_tests::output_taking_nothing().into_iter().enumerate() {
        let socket = dir.join(format!("sidecar-{k}.sock"));
        let mut child = std::process::Command::new(livecov_bin())
            .args(["sidecar", "--dir", &cov, "--socket", socket.to_str().unwrap()])
            .stdout(stdout)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start livecov sidecar");
        wait_for("the sidecar's socket", || socket.exists().then_some(()));
        let r = unix_request(&socket, "GET", "/coverage");
        assert_eq!((r.status, r.text()), (200, want.clone()), "stdout {what}");
        assert!(matches!(child.try_wait(), Ok(None)), "stdout {what}: the sidecar ended");
        // Safety: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let out = child.wait_with_output().expect("wait for the sidecar");
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(log.contains("cannot write to standard output") && log.contains("listening on unix:"), "stdout {what}: {log}");
    }
}

#[test]
fn bad_targets_are_reported_the_others_merge_and_the_sidecar_stays_up() {
    let dir = scratch("sidecar", "bad");
    let agent_port = free_port();
    let good = Replica::start("127.0.0.1", Some(agent_port), None, &dir.join("cov"), &[]);
    good.get("/fib?n=12");
    let fakes: Vec<(Bad, Fake)> =
        [Bad::Garbage, Bad::Malformed, Bad::NotLivecov, Bad::Hang, Bad::Endless].into_iter().map(|b| (b, Fake::start(b))).collect();
    let refused = refused_url();
    let good_url = format!("http://127.0.0.1:{agent_port}");
    let mut args: Vec<String> = vec!["--target".into(), good_url.clone(), "--target".into(), refused.clone()];
    for (_, f) in &fakes {
        args.extend(["--target".to_owned(), f.url()]);
    }
    args.extend(["--listen", "127.0.0.1:0", "--timeout", "3", "--max-size", "4", "--parallelism", "3"].map(String::from));
    let mut sidecar = Sidecar::start(&strs(&args), Some("s"));

    // One instance of one build: its own report, as llvm-cov prints it.
    let want = good.own_dump();
    for round in 0..2 {
        let start = Instant::now();
        assert_eq!(sidecar.coverage(""), want, "round {round}");
        // Two attempts of at most 3 s for the slow ones, in parallel (the
        // timeout leaves the good agent's debug build time under load).
        assert!(start.elapsed() < Duration::from_secs(30), "round {round} took {:?}", start.elapsed());
    }
    let expect = |url: &str, words: &str| {
        let row = sidecar.target(url.trim_start_matches("http://")).unwrap_or_else(|| panic!("no row for {url}"));
        assert_eq!(row["state"], "error", "{row}");
        let error = row["last_error"].as_str().unwrap_or_default();
        assert!(error.contains(words), "{url}: {words:?} not in {error:?}");
    };
    expect(&refused, "refused the connection");
    for (bad, fake) in &fakes {
        let words = match bad {
            Bad::Garbage => "did not answer as a livecov agent",
            Bad::Malformed => "not LCOV",
            Bad::NotLivecov => "without a Livecov-Instance header",
            Bad::Hang => "no complete answer",
            Bad::Endless => "larger than 4 MiB",
        };
        expect(&fake.url(), words);
    }
    let good_row = sidecar.target(good_url.trim_start_matches("http://")).unwrap();
    assert_eq!(good_row["state"], "running", "{good_row}");
    assert!(sidecar.get("/metrics").text().contains("livecov_sidecar_targets{state=\"error\"} 6\n"));
    let r = sidecar.get("/coverage");
    assert_eq!(r.header("livecov-targets-failed"), Some("6"));
    assert_eq!(sidecar.get("/health").status, 200);
    assert!(sidecar.alive());
    // The endless body was cut at the size limit: memory stays bounded.
    let peak = peak_rss_kib(sidecar.pid());
    assert!(peak < 150 * 1024, "the sidecar peaked at {peak} KiB");
}
