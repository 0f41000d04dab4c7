//! Finding the tools the fixtures need: the workspace root, LLVM 22's
//! llvm-cov/llvm-profdata from rustup's llvm-tools, and Debian's clang and
//! llvm-profdata packages. A missing tool is a panic that says what to install.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The livecov workspace root (the folder of the top Cargo.toml).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent folder: the workspace root")
        .to_path_buf()
}

/// An LLVM tool (`llvm-cov`, `llvm-profdata`, ...) of the Rust toolchain's LLVM
/// (LLVM 22 for rustc 1.95), from the rustup component `llvm-tools`.
///
/// Panics, telling to run `rustup component add llvm-tools`, when it is missing.
pub fn llvm_tool(name: &str) -> PathBuf {
    let path = rust_llvm_tools_dir().join(name);
    if !path.is_file() {
        panic!(
            "{} not found: run `rustup component add llvm-tools` (`make test` does it)",
            path.display()
        );
    }
    path
}

/// `<sysroot>/lib/rustlib/<host>/bin`, where rustup's llvm-tools puts its tools.
fn rust_llvm_tools_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let sysroot = command_stdout(
            Command::new("rustc").args(["--print", "sysroot"]),
            "rustc --print sysroot",
        );
        let version = command_stdout(Command::new("rustc").arg("-vV"), "rustc -vV");
        let host = version
            .lines()
            .find_map(|line| line.strip_prefix("host: "))
            .expect("`rustc -vV` prints a `host:` line");
        Path::new(sysroot.trim())
            .join("lib/rustlib")
            .join(host.trim())
            .join("bin")
    })
}

/// A program of a Debian package, found on PATH (or in /usr/bin).
///
/// Panics, naming the package to install, when it is missing.
pub(crate) fn system_tool(name: &str, package: &str) -> PathBuf {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|path| path.is_file());
    match found {
        Some(path) => path,
        None => panic!(
            "`{name}` not found: install the Debian package {package} \
             (`apt-get install {package}`; `make test` installs it)"
        ),
    }
}

/// Checks that `compiler` (clang-N) has its profile runtime, from libclang-rt-N-dev.
pub(crate) fn require_profile_runtime(compiler: &Path, package: &str) {
    let dir = command_stdout(
        Command::new(compiler).arg("--print-runtime-dir"),
        &format!("{} --print-runtime-dir", compiler.display()),
    );
    let dir = Path::new(dir.trim());
    let candidates = [
        dir.join("libclang_rt.profile-x86_64.a"),
        dir.join("libclang_rt.profile.a"),
        dir.with_file_name("linux")
            .join("libclang_rt.profile-x86_64.a"),
    ];
    if !candidates.iter().any(|path| path.is_file()) {
        panic!(
            "{} has no profile runtime (libclang_rt.profile) in {}: install the Debian package \
             {package} (`apt-get install {package}`; `make test` installs it)",
            compiler.display(),
            dir.display()
        );
    }
}

/// Runs `command` and returns its output; panics with `what`, the exit status
/// and stderr when it cannot start or fails.
pub fn run_checked(command: &mut Command, what: &str) -> Output {
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("cannot start {what} ({command:?}): {error}"));
    if !output.status.success() {
        panic!(
            "{what} failed ({}): {command:?}\n--- stderr ---\n{}\n--- stdout ---\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        );
    }
    output
}

/// Stdout of a successful command, as text.
pub(crate) fn command_stdout(command: &mut Command, what: &str) -> String {
    let output = run_checked(command, what);
    String::from_utf8(output.stdout).unwrap_or_else(|_| panic!("{what} printed non-UTF-8 text"))
}
