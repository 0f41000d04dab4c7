//! The Rust agent in a service nobody here wrote: mini-redis 0.4.1 (tokio's
//! example server) from crates.io, built with its own Cargo.lock as a user
//! adds the agent (one dependency, `livecov::start()` in `main`) with
//! `-C instrument-coverage`. Under traffic of `SET` with an expiry and
//! `GET`, its own background task (the purge of expired keys) runs between
//! dumps; each dump answers the counts of its moment, and once the traffic
//! stops, the dump is llvm-cov's report of the same moment byte for byte.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use livecov_tests::http::unix_request;
use livecov_tests::service::scratch;
use livecov_tests::{coverage_build, run_checked, rust_agent_oracle, wait_for, without_outer_cargo, workspace_root, Killed};

const CRATE: &str = "mini-redis";
const VERSION: &str = "0.4.1";

/// The crate's sources as cargo fetched them from the registry.
fn fetched_sources(dir: &Path) -> PathBuf {
    let fetch = dir.join("fetch");
    std::fs::create_dir_all(fetch.join("src")).unwrap();
    std::fs::write(
        fetch.join("Cargo.toml"),
        format!("[package]\nname = \"fetch\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n[workspace]\n\n[dependencies]\n{CRATE} = \"={VERSION}\"\n"),
    )
    .unwrap();
    std::fs::write(fetch.join("src/lib.rs"), "").unwrap();
    let mut metadata = Command::new("cargo");
    without_outer_cargo(&mut metadata);
    metadata.args(["metadata", "--format-version", "1"]).current_dir(&fetch);
    let out = run_checked(&mut metadata, "cargo metadata (fetches mini-redis from crates.io)");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    let package = doc["packages"].as_array().expect("packages").iter().find(|p| p["name"] == CRATE && p["version"] == VERSION);
    let manifest = package.and_then(|p| p["manifest_path"].as_str()).expect("mini-redis in cargo metadata");
    Path::new(manifest).parent().expect("its folder").to_owned()
}

/// mini-redis with the agent added, built with coverage: the server's path.
fn build(dir: &Path) -> PathBuf {
    let project = dir.join(format!("{CRATE}-{VERSION}"));
    let _ = std::fs::remove_dir_all(&project);
    let sources = fetched_sources(dir);
    let mut copy = Command::new("cp");
    copy.arg("-r").arg(&sources).arg(&project);
    run_checked(&mut copy, "copy mini-redis's sources");
    assert!(project.join("Cargo.lock").is_file(), "mini-redis {VERSION} is published with its Cargo.lock");

    let manifest = std::fs::read_to_string(project.join("Cargo.toml")).unwrap();
    let agent = workspace_root().join("agent-rust");
    std::fs::write(project.join("Cargo.toml"), format!("{manifest}\n[workspace]\n\n[dependencies.livecov]\npath = {:?}\n", agent.display().to_string()))
        .unwrap();
    let server = project.join("src/bin/server.rs");
    let main = std::fs::read_to_string(&server).unwrap();
    let first_line = "    tracing_subscriber::fmt::try_init()?;\n";
    assert!(main.contains(first_line), "mini-redis's main changed: {main}");
    std::fs::write(&server, main.replace(first_line, &format!("    livecov::start();\n{first_line}"))).unwrap();

    let target = workspace_root().join("target/third-party/mini-redis");
    let mut build = Command::new("cargo");
    coverage_build(&mut build, &target).args(["build", "--quiet", "--bin", "mini-redis-server"]).current_dir(&project);
    run_checked(&mut build, "cargo build of mini-redis with livecov added");
    // A copy: the agent reads the coverage mapping from the running file,
    // and another test run may build over the target's.
    let bin = dir.join("mini-redis-server");
    std::fs::copy(target.join("debug/mini-redis-server"), &bin).expect("copy the server");
    bin
}

/// A RESP connection to the server.
struct Client {
    write: TcpStream,
    read: BufReader<TcpStream>,
}

impl Client {
    fn connect(port: u16) -> Option<Client> {
        let s = TcpStream::connect(("127.0.0.1", port)).ok()?;
        Some(Client { read: BufReader::new(s.try_clone().ok()?), write: s })
    }

    /// Sends a command, returns the first line of its reply.
    fn command(&mut self, args: &[&str]) -> String {
        let mut frame = format!("*{}\r\n", args.len());
        for a in args {
            frame.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        self.write.write_all(frame.as_bytes()).expect("send a command");
        let mut line = String::new();
        self.read.read_line(&mut line).expect("read a reply");
        if line.starts_with('$') && line.trim() != "$-1" {
            let mut value = String::new();
            self.read.read_line(&mut value).expect("read a bulk value");
        }
        line
    }
}

/// The `FNDA` count of the function whose (v0-mangled) name ends with
/// `name`: llvm-cov does not demangle, so the agent is asked not to.
fn count(lcov: &str, name: &str) -> u64 {
    let counts = lcov.lines().filter_map(|l| l.strip_prefix("FNDA:")?.split_once(','));
    let found = counts.filter(|&(_, f)| f.ends_with(name)).map(|(c, _)| c.parse::<u64>().expect("a count")).max();
    found.unwrap_or_else(|| panic!("no FNDA line of *{name}"))
}

/// `mini_redis::db::Db::set`, called once by each `SET`, and the purge of
/// expired keys.
const SET: &str = "2Db3set";
const PURGE: &str = "6Shared18purge_expired_keys";

#[test]
fn a_crates_io_service_dumps_under_traffic_and_its_quiet_dump_is_llvm_cov_s_report() {
    let dir = scratch("mini_redis", "server");
    let bin = build(&dir);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let cov = dir.join("cov");
    let server = Killed(
        Command::new(&bin)
            .args(["--port", &port.to_string()])
            .env("LIVECOV_DIR", &cov)
            .env("LIVECOV_DEMANGLE", "0")
            .env("LLVM_PROFILE_FILE", dir.join("exit-%p.profraw"))
            .stdout(Stdio::null())
            .spawn()
            .expect("start mini-redis-server"),
    );
    let mut client = wait_for("mini-redis to listen", Duration::from_millis(20), || Client::connect(port));
    assert_eq!(client.command(&["SET", "hello", "world"]), "+OK\r\n");
    let socket = wait_for("the agent's socket", Duration::from_millis(20), || {
        std::fs::read_dir(cov.join("sockets")).ok()?.flatten().map(|e| e.path()).find(|p| p.extension().is_some_and(|x| x == "sock"))
    });
    let dump = || {
        let r = unix_request(&socket, "GET", "/coverage", &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        r.text()
    };

    // Keys that expire in 5 ms: the server's purge task wakes for them.
    let running = Arc::new(AtomicBool::new(true));
    let traffic = std::thread::spawn({
        let running = running.clone();
        move || {
            let mut n = 0u64;
            while running.load(Ordering::Relaxed) {
                let key = format!("key:{}", n % 1000);
                assert_eq!(client.command(&["SET", &key, "v", "PX", "5"]), "+OK\r\n");
                client.command(&["GET", &key]);
                n += 1;
            }
            n
        }
    });
    let mut sets = Vec::new();
    let mut purges = Vec::new();
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(150));
        let lcov = dump();
        sets.push(count(&lcov, SET));
        purges.push(count(&lcov, PURGE));
    }
    running.store(false, Ordering::Relaxed);
    let sent = traffic.join().expect("the traffic");
    assert!(sets.windows(2).all(|w| w[0] < w[1]), "SET's count grows from dump to dump under traffic: {sets:?}");
    assert!(purges.windows(2).all(|w| w[0] < w[1]), "the purge task runs between dumps: {purges:?}");

    // Quiet (the last keys expired, the purge task waits): the dump and a
    // raw profile of the same moment.
    std::thread::sleep(Duration::from_millis(100));
    let (lcov, profraw) = wait_for("a quiet moment", Duration::from_millis(50), || {
        let before = dump();
        let r = unix_request(&socket, "GET", "/coverage?format=profraw", &[]);
        assert_eq!(r.status, 200);
        (dump() == before).then_some((before, r.body))
    });
    let path = dir.join("moment.profraw");
    std::fs::write(&path, &profraw).expect("write the snapshot");
    let expected = rust_agent_oracle("lcov", &bin, &[], &[path], &dir);
    assert_eq!(lcov, expected, "mini-redis's dump differs from llvm-cov over the profraw of the same moment");
    assert_eq!(count(&lcov, SET), sent + 1, "every SET sent, and no other");
    drop(server);
}
