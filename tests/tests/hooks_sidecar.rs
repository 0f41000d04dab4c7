//! One pod's coverage directory shared by a Rust service with the agent, a
//! Node service with the Node hook and a Python program with the Python
//! hook, collected by `livecov sidecar --dir`: the runtimes speak one
//! protocol, and the sidecar merges them as it merges agents.

mod replicas;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{ChildStdout, Command, Stdio};

use livecov_tests::lcov::lines_hit;
use livecov_tests::service::{service_bin, Service};
use livecov_tests::{node, python, Killed};
use replicas::*;

#[test]
fn a_sidecar_over_one_directory_merges_rust_node_and_python_processes() {
    let dir = scratch("hooks-sidecar", "pod");
    let cov = dir.join("cov");

    let mut pod = Pod::start(&dir, &cov);
    let mut line = String::new();
    // Each process does something of its own.
    pod.rust.get("/hello?name=pod");
    assert_eq!(node::get(pod.node_port, "/hello?name=pod").status, 200);
    let py_in = pod.py.0.stdin.as_mut().expect("stdin");
    writeln!(py_in, "call").expect("tell the Python program to call later()");
    pod.py_out.read_line(&mut line).expect("its answer");
    assert!(line.starts_with("later "), "Python said {line:?}");

    let instances = pod.instances(&cov);
    let own: Vec<String> = instances
        .iter()
        .map(|i| {
            let r = unix_request(&cov.join("sockets").join(format!("{i}.sock")), "GET", "/coverage");
            assert_eq!(r.status, 200, "{i}: {}", r.text());
            r.text()
        })
        .collect();
    let own: Vec<&str> = own.iter().map(String::as_str).collect();

    let cov_arg = cov.display().to_string();
    let sidecar = Sidecar::start(&["--dir", &cov_arg, "--listen", "127.0.0.1:0"], None);
    let merged = sidecar.coverage("");
    assert_eq!(merged, merge(&own), "the sidecar's merge is the merge of the three processes' own dumps");

    let mut runtimes: Vec<String> = sidecar
        .targets()
        .iter()
        .filter(|t| t["state"] == "running")
        .map(|t| t["runtime"].as_str().unwrap_or("?").to_owned())
        .collect();
    runtimes.sort();
    assert_eq!(runtimes, ["node", "python", "rust"], "{:?}", sidecar.targets());
    let files = lines_hit(&merged);
    for suffix in ["fixtures/service/src/handlers.rs", "fixtures/node/http/server.js", "fixtures/python/plain.py"] {
        let hit = files.iter().find(|(f, _)| f.ends_with(suffix)).map(|(_, l)| l.len()).unwrap_or(0);
        assert!(hit > 0, "no line of {suffix} is covered in the merge: {:?}", files.keys().collect::<Vec<_>>());
    }

    // The Python program ends: its final report stands in for it.
    writeln!(pod.py.0.stdin.as_mut().expect("stdin"), "exit").expect("tell the Python program to exit");
    assert!(pod.py.0.wait().expect("wait for Python").success());
    let after = wait_for("the Python program gone from the sidecar's targets", || {
        let merged = sidecar.coverage("");
        let gone = sidecar.targets().iter().any(|t| t["instance"] == instances[2].as_str() && t["state"] == "gone");
        gone.then_some(merged)
    });
    // Its final report has what it ran before (and the lines of its exit);
    // the others are as they were.
    let after = lines_hit(&after);
    assert_eq!(after.keys().collect::<Vec<_>>(), files.keys().collect::<Vec<_>>());
    for (file, lines) in &files {
        if file.ends_with("fixtures/python/plain.py") {
            assert!(lines.iter().all(|l| after[file].contains(l)), "{file}: {lines:?} then {:?}", after[file]);
        } else {
            assert_eq!(&after[file], lines, "{file}");
        }
    }

    pod.rust.kill();
}

/// The processes of one pod, all with `LIVECOV_DIR=cov`: the Rust fixture
/// service with the agent, the Node HTTP fixture with the hook, and the
/// Python plain script with the hook (ready, waiting for commands).
struct Pod {
    rust: Service,
    node: Killed,
    node_port: u16,
    py: Killed,
    py_out: BufReader<ChildStdout>,
}

impl Pod {
    fn start(dir: &Path, cov: &Path) -> Pod {
        let rust = {
            let mut cmd = Command::new(service_bin());
            cmd.env("LIVECOV_DIR", cov).env("LIVECOV_DEMANGLE", "0").env("LLVM_PROFILE_FILE", dir.join("exit-%p.profraw"));
            Service::spawn(cmd, cov.to_owned())
        };
        let mut node = Killed(
            node::node_with_hook(&node::fixture_dir().join("http/server.js"), &[], cov)
                .stdout(Stdio::piped())
                .spawn()
                .expect("start the Node service"),
        );
        let node_port: u16 = {
            let mut line = String::new();
            BufReader::new(node.0.stdout.as_mut().expect("stdout")).read_line(&mut line).expect("its first line");
            line.trim().rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("Node said {line:?}"))
        };
        let mut py = Killed(
            python::command("python")
                .arg("plain.py")
                .env("LIVECOV_DIR", cov)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("start the Python program"),
        );
        let mut py_out = BufReader::new(py.0.stdout.take().expect("stdout"));
        let mut line = String::new();
        py_out.read_line(&mut line).expect("its first line");
        assert!(line.starts_with("ready "), "Python said {line:?}");
        Pod { rust, node, node_port, py, py_out }
    }

    /// The instances of the Rust, Node and Python processes, once each listens.
    fn instances(&self, cov: &Path) -> [String; 3] {
        [
            self.rust.instance(),
            node::node_instance(cov, self.node.0.id()),
            livecov_tests::wait_for("the Python hook's socket", std::time::Duration::from_millis(20), || {
                livecov_tests::service::find_instance(cov, "python", self.py.0.id())
            }),
        ]
    }
}

/// A coverage directory deeper than a Unix socket address holds (107
/// bytes): every agent and hook still listens, and `livecov collect`
/// reaches them all.
#[test]
fn processes_in_a_deep_directory_are_collected() {
    let dir = scratch("hooks-sidecar", "deep");
    let cov = dir.join("d".repeat(60)).join("cov");
    std::fs::create_dir_all(&cov).expect("create the deep folder");
    assert!(cov.join("sockets/rust-4711-0123456789abcdef.sock").as_os_str().len() > 107);

    let mut pod = Pod::start(&dir, &cov);
    let instances = pod.instances(&cov);

    let out = dir.join("collected");
    let (cov_arg, out_arg) = (cov.display().to_string(), out.display().to_string());
    let run = livecov(&["collect", "--dir", &cov_arg, "-o", &out_arg]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).expect("manifest.json")).expect("JSON");
    let mut live: Vec<&str> = manifest["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .filter(|t| t["error"].is_null())
        .filter_map(|t| t["instance"].as_str())
        .collect();
    live.sort();
    let mut want: Vec<&str> = instances.iter().map(String::as_str).collect();
    want.sort();
    assert_eq!(live, want, "{manifest:#}");
    writeln!(pod.py.0.stdin.as_mut().expect("stdin"), "exit").expect("tell the Python program to exit");
}
