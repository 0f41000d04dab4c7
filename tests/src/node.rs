//! Node.js programs with the livecov hook (`hooks/node/livecov-hook.cjs`),
//! for the end-to-end tests: the fixtures of `fixtures/node`, their tools
//! (c8, tsc) as `tests/scripts/deps-node.sh` installs them, and requests to
//! a running program's own port.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::http::{exchange, Response};
use crate::service::find_instance;
use crate::tools::workspace_root;
use crate::wait::wait_for;

/// The hook, as programs load it with `NODE_OPTIONS=--require <it>`.
pub fn hook() -> PathBuf {
    workspace_root().join("hooks/node/livecov-hook.cjs")
}

/// `fixtures/node`, the Node fixtures and their `node_modules`.
pub fn fixture_dir() -> PathBuf {
    workspace_root().join("fixtures/node")
}

/// A tool of the fixtures' `node_modules/.bin` (`c8`, `tsc`); panics saying
/// how to install it when it is missing.
pub fn node_tool(name: &str) -> PathBuf {
    let tool = fixture_dir().join("node_modules/.bin").join(name);
    assert!(
        tool.is_file(),
        "{} is missing: run tests/scripts/deps-node.sh (tests/scripts/install-deps.sh runs it)",
        tool.display()
    );
    tool
}

/// `node <script> <args>` in a clean environment: no `LIVECOV_*`, no
/// `NODE_OPTIONS` or `NODE_V8_COVERAGE` from the caller's.
pub fn node(script: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("node");
    cmd.arg(script).args(args);
    clean_env(&mut cmd);
    cmd
}

/// `node <script> <args>` with the hook loaded and `LIVECOV_DIR=cov`.
pub fn node_with_hook(script: &Path, args: &[&str], cov: &Path) -> Command {
    let mut cmd = node(script, args);
    cmd.env("NODE_OPTIONS", format!("--require {}", hook().display())).env("LIVECOV_DIR", cov);
    cmd
}

/// Removes what would change how Node.js or the hook behave.
pub fn clean_env(cmd: &mut Command) {
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        if name.starts_with("LIVECOV_") || name == "NODE_OPTIONS" || name == "NODE_V8_COVERAGE" {
            cmd.env_remove(&name);
        }
    }
}

/// The instance of Node.js process `pid`, once its socket exists in `cov`.
pub fn node_instance(cov: &Path, pid: u32) -> String {
    wait_for("the hook's socket", Duration::from_millis(20), || find_instance(cov, "node", pid))
}

/// `GET path` on a program's own port (`127.0.0.1:port`).
pub fn get(port: u16, path: &str) -> Response {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("connect to 127.0.0.1:{port}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30))).expect("set a read timeout");
    exchange(s, "GET", path, &[])
}

/// The 1-based lines of `source` from the first one containing `start` to
/// the first one after it that is exactly `end` (e.g. a function and its
/// closing `}`); panics when there is no such span.
pub fn span(source: &str, start: &str, end: &str) -> Vec<u32> {
    let lines: Vec<&str> = source.lines().collect();
    let first = lines
        .iter()
        .position(|l| l.contains(start))
        .unwrap_or_else(|| panic!("no line contains {start:?}"));
    let last = lines[first..]
        .iter()
        .position(|l| *l == end)
        .map(|i| first + i)
        .unwrap_or_else(|| panic!("no line {end:?} after {start:?}"));
    (first as u32 + 1..=last as u32 + 1).collect()
}
