//! Test support for livecov: builds the instrumented fixture programs
//! (`fixtures/`), runs them with inputs that take different code paths, and
//! computes the oracle LCOV with the real LLVM tools.
//!
//! ```no_run
//! use livecov_tests::{fixtures, oracle_lcov};
//!
//! for fixture in fixtures() {
//!     for run in &fixture.runs {
//!         let expected = oracle_lcov(fixture, run, &[]);
//!         // ... compare with what livecov computes for fixture.binary,
//!         // fixture.objects and run.profraws.
//!         # let _ = expected;
//!     }
//! }
//! ```
//!
//! Fixtures are built once per test process into
//! `<workspace>/target/fixtures/<name>/` (safe when several test processes
//! build at once), and run into `target/fixtures/<name>/runs/<pid>/<run>/`.
//!
//! | name        | toolchain | sources                | binary, objects            |
//! |-------------|-----------|------------------------|----------------------------|
//! | `rust`      | `Rustc`   | `fixtures/rust` (app + shapes crates) | `app`           |
//! | `c-clang19` | `Clang19` | `fixtures/c`           | `main`                     |
//! | `c-clang14` | `Clang14` | `fixtures/c`           | `main`                     |
//! | `c-clang13` | `Clang13` | `fixtures/c`           | `main`                     |
//! | `cpp`       | `Clang19` | `fixtures/cpp`         | `main`                     |
//! | `sharedlib` | `Clang19` | `fixtures/sharedlib`   | `host`, `libplugin.so`     |
//!
//! Missing tools are a panic naming what to install, never a skipped test.

/// One test per fixture of the table above, each calling `$check` with its
/// name: a report format's parity tests, where a failure names its fixture
/// and the other fixtures still run.
#[macro_export]
macro_rules! test_each_fixture {
    ($check:path) => {
        #[test]
        fn rust_fixture_matches_llvm_cov() {
            $check("rust");
        }

        #[test]
        fn c_clang19_fixture_matches_llvm_cov() {
            $check("c-clang19");
        }

        #[test]
        fn c_clang14_fixture_matches_llvm_cov() {
            $check("c-clang14");
        }

        #[test]
        fn c_clang13_fixture_matches_llvm_cov() {
            $check("c-clang13");
        }

        #[test]
        fn cpp_fixture_matches_llvm_cov() {
            $check("cpp");
        }

        #[test]
        fn shared_object_fixture_matches_llvm_cov() {
            $check("sharedlib");
        }
    };
}

mod builder;
mod cli;
pub mod disk;
pub mod dns;
pub mod go;
pub mod http;
pub mod lcov;
pub mod native;
pub mod node;
mod oracle;
pub mod python;
pub mod registry;
mod runner;
pub mod service;
mod specs;
mod tools;
mod wait;

pub use builder::{coverage_build, without_outer_cargo};
pub use cli::livecov_bin;
pub use oracle::{merge_profdata, oracle_lcov, profdata_tool, regex_escape, rust_agent_oracle};
pub use tools::{llvm_tool, run_checked, workspace_root};
pub use wait::wait_for;

use std::path::PathBuf;
use std::process::Child;
use std::sync::OnceLock;

/// A child process killed (and waited for) when dropped: a server a test
/// starts ends with the test, also when it fails.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A TCP port free on 127.0.0.1 now, for a server a test starts.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("its address").port()
}

/// A standard output or error that takes nothing: a pipe whose reader is
/// gone (a write raises SIGPIPE), or a full disk (`/dev/full`).
pub fn output_taking_nothing() -> [(&'static str, std::process::Stdio); 2] {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // Safety: a pipe whose read end is closed at once; its write end is
    // owned by the `OwnedFd`.
    let pipe = unsafe {
        assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC), 0, "pipe2");
        libc::close(fds[0]);
        OwnedFd::from_raw_fd(fds[1])
    };
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("open /dev/full");
    [("a pipe nobody reads", pipe.into()), ("/dev/full", full.into())]
}

/// The compiler a fixture is built with; it decides the coverage mapping
/// version and which `llvm-profdata` reads its raw profiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Toolchain {
    /// rustc with `-C instrument-coverage` (LLVM 22).
    Rustc,
    /// Debian's clang-19 / clang++-19.
    Clang19,
    /// Debian's clang-14 (coverage mapping and raw profiles of LLVM 14).
    Clang14,
    /// Debian's clang-13 (raw profile version 7, coverage mapping Version6).
    Clang13,
}

/// A built fixture and the profiles of its runs.
#[derive(Debug)]
pub struct Fixture {
    /// `rust`, `c-clang19`, `c-clang14`, `c-clang13`, `cpp` or `sharedlib`.
    pub name: String,
    pub toolchain: Toolchain,
    /// The fixture's source folder, `<workspace>/fixtures/...`.
    pub source_dir: PathBuf,
    /// The fixture's own source files (absolute paths, as in LCOV `SF:` lines).
    pub sources: Vec<PathBuf>,
    /// The instrumented executable.
    pub binary: PathBuf,
    /// Extra instrumented shared objects loaded by `binary` (`-object` of llvm-cov).
    pub objects: Vec<PathBuf>,
    /// At least two runs with different inputs, the last one of several executions.
    pub runs: Vec<Run>,
}

/// The fixture executed with some inputs: one or more executions.
#[derive(Debug)]
pub struct Run {
    /// A short name, unique within the fixture (`shapes`, `combined`...).
    pub label: String,
    /// The arguments of each execution.
    pub args: Vec<Vec<String>>,
    /// The `.profraw` files written by the executions (one per execution; the
    /// `sharedlib` one holds two raw profiles, of `host` and of `libplugin.so`).
    pub profraws: Vec<PathBuf>,
    /// The run's folder (working directory, profiles, `<n>.stdout`, `<n>.stderr`).
    pub dir: PathBuf,
}

impl Fixture {
    /// The run labelled `label`; panics when there is none.
    pub fn run(&self, label: &str) -> &Run {
        self.runs
            .iter()
            .find(|run| run.label == label)
            .unwrap_or_else(|| panic!("fixture {} has no run {label:?}", self.name))
    }
}

/// All fixtures, built and run once per test process (on first call; the
/// fixtures are built in parallel).
pub fn fixtures() -> &'static [Fixture] {
    static FIXTURES: OnceLock<Vec<Fixture>> = OnceLock::new();
    FIXTURES.get_or_init(|| {
        let root = workspace_root();
        let root = root.as_path();
        std::thread::scope(|scope| {
            let handles = [
                scope.spawn(move || specs::rust(root)),
                scope.spawn(move || specs::c(root, Toolchain::Clang19)),
                scope.spawn(move || specs::c(root, Toolchain::Clang14)),
                scope.spawn(move || specs::c(root, Toolchain::Clang13)),
                scope.spawn(move || specs::cpp(root)),
                scope.spawn(move || specs::sharedlib(root)),
            ];
            handles
                .into_iter()
                .map(|handle| {
                    handle
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        })
    })
}

/// The fixture named `name`. Panics when there is none.
pub fn fixture(name: &str) -> &'static Fixture {
    fixtures()
        .iter()
        .find(|fixture| fixture.name == name)
        .unwrap_or_else(|| panic!("no fixture named {name:?}"))
}
