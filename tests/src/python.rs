//! The Python hook's test environment: `target/python-venv`, made and kept up
//! to date by `tests/scripts/deps-python.sh` (the pinned packages of
//! `fixtures/python/requirements.txt`, and the hook installed from
//! `hooks/python` as users install it), and the fixtures in `fixtures/python`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::tools::{run_checked, workspace_root};

/// Every variable the hook reads: a test sets the ones it wants, none leaks in.
const HOOK_VARIABLES: &[&str] = &[
    "LIVECOV_DIR",
    "LIVECOV_LISTEN",
    "LIVECOV_TOKEN",
    "LIVECOV_TOKEN_FILE",
    "LIVECOV_IGNORE",
    "LIVECOV_FLUSH_SECS",
    "LIVECOV_PATH_MAP",
    "LIVECOV_SOCKET_MODE",
];

/// `target/python-venv`, brought up to date once per test process (quick
/// when it is: the script only compares hashes then).
pub fn venv() -> &'static Path {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| {
        let root = workspace_root();
        run_checked(
            Command::new("bash").arg(root.join("tests/scripts/deps-python.sh")),
            "tests/scripts/deps-python.sh (the Python venv of the hook's tests)",
        );
        root.join("target/python-venv")
    })
}

/// A program of the venv (`python`, `gunicorn`, `coverage`).
pub fn venv_bin(name: &str) -> PathBuf {
    let path = venv().join("bin").join(name);
    assert!(path.is_file(), "{} is missing: run tests/scripts/deps-python.sh", path.display());
    path
}

/// `fixtures/python`.
pub fn fixture_dir() -> PathBuf {
    workspace_root().join("fixtures/python")
}

/// `program` (a program of the venv) in `fixtures/python`, without any
/// `LIVECOV_*` variable of the test's own environment and without writing
/// `__pycache__` into the source tree.
pub fn command(program: &str) -> Command {
    let mut cmd = Command::new(venv_bin(program));
    for name in HOOK_VARIABLES {
        cmd.env_remove(name);
    }
    cmd.env("PYTHONDONTWRITEBYTECODE", "1").env("PYTHONUNBUFFERED", "1").current_dir(fixture_dir());
    cmd
}
