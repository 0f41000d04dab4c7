//! The Python hook's test environments: one venv per interpreter the hook is
//! tested on (`target/python-venv` for the system's python3, which the other
//! tests use, `target/python-venv-3.12` and `-3.13` from pyenv), made and kept
//! up to date by `tests/scripts/deps-python.sh` (the pinned packages of
//! `fixtures/python/requirements.txt`, and the hook installed from
//! `hooks/python` as users install it), and the fixtures in `fixtures/python`.

use std::path::PathBuf;
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

/// An interpreter the hook is tested on, with its venv.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Python {
    /// The system's `python3` (Debian 12's 3.11).
    System,
    /// pyenv's newest 3.12.
    V3_12,
    /// pyenv's newest 3.13.
    V3_13,
}

impl Python {
    /// A short name for folders and messages: `system`, `3.12`, `3.13`.
    pub fn label(self) -> &'static str {
        match self {
            Python::System => "system",
            Python::V3_12 => "3.12",
            Python::V3_13 => "3.13",
        }
    }

    /// The minor version the interpreter must have, when it is fixed.
    pub fn version(self) -> Option<&'static str> {
        match self {
            Python::System => None,
            Python::V3_12 => Some("3.12"),
            Python::V3_13 => Some("3.13"),
        }
    }

    /// The venv, every venv being brought up to date once per test process
    /// (quick when they are: the script only compares hashes then).
    pub fn venv(self) -> PathBuf {
        static READY: OnceLock<()> = OnceLock::new();
        READY.get_or_init(|| {
            run_checked(
                Command::new("bash").arg(workspace_root().join("tests/scripts/deps-python.sh")),
                "tests/scripts/deps-python.sh (the Python venvs of the hook's tests)",
            );
        });
        let name = match self {
            Python::System => "python-venv".to_owned(),
            _ => format!("python-venv-{}", self.label()),
        };
        workspace_root().join("target").join(name)
    }

    /// A program of the venv (`python`, `gunicorn`, `coverage`).
    pub fn bin(self, name: &str) -> PathBuf {
        let path = self.venv().join("bin").join(name);
        assert!(path.is_file(), "{} is missing: run tests/scripts/deps-python.sh", path.display());
        path
    }

    /// `program` (a program of the venv) in `fixtures/python`, without any
    /// `LIVECOV_*` variable of the test's own environment and without writing
    /// `__pycache__` into the source tree.
    pub fn command(self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin(program));
        for name in HOOK_VARIABLES {
            cmd.env_remove(name);
        }
        cmd.env("PYTHONDONTWRITEBYTECODE", "1").env("PYTHONUNBUFFERED", "1").current_dir(fixture_dir());
        cmd
    }
}

/// `fixtures/python`.
pub fn fixture_dir() -> PathBuf {
    workspace_root().join("fixtures/python")
}

/// [`Python::command`] of the system python3's venv.
pub fn command(program: &str) -> Command {
    Python::System.command(program)
}
