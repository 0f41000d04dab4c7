//! The exact fleet merge, end to end: replicas of the fixture service with
//! different traffic each, collected by `livecov collect` and by a sidecar
//! (the exact merge is their default), against llvm-cov 22 over the replicas' own
//! `?format=profraw` of the same moment merged by llvm-profdata. Replicas
//! that loaded the C plugin are another build (another set of instrumented
//! modules): a second exact group, merged with the first as LCOV.

mod replicas;

use std::path::{Path, PathBuf};
use std::process::Command;

use livecov_tests::service::plugin;
use replicas::*;

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

#[test]
fn collect_and_sidecar_merge_each_build_as_llvm_cov_does() {
    let dir = scratch("exact_merge", "fleet");
    let port = free_port();
    let ips = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"];
    let dns = Dns::start(&dir, &ips, port);
    let plugin_arg = plugin().to_str().expect("utf-8 path");
    let service = |ip: &str| Replica::start(ip, Some(port), None, &dir.join(format!("cov-{ip}")), &[]);
    // With the plugin loaded: another set of instrumented modules.
    let with_plugin = |ip: &str| {
        let cov = dir.join(format!("cov-{ip}"));
        let mut cmd = Command::new(livecov_tests::service::service_bin());
        cmd.args(["--addr", &format!("{ip}:0"), "--plugin", plugin_arg])
            .env("LIVECOV_DIR", &cov)
            .env("LIVECOV_DEMANGLE", "0")
            .env("LIVECOV_LISTEN", format!("{ip}:{port}"))
            .env_remove("LIVECOV_TOKEN")
            .env("LLVM_PROFILE_FILE", dir.join(format!("exit-{ip}-%p.profraw")));
        Replica { service: livecov_tests::service::Service::spawn(cmd, cov), ip: ip.to_owned() }
    };
    let plain = [service(ips[0]), service(ips[1])];
    let plugged = [with_plugin(ips[2]), with_plugin(ips[3])];
    // Different traffic each.
    plain[0].get("/hello?name=a");
    plain[0].get("/fib?n=12");
    plain[1].get("/primes?limit=50");
    plain[1].get("/hello?name=b");
    plugged[0].get("/plugin?x=-4");
    plugged[1].get("/plugin?x=9");
    plugged[1].get("/fib?n=3");

    // The same moment: nothing runs between the collection and the
    // replicas' own profiles but the agents' own code, which reports leave out.
    let by_dns = format!("dns:{NAME}:{port}");
    let out = dir.join("out");
    let run = livecov(&[
        "collect", "--profraw", "--replicas", &by_dns, "--dns-server", &dns.arg(), "-o", out.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let profiles = dir.join("profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    let plain_profiles: Vec<PathBuf> = plain.iter().map(|r| profraw(r, &profiles)).collect();
    let plugged_profiles: Vec<PathBuf> = plugged.iter().map(|r| profraw(r, &profiles)).collect();
    let plain_lcov = llvm_cov(&plain_profiles, &[], &dir);
    let plugged_lcov = llvm_cov(&plugged_profiles, &[plugin()], &dir);
    assert!(plugged_lcov.contains("plugin.c") && !plain_lcov.contains("plugin.c"));

    // Two exact groups, merged with each other as LCOV.
    let merged = read(&out.join("merged.lcov"));
    assert_eq!(merged, merge(&[&plain_lcov, &plugged_lcov]));
    let manifest: serde_json::Value = serde_json::from_str(&read(&out.join("manifest.json"))).unwrap();
    let groups = manifest["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), 2, "{manifest}");
    let mut members: Vec<Vec<String>> = groups
        .iter()
        .map(|g| {
            let mut v: Vec<String> = g["instances"].as_array().unwrap().iter().map(|i| i.as_str().unwrap().to_owned()).collect();
            v.sort();
            v
        })
        .collect();
    members.sort();
    let mut want: Vec<Vec<String>> = [&plain, &plugged]
        .iter()
        .map(|rs| {
            let mut v: Vec<String> = rs.iter().map(Replica::instance).collect();
            v.sort();
            v
        })
        .collect();
    want.sort();
    assert_eq!(members, want);
    for t in manifest["targets"].as_array().unwrap() {
        assert!(t["group"].is_string(), "{t}");
        assert!(t["file"].as_str().unwrap().ends_with(".profraw"), "{t}");
    }
    // The instances' files are the raw profiles their counters stand for.
    let written: Vec<PathBuf> = plain.iter().map(|r| out.join(format!("instances/{}.profraw", r.instance()))).collect();
    assert_eq!(llvm_cov(&written, &[], &dir), plain_lcov);

    // One build alone: its report is llvm-cov's, byte for byte (not
    // recounted by an LCOV merge).
    let one = dir.join("one");
    let targets: Vec<String> = plain.iter().map(|r| format!("http://{}:{port}", r.ip)).collect();
    let run = livecov(&["collect", "--target", &targets[0], "--target", &targets[1], "-o", one.to_str().unwrap()]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(read(&one.join("merged.lcov")), plain_lcov);
    // Without --profraw, no raw profile is rebuilt: nothing per instance.
    assert_eq!(std::fs::read_dir(one.join("instances")).unwrap().count(), 0);
    let manifest: serde_json::Value = serde_json::from_str(&read(&one.join("manifest.json"))).unwrap();
    assert!(manifest["targets"].as_array().unwrap().iter().all(|t| t["file"].is_null() && t["group"].is_string()), "{manifest}");
    // With --lcov-merge, the LCOV merge of the replicas' reports differs.
    let lcov_merge = dir.join("lcov-merge");
    let run = livecov(&["collect", "--lcov-merge", "--target", &targets[0], "--target", &targets[1], "-o", lcov_merge.to_str().unwrap()]);
    assert!(run.status.success());
    assert_ne!(read(&lcov_merge.join("merged.lcov")), plain_lcov, "the test cannot tell the two merges apart");

    // The sidecar (an aggregator over the replicas): the same.
    let sidecar = Sidecar::start(&["--replicas", &by_dns, "--dns-server", &dns.arg(), "--listen", "127.0.0.1:0"], None);
    assert_eq!(sidecar.coverage(""), merged);
    assert!(sidecar.targets().iter().all(|t| t["group"].is_string()));
    // With a test name, and a dump-and-reset: the same counts, named.
    let named = sidecar.coverage("?test=t&reset=1");
    assert_eq!(named, merge(&[&plain_lcov.replace("SF:", "TN:t\nSF:"), &plugged_lcov.replace("SF:", "TN:t\nSF:")]));
    let after = sidecar.coverage("");
    assert!(lines_hit(&after).is_empty(), "counts after a reset: {after}");
}

/// Two pods, each a sidecar over two processes of the build in its folder,
/// under an aggregator: each pod sidecar serves its processes' counters
/// summed, so the aggregator's report is llvm-cov's over all four
/// processes, which merging the pods' reports as LCOV is not. A
/// dump-and-reset through the aggregator resets every process once.
#[test]
fn an_aggregator_merges_pod_sidecars_exactly() {
    let dir = scratch("exact_merge", "pods");
    let pod = |name: &str| {
        let cov = dir.join(name);
        let replicas = [Replica::start("127.0.0.1", None, None, &cov, &[]), Replica::start("127.0.0.1", None, None, &cov, &[])];
        let sidecar = Sidecar::start(&["--dir", cov.to_str().unwrap(), "--listen", "127.0.0.1:0"], None);
        (replicas, sidecar)
    };
    let (a, a_sidecar) = pod("pod-a");
    let (b, b_sidecar) = pod("pod-b");
    a[0].get("/hello?name=a");
    a[1].get("/fib?n=9");
    b[0].get("/primes?limit=40");
    b[1].get("/hello?name=b");
    b[1].get("/fib?n=4");

    let aggregator = Sidecar::start(
        &[
            "--target",
            &format!("http://{}", a_sidecar.addr.unwrap()),
            "--target",
            &format!("http://{}", b_sidecar.addr.unwrap()),
            "--listen",
            "127.0.0.1:0",
        ],
        None,
    );
    let merged = aggregator.coverage("");
    let profiles = dir.join("profiles");
    std::fs::create_dir_all(&profiles).unwrap();
    let all: Vec<PathBuf> = a.iter().chain(&b).map(|r| profraw(r, &profiles)).collect();
    let expected = llvm_cov(&all, &[], &dir);
    assert_eq!(merged, expected);
    let pods = merge(&[&a_sidecar.coverage(""), &b_sidecar.coverage("")]);
    assert_ne!(pods, expected, "the test cannot tell an exact merge from an LCOV merge of the pods");
    let targets = aggregator.targets();
    assert_eq!(targets.len(), 2, "{targets:?}");
    let groups: std::collections::BTreeSet<&str> = targets.iter().map(|t| t["group"].as_str().expect("a group")).collect();
    assert_eq!(groups.len(), 1, "{targets:?}");
    // The pod sidecar serves the mapping its agents gave.
    let mapping = a_sidecar.get("/coverage?format=mapping");
    assert_eq!(mapping.status, 200);
    assert_eq!(mapping.header("livecov-mapping"), groups.first().copied());

    // A pod sidecar that is not one exact group (here with --lcov-merge)
    // answers the aggregator with LCOV, merged as LCOV with the others.
    let c_cov = dir.join("pod-c");
    let c = Replica::start("127.0.0.1", None, None, &c_cov, &[]);
    c.get("/fib?n=15");
    let c_sidecar = Sidecar::start(&["--dir", c_cov.to_str().unwrap(), "--listen", "127.0.0.1:0", "--lcov-merge"], None);
    let mixed = Sidecar::start(
        &[
            "--target",
            &format!("http://{}", a_sidecar.addr.unwrap()),
            "--target",
            &format!("http://{}", c_sidecar.addr.unwrap()),
            "--listen",
            "127.0.0.1:0",
        ],
        None,
    );
    assert_eq!(mixed.coverage(""), merge(&[&a_sidecar.coverage(""), &c_sidecar.coverage("")]));
    let groups: Vec<bool> = mixed.targets().iter().map(|t| t["group"].is_string()).collect();
    assert_eq!(groups.iter().filter(|g| **g).count(), 1, "{:?}", mixed.targets());
    drop(mixed);

    // Dump-and-reset through both levels: the same counts, then none.
    assert_eq!(aggregator.coverage("?reset=1"), expected);
    for r in a.iter().chain(&b) {
        assert!(lines_hit(&r.own_dump()).is_empty(), "a process was not reset");
    }
    assert!(lines_hit(&aggregator.coverage("")).is_empty());
}
