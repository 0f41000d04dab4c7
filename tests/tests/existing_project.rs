//! The agent added to a project that has a Cargo.lock of its own, as a user
//! adds it: fixtures/locked-service (tokio 1.28, hyper 1.1, hyper-util 0.1.2
//! locked) gets `livecov` as a dependency and `livecov::start()` in `main`,
//! and is built with `-C instrument-coverage` and no `cargo update`. Every
//! version the project had locked must stay as it was, and the program must
//! serve its coverage.

use std::collections::BTreeSet;
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use livecov_tests::http::unix_request;
use livecov_tests::service::scratch;
use livecov_tests::{coverage_build, run_checked, wait_for, workspace_root};

/// The (name, version) of every package in a Cargo.lock.
fn locked(lock: &Path) -> BTreeSet<(String, String)> {
    let text = std::fs::read_to_string(lock).expect("Cargo.lock");
    let mut packages = BTreeSet::new();
    let mut name = None;
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = Some(n.trim_matches('"').to_owned());
        } else if let (Some(v), Some(n)) = (line.strip_prefix("version = "), name.take()) {
            packages.insert((n, v.trim_matches('"').to_owned()));
        }
    }
    packages
}

#[test]
fn the_agent_builds_into_a_project_with_an_old_lock_file_and_changes_none_of_its_versions() {
    let dir = scratch("existing_project", "locked-service");
    let fixture = workspace_root().join("fixtures/locked-service");
    let project = dir.join("project");
    std::fs::create_dir_all(project.join("src")).unwrap();
    for file in ["Cargo.toml", "Cargo.lock", "src/main.rs"] {
        std::fs::copy(fixture.join(file), project.join(file)).expect("copy the fixture");
    }
    let before = locked(&project.join("Cargo.lock"));
    assert!(before.contains(&("hyper".to_owned(), "1.1.0".to_owned())), "the fixture locks hyper 1.1.0: {before:?}");

    // What the user does: one dependency, one line in main.
    let manifest = std::fs::read_to_string(project.join("Cargo.toml")).unwrap();
    let agent = workspace_root().join("agent-rust");
    std::fs::write(project.join("Cargo.toml"), format!("{manifest}livecov = {{ path = {:?} }}\n", agent.display().to_string()))
        .unwrap();
    let main = std::fs::read_to_string(project.join("src/main.rs")).unwrap();
    let marker = "    // The line a project adds for livecov goes here.\n";
    assert!(main.contains(marker));
    std::fs::write(project.join("src/main.rs"), main.replace(marker, "    livecov::start();\n")).unwrap();

    let target = workspace_root().join("target/fixtures/locked-service");
    let mut build = Command::new("cargo");
    coverage_build(&mut build, &target).args(["build", "--quiet"]).current_dir(&project);
    run_checked(&mut build, "cargo build of the project with livecov added");

    let after = locked(&project.join("Cargo.lock"));
    let changed: Vec<_> = before.difference(&after).collect();
    assert!(changed.is_empty(), "adding livecov changed the project's locked versions: {changed:?}");
    assert!(after.iter().any(|(n, _)| n == "livecov"));

    // The program serves its own coverage.
    let cov = dir.join("cov");
    let mut child = Command::new(target.join("debug/locked-service"))
        .env("LIVECOV_DIR", &cov)
        .env("LLVM_PROFILE_FILE", dir.join("exit-%p.profraw"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the project");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).expect("its first line");
    let address = line.trim().strip_prefix("listening on ").expect("listening on ADDR").to_owned();
    let get = |path: &str| {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&address).expect("connect to the project");
        write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    };
    assert!(get("/hello").ends_with("hello\n"));
    let socket = wait_for("the agent's socket", Duration::from_millis(20), || {
        std::fs::read_dir(cov.join("sockets")).ok()?.flatten().map(|e| e.path()).find(|p| p.extension().is_some_and(|x| x == "sock"))
    });
    let r = unix_request(&socket, "GET", "/coverage", &[]);
    assert_eq!(r.status, 200);
    let lcov = String::from_utf8(r.body).expect("LCOV");
    assert!(lcov.contains(&format!("SF:{}", project.join("src/main.rs").display())), "{lcov}");
    assert!(lcov.lines().any(|l| l == "FNDA:1,locked_service::answer"), "/hello once: {lcov}");
    get("/quit");
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status}");
}
