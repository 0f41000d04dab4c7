//! Replica discovery, end to end, against a real DNS server (dnsmasq on a
//! loopback port): every outcome of a resolution (no server, REFUSED,
//! NXDOMAIN, a name without records of the asked type) is named, with what
//! to check, by `livecov collect` (its exit status, its error line and the
//! manifest's sources) and by the sidecar (`/targets`, `/health`,
//! `/metrics`), which keeps resolving and shows a name that comes back.

mod replicas;

use std::path::Path;
use std::process::Output;

use replicas::*;

/// The domain dnsmasq answers alone (`--local`): names of it that it does
/// not know are NXDOMAIN.
const LOCAL: &str = "--local=/livecov.test/";

fn manifest(out: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(out.join("manifest.json")).expect("manifest.json");
    serde_json::from_str(&text).expect("manifest.json is JSON")
}

/// `livecov collect --replicas SPEC --dns-server DNS -o OUT EXTRA...`.
fn collect(spec: &str, dns: &str, out: &Path, extra: &[&str]) -> (Output, String) {
    let mut args = vec!["collect", "--replicas", spec, "--dns-server", dns, "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let run = livecov(&args);
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    (run, stderr)
}

/// A collection that finds nothing: status 1 with the source's outcome in
/// the error line, also with --allow-partial; status 0 with --allow-empty.
/// The manifest's source: its state and its error (returned).
fn collect_nothing(spec: &str, dns: &str, out: &Path, state: &str, wants: &[&str]) -> String {
    let (run, stderr) = collect(spec, dns, out, &[]);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    let line = stderr.lines().find(|l| l.starts_with("livecov: error: ")).unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert!(line.contains(&format!("no target found: {spec}: ")) && line.contains("--allow-empty"), "{line}");
    for want in wants {
        assert!(line.contains(want), "{want:?} not in {line}");
    }
    let m = manifest(out);
    let source = &m["sources"][0];
    assert_eq!(source["source"], spec, "{m}");
    assert_eq!(source["state"], state, "{m}");
    assert_eq!(source["targets"], 0, "{m}");
    let error = source["error"].as_str().unwrap_or_else(|| panic!("no error on the source: {m}")).to_owned();
    assert!(line.contains(&error), "the manifest's error is the error line's: {error} / {line}");
    assert_eq!(m["targets"].as_array().map(Vec::len), Some(0), "{m}");

    let (run, stderr) = collect(spec, dns, out, &["--allow-partial"]);
    assert_eq!(run.status.code(), Some(1), "--allow-partial accepts failed targets, not an empty discovery: {stderr}");
    assert!(stderr.contains("no target found"), "{stderr}");
    let (run, stderr) = collect(spec, dns, out, &["--allow-empty", "--allow-partial"]);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("livecov: {spec}: {error}")), "the source's error is still shown: {stderr}");
    error
}

#[test]
fn collect_names_a_dns_server_that_does_not_answer() {
    let dir = scratch("discovery", "no-server");
    // Nothing listens there (UDP nor TCP).
    let nobody = format!("127.0.0.1:{}", free_port());
    let spec = format!("dns:{NAME}:9464");
    let error = collect_nothing(&spec, &nobody, &dir.join("out"), "no_answer", &[]);
    assert!(error.starts_with(&format!("no answer from --dns-server {nobody} for {NAME} after ")), "{error}");
    assert!(error.contains("2 tries of 2 s") && error.contains("check that --dns-server"), "{error}");
    // Only --allow-empty: a server that does not answer is a failure (nothing
    // is known of the replicas), which --allow-partial accepts.
    let (run, stderr) = collect(&spec, &nobody, &dir.join("out"), &["--allow-empty"]);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("1 source(s) could not be resolved or listed") && stderr.contains("--allow-partial"), "{stderr}");
}

#[test]
fn collect_names_a_refusing_dns_server() {
    let dir = scratch("discovery", "refused");
    // No upstream, and NAME unknown: dnsmasq refuses.
    let dns = Dns::start(&dir, &[], 9464);
    let spec = format!("dns:{NAME}:9464");
    let error = collect_nothing(&spec, &dns.arg(), &dir.join("out"), "refused", &["REFUSED"]);
    assert!(error.starts_with(&format!("--dns-server {} refused to resolve {NAME} (REFUSED", dns.arg())), "{error}");
    assert!(error.contains("check the Service's name and namespace") && error.contains("is the cluster's DNS server"), "{error}");
}

#[test]
fn collect_names_a_name_that_does_not_exist() {
    let dir = scratch("discovery", "nxdomain");
    let records = [LOCAL.to_owned(), "--host-record=app.livecov.test,127.0.0.9".to_owned()];
    let dns = Dns::with_records(&dir, &records, "app.livecov.test", &["127.0.0.9"]);
    let out = dir.join("out");

    let error = collect_nothing("dns:typo.livecov.test:9464", &dns.arg(), &out, "nxdomain", &["NXDOMAIN"]);
    assert!(error.starts_with(&format!("typo.livecov.test does not exist (NXDOMAIN from --dns-server {})", dns.arg())), "{error}");
    assert!(error.contains("the Service's name and namespace") && error.contains("selector matches ready pods"), "{error}");

    let error = collect_nothing("srv:_coverage._tcp.typo.livecov.test", &dns.arg(), &out, "nxdomain", &[]);
    assert!(error.contains("does not exist (NXDOMAIN") && error.contains("_PORT-NAME._tcp.SERVICE.NAMESPACE"), "{error}");

    // The Service exists, its port's name is wrong.
    let error = collect_nothing("srv:_cov._tcp.app.livecov.test", &dns.arg(), &out, "nxdomain", &[]);
    assert!(error.contains("but app.livecov.test does: the Service has no port named cov"), "{error}");
}

#[test]
fn collect_names_a_name_without_records_of_the_asked_type() {
    let dir = scratch("discovery", "no-records");
    let records = [
        LOCAL.to_owned(),
        "--host-record=app.livecov.test,127.0.0.9".to_owned(),
        "--srv-host=_coverage._tcp.app.livecov.test,app.livecov.test,9464".to_owned(),
        "--txt-record=empty.livecov.test,nothing".to_owned(),
    ];
    let dns = Dns::with_records(&dir, &records, "app.livecov.test", &["127.0.0.9"]);
    let out = dir.join("out");

    // A/AAAA asked of a SRV name: the other form is suggested.
    let srv_name = "_coverage._tcp.app.livecov.test";
    let error = collect_nothing(&format!("dns:{srv_name}:9464"), &dns.arg(), &out, "no_records", &[]);
    assert!(error.starts_with(&format!("{srv_name} exists but has no A or AAAA records")), "{error}");
    assert!(error.contains(&format!("it has SRV records (app.livecov.test:9464): give --replicas srv:{srv_name}")), "{error}");

    // SRV asked of an A name: the other way round.
    let error = collect_nothing("srv:app.livecov.test", &dns.arg(), &out, "no_records", &[]);
    assert!(error.starts_with("app.livecov.test exists but has no SRV records"), "{error}");
    assert!(error.contains("it has A/AAAA records (127.0.0.9): give --replicas dns:app.livecov.test:PORT"), "{error}");

    // Neither: the Service's pods are what to check.
    let error = collect_nothing("dns:empty.livecov.test:9464", &dns.arg(), &out, "no_records", &[]);
    assert!(error.contains("no A or AAAA records") && error.contains("nor SRV records"), "{error}");
    assert!(error.contains("selector matches pods") && error.contains("publishNotReadyAddresses"), "{error}");

    // Next to a name that gives targets, a name without records still fails
    // the step, unless --allow-empty.
    let agent_port = free_port();
    let good = Replica::start("127.0.0.9", Some(agent_port), None, &dir.join("cov"), &[]);
    good.get("/hello?name=x");
    let good_spec = format!("dns:app.livecov.test:{agent_port}");
    let (run, stderr) = collect(&good_spec, &dns.arg(), &out, &["--replicas", "dns:empty.livecov.test:9464"]);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("collected 1 instance(s) from 1 target(s)"), "{stderr}");
    assert!(stderr.contains("livecov: dns:empty.livecov.test:9464: empty.livecov.test exists but has no A or AAAA"), "{stderr}");
    assert!(stderr.contains("no target from dns:empty.livecov.test:9464") && stderr.contains("--allow-empty"), "{stderr}");
    let m = manifest(&out);
    let states: Vec<&str> = m["sources"].as_array().unwrap().iter().map(|s| s["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["ok", "no_records"], "{m}");
    assert_eq!(m["instances"], 1, "{m}");
    let (run, stderr) = collect(&good_spec, &dns.arg(), &out, &["--replicas", "dns:empty.livecov.test:9464", "--allow-empty"]);
    assert!(run.status.success(), "{stderr}");
}

#[test]
fn a_sidecar_started_before_its_replicas_waits_for_their_name_and_says_when_it_comes_back() {
    let dir = scratch("discovery", "sidecar-later");
    let port = free_port();
    // NAME has no record yet, only the SRV name under it: it exists, without
    // A or AAAA records (as a headless Service without ready pods).
    let dns = Dns::start_with(&dir, &[], port, &[LOCAL.to_owned()]);
    let spec = format!("dns:{NAME}:{port}");
    let log = dir.join("sidecar.log");
    let sidecar = Sidecar::start_logging(
        &["--replicas", &spec, "--dns-server", &dns.arg(), "--listen", "127.0.0.1:0", "--resolve-interval", "0.5", "--timeout", "10"],
        None,
        std::fs::File::create(&log).expect("the sidecar's log").into(),
    );
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    // Resolved at start, without a request for coverage.
    let source = |sc: &Sidecar| sc.get("/targets").json()["sources"][0].clone();
    let failing = wait_for("the name's failure in /targets", || Some(source(&sidecar)).filter(|s| s["state"] == "no_records"));
    assert_eq!(failing["source"], spec.as_str());
    assert_eq!(failing["targets"], 0);
    assert!(failing["since"].is_string() && failing["last_resolved"].is_null(), "{failing}");
    let error = failing["error"].as_str().unwrap();
    assert!(error.starts_with(&format!("{NAME} exists but has no A or AAAA records (--dns-server {})", dns.arg())), "{error}");
    assert!(error.contains("nor SRV records") && error.contains("ready"), "{error}");
    let health = sidecar.get("/health").json();
    assert_eq!((health["state"].as_str(), health["targets_found"].as_u64()), (Some("running"), Some(0)), "{health}");
    assert_eq!(health["sources_failing"], 1, "{health}");
    let warnings: Vec<&str> = health["warnings"].as_array().unwrap().iter().filter_map(|w| w.as_str()).collect();
    assert!(warnings[0].starts_with("no target found yet") && warnings[1] == format!("{spec}: {error}"), "{health}");
    let metrics = sidecar.get("/metrics").text();
    assert!(metrics.contains(&format!("livecov_sidecar_source_state{{source=\"{spec}\",state=\"no_records\"}} 1\n")), "{metrics}");
    assert!(metrics.contains(&format!("livecov_sidecar_source_targets{{source=\"{spec}\"}} 0\n")), "{metrics}");
    // An empty merge is still served.
    sidecar.coverage("");
    // Logged once, not at every resolution.
    let failure_line = format!("livecov sidecar: {spec}: {error} (resolving again every 0.5 s)\n");
    assert_eq!(logged().matches(&failure_line).count(), 1, "{}", logged());

    // The replica starts and its record appears.
    let replica = Replica::start("127.0.0.2", Some(port), None, &dir.join("cov"), &[]);
    replica.get("/fib?n=7");
    dns.set(&["127.0.0.2"]);
    let back = wait_for("the name back in /targets", || Some(source(&sidecar)).filter(|s| s["state"] == "ok"));
    assert_eq!(back["targets"], 1, "{back}");
    assert!(back["error"].is_null() && back["last_resolved"].is_string(), "{back}");
    assert_eq!(back["previous_error"], error, "{back}");
    assert_ne!(back["since"], failing["since"], "{back}");
    let health = sidecar.get("/health").json();
    assert_eq!((health["targets_found"].as_u64(), health["sources_failing"].as_u64()), (Some(1), Some(0)), "{health}");
    assert_eq!(health["warnings"].as_array().map(Vec::len), Some(0), "{health}");
    assert!(function_count(&sidecar.coverage(""), FIB) > 0);
    let row = sidecar.target("127.0.0.2").expect("the replica in /targets");
    assert_eq!(row["state"], "running", "{row}");
    let back_line = format!("livecov sidecar: {spec}: resolved again: 1 target(s), after ");
    assert!(logged().contains(&back_line) && logged().contains(" of: no records of the asked type\n"), "{}", logged());

    // The DNS server goes away: the last answer is kept, the source says why.
    let dns_arg = dns.arg();
    drop(dns);
    let gone = wait_for("no answer in /targets", || Some(source(&sidecar)).filter(|s| s["state"] == "no_answer"));
    assert_eq!(gone["targets"], 1, "the last answer is kept: {gone}");
    assert!(gone["error"].as_str().unwrap().starts_with(&format!("no answer from --dns-server {dns_arg} for {NAME}")), "{gone}");
    assert!(function_count(&sidecar.coverage(""), FIB) > 0);
    assert_eq!(sidecar.target("127.0.0.2").expect("the replica")["state"], "running");
    let metrics = sidecar.get("/metrics").text();
    assert!(metrics.contains(&format!("livecov_sidecar_source_state{{source=\"{spec}\",state=\"no_answer\"}} 1\n")), "{metrics}");
    assert!(logged().contains("(resolving again every 0.5 s; the 1 target(s) of the last answer are kept)\n"), "{}", logged());
}

#[test]
fn a_sidecar_names_each_sources_outcome_in_targets_health_and_metrics() {
    let dir = scratch("discovery", "sidecar-outcomes");
    let records = [LOCAL.to_owned(), "--host-record=app.livecov.test,127.0.0.9".to_owned()];
    let dns = Dns::with_records(&dir, &records, "app.livecov.test", &["127.0.0.9"]);
    // Outside its domain, without upstream: REFUSED; inside, unknown: NXDOMAIN.
    let specs = ["dns:app.elsewhere.test:9464", "dns:typo.livecov.test:9464", "srv:app.livecov.test"];
    let dns_arg = dns.arg();
    let mut args = vec!["--dns-server", &dns_arg, "--listen", "127.0.0.1:0", "--resolve-interval", "0.5"];
    for spec in &specs {
        args.extend(["--replicas", spec]);
    }
    let mut sidecar = Sidecar::start(&args, None);
    let sources = wait_for("every source resolved once", || {
        let sources = sidecar.get("/targets").json()["sources"].as_array().cloned().unwrap_or_default();
        Some(sources).filter(|s| s.len() == 3 && s.iter().all(|s| s["since"].is_string()))
    });
    let by_spec = |spec: &str| sources.iter().find(|s| s["source"] == spec).unwrap_or_else(|| panic!("no {spec} in {sources:?}"));
    let wants = [
        ("refused", "refused to resolve app.elsewhere.test (REFUSED"),
        ("nxdomain", "typo.livecov.test does not exist (NXDOMAIN"),
        ("no_records", "it has A/AAAA records (127.0.0.9): give --replicas dns:app.livecov.test:PORT"),
    ];
    let metrics = sidecar.get("/metrics").text();
    for (spec, (state, message)) in specs.iter().zip(wants) {
        let source = by_spec(spec);
        assert_eq!(source["state"], state, "{source}");
        assert!(source["error"].as_str().is_some_and(|e| e.contains(message)), "{message:?} not in {source}");
        assert!(metrics.contains(&format!("livecov_sidecar_source_state{{source=\"{spec}\",state=\"{state}\"}} 1\n")), "{metrics}");
    }
    let health = sidecar.get("/health").json();
    assert_eq!((health["targets_found"].as_u64(), health["sources_failing"].as_u64()), (Some(0), Some(3)), "{health}");
    assert_eq!(health["warnings"].as_array().map(Vec::len), Some(4), "{health}");
    assert!(sidecar.alive(), "the sidecar keeps running without targets");
}
