//! The C-ABI shim (agent-native), end to end: liblivecov.so and
//! liblivecov.a really built, C fixtures (fixtures/native) really compiled
//! with clang-19 and clang-14, linked against the library or run
//! unmodified under LD_PRELOAD, really requested, signalled and forked,
//! and checked against LLVM 22's llvm-cov over a profile of the same
//! moment (clang-14 profiles indexed by llvm-profdata-14).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use livecov::agent::REST_AFTER;
use livecov_tests::http::{connect_unix, get_keeping_the_connection, unix_request};
use livecov_tests::lcov::{file_ending, parse_lcov, FileCoverage};
use livecov_tests::service::{find_instance, Service};
use livecov_tests::{llvm_tool, profdata_tool, run_checked, workspace_root, Toolchain};

/// What liblivecov.a needs from the system (`rustc --print native-static-libs`).
const NATIVE_STATIC_LIBS: &[&str] =
    &["-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl", "-lc"];

// ---------------------------------------------------------------- building

fn out_root() -> PathBuf {
    workspace_root().join("target/fixtures/native")
}

/// Holds an exclusive lock on `<dir>/.lock` while alive.
fn lock_dir(dir: &Path) -> std::fs::File {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    let lock = std::fs::File::create(dir.join(".lock")).expect("lock file");
    lock.lock().expect("lock");
    lock
}

/// The shim as users build it: `cargo build -p livecov-native --profile
/// release-native` (in a target folder of its own, not to wait for the
/// cargo running these tests).
struct Shim {
    so: PathBuf,
    a: PathBuf,
    include: PathBuf,
}

fn shim() -> &'static Shim {
    static SHIM: OnceLock<Shim> = OnceLock::new();
    SHIM.get_or_init(|| {
        let target = out_root().join("cargo");
        let _lock = lock_dir(&target);
        let mut cargo = cargo();
        cargo
            .args(["build", "--quiet", "-p", "livecov-native", "--profile", "release-native"])
            .env("CARGO_TARGET_DIR", &target)
            .current_dir(workspace_root());
        run_checked(&mut cargo, "cargo build -p livecov-native --profile release-native");
        let dir = target.join("release-native");
        let shim = Shim {
            so: dir.join("liblivecov.so"),
            a: dir.join("liblivecov.a"),
            include: workspace_root().join("agent-native/include"),
        };
        assert!(shim.so.is_file() && shim.a.is_file(), "cargo built no liblivecov in {}", dir.display());
        shim
    })
}

/// `cargo` without what the cargo running these tests set for itself
/// (target dir, flags, wrappers) and without profile file names.
fn cargo() -> Command {
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    for (name, _) in std::env::vars() {
        if (name.starts_with("CARGO") && name != "CARGO_HOME")
            || name.starts_with("RUSTC")
            || name == "RUSTFLAGS"
            || name == "LLVM_PROFILE_FILE"
        {
            cargo.env_remove(name);
        }
    }
    cargo
}

/// A program on PATH (or in /usr/bin); panics naming the package to install.
fn system_tool(name: &str, package: &str) -> PathBuf {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` not found: install the Debian package {package} (tests/scripts/install-deps.sh \
                 installs clang-19, clang-14 and llvm-14; `make test` runs it)"
            )
        })
}

fn clang(toolchain: Toolchain) -> PathBuf {
    match toolchain {
        Toolchain::Clang19 => system_tool("clang-19", "clang-19 (and libclang-rt-19-dev)"),
        Toolchain::Clang14 => system_tool("clang-14", "clang-14 (and libclang-rt-14-dev)"),
        other => panic!("no native fixtures for {other:?}"),
    }
}

fn toolchain_name(toolchain: Toolchain) -> &'static str {
    match toolchain {
        Toolchain::Clang19 => "clang19",
        Toolchain::Clang14 => "clang14",
        _ => "other",
    }
}

/// The native fixtures built with one compiler.
struct Built {
    /// app.c + work.c, instrumented, with -DLIVECOV_API, linked with liblivecov.a.
    app_api: PathBuf,
    /// app.c + work.c, instrumented, no livecov in it (for LD_PRELOAD).
    app: PathBuf,
    /// app.c + work.c without instrumentation.
    app_uninstrumented: PathBuf,
    /// plugin.c as an instrumented shared object.
    plugin: PathBuf,
    /// prefork.c + work.c, instrumented.
    prefork: PathBuf,
    /// drop_user.c + work.c, instrumented.
    drop_user: PathBuf,
    /// fork_exec.c, instrumented.
    fork_exec: PathBuf,
    /// fork_dup2.c, instrumented.
    fork_dup2: PathBuf,
    /// fork_after.c + work.c, instrumented.
    fork_after: PathBuf,
    /// api_test.c, instrumented, linked with liblivecov.a.
    api_test: PathBuf,
    /// api_test.c without instrumentation (-DNOT_INSTRUMENTED).
    api_test_uninstrumented: PathBuf,
}

fn built(toolchain: Toolchain) -> &'static Built {
    static CLANG19: OnceLock<Built> = OnceLock::new();
    static CLANG14: OnceLock<Built> = OnceLock::new();
    let cell = match toolchain {
        Toolchain::Clang19 => &CLANG19,
        Toolchain::Clang14 => &CLANG14,
        other => panic!("no native fixtures for {other:?}"),
    };
    cell.get_or_init(|| build(toolchain))
}

/// One compiler, the sources of one fixture folder and an output folder.
struct Compiler {
    cc: PathBuf,
    src: PathBuf,
    out: PathBuf,
}

impl Compiler {
    /// Builds `out/name` from `sources` (in `src`), with the shim's header
    /// and `src` on the include path. Made under a temporary name and
    /// renamed: a binary another test process runs is never rewritten
    /// under it.
    fn compile(&self, name: &str, flags: &[&str], sources: &[&str], libs: &[&Path], extra: &[&str]) -> PathBuf {
        let target = self.out.join(name);
        let tmp = self.out.join(format!(".{name}.{}", std::process::id()));
        let mut command = Command::new(&self.cc);
        command.args(flags).arg("-I").arg(&shim().include).arg("-I").arg(&self.src).arg("-o").arg(&tmp);
        for s in sources {
            command.arg(self.src.join(s));
        }
        command.args(libs).args(extra);
        run_checked(&mut command, &format!("building {name} with {}", self.cc.display()));
        std::fs::rename(&tmp, &target).expect("rename the built fixture");
        target
    }
}

const COVERAGE: &[&str] = &["-O0", "-g", "-fprofile-instr-generate", "-fcoverage-mapping"];

fn build(toolchain: Toolchain) -> Built {
    let shim = shim();
    let out = out_root().join(toolchain_name(toolchain));
    let _lock = lock_dir(&out);
    let compiler = Compiler { cc: clang(toolchain), src: workspace_root().join("fixtures/native"), out };
    let compile = |name: &str, flags: &[&str], sources: &[&str], libs: &[&Path], extra: &[&str]| {
        compiler.compile(name, flags, sources, libs, extra)
    };
    let cov = COVERAGE;
    let strict: &[&str] = &["-std=c99", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-pedantic", "-Werror"];
    let api_flags: Vec<&str> = [cov, strict, &["-DLIVECOV_API"]].concat();
    let a: &Path = &shim.a;
    Built {
        app_api: compile("app_api", &api_flags, &["app.c", "work.c"], &[a], NATIVE_STATIC_LIBS),
        app: compile("app", &[cov, strict].concat(), &["app.c", "work.c"], &[], &["-ldl"]),
        app_uninstrumented: compile("app_uninstrumented", strict, &["app.c", "work.c"], &[], &["-ldl"]),
        plugin: compile("libplugin.so", &[cov, &["-shared", "-fPIC"]].concat(), &["plugin.c"], &[], &[]),
        prefork: compile("prefork", &[cov, strict].concat(), &["prefork.c", "work.c"], &[], &[]),
        drop_user: compile("drop_user", &[cov, strict].concat(), &["drop_user.c", "work.c"], &[], &[]),
        fork_exec: compile("fork_exec", &[cov, strict].concat(), &["fork_exec.c"], &[], &[]),
        fork_dup2: compile("fork_dup2", &[cov, strict].concat(), &["fork_dup2.c"], &[], &[]),
        fork_after: compile("fork_after", &[cov, strict].concat(), &["fork_after.c", "work.c"], &[], &[]),
        api_test: compile("api_test", &[cov, strict].concat(), &["api_test.c"], &[a], NATIVE_STATIC_LIBS),
        api_test_uninstrumented: compile(
            "api_test_uninstrumented",
            &[strict, &["-DNOT_INSTRUMENTED"]].concat(),
            &["api_test.c"],
            &[a],
            NATIVE_STATIC_LIBS,
        ),
    }
}

// ---------------------------------------------------------------- running

fn scratch(name: &str) -> PathBuf {
    let dir = workspace_root().join("target/tmp/native").join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch folder");
    dir
}

/// A command with none of the caller's LIVECOV_* or LLVM_PROFILE_FILE.
fn command(program: &Path, dir: &Path) -> Command {
    let mut c = Command::new(program);
    for (name, _) in std::env::vars() {
        if name.starts_with("LIVECOV_") || name == "LLVM_PROFILE_FILE" || name == "LD_PRELOAD" {
            c.env_remove(name);
        }
    }
    c.current_dir(dir);
    c
}

fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    livecov_tests::wait_for(what, Duration::from_millis(10), f)
}

/// The instance of process `pid` in `cov`, once its socket exists.
fn instance_of(cov: &Path, pid: u32) -> String {
    wait_for(&format!("the socket of process {pid}"), || find_instance(cov, "native", pid))
}

/// `app --serve` under LD_PRELOAD, driven line by line through stdin.
struct Served {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    dir: PathBuf,
    instance: String,
}

impl Served {
    /// `program --serve` under LD_PRELOAD.
    fn start(name: &str, program: &Path) -> Served {
        Served::spawn(name, program, true)
    }

    /// `program --serve`, under LD_PRELOAD when `preload` (else the
    /// program starts its agent itself).
    fn spawn(name: &str, program: &Path, preload: bool) -> Served {
        let dir = scratch(name);
        let mut command = command(program, &dir);
        if preload {
            command.env("LD_PRELOAD", &shim().so);
        }
        let mut child = command
            .arg("--serve")
            .env("LIVECOV_DIR", dir.join("cov"))
            .env("LLVM_PROFILE_FILE", dir.join("exit.profraw"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        // Whatever the program prints before (`instance ID`), then `ready`.
        let mut line = String::new();
        while line != "ready\n" {
            line.clear();
            assert!(stdout.read_line(&mut line).expect("read `ready`") > 0, "{} ended before `ready`", program.display());
        }
        let instance = instance_of(&dir.join("cov"), child.id());
        Served { child, stdin, stdout, dir, instance }
    }

    /// Runs one command; returns its output.
    fn send(&mut self, line: &str) -> String {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("send a command");
        stdin.flush().expect("flush");
        let mut out = String::new();
        loop {
            let mut l = String::new();
            assert!(self.stdout.read_line(&mut l).expect("read") > 0, "app ended during {line:?}");
            if l == "done\n" {
                return out;
            }
            out.push_str(&l);
        }
    }

    fn cov(&self) -> PathBuf {
        self.dir.join("cov")
    }

    fn socket(&self) -> PathBuf {
        self.cov().join("sockets").join(format!("{}.sock", self.instance))
    }

    fn report(&self) -> PathBuf {
        self.cov().join("reports").join(format!("{}.lcov", self.instance))
    }

    fn get(&self, path: &str) -> Vec<u8> {
        let (status, body) = unix_get(&self.socket(), path);
        assert_eq!(status, 200, "GET {path}: {}", String::from_utf8_lossy(&body));
        body
    }

    fn lcov(&self) -> String {
        String::from_utf8(self.get("/coverage")).expect("UTF-8 LCOV")
    }

    /// `?format=profraw` of this moment, saved to a file.
    fn profraw(&self, name: &str) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, self.get("/coverage?format=profraw")).expect("write the snapshot");
        path
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unix_get(socket: &Path, path: &str) -> (u16, Vec<u8>) {
    let r = unix_request(socket, "GET", path, &[]);
    (r.status, r.body)
}

// ---------------------------------------------------------------- LCOV

/// LLVM 22's llvm-cov over raw profiles of `built`'s toolchain, filtered
/// as the agent filters by default.
fn llvm_cov(toolchain: Toolchain, binary: &Path, objects: &[&Path], profraws: &[PathBuf], dir: &Path) -> String {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let profdata = dir.join(format!("merged-{}.profdata", N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
    run_checked(
        Command::new(profdata_tool(toolchain)).arg("merge").args(profraws).arg("-o").arg(&profdata),
        "llvm-profdata merge",
    );
    let mut cmd = Command::new(llvm_tool("llvm-cov"));
    cmd.args(["export", "-format=lcov"]).arg(binary);
    for o in objects {
        cmd.arg("-object").arg(o);
    }
    cmd.arg("-instr-profile")
        .arg(&profdata)
        .arg(format!("-ignore-filename-regex={}", livecov::agent::DEFAULT_IGNORE));
    String::from_utf8(run_checked(&mut cmd, "llvm-cov export").stdout).expect("UTF-8 LCOV")
}

/// The count of `function` in the file ending with `suffix`.
fn function_count(lcov: &str, suffix: &str, function: &str) -> u64 {
    let files = parse_lcov(lcov);
    let file = file_ending(&files, suffix);
    *file
        .functions
        .get(function)
        .unwrap_or_else(|| panic!("no function {function} in {suffix}: {:?}", file.functions.keys().collect::<Vec<_>>()))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn assert_same_lcov(live: &str, expected: &str, what: &str) {
    assert!(live.contains("SF:"), "{what}: an empty report");
    if live != expected {
        let first = live.lines().zip(expected.lines()).position(|(a, b)| a != b);
        panic!(
            "{what}: the agent's LCOV differs from llvm-cov's, first at line {first:?}\n--- agent ---\n{live}\n--- llvm-cov ---\n{expected}"
        );
    }
}

// ---------------------------------------------------------------- the API, linked statically

/// app built with -DLIVECOV_API and liblivecov.a: `checkpoint` dumps the
/// live LCOV and writes the program's raw profile at the same moment.
fn api_dumps_equal_llvm_cov(toolchain: Toolchain) {
    let b = built(toolchain);
    let dir = scratch(&format!("api-{}", toolchain_name(toolchain)));
    let c = |n: &str| dir.join(n).display().to_string();
    let (c1, c2) = (c("c1"), c("c2"));
    let args = [
        "sum", "1", "2", "3", ",", "checkpoint", &c1, ",", "fib", "12", ",", "words", "abba", "kayak", "hello", ",",
        "classify", "-5", "0", "7", "99", "5000", ",", "checkpoint", &c2, ",", "primes", "30", ",", "sum", "4", "x",
    ];
    let out = command(&b.app_api, &dir)
        .args(args)
        .env("LIVECOV_DIR", dir.join("cov"))
        .env("LLVM_PROFILE_FILE", dir.join("exit.profraw"))
        .output()
        .expect("run app");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "`sum 4 x` fails: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let instance = stdout.lines().find_map(|l| l.strip_prefix("instance ")).expect("app prints its instance");
    assert!(instance.starts_with("native-"), "{instance}");

    for name in ["c1", "c2"] {
        let live = read(&dir.join(format!("{name}.lcov")));
        let expected = llvm_cov(toolchain, &b.app_api, &[], &[dir.join(format!("{name}.profraw"))], &dir);
        assert_same_lcov(&live, &expected, &format!("{toolchain:?} checkpoint {name}"));
    }
    let (c1, c2) = (read(&dir.join("c1.lcov")), read(&dir.join("c2.lcov")));
    assert_eq!(function_count(&c1, "work.c", "work_fib"), 0);
    assert_eq!(function_count(&c2, "work.c", "work_fib"), 1);

    // The final report, written at exit, is what the exit profile says.
    let report = read(&dir.join("cov/reports").join(format!("{instance}.lcov")));
    let expected = llvm_cov(toolchain, &b.app_api, &[], &[dir.join("exit.profraw")], &dir);
    assert_same_lcov(&report, &expected, &format!("{toolchain:?} final report"));
    assert_eq!(function_count(&report, "work.c", "work_count_primes"), 1);
    let meta = read(&dir.join("cov/reports").join(format!("{instance}.json")));
    assert!(meta.contains("\"runtime\":\"native\"") && meta.contains("\"state\":\"exited\""), "{meta}");
}

#[test]
fn api_dumps_equal_llvm_cov_at_the_same_moment_clang19() {
    api_dumps_equal_llvm_cov(Toolchain::Clang19);
}

#[test]
fn api_dumps_equal_llvm_cov_at_the_same_moment_clang14() {
    api_dumps_equal_llvm_cov(Toolchain::Clang14);
}

#[test]
fn api_dumps_with_test_names_and_resets() {
    let b = built(Toolchain::Clang19);
    let dir = scratch("api-reset");
    let d = |n: &str| dir.join(n).display().to_string();
    let (d1, d2, d3, mine) = (d("d1"), d("d2"), d("d3"), d("mine.lcov"));
    let args = [
        "fib", "5", ",", "dump", &d1, "first", "1", ",", "fib", "6", ",", "fib", "7", ",", "dump", &d2, "second", "0",
        ",", "reset", ",", "dump", &d3, "", "0", ",", "report", &mine, ",", "report",
    ];
    let out = command(&b.app_api, &dir)
        .args(args)
        .env("LLVM_PROFILE_FILE", dir.join("exit.profraw"))
        .env("APP_CONFIG", format!("dir={}/cov;demangle=0", dir.display()))
        .output()
        .expect("run app");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (d1, d2, d3) = (read(&dir.join("d1.lcov")), read(&dir.join("d2.lcov")), read(&dir.join("d3.lcov")));
    assert!(d1.starts_with("TN:first\n") && d2.starts_with("TN:second\n") && !d3.contains("TN:"));
    assert_eq!(function_count(&d1, "work.c", "work_fib"), 1);
    assert_eq!(function_count(&d2, "work.c", "work_fib"), 2, "counts since the dump-and-reset");
    assert_eq!(function_count(&d3, "work.c", "work_fib"), 0, "nothing since the reset");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let instance = stdout.lines().find_map(|l| l.strip_prefix("instance ")).expect("instance");
    assert!(read(&dir.join("mine.lcov")).contains("SF:"));
    assert!(dir.join("cov/reports").join(format!("{instance}.lcov")).is_file());
}

// ---------------------------------------------------------------- LD_PRELOAD

/// The same program, not linked with livecov, run under LD_PRELOAD: live
/// dumps over the socket (the first, a record computed whole again, and
/// updated) equal llvm-cov over the `?format=profraw` of the same moment;
/// SIGTERM leaves the last dump as final report and the
/// signal as exit status.
fn preloaded_serving(toolchain: Toolchain) {
    let b = built(toolchain);
    let mut s = Served::start(&format!("preload-{}", toolchain_name(toolchain)), &b.app);
    let first = s.lcov();
    assert_eq!(function_count(&first, "work.c", "work_fib"), 0);
    assert_eq!(s.send("fib 20"), "fib 6765\n");
    s.send("words noon level river");
    s.send("classify 3 -1 12");
    let live = s.lcov();
    let profraw = s.profraw("moment.profraw");
    let expected = llvm_cov(toolchain, &b.app, &[], &[profraw], &s.dir);
    assert_same_lcov(&live, &expected, &format!("{toolchain:?} preloaded dump"));
    assert_eq!(function_count(&live, "work.c", "work_fib"), 1);

    // The first dump parked work.c's record, the second computed it whole
    // again, in parts: this one updates those parts.
    s.send("primes 50");
    let last = s.lcov();
    let profraw = s.profraw("later.profraw");
    let expected = llvm_cov(toolchain, &b.app, &[], &[profraw], &s.dir);
    assert_same_lcov(&last, &expected, &format!("{toolchain:?} preloaded dump, updated"));
    assert_eq!(function_count(&last, "work.c", "work_count_primes"), 1);
    // Safety: signalling our own child.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    let status = s.child.wait().expect("wait");
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    assert_eq!(read(&s.report()), last, "the final report is the state at the signal");
    let meta = read(&s.cov().join("reports").join(format!("{}.json", s.instance)));
    assert!(meta.contains("\"state\":\"exited\"") && meta.contains("\"runtime\":\"native\""), "{meta}");
    assert!(!s.socket().exists(), "socket left behind");
}

/// Run to its end under LD_PRELOAD: the final report is the exit profile.
fn preloaded_exiting(toolchain: Toolchain) {
    let b = built(toolchain);
    let dir = scratch(&format!("preload-exit-{}", toolchain_name(toolchain)));
    let out = command(&b.app, &dir)
        .args(["sum", "5", "6", ",", "classify", "1", "1000", ",", "words", "a", ",", "exit", "3"])
        .env("LD_PRELOAD", &shim().so)
        .env("LIVECOV_DIR", dir.join("cov"))
        .env("LLVM_PROFILE_FILE", dir.join("exit.profraw"))
        .output()
        .expect("run app");
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "the agent said something: {}", String::from_utf8_lossy(&out.stderr));
    let reports: Vec<PathBuf> = std::fs::read_dir(dir.join("cov/reports"))
        .expect("reports/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "lcov"))
        .collect();
    assert_eq!(reports.len(), 1, "{reports:?}");
    let expected = llvm_cov(toolchain, &b.app, &[], &[dir.join("exit.profraw")], &dir);
    assert_same_lcov(&read(&reports[0]), &expected, &format!("{toolchain:?} final report at exit"));
}

#[test]
fn preloaded_into_an_unmodified_program_clang19() {
    preloaded_serving(Toolchain::Clang19);
    preloaded_exiting(Toolchain::Clang19);
}

#[test]
fn preloaded_into_an_unmodified_program_clang14() {
    preloaded_serving(Toolchain::Clang14);
    preloaded_exiting(Toolchain::Clang14);
}

/// An MC/DC build (clang-19 `-fcoverage-mcdc`) under LD_PRELOAD:
/// `?format=llvm-json` is llvm-cov 22's JSON export of the
/// `?format=profraw` of the same moment, byte for byte, MC/DC records (read
/// from the program's own bitmaps) included.
#[test]
fn preloaded_llvm_json_has_the_mcdc_records_of_llvm_cov() {
    let out = out_root().join("clang19-mcdc");
    let compiler = Compiler { cc: clang(Toolchain::Clang19), src: workspace_root().join("fixtures/native"), out };
    let app = {
        let _lock = lock_dir(&compiler.out);
        compiler.compile("app", &[COVERAGE, &["-fcoverage-mcdc"]].concat(), &["app.c", "work.c"], &[], &["-ldl"])
    };
    let mut s = Served::start("preload-mcdc", &app);
    assert_eq!(s.send("fib 12"), "fib 144\n");
    s.send("primes 30");
    s.send("sum 4 x 5");
    let json = String::from_utf8(s.get("/coverage?format=llvm-json")).expect("UTF-8 JSON");
    let profraw = s.profraw("moment.profraw");
    let profdata = s.dir.join("moment.profdata");
    run_checked(
        Command::new(profdata_tool(Toolchain::Clang19)).arg("merge").arg(&profraw).arg("-o").arg(&profdata),
        "llvm-profdata merge",
    );
    let mut export = Command::new(llvm_tool("llvm-cov"));
    export
        .args(["export", "-format=text"])
        .arg(&app)
        .arg("-instr-profile")
        .arg(&profdata)
        .arg(format!("-ignore-filename-regex={}", livecov::agent::DEFAULT_IGNORE));
    let expected = String::from_utf8(run_checked(&mut export, "llvm-cov export").stdout).expect("UTF-8 JSON");
    assert!(json == expected, "the agent's llvm-json differs from llvm-cov's export of the same moment");
    // Decisions with test vectors that ran, and independence pairs shown.
    let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    let records: Vec<&serde_json::Value> = v["data"][0]["files"]
        .as_array()
        .expect("files")
        .iter()
        .flat_map(|f| f["mcdc_records"].as_array().expect("mcdc_records"))
        .collect();
    assert!(records.iter().any(|r| r[10].as_array().is_some_and(|tvs| !tvs.is_empty())), "no test vector ran: {records:?}");
    assert!(v["data"][0]["totals"]["mcdc"]["count"].as_u64() > Some(0), "{}", v["data"][0]["totals"]["mcdc"]);
}

#[test]
fn a_dlopened_plugin_is_reported() {
    let b = built(Toolchain::Clang19);
    let mut s = Served::start("plugin", &b.app);
    s.send("fib 3");
    let before = s.lcov();
    assert!(!before.contains("plugin.c"), "the plugin is not loaded yet");
    assert_eq!(s.send(&format!("load {}", b.plugin.display())), "loaded\n");
    assert_eq!(s.send("plugin 27"), "plugin 111\n");
    assert_eq!(s.send("plugin -3"), "plugin 3\n");
    let live = s.lcov();
    let profraw = s.profraw("moment.profraw");
    let expected = llvm_cov(Toolchain::Clang19, &b.app, &[&b.plugin], &[profraw], &s.dir);
    assert_same_lcov(&live, &expected, "dump with a dlopen'ed plugin");
    assert_eq!(function_count(&live, "plugin.c", "plugin_compute"), 2);
}

/// `prefork 3` under LD_PRELOAD with LIVECOV_DIR `cov` and exit profiles
/// `profile_file`: the parent, its listening port and its workers' pids.
fn start_prefork(dir: &Path, cov: &Path, profile_file: &std::ffi::OsStr) -> (Child, u16, Vec<u32>) {
    let mut child = command(&built(Toolchain::Clang19).prefork, dir)
        .arg("3")
        .env("LD_PRELOAD", &shim().so)
        .env("LIVECOV_DIR", cov)
        .env("LLVM_PROFILE_FILE", profile_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start prefork");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("listening line");
    let port: u16 = line.trim().strip_prefix("listening on ").and_then(|p| p.parse().ok()).expect("listening on PORT");
    line.clear();
    stdout.read_line(&mut line).expect("workers line");
    let workers: Vec<u32> =
        line.trim().strip_prefix("workers ").expect("workers line").split(' ').map(|p| p.parse().expect("pid")).collect();
    assert_eq!(workers.len(), 3);
    (child, port, workers)
}

/// One request line to a prefork worker on `port`, and its answer.
fn prefork_request(port: u16, text: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to a worker");
    s.write_all(text.as_bytes()).expect("send");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("answer");
    answer
}

#[test]
fn prefork_workers_sum_to_the_exit_profiles() {
    let b = built(Toolchain::Clang19);
    let dir = scratch("prefork");
    let cov = dir.join("cov");
    let (mut child, port, workers) = start_prefork(&dir, &cov, dir.join("exit-%p.profraw").as_os_str());
    let parent = instance_of(&cov, child.id());
    let instances: Vec<String> = workers.iter().map(|&pid| instance_of(&cov, pid)).collect();
    let request = |text: &str| prefork_request(port, text);
    for n in 1..=12 {
        request(&format!("fib {n}\n"));
    }
    assert_eq!(request("classify -4\n"), "negative\n");
    for _ in 0..3 {
        assert_eq!(request("quit\n"), "bye\n");
    }
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status:?}");

    // The final reports of the parent and every worker, summed. A worker
    // starts from zeroed counters in the middle of `main` (on the stack at
    // the fork): counter expressions of `main` below the fork are negative
    // in the worker, in its report as in llvm-cov over its exit profile
    // (both print them as u64). Region counts are linear in the counters,
    // so sums modulo 2^64 are those of the summed counters.
    let mut sum: BTreeMap<String, FileCoverage> = BTreeMap::new();
    for instance in instances.iter().chain([&parent]) {
        for (file, c) in parse_lcov(&read(&cov.join("reports").join(format!("{instance}.lcov")))) {
            let total = sum.entry(file).or_default();
            for (l, n) in c.lines {
                let t = total.lines.entry(l).or_default();
                *t = t.wrapping_add(n);
            }
            for (f, n) in c.functions {
                *total.functions.entry(f).or_default() += n;
            }
        }
    }
    let profraws: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("scratch")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "profraw"))
        .collect();
    assert_eq!(profraws.len(), 4, "one exit profile per process: {profraws:?}");
    let expected = parse_lcov(&llvm_cov(Toolchain::Clang19, &b.prefork, &[], &profraws, &dir));
    assert_eq!(sum.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>());
    let covered = |m: &BTreeMap<u32, u64>| m.iter().filter(|(_, c)| **c > 0).map(|(l, _)| *l).collect::<Vec<_>>();
    for (file, want) in &expected {
        let got = &sum[file];
        assert_eq!(got.functions, want.functions, "{file}: function counts");
        assert_eq!(covered(&got.lines), covered(&want.lines), "{file}: covered lines");
        assert_eq!(got.lines.keys().collect::<Vec<_>>(), want.lines.keys().collect::<Vec<_>>(), "{file}");
    }
    let total = |f: &str| sum.values().filter_map(|c| c.functions.get(f)).sum::<u64>();
    assert_eq!(total("work_fib"), 12);
    // What ran before the fork is counted once, in the parent.
    assert_eq!(total("main"), 1, "main counted in the workers too");
}

#[test]
fn the_workers_of_a_preloaded_c_server_merge_exactly_as_llvm_cov_does() {
    let b = built(Toolchain::Clang19);
    let dir = scratch("prefork-exact");
    let cov = dir.join("cov");
    let (mut child, port, workers) = start_prefork(&dir, &cov, std::ffi::OsStr::new("/dev/null"));
    let mut instances: Vec<String> = workers.iter().map(|&pid| instance_of(&cov, pid)).collect();
    instances.push(instance_of(&cov, child.id()));
    let request = |text: &str| prefork_request(port, text);
    // Workers take connections as they come: each counts a different share.
    for n in 1..=9 {
        request(&format!("fib {n}\n"));
    }
    request("primes 30\n");
    request("classify -4\n");

    // The workers wait in accept(): the collection and their own raw
    // profiles are of the same moment.
    let out = dir.join("out");
    let run = Command::new(livecov_tests::livecov_bin())
        .args(["collect", "--dir"])
        .arg(&cov)
        .arg("-o")
        .arg(&out)
        .output()
        .expect("run livecov collect");
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let profraws: Vec<PathBuf> = instances
        .iter()
        .map(|i| {
            let (status, body) = unix_get(&cov.join("sockets").join(format!("{i}.sock")), "/coverage?format=profraw");
            assert_eq!(status, 200);
            let path = dir.join(format!("{i}.profraw"));
            std::fs::write(&path, body).expect("write the profile");
            path
        })
        .collect();
    let expected = llvm_cov(Toolchain::Clang19, &b.prefork, &[], &profraws, &dir);
    assert_eq!(read(&out.join("merged.lcov")), expected);
    let manifest: serde_json::Value = serde_json::from_str(&read(&out.join("manifest.json"))).expect("JSON");
    assert_eq!(manifest["groups"].as_array().map(Vec::len), Some(1), "one build, one exact group: {manifest}");

    for _ in 0..3 {
        assert_eq!(request("quit\n"), "bye\n");
    }
    assert!(child.wait().expect("wait").success());
}

/// Workers forked by a parent started as root switch to `nobody`; with
/// `chroot`, they first make an empty folder their root, so that the
/// coverage folder is out of their sight too. Their final reports are
/// written in any case, through the files opened while they were root.
#[test]
fn workers_that_drop_root_leave_their_final_reports_and_their_exit_status() {
    // CI runs the tests as root, which this needs: a test run as another
    // user fails here, at the workers' setuid.
    let b = built(Toolchain::Clang19);
    for confined in [false, true] {
        let run = |agent: bool| {
            let name = format!("drop-user{}{}", if confined { "-chroot" } else { "" }, if agent { "" } else { "-alone" });
            let dir = scratch(&name);
            let cov = dir.join("cov");
            let jail = dir.join("jail");
            std::fs::create_dir_all(&jail).expect("create the workers' root");
            let mut c = command(&b.drop_user, &dir);
            if confined {
                c.arg("chroot").arg(&jail);
            }
            c.env("LLVM_PROFILE_FILE", "/dev/null");
            if agent {
                c.env("LD_PRELOAD", &shim().so).env("LIVECOV_DIR", &cov);
            }
            let out = c.output().expect("run drop_user");
            assert!(out.status.success(), "drop_user: {out:?}");
            (String::from_utf8(out.stdout).expect("utf-8"), String::from_utf8_lossy(&out.stderr).into_owned(), cov)
        };
        let (alone, _, _) = run(false);
        assert_eq!(alone, "worker 0 exit 0\nworker 1 signal 15\n", "chroot {confined}");
        let (with_agent, stderr, cov) = run(true);
        assert_eq!(with_agent, alone, "chroot {confined}: the agent changed how the workers end");
        assert!(!stderr.contains("livecov"), "chroot {confined}: {stderr}");

        let reports = cov.join("reports");
        let mut fibs = Vec::new();
        let mut states = Vec::new();
        for e in std::fs::read_dir(&reports).expect("reports").flatten() {
            let path = e.path();
            if path.extension().is_some_and(|x| x == "json") {
                let meta: serde_json::Value = serde_json::from_str(&read(&path)).expect("metadata is JSON");
                states.push(meta["state"].as_str().unwrap_or("").to_owned());
                // Read once: after a chroot, /proc/self/exe leads nowhere.
                assert_eq!(meta["program"].as_str().map(Path::new), Some(b.drop_user.as_path()), "chroot {confined}: {meta}");
                let lcov = read(&path.with_extension("lcov"));
                fibs.push(parse_lcov(&lcov).values().filter_map(|c| c.functions.get("work_fib")).sum::<u64>());
            }
        }
        assert_eq!(states, ["exited"; 3], "chroot {confined}: parent and both workers end with a final report");
        fibs.sort();
        // One call in each worker, none in the parent.
        assert_eq!(fibs, [0, 1, 1], "chroot {confined}");
    }
}

/// Forked children that run another program (`exec`): an uninstrumented
/// one (`/bin/true`), and the fixture itself. Each child's agent, started
/// at the fork, is lost with its program; the next program of the process
/// ends its instance: its socket goes, and `livecov collect` finds no
/// instance lost. A child that wrote no report (it ran its helper at once)
/// leaves no file; one that lived long enough for a periodic report leaves
/// it, its metadata `exited` with `exec` the new program, and its counts
/// are collected. Before, each exec left a socket where nothing answered
/// and an instance `running` forever, which `collect` reported lost; then
/// three files each, however little they held.
/// A program that puts descriptors at every number from 3 to 63, as
/// programs hand descriptors to the one they run next, and runs on: a
/// forked child (a pipe there) and the program itself (/dev/null there).
/// The descriptors its agent keeps are past those, its runtime's too, so
/// it still answers, writes nothing into the pipe, and leaves its final
/// report. Before, the child's socket refused connections, and the
/// runtime's `epoll` and the executable's file kept open for a dump were
/// replaced (the agent's thread panicked, on the program's stderr; the
/// final report failed: "Permission denied").
#[test]
fn a_program_that_puts_descriptors_at_small_numbers_keeps_its_agent() {
    let b = built(Toolchain::Clang19);
    for (name, args, says, rest) in [
        ("child", &[][..], "child ", "pipe: from the child\nchild exit 0\n"),
        ("self", &["self"][..], "ready ", ""),
    ] {
        let dir = scratch(&format!("dup2-{name}"));
        let cov = dir.join("cov");
        let mut run = command(&b.fork_dup2, &dir);
        run.args(args).env("LLVM_PROFILE_FILE", "/dev/null").env("LD_PRELOAD", &shim().so).env("LIVECOV_DIR", &cov);
        let mut program = run.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run fork_dup2");
        let mut stdout = BufReader::new(program.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("its first line");
        let pid: u32 = line.trim().strip_prefix(says).and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("{name}: said {line:?}"));
        let instance = instance_of(&cov, pid);
        let socket = cov.join("sockets").join(format!("{instance}.sock"));
        let connection = livecov_tests::http::connect_unix(&socket);
        connection.set_read_timeout(Some(Duration::from_secs(10))).expect("a timeout");
        let answer = livecov_tests::http::exchange(&connection, "GET", "/coverage", &[]);
        assert_eq!(answer.status, 200, "{name}: the agent after the dup2s: {}", answer.text());
        program.stdin.take().expect("stdin").write_all(b"go\n").expect("tell it to go on");
        let status = program.wait().expect("wait for fork_dup2");
        let mut said = String::new();
        stdout.read_to_string(&mut said).expect("the rest of its output");
        let mut stderr = String::new();
        program.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("its stderr");
        assert!(status.success(), "{name}: {status:?}: {stderr}");
        assert_eq!(said, rest, "{name}: only what the child wrote came through the pipe");
        assert!(stderr.is_empty(), "{name}: the program's stderr: {stderr}");
        let meta: serde_json::Value = serde_json::from_str(&read(&cov.join(format!("reports/{instance}.json")))).expect("metadata");
        assert_eq!(meta["state"], "exited", "{name}: {meta}");
        let report = parse_lcov(&read(&cov.join(format!("reports/{instance}.lcov"))));
        let after = file_ending(&report, "fork_dup2.c").functions.get("fork_dup2.c:after_dup2");
        assert_eq!(after, Some(&1), "{name}: the final report");
        let sockets: Vec<_> = std::fs::read_dir(cov.join("sockets")).expect("sockets").flatten().map(|e| e.file_name()).collect();
        assert!(sockets.is_empty(), "{name}: sockets left behind: {sockets:?}");
    }
}

/// A child forked after its parent's agent was dumped starts from the
/// parent's engine as those dumps left it: its first report takes the
/// files and stretches where nothing counts any more (the parent's code it
/// never ran) with every count zero, and updates the rest. Its final report
/// is still llvm-cov's over its exit profile, byte for byte, branches too:
/// as its first report, and after a periodic one (the child then runs
/// more code).
#[test]
fn a_child_forked_after_dumps_reports_exactly_its_own_counts() {
    for periodic in [false, true] {
        child_forked_after(Before::Dumps, periodic);
    }
}

/// The same for a parent never dumped: its agent makes its records once,
/// in the background, at the program's first fork after one of its
/// children reported, and the children forked later take them (the first
/// two children, forked before, compute every file).
#[test]
fn a_child_forked_after_the_first_fork_of_a_parent_never_dumped_reports_exactly_its_own_counts() {
    child_forked_after(Before::AFork, false);
}

/// What the parent of [`child_forked_after`] does before the children it
/// checks: two dumps, or two forks and a second's wait.
#[derive(Clone, Copy)]
enum Before {
    Dumps,
    AFork,
}

fn child_forked_after(before: Before, periodic: bool) {
    let b = built(Toolchain::Clang19);
    let name = match (before, periodic) {
        (Before::Dumps, false) => "fork-after-dumps",
        (Before::Dumps, true) => "fork-after-dumps-periodic",
        (Before::AFork, _) => "fork-after-a-fork",
    };
    let dir = scratch(name);
    let cov = dir.join("cov");
    let mut run = command(&b.fork_after, &dir);
    run.env("LLVM_PROFILE_FILE", dir.join("exit-%p.profraw")).env("LD_PRELOAD", &shim().so).env("LIVECOV_DIR", &cov);
    if periodic {
        run.env("LIVECOV_FLUSH_SECS", "0.1").env("FORK_AFTER_WAIT_MS", "400");
    }
    let (mut program, mut stdin, mut stdout, pid) = start_fork_after(&mut run);
    let mut said = |command: &str| {
        stdin.write_all(command.as_bytes()).expect("a command");
        let mut line = String::new();
        stdout.read_line(&mut line).expect("its answer");
        line.trim().to_owned()
    };
    // A child that runs `fork N`'s work.c, or none of it (N = 0: its
    // record there is the parent's with every count zero): its final
    // report.
    let fork_and_check = |said: &mut dyn FnMut(&str) -> String, n: u32| {
        let answer = said(&format!("fork {n}\n"));
        let child: u32 = answer.strip_prefix("child ").and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("said {answer:?}"));
        let reports = std::fs::read_dir(cov.join("reports")).expect("reports").flatten().map(|e| e.path());
        let report = reports
            .filter(|p| p.extension().is_some_and(|e| e == "lcov"))
            .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("native-{child}-"))))
            .unwrap_or_else(|| panic!("no report of the child {child}"));
        let report = read(&report);
        let expected = llvm_cov(Toolchain::Clang19, &b.fork_after, &[], &[dir.join(format!("exit-{child}.profraw"))], &dir);
        assert_same_lcov(&report, &expected, &format!("the final report of the child of fork {n} ({name})"));
        let files = parse_lcov(&report);
        let work = file_ending(&files, "work.c");
        let fib = u64::from(n > 0);
        assert_eq!((work.functions.get("work_fib"), work.functions.get("work_count_primes")), (Some(&fib), Some(&0)), "{report}");
        assert!(report.contains("BRDA:"), "branches in the report: {report}");
    };
    match before {
        Before::Dumps => {
            let socket = cov.join("sockets").join(format!("{}.sock", instance_of(&cov, pid)));
            for n in [30, 10] {
                assert_eq!(said(&format!("work {n}\n")), "done");
                let (status, body) = unix_get(&socket, "/coverage");
                assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
            }
        }
        Before::AFork => {
            assert_eq!(said("work 30\n"), "done");
            // The first child reports at its exit: the second fork tells the
            // parent's agent to make its records, which it does meanwhile.
            fork_and_check(&mut said, 0);
            fork_and_check(&mut said, 0);
            std::thread::sleep(Duration::from_secs(1));
            assert_eq!(said("work 10\n"), "done");
        }
    }
    for n in [12, 0] {
        fork_and_check(&mut said, n);
    }
    assert_eq!(said("quit\n"), "");
    assert!(program.wait().expect("wait for fork_after").success());
    let mut stderr = String::new();
    program.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("its stderr");
    assert!(stderr.is_empty(), "{stderr}");
}

/// fixtures/native/fork_after started by `run`, its standard streams
/// piped: the program, its input and output, and its pid (its first line).
fn start_fork_after(run: &mut Command) -> (Child, ChildStdin, BufReader<ChildStdout>, u32) {
    let mut program = run.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run fork_after");
    let stdin = program.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(program.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("its first line");
    let pid: u32 = line.trim().strip_prefix("ready ").and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("said {line:?}"));
    (program, stdin, stdout, pid)
}

/// A client's connection to the agent, open as the program forks, is the
/// parent's alone: when the parent is killed, it ends then, not when the
/// child (which has an agent of its own) ends.
#[test]
fn a_child_forked_while_a_client_is_connected_leaves_the_connection_to_its_parent() {
    const CHILD_WAITS_MS: u64 = 5000;
    let b = built(Toolchain::Clang19);
    let dir = scratch("fork-with-a-connection");
    let cov = dir.join("cov");
    let mut run = command(&b.fork_after, &dir);
    run.env("LLVM_PROFILE_FILE", dir.join("exit-%p.profraw")).env("LD_PRELOAD", &shim().so).env("LIVECOV_DIR", &cov);
    run.env("FORK_AFTER_WAIT_MS", CHILD_WAITS_MS.to_string());
    let (mut program, mut stdin, _stdout, pid) = start_fork_after(&mut run);
    let socket = cov.join("sockets").join(format!("{}.sock", instance_of(&cov, pid)));
    let mut client = connect_unix(&socket);
    client.set_read_timeout(Some(Duration::from_secs(120))).expect("a read timeout");
    assert_eq!(get_keeping_the_connection(&mut client, "/health").status, 200);
    stdin.write_all(b"fork 3\n").expect("a command");
    // The child's agent listens as its fork returns.
    let children = format!("/proc/{pid}/task/{pid}/children");
    let deadline = Instant::now() + Duration::from_secs(30);
    let child: u32 = loop {
        let sockets = std::fs::read_dir(cov.join("sockets")).map_or(0, |d| d.flatten().count());
        let child = std::fs::read_to_string(&children).ok().and_then(|c| c.trim().parse().ok());
        match child {
            Some(child) if sockets == 2 => break child,
            _ => assert!(Instant::now() < deadline, "no child with an agent: {sockets} sockets"),
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    program.kill().expect("kill fork_after");
    let killed = Instant::now();
    let read = client.read(&mut [0; 64]);
    let took = killed.elapsed();
    let child_lives = running(child);
    assert!(matches!(read, Ok(0)), "{read:?}");
    assert!(
        took < Duration::from_millis(CHILD_WAITS_MS / 2),
        "the connection ended {took:?} after its process was killed: held open by the child, which waits {CHILD_WAITS_MS} ms"
    );
    assert!(child_lives, "the child {child} ended before the connection");
    let _ = program.wait();
    let deadline = Instant::now() + Duration::from_secs(60);
    while running(child) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether process `pid` runs (is there and not a zombie: an orphan's
/// end waits for whoever reaps it).
fn running(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z'))
}

#[test]
fn children_that_run_another_program_leave_no_instance_running() {
    let b = built(Toolchain::Clang19);
    let true_path = std::fs::canonicalize("/bin/true").expect("/bin/true");
    let runs = [
        ("exec-true", vec![true_path.clone()], None),
        ("exec-self", vec![b.fork_exec.clone(), "helper".into()], None),
        ("exec-true-after-a-report", vec![true_path.clone()], Some("600")),
    ];
    for (name, args, wait) in runs {
        let dir = scratch(name);
        let cov = dir.join("cov");
        let mut run = command(&b.fork_exec, &dir);
        run.args(&args).env("LLVM_PROFILE_FILE", "/dev/null").env("LD_PRELOAD", &shim().so).env("LIVECOV_DIR", &cov);
        if let Some(wait) = wait {
            run.env("FORK_EXEC_WAIT_MS", wait).env("LIVECOV_FLUSH_SECS", "0.1");
        }
        let out = run.output().expect("run fork_exec");
        assert!(out.status.success(), "{name}: {out:?}");
        let helper = if name == "exec-self" { "helper\n" } else { "" };
        let want: String = (0..3).map(|n| format!("{helper}child {n} exit 0\n")).collect();
        assert_eq!(String::from_utf8_lossy(&out.stdout), want, "{name}");

        let mut replaced = 0;
        let mut instances = 0;
        let mut files = 0;
        let mut mappings = 0;
        for e in std::fs::read_dir(cov.join("reports")).expect("reports").flatten() {
            let path = e.path();
            if path.extension().is_some_and(|x| x == "mapping") {
                mappings += 1;
                continue;
            }
            files += 1;
            if path.extension().is_some_and(|x| x == "json") {
                instances += 1;
                let meta: serde_json::Value = serde_json::from_str(&read(&path)).expect("metadata is JSON");
                assert_eq!(meta["state"], "exited", "{name}: {meta}");
                if let Some(exec) = meta["exec"].as_str() {
                    assert_eq!(Path::new(exec), true_path.as_path(), "{name}: {meta}");
                    replaced += 1;
                }
            }
        }
        // The parent; with the fixture run again, each child's second
        // program; with a report before the exec, each child.
        let want = match name {
            "exec-true" => (1, 0),
            "exec-self" => (4, 0),
            _ => (4, 3),
        };
        assert_eq!((instances, replaced), want, "{name}");
        assert_eq!(files, 3 * instances, "{name}: files of instances that are gone");
        assert_eq!(mappings, 1, "{name}: the build mapping, once");
        let sockets: Vec<_> = std::fs::read_dir(cov.join("sockets")).expect("sockets").flatten().map(|e| e.file_name()).collect();
        assert!(sockets.is_empty(), "{name}: sockets left behind: {sockets:?}");
        let collected = Command::new(livecov_tests::livecov_bin())
            .args(["collect", "--dir"])
            .arg(&cov)
            .arg("-o")
            .arg(dir.join("collected"))
            .output()
            .expect("run livecov collect");
        let said = String::from_utf8_lossy(&collected.stderr);
        assert!(collected.status.success() && !said.contains("lost"), "{name}: {said}");
        let merged = parse_lcov(&read(&dir.join("collected/merged.lcov")));
        let count = |function: &str| merged.values().flat_map(|f| &f.functions).find(|(f, _)| f.ends_with(function)).map(|(_, &n)| n);
        // A child's periodic report counts `child_setup`, which ran between
        // its fork and its exec; without one, that is lost.
        let setups = if wait.is_some() { 3 } else { 0 };
        assert_eq!(count("child_setup"), Some(setups), "{name}");
        if name == "exec-self" {
            assert_eq!(count("helper"), Some(3), "{name}: each child's second program counts");
        }
    }
}

#[test]
fn an_uninstrumented_program_is_left_alone_with_one_line() {
    let b = built(Toolchain::Clang19);
    let dir = scratch("uninstrumented");
    let args = ["fib", "10", ",", "words", "abc"];
    let plain = command(&b.app_uninstrumented, &dir).args(args).output().expect("run");
    let preload = || {
        let mut preloaded = command(&b.app_uninstrumented, &dir);
        preloaded.args(args).env("LD_PRELOAD", &shim().so).env("LIVECOV_DIR", dir.join("cov"));
        preloaded
    };
    let preloaded = preload().output().expect("run under LD_PRELOAD");
    assert_eq!(preloaded.status.code(), plain.status.code());
    assert_eq!(preloaded.stdout, plain.stdout);
    let stderr = String::from_utf8_lossy(&preloaded.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("livecov: not started in ") && stderr.contains("no LLVM-instrumented module"), "{stderr}");
    assert!(!dir.join("cov").exists(), "the agent made its directory anyway");
    // Without LIVECOV_DIR, not a word.
    let quiet = command(&b.app_uninstrumented, &dir).args(args).env("LD_PRELOAD", &shim().so).output().expect("run");
    assert!(quiet.stderr.is_empty() && quiet.stdout == plain.stdout);
    // That line is written on the program's thread, before `main`: a pipe
    // nobody reads raises SIGPIPE there, whose default action ends the
    // program, and a full disk takes nothing. Neither changes the program.
    for (how, stderr) in livecov_tests::output_taking_nothing() {
        let preloaded = preload().stderr(stderr).output().expect("run under LD_PRELOAD");
        assert_eq!(preloaded.status.code(), plain.status.code(), "stderr {how}: {}", preloaded.status);
        assert_eq!(preloaded.stdout, plain.stdout, "stderr {how}");
    }
}

#[test]
fn a_second_copy_of_livecov_does_not_start_a_second_agent() {
    // The API build (liblivecov.a inside) run with liblivecov.so preloaded:
    // the preloaded copy starts first; the program's own start is refused.
    let b = built(Toolchain::Clang19);
    let dir = scratch("two-copies");
    let out = command(&b.app_api, &dir)
        .args(["fib", "3"])
        .env("LD_PRELOAD", &shim().so)
        .env("LIVECOV_DIR", dir.join("cov"))
        .env("LLVM_PROFILE_FILE", dir.join("exit.profraw"))
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("LIVECOV_ALREADY_STARTED") && stderr.contains("another livecov agent"), "{stderr}");
    let reports = std::fs::read_dir(dir.join("cov/reports")).expect("reports/").count();
    assert_eq!(reports, 4, "one instance: its .lcov, .counters and .json, and its build's .mapping");
}

// ---------------------------------------------------------------- the C API from C

#[test]
fn every_api_function_and_its_errors_from_c() {
    for toolchain in [Toolchain::Clang19, Toolchain::Clang14] {
        let b = built(toolchain);
        for program in [&b.api_test, &b.api_test_uninstrumented] {
            let dir = scratch(&format!("api-test-{}", toolchain_name(toolchain)));
            let out = command(program, &dir).arg(&dir).env("LLVM_PROFILE_FILE", dir.join("exit.profraw")).output().expect("run");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && stdout.contains("api_test ok"),
                "{} ({toolchain:?}): {}\n{stdout}",
                program.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            let micros: u64 = stdout.lines().find_map(|l| l.strip_prefix("start_us ")).and_then(|v| v.parse().ok()).expect("start_us");
            eprintln!("{} ({toolchain:?}): livecov_start with socket and TCP took {micros} us", program.display());
        }
    }
}

#[test]
fn the_header_is_plain_c_and_cpp() {
    let dir = scratch("header");
    let probe = dir.join("probe.c");
    std::fs::write(
        &probe,
        "#include \"livecov.h\"\nint main(void) {\n  char *out = 0; size_t len = 0;\n  \
         int s = livecov_dump(0, 0, &out, &len);\n  livecov_free(out);\n  \
         return s == LIVECOV_NOT_STARTED && livecov_start(\"\") == LIVECOV_OK && livecov_stop() == LIVECOV_OK \
         && livecov_reset() == LIVECOV_NOT_STARTED && livecov_write_report(0) == LIVECOV_NOT_STARTED \
         && livecov_last_error()[0] != 0 && livecov_instance() == 0 && livecov_status_name(0)[0] == 'L' \
         && livecov_version()[0] ? 0 : 1;\n}\n",
    )
    .expect("write the probe");
    let include = &shim().include;
    run_checked(
        Command::new(clang(Toolchain::Clang19))
            .args(["-std=c89", "-Wall", "-Wextra", "-pedantic", "-Werror", "-fsyntax-only", "-I"])
            .arg(include)
            .arg(&probe),
        "the header in C89",
    );
    run_checked(
        Command::new(system_tool("clang++-19", "clang-19"))
            .args(["-x", "c++", "-std=c++11", "-Wall", "-Wextra", "-pedantic", "-Werror", "-fsyntax-only", "-I"])
            .arg(include)
            .arg(&probe),
        "the header in C++",
    );
    // Linked dynamically with -llivecov (the .so's constructor does not
    // start anything without LIVECOV_DIR), the probe runs.
    let exe = dir.join("probe");
    let so_dir = shim().so.parent().expect("folder");
    run_checked(
        Command::new(clang(Toolchain::Clang19)).arg("-I").arg(include).arg(&probe).arg("-o").arg(&exe).arg("-L").arg(so_dir).arg("-llivecov"),
        "linking the probe with -llivecov",
    );
    let status = command(&exe, &dir).env("LD_LIBRARY_PATH", so_dir).status().expect("run the probe");
    assert!(status.success(), "the probe's checks failed: {status:?}");
}

#[test]
fn only_the_c_api_and_the_c_library_calls_it_answers_are_exported_and_the_library_is_small() {
    use object::{Object, ObjectSection, ObjectSymbol};
    let so = &shim().so;
    let bytes = std::fs::read(so).expect("read liblivecov.so");
    let file = object::File::parse(&*bytes).expect("an ELF file");
    let mut exported: Vec<String> = file
        .dynamic_symbols()
        .filter(|s| s.is_definition() && s.is_global())
        .map(|s| s.name().expect("a name").to_owned())
        .collect();
    exported.sort();
    let header = read(&shim().include.join("livecov.h"));
    let mut declared: Vec<String> = header
        .match_indices("livecov_")
        .filter_map(|(at, _)| {
            let name: String =
                header[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            header[at + name.len()..].starts_with('(').then_some(name)
        })
        .collect();
    // And the C library's close calls, which it answers so that a program
    // that closes every descriptor leaves the agent's open, and its `_exit`
    // calls, so that a process that ends with them leaves its final report.
    declared.extend(["close", "close_range", "closefrom", "_exit", "_Exit"].map(String::from));
    declared.sort();
    declared.dedup();
    assert_eq!(exported, declared, "liblivecov.so exports exactly the functions of livecov.h, the close calls and _exit");
    let size = bytes.len();
    eprintln!("liblivecov.so: {size} bytes ({:.2} MiB)", size as f64 / (1024.0 * 1024.0));
    assert!(size < 4 << 20, "liblivecov.so grew to {size} bytes");
    assert!(file.section_by_name(".symtab").is_none(), "liblivecov.so is not stripped");
    // The code a warm dump never runs is apart (agent-native/cold-code.ld):
    // a quarter of the code or more, unless its patterns stopped matching;
    // the code warm dumps run is ahead of the rest (warm-code.ld).
    let size_of = |name: &str| file.section_by_name(name).map_or(0, |s| s.size());
    let (warm, text, cold) = (size_of(".text.warm"), size_of(".text"), size_of(".text.cold"));
    eprintln!("liblivecov.so: .text.warm {warm} bytes, .text {text} bytes, .text.cold {cold} bytes");
    assert!(cold * 3 > text, "cold-code.ld set apart {cold} bytes of code, against {text} in .text");
    assert!(warm > text / 2, "warm-code.ld set {warm} bytes of code ahead, against {text} in .text");
}

/// The resident and mapped KiB of the code segments (`r-xp`) of `so` in
/// process `pid`, from its smaps.
fn resident_code(pid: u32, so: &Path) -> (u64, u64) {
    resident_mappings(pid, so, "r-xp")
}

/// The resident and mapped KiB of the mappings of `file` with `perms` in
/// process `pid`, from its smaps.
fn resident_mappings(pid: u32, file: &Path, perms: &str) -> (u64, u64) {
    let smaps = read(Path::new(&format!("/proc/{pid}/smaps")));
    let file = file.canonicalize().expect("the file's path");
    let (mut code, mut rss, mut size) = (false, 0, 0);
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.first().is_some_and(|f| f.contains('-') && !f.ends_with(':')) {
            code = fields.get(1) == Some(&perms) && fields.get(5).map(Path::new) == Some(file.as_path());
        } else if code {
            let kib = || fields.get(1).and_then(|v| v.parse::<u64>().ok()).expect("a size in kB");
            match fields.first() {
                Some(&"Rss:") => rss += kib(),
                Some(&"Size:") => size += kib(),
                _ => {}
            }
        }
    }
    (rss, size)
}

/// The resident KiB of the code segments of `so` in process `pid` once it
/// falls to at most a fifth of `size` KiB within 300 ms (the server gives
/// them back once its connection has ended, after the client read its
/// answer), or as it is then.
fn resident_code_given_back(pid: u32, so: &Path, size: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_millis(300);
    loop {
        let (rss, _) = resident_code(pid, so);
        if rss * 5 <= size || Instant::now() > deadline {
            return rss;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn the_agents_code_is_given_back_after_its_start_and_after_each_dump() {
    let b = built(Toolchain::Clang19);
    let mut s = Served::start("code-pages", &b.app);
    let pid = s.child.id();
    let (_, size) = resident_code(pid, &shim().so);
    assert!(size > 0, "no code segment of {} in the program's smaps", shim().so.display());
    // Starting runs the runtime, the socket, the metadata: more than half
    // of the code stayed resident until the first dump, in a program that
    // may have none.
    std::thread::sleep(REST_AFTER + Duration::from_millis(500));
    let (started, _) = resident_code(pid, &shim().so);
    eprintln!("started, then at rest: {started} KiB of the agent's {size} KiB of code resident");
    assert!(started * 4 < size, "{started} KiB of the agent's {size} KiB of code stayed resident after its start");
    // A first dump runs most of the code, a warm one much of it (what
    // warm dumps run lies together: agent-native/warm-code.ld); once the
    // connection has ended, the server's thread gives it back before it
    // waits for work, and what it runs until then and while it waits lies
    // at the head of that code (64 KiB or more are mapped around a page
    // run). Well before the agent rests.
    s.send("fib 20");
    let first = s.lcov();
    let rss = resident_code_given_back(pid, &shim().so, size);
    eprintln!("after a first dump: {rss} KiB of the agent's {size} KiB of code resident");
    assert!(rss * 5 <= size, "{rss} KiB of the agent's {size} KiB of code stayed resident after a first dump");
    // Dropped pages come back from the file as they run again.
    s.send("primes 50");
    let second = s.lcov();
    let warm = resident_code_given_back(pid, &shim().so, size);
    eprintln!("after a warm dump: {warm} KiB of the agent's {size} KiB of code resident");
    assert!(warm * 5 <= size, "{warm} KiB of the agent's {size} KiB of code stayed resident after a warm dump");
    assert_eq!(function_count(&first, "work.c", "work_fib"), 1);
    assert_eq!(function_count(&second, "work.c", "work_count_primes"), 1);
    std::thread::sleep(REST_AFTER + Duration::from_millis(500));
    let (rested, _) = resident_code(pid, &shim().so);
    eprintln!("{} s later, at rest: {rested} KiB", REST_AFTER.as_secs_f64() + 0.5);
    assert!(rested * 5 <= size, "{rested} KiB of the agent's {size} KiB of code stayed resident at rest");
    s.send("fib 21");
    assert_eq!(function_count(&s.lcov(), "work.c", "work_fib"), 2, "a dump after the rest counts as before");
}

#[test]
fn the_binarys_pages_go_back_once_a_dump_is_sent_its_connection_still_open() {
    let b = built(Toolchain::Clang19);
    let mut s = Served::start("binary-pages", &b.app);
    let pid = s.child.id();
    s.send("fib 20");
    // A client that keeps its connection (a collector's pool): the pages
    // of the binary that a warm dump read (the coverage mapping of the
    // functions that ran for the first time), through the agent's own
    // shared mapping of the file, are let go once its answer is sent, not
    // when the connection ends. A first dump lets them go before its
    // answer.
    let mut kept = livecov_tests::http::connect_unix(&s.socket());
    let first = get_keeping_the_connection(&mut kept, "/coverage").text();
    s.send("primes 50");
    let second = get_keeping_the_connection(&mut kept, "/coverage").text();
    assert_eq!(function_count(&first, "work.c", "work_fib"), 1);
    assert_eq!(function_count(&second, "work.c", "work_count_primes"), 1);
    let (_, size) = resident_mappings(pid, &b.app, "r--s");
    assert!(size > 0, "no shared mapping of {} in the program's smaps", b.app.display());
    let deadline = Instant::now() + Duration::from_millis(300);
    let rss = loop {
        let (rss, _) = resident_mappings(pid, &b.app, "r--s");
        if rss == 0 || Instant::now() > deadline {
            break rss;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(rss, 0, "{rss} KiB of the agent's {size} KiB mapping of the binary stayed resident, its connection open");
    drop(kept);
}

#[test]
fn starting_from_the_constructor_costs_less_than_a_millisecond() {
    let b = built(Toolchain::Clang19);
    let dir = scratch("start-time");
    let mut micros: Vec<u64> = (0..15)
        .map(|_| {
            let out = command(&b.app, &dir)
                .args(["fib", "1"])
                .env("LD_PRELOAD", &shim().so)
                .env("LIVECOV_DIR", dir.join("cov"))
                .env("LIVECOV_VERBOSE", "1")
                .env("LLVM_PROFILE_FILE", dir.join("exit.profraw"))
                .output()
                .expect("run");
            assert!(out.status.success());
            let stderr = String::from_utf8_lossy(&out.stderr);
            stderr
                .lines()
                .find_map(|l| l.strip_prefix("livecov: started ")?.split(" in ").nth(1)?.strip_suffix(" us")?.parse().ok())
                .unwrap_or_else(|| panic!("no `livecov: started ... in N us` line: {stderr}"))
        })
        .collect();
    micros.sort();
    eprintln!("start from the ELF constructor: min {} us, median {} us, max {} us", micros[0], micros[7], micros[14]);
    assert!(micros[0] < 1000, "starting took {micros:?} us");
}

// ---------------------------------------------------------------- installed: pkg-config and CMake

/// The shim installed by agent-native/install.sh into a scratch prefix.
fn installed() -> &'static Path {
    static PREFIX: OnceLock<PathBuf> = OnceLock::new();
    PREFIX.get_or_init(|| {
        let prefix = scratch("install").join("prefix");
        let so_dir = shim().so.parent().expect("folder");
        run_checked(
            Command::new("sh").arg(workspace_root().join("agent-native/install.sh")).arg(&prefix).arg(so_dir),
            "agent-native/install.sh",
        );
        for f in ["lib/liblivecov.so", "lib/liblivecov.a", "include/livecov.h", "lib/pkgconfig/livecov.pc"] {
            assert!(prefix.join(f).is_file(), "{f} is not installed");
        }
        prefix
    })
}

/// `pkg-config ARGS livecov` of the installed .pc file.
fn pkg_config(args: &[&str]) -> String {
    let out = run_checked(
        Command::new(system_tool("pkg-config", "pkg-config"))
            .args(args)
            .arg("livecov")
            .env("PKG_CONFIG_PATH", installed().join("lib/pkgconfig")),
        &format!("pkg-config {args:?} livecov"),
    );
    String::from_utf8(out.stdout).expect("UTF-8").trim().to_owned()
}

#[test]
fn installs_with_a_pkg_config_file() {
    let prefix = installed();
    assert_eq!(pkg_config(&["--modversion"]), env!("CARGO_PKG_VERSION"));
    assert_eq!(pkg_config(&["--variable=libdir"]), prefix.join("lib").display().to_string());
    // Libs.private is what liblivecov.a needs: the flags the tests link it with.
    let static_libs = pkg_config(&["--static", "--libs"]);
    assert!(static_libs.ends_with(&NATIVE_STATIC_LIBS.join(" ")), "pkg-config --static --libs: {static_libs}");

    // The API fixture built with `$(pkg-config --cflags --libs livecov)`
    // against the shared library: the library's constructor starts the
    // agent from LIVECOV_DIR, and the program's livecov_start(NULL) finds
    // it running.
    let dir = scratch("pkg-config");
    let exe = dir.join("app");
    let src = workspace_root().join("fixtures/native");
    run_checked(
        Command::new(clang(Toolchain::Clang19))
            .args(["-O0", "-fprofile-instr-generate", "-fcoverage-mapping", "-DLIVECOV_API"])
            .arg(src.join("app.c"))
            .arg(src.join("work.c"))
            .arg("-o")
            .arg(&exe)
            .args(pkg_config(&["--cflags", "--libs"]).split_whitespace())
            .arg("-ldl"),
        "building app with the flags of livecov.pc",
    );
    let checkpoint = dir.join("c").display().to_string();
    let out = command(&exe, &dir)
        .args(["fib", "9", ",", "checkpoint", &checkpoint])
        .env("LD_LIBRARY_PATH", prefix.join("lib"))
        .env("LIVECOV_DIR", dir.join("cov"))
        .env("LLVM_PROFILE_FILE", dir.join("exit.profraw"))
        .output()
        .expect("run app");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let expected = llvm_cov(Toolchain::Clang19, &exe, &[], &[dir.join("c.profraw")], &dir);
    assert_same_lcov(&read(&dir.join("c.lcov")), &expected, "app linked with -llivecov");
    let reports = std::fs::read_dir(dir.join("cov/reports")).expect("reports").count();
    assert_eq!(reports, 4, "one instance: its .lcov, .counters and .json, and its build's .mapping");
}

/// A file of the docs' example (fixtures/native/example), checked to be
/// quoted as it is in docs/native.md.
fn example_quoted_in_docs(name: &str) -> PathBuf {
    let path = workspace_root().join("fixtures/native/example").join(name);
    let docs = read(&workspace_root().join("docs/native.md"));
    assert!(docs.contains(&read(&path)), "docs/native.md does not quote fixtures/native/example/{name} as it is");
    path
}

/// Runs an example build of hello.c with LIVECOV_DIR: it prints the sum
/// and the LCOV of that moment, and leaves a final report at exit.
fn check_hello(exe: &Path, dir: &Path, shared: bool) {
    let cov = dir.join(format!("cov-{}", exe.file_name().expect("name").to_string_lossy()));
    let out = command(exe, dir)
        .args(["1", "2", "3"])
        .env("LIVECOV_DIR", &cov)
        .env("LD_LIBRARY_PATH", installed().join("lib"))
        .env("LLVM_PROFILE_FILE", dir.join("exit.profraw"))
        .output()
        .expect("run hello");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && out.stderr.is_empty(), "{}: {}", exe.display(), String::from_utf8_lossy(&out.stderr));
    let (sum, lcov) = stdout.split_once('\n').expect("the sum, then LCOV");
    assert_eq!(sum, "14");
    assert!(lcov.starts_with("TN:hello\nSF:") && lcov.contains("hello.c\n"), "{}: {lcov}", exe.display());
    assert_eq!(count_of(lcov, "hello.c", &["square"]), 3, "{lcov}");
    let report = std::fs::read_dir(cov.join("reports"))
        .expect("reports/")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "lcov"))
        .expect("a final report");
    assert_eq!(count_of(&read(&report), "hello.c", &["main"]), 1);
    let needed = run_checked(Command::new(llvm_tool("llvm-readobj")).arg("--needed-libs").arg(exe), "llvm-readobj").stdout;
    assert_eq!(String::from_utf8_lossy(&needed).contains("liblivecov.so"), shared, "{}", exe.display());
    assert_eq!(stack_flags(exe) & object::elf::PF_X, 0, "{}: an executable stack", exe.display());
}

#[test]
fn the_pkg_config_example_of_the_docs_builds_and_runs() {
    let script = example_quoted_in_docs("build.sh");
    let dir = scratch("example-pkg-config");
    std::fs::copy(workspace_root().join("fixtures/native/example/hello.c"), dir.join("hello.c")).expect("copy hello.c");
    run_checked(
        Command::new("sh")
            .arg(&script)
            .current_dir(&dir)
            .env("CC", clang(Toolchain::Clang19))
            .env("PKG_CONFIG_PATH", installed().join("lib/pkgconfig")),
        "fixtures/native/example/build.sh",
    );
    check_hello(&dir.join("hello"), &dir, true);
    check_hello(&dir.join("hello-static"), &dir, false);
}

#[test]
fn the_cmake_example_of_the_docs_builds_and_runs() {
    let lists = example_quoted_in_docs("CMakeLists.txt");
    let source = lists.parent().expect("folder");
    let cmake = system_tool("cmake", "cmake");
    let dir = scratch("example-cmake");
    let prefix = installed().display().to_string();
    for (build, options) in [("shared", vec![]), ("static", vec![format!("-DLIVECOV_PREFIX={prefix}")])] {
        let build_dir = dir.join(build);
        run_checked(
            Command::new(&cmake)
                .arg("-S")
                .arg(source)
                .arg("-B")
                .arg(&build_dir)
                .arg("-DCOVERAGE=ON")
                .args(&options)
                .env("CC", clang(Toolchain::Clang19))
                .env("PKG_CONFIG_PATH", installed().join("lib/pkgconfig")),
            &format!("cmake configure ({build})"),
        );
        run_checked(Command::new(&cmake).arg("--build").arg(&build_dir), &format!("cmake --build ({build})"));
        check_hello(&build_dir.join("hello"), &build_dir, build == "shared");
    }
}

// ---------------------------------------------------------------- C++

/// The C++ fixture (fixtures/native/cpp) built with clang++-19.
struct BuiltCpp {
    /// app.cpp, instrumented, with -DLIVECOV_API, linked with liblivecov.a.
    app_api: PathBuf,
    /// app.cpp, instrumented, no livecov in it (for LD_PRELOAD).
    app: PathBuf,
}

fn built_cpp() -> &'static BuiltCpp {
    static BUILT: OnceLock<BuiltCpp> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out = out_root().join("clang19-cpp");
        let _lock = lock_dir(&out);
        let compiler = Compiler {
            cc: system_tool("clang++-19", "clang-19 (and libclang-rt-19-dev)"),
            src: workspace_root().join("fixtures/native/cpp"),
            out,
        };
        let strict: &[&str] = &["-std=c++17", "-Wall", "-Wextra", "-pedantic", "-Werror"];
        let flags = [COVERAGE, strict].concat();
        BuiltCpp {
            app_api: compiler.compile(
                "app_api",
                &[&flags[..], &["-DLIVECOV_API"]].concat(),
                &["app.cpp"],
                &[&shim().a],
                NATIVE_STATIC_LIBS,
            ),
            app: compiler.compile("app", &flags, &["app.cpp"], &[], &[]),
        }
    })
}

/// llvm-cov's LCOV with the names of FN and FNDA records demangled as
/// the agent demangles them by default (llvm-cov export does not).
fn demangled(lcov: &str) -> String {
    let mut out = String::new();
    for line in lcov.lines() {
        let renamed = ["FN:", "FNDA:"].iter().find_map(|tag| {
            let (number, name) = line.strip_prefix(tag)?.split_once(',')?;
            Some(format!("{tag}{number},{}", livecov::lcov::display_name(name, false)))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// The summed count of the functions of the file ending with `suffix`
/// whose name contains every one of `parts`.
fn count_of(lcov: &str, suffix: &str, parts: &[&str]) -> u64 {
    let files = parse_lcov(lcov);
    let file = file_ending(&files, suffix);
    let matching: Vec<u64> =
        file.functions.iter().filter(|(name, _)| parts.iter().all(|p| name.contains(p))).map(|(_, c)| *c).collect();
    assert!(!matching.is_empty(), "no function with {parts:?} in {suffix}: {:?}", file.functions.keys().collect::<Vec<_>>());
    matching.iter().sum()
}

/// The flags of the program header PT_GNU_STACK of an ELF executable.
fn stack_flags(program: &Path) -> u32 {
    use object::read::elf::{ElfFile64, ProgramHeader};
    let bytes = std::fs::read(program).expect("read the program");
    let elf = ElfFile64::<object::Endianness>::parse(&*bytes).expect("an ELF file");
    let endian = elf.endian();
    elf.elf_program_headers()
        .iter()
        .find(|ph| ph.p_type(endian) == object::elf::PT_GNU_STACK)
        .map(|ph| ph.p_flags(endian))
        .expect("a PT_GNU_STACK header")
}

#[test]
fn cpp_linked_with_the_static_library() {
    let b = built_cpp();
    assert_eq!(stack_flags(&b.app_api) & object::elf::PF_X, 0, "liblivecov.a made the program's stack executable");

    // Live dumps and raw profiles of the same moments, then exit.
    let dir = scratch("cpp-api");
    let c = |n: &str| dir.join(n).display().to_string();
    let (c1, c2) = (c("c1"), c("c2"));
    let args = [
        "shape", "circle", "2", ",", "sort", "3", "-1", "2", ",", "checkpoint", &c1, ",", "shape", "rect", "2", "3", ",",
        "shape", "tri", "1", ",", "stack", "1", "2", "3", "4", ",", "checkpoint", &c2, ",", "sort", "5", "-9", "x",
    ];
    let out = command(&b.app_api, &dir)
        .args(args)
        .env("LIVECOV_DIR", dir.join("cov"))
        .env("LLVM_PROFILE_FILE", dir.join("exit.profraw"))
        .output()
        .expect("run app");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "`sort 5 -9 x` fails: {stdout}\n{stderr}");
    assert!(stderr.contains("unknown shape: tri") && stderr.contains("not a number: x"), "{stderr}");
    let instance = stdout.lines().find_map(|l| l.strip_prefix("instance ")).expect("app prints its instance");
    assert!(instance.starts_with("native-"), "{instance}");
    for name in ["c1", "c2"] {
        let live = read(&dir.join(format!("{name}.lcov")));
        let expected = llvm_cov(Toolchain::Clang19, &b.app_api, &[], &[dir.join(format!("{name}.profraw"))], &dir);
        assert_same_lcov(&live, &demangled(&expected), &format!("C++ checkpoint {name}"));
    }
    let (c1, c2) = (read(&dir.join("c1.lcov")), read(&dir.join("c2.lcov")));
    // Demangled: class templates, virtual functions. The lambda has
    // internal linkage: its name is `app.cpp:` and its symbol, demangled.
    let push = ["shapes::Stack<int, (unsigned long)3>::push(int const&)"];
    assert_eq!((count_of(&c1, "shapes.hpp", &push), count_of(&c2, "shapes.hpp", &push)), (0, 4));
    assert_eq!(count_of(&c2, "shapes.hpp", &["shapes::Rect::area() const"]), 1);
    let lambda = ["app.cpp:cli::sort(", "$_0::operator()(long, long) const"];
    assert!(count_of(&c1, "app.cpp", &lambda) > 0);
    assert_eq!(count_of(&c1, "app.cpp", &lambda), count_of(&c2, "app.cpp", &lambda), "no sort between c1 and c2");
    let report = read(&dir.join("cov/reports").join(format!("{instance}.lcov")));
    let expected = llvm_cov(Toolchain::Clang19, &b.app_api, &[], &[dir.join("exit.profraw")], &dir);
    assert_same_lcov(&report, &demangled(&expected), "C++ final report at exit");
    let meta = read(&dir.join("cov/reports").join(format!("{instance}.json")));
    assert!(meta.contains("\"runtime\":\"native\"") && meta.contains("\"state\":\"exited\""), "{meta}");

    cpp_serving("cpp-api-serve", &b.app_api, false);
}

/// One inline function in the program and in its shared library (built
/// with -fvisibility-inlines-hidden, so that each runs its own copy): two
/// records of one function, which llvm-profdata adds up. A dump after only
/// one of them ran still adds the other's counts.
#[test]
fn a_function_in_two_modules_is_merged_whole_when_one_of_them_ran() {
    let out = out_root().join("clang19-shared-inline");
    let compiler = Compiler {
        cc: system_tool("clang++-19", "clang-19 (and libclang-rt-19-dev)"),
        src: workspace_root().join("fixtures/native/shared-inline"),
        out,
    };
    let flags = [COVERAGE, &["-std=c++17", "-Wall", "-Werror"]].concat();
    let (program, lib) = {
        let _lock = lock_dir(&compiler.out);
        let lib = compiler.compile(
            "libtwice.so",
            &[&flags[..], &["-shared", "-fPIC", "-fvisibility-inlines-hidden"]].concat(),
            &["lib.cpp"],
            &[],
            &[],
        );
        let program = compiler.compile("shared-inline", &flags, &["main.cpp"], &[&lib], &["-Wl,-rpath,$ORIGIN"]);
        (program, lib)
    };
    let mut s = Served::start("shared-inline", &program);
    assert_eq!(s.send("lib 5"), "11\n");
    assert_eq!(s.send("main 3"), "6\n");
    s.lcov();
    // Only the program's copy runs before the next dump.
    assert_eq!(s.send("main -4"), "4\n");
    let live = s.lcov();
    let profraw = s.profraw("moment.profraw");
    let expected = llvm_cov(Toolchain::Clang19, &program, &[&lib], &[profraw], &s.dir);
    assert_same_lcov(&live, &demangled(&expected), "a function in two modules");
    assert_eq!(function_count(&live, "twice.hpp", "twice(int)"), 3, "both copies' calls add up");
}

#[test]
fn cpp_preloaded_into_an_unmodified_program() {
    let b = built_cpp();
    cpp_serving("cpp-preload", &b.app, true);

    // Run to exit(3), names as the compiler wrote them: the final report
    // is llvm-cov's over the exit profile, byte for byte.
    let dir = scratch("cpp-preload-exit");
    let out = command(&b.app, &dir)
        .args(["shape", "rect", "1", "5", ",", "stack", "1", ",", "sort", ",", "exit", "3"])
        .env("LD_PRELOAD", &shim().so)
        .env("LIVECOV_DIR", dir.join("cov"))
        .env("LIVECOV_DEMANGLE", "0")
        .env("LLVM_PROFILE_FILE", dir.join("exit.profraw"))
        .output()
        .expect("run app");
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "rect area 5\npopped 1\nsorted (nothing to compare)\n");
    let reports: Vec<PathBuf> = std::fs::read_dir(dir.join("cov/reports"))
        .expect("reports/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "lcov"))
        .collect();
    assert_eq!(reports.len(), 1, "{reports:?}");
    let report = read(&reports[0]);
    let expected = llvm_cov(Toolchain::Clang19, &b.app, &[], &[dir.join("exit.profraw")], &dir);
    assert_same_lcov(&report, &expected, "C++ final report at exit, not demangled");
    assert_eq!(count_of(&report, "shapes.hpp", &["_ZN6shapes5StackIiLm3EE4pushERKi"]), 1);
}

/// The C++ fixture serving (preloaded, or starting its agent itself): a
/// dump over the socket equals llvm-cov over `?format=profraw` of the
/// same moment; SIGTERM leaves the last dump as the final report and the
/// signal as exit status.
fn cpp_serving(name: &str, program: &Path, preload: bool) {
    let mut s = Served::spawn(name, program, preload);
    assert_eq!(s.send("shape square 3"), "square area 9\n");
    assert_eq!(s.send("sort 4 -2 1"), "sorted 1 -2 4\n");
    assert_eq!(s.send("stack 7 8 9 10"), "stack full at 10\npopped 9 8 7\n");
    assert_eq!(s.send("shape hexagon 1"), "");
    let live = s.lcov();
    let profraw = s.profraw("moment.profraw");
    let expected = llvm_cov(Toolchain::Clang19, program, &[], &[profraw], &s.dir);
    assert_same_lcov(&live, &demangled(&expected), &format!("{name}: C++ dump"));
    // Three pops, and the fourth that throws.
    assert_eq!(count_of(&live, "shapes.hpp", &["shapes::Stack<int, (unsigned long)3>::pop()"]), 4);
    let health = String::from_utf8(s.get("/health")).expect("UTF-8");
    assert!(health.contains("\"runtime\":\"native\"") && health.contains("\"state\":\"running\""), "{health}");

    s.send("shape circle 1");
    let last = s.lcov();
    assert_eq!(count_of(&last, "shapes.hpp", &["shapes::Circle::area() const"]), 1);
    // Safety: signalling our own child.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    let status = s.child.wait().expect("wait");
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    assert_eq!(read(&s.report()), last, "{name}: the final report is the state at the signal");
    let meta = read(&s.cov().join("reports").join(format!("{}.json", s.instance)));
    assert!(meta.contains("\"state\":\"exited\""), "{meta}");
    assert!(!s.socket().exists(), "socket left behind");
}

// ---------------------------------------------------------------- a Rust program without the agent crate

/// fixtures/service built with `-C instrument-coverage` but without its
/// `livecov` feature (no agent inside), in `target/fixtures/service-noagent`.
fn service_without_agent() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out = workspace_root().join("target/fixtures/service-noagent");
        let _lock = lock_dir(&out);
        let version = run_checked(Command::new("rustc").arg("-vV"), "rustc -vV").stdout;
        let host = String::from_utf8_lossy(&version)
            .lines()
            .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
            .expect("rustc -vV prints the host triple");
        // With --target, the flags reach the program and its libraries but
        // not build scripts (which would leave .profraw files behind).
        run_checked(
            cargo()
                .args(["build", "--quiet", "--no-default-features", "--target", &host])
                .env("RUSTFLAGS", "-C instrument-coverage")
                .env("CARGO_TARGET_DIR", &out)
                .current_dir(workspace_root().join("fixtures/service")),
            "cargo build --no-default-features of fixtures/service",
        );
        out.join(host).join("debug/service")
    })
}

/// The service, a Rust program with its own standard library and profile
/// runtime, and liblivecov.so, with another standard library inside that
/// exports nothing: dumps equal llvm-cov over `?format=profraw` of the same
/// moment, the instance is `native`, SIGTERM and exit leave final reports.
#[test]
fn a_rust_program_without_the_agent_crate_under_ld_preload() {
    let bin = service_without_agent();
    let defined = run_checked(Command::new(llvm_tool("llvm-nm")).arg("--defined-only").arg(bin), "llvm-nm").stdout;
    assert!(
        !String::from_utf8_lossy(&defined).contains("livecov"),
        "the service was built with the agent crate inside"
    );
    let start = |name: &str| {
        let dir = scratch(name);
        let cov = dir.join("cov");
        let mut cmd = command(bin, &dir);
        cmd.env("LD_PRELOAD", &shim().so)
            .env("LIVECOV_DIR", &cov)
            .env("LIVECOV_DEMANGLE", "0")
            .env("LLVM_PROFILE_FILE", dir.join("exit.profraw"));
        let service = Service::spawn(cmd, cov);
        let instance = instance_of(&service.cov, service.child.id());
        (service, instance)
    };

    let (mut s, instance) = start("service-preload");
    let socket = s.cov.join("sockets").join(format!("{instance}.sock"));
    let get = |path: &str| {
        let r = unix_request(&socket, "GET", path, &[]);
        assert_eq!(r.status, 200, "GET {path}: {}", r.text());
        assert_eq!(r.header("livecov-instance"), Some(instance.as_str()));
        r
    };
    let health = get("/health").json();
    assert_eq!(health["runtime"], "native", "{health}");
    assert_eq!(health["pid"], s.child.id(), "{health}");
    assert_eq!(health["state"], "running", "{health}");
    assert!(health["program"].as_str().is_some_and(|p| p.ends_with("/service")), "{health}");

    assert_eq!(function_count_like(&get("/coverage").text(), "handlers.rs", "handlers3fib"), 0);
    assert!(s.get("/fib?n=20").ends_with("6765"));
    assert!(s.get("/hello?name=x").ends_with("hello, x"));
    s.get("/primes?limit=30");
    // The service's thread may still be finishing the last request after
    // the client has its answer: take the moment once two dumps agree.
    let (live, profraw) = wait_for("two equal dumps around a snapshot", || {
        let before = get("/coverage").text();
        let profraw = get("/coverage?format=profraw").body;
        (get("/coverage").text() == before).then_some((before, profraw))
    });
    let path = s.dir.join("moment.profraw");
    std::fs::write(&path, profraw).expect("write the snapshot");
    let expected = llvm_cov(Toolchain::Rustc, bin, &[], &[path], &s.dir);
    assert_same_lcov(&live, &expected, "the preloaded Rust service");
    assert_eq!(function_count_like(&live, "handlers.rs", "handlers3fib"), 1);
    assert_eq!(function_count_like(&live, "handlers.rs", "handlers4echo"), 0);

    // SIGTERM: the last dump is the final report, the signal the status.
    s.get("/hello");
    // The serve loop counts its own lines after the handler's thread ends:
    // the moment is taken once two dumps agree, as above.
    let last = wait_for("the last request counted", || {
        let dump = get("/coverage").text();
        (function_count_like(&dump, "handlers.rs", "handlers5hello") == 2 && get("/coverage").text() == dump)
            .then_some(dump)
    });
    // Safety: signalling our own child.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    let status = s.child.wait().expect("wait");
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    let reports = s.cov.join("reports");
    assert_eq!(read(&reports.join(format!("{instance}.lcov"))), last);
    let meta = read(&reports.join(format!("{instance}.json")));
    assert!(meta.contains("\"state\":\"exited\"") && meta.contains("\"runtime\":\"native\""), "{meta}");
    assert!(!socket.exists(), "socket left behind");

    // Exit (GET /quit returns from main): the final report is the exit profile's.
    let (mut s, instance) = start("service-preload-exit");
    s.get("/fib?n=7");
    s.get("/quit");
    let status = s.child.wait().expect("wait");
    assert!(status.success(), "{status:?}");
    let report = read(&s.cov.join("reports").join(format!("{instance}.lcov")));
    let expected = llvm_cov(Toolchain::Rustc, bin, &[], &[s.dir.join("exit.profraw")], &s.dir);
    assert_same_lcov(&report, &expected, "the preloaded Rust service's final report at exit");
    assert_eq!(function_count_like(&report, "main.rs", "7service6handle"), 2);
}

/// The count of the one function of the file ending with `suffix` whose
/// (mangled) name ends with `end` (Rust's v0 names end with the path).
fn function_count_like(lcov: &str, suffix: &str, end: &str) -> u64 {
    let files = parse_lcov(lcov);
    let matching: Vec<(&String, &u64)> =
        file_ending(&files, suffix).functions.iter().filter(|(name, _)| name.ends_with(end)).collect();
    assert_eq!(matching.len(), 1, "functions ending with {end} in {suffix}: {matching:?}");
    *matching[0].1
}
