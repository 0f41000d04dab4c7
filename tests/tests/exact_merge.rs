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
