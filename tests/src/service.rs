//! The fixture service (fixtures/service) built with `-C instrument-coverage`
//! and the livecov agent, its C plugin, and a handle on a running service.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::builder::lock;
use crate::http::unix_request;
use crate::tools::workspace_root;
use crate::wait::wait_for;

/// `target/fixtures/service`, where the service and the plugin are built.
fn out_dir() -> PathBuf {
    workspace_root().join("target/fixtures/service")
}

/// The service with coverage and the agent, built once per test process
/// (`cargo build --target <host>` in `target/fixtures/service`).
pub fn service_bin() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let root = workspace_root();
        let out = out_dir();
        let _lock = lock(&out);
        let host = String::from_utf8(Command::new("rustc").arg("-vV").output().expect("rustc -vV").stdout)
            .expect("utf-8")
            .lines()
            .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
            .expect("host triple");
        let mut cargo = Command::new("cargo");
        for (name, _) in std::env::vars() {
            if (name.starts_with("CARGO") && name != "CARGO_HOME") || name.starts_with("RUSTC") || name == "RUSTFLAGS" {
                cargo.env_remove(name);
            }
        }
        // With --target, the flags reach the program and its libraries but
        // not build scripts (which would leave .profraw files behind).
        let status = cargo
            .args(["build", "--quiet", "--target", &host])
            .env("RUSTFLAGS", "-C instrument-coverage")
            .env("CARGO_TARGET_DIR", &out)
            .current_dir(root.join("fixtures/service"))
            .status()
            .expect("run cargo build for fixtures/service");
        assert!(status.success(), "building fixtures/service failed");
        out.join(host).join("debug/service")
    })
}

/// The C plugin the service can load (`--plugin`), built with clang-19 and
/// coverage into `target/fixtures/service/libplugin.so`.
pub fn plugin() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        service_bin();
        let out = out_dir();
        let _lock = lock(&out);
        let plugin = out.join("libplugin.so");
        let status = Command::new("clang-19")
            .args(["-shared", "-fPIC", "-O0", "-fprofile-instr-generate", "-fcoverage-mapping", "-o"])
            .arg(&plugin)
            .arg(workspace_root().join("fixtures/service/plugin/plugin.c"))
            .status()
            .expect("run clang-19 (install it with tests/scripts/install-deps.sh)");
        assert!(status.success(), "building the plugin failed");
        plugin
    })
}

/// A fresh folder `target/tmp/<group>/<name>-<pid>` for one test.
pub fn scratch(group: &str, name: &str) -> PathBuf {
    let dir = workspace_root().join("target/tmp").join(group).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch folder");
    dir
}

/// The instance named by a socket `<cov>/sockets/<runtime>-<pid>-*.sock`, if there is one yet.
pub fn find_instance(cov: &Path, runtime: &str, pid: u32) -> Option<String> {
    std::fs::read_dir(cov.join("sockets")).ok()?.flatten().find_map(|e| {
        let name = e.file_name().into_string().ok()?;
        let instance = name.strip_suffix(".sock")?;
        instance.starts_with(&format!("{runtime}-{pid}-")).then(|| instance.to_owned())
    })
}

/// A running service, killed when dropped.
pub struct Service {
    pub child: Child,
    /// Its folder: exit profiles and, as `cov`'s parent, coverage.
    pub dir: PathBuf,
    /// `LIVECOV_DIR`.
    pub cov: PathBuf,
    /// The port of the service's own API, from its `listening on ADDR` line.
    pub port: u16,
    /// The rest of its standard output.
    pub stdout: BufReader<ChildStdout>,
}

impl Service {
    /// Starts the service with `args` and `env` in a scratch folder
    /// `target/tmp/<group>/<name>-<pid>`: `LIVECOV_DIR` is its `cov`, exit
    /// profiles `exit-%p.profraw` in it, names not demangled.
    pub fn start(group: &str, name: &str, args: &[&str], env: &[(&str, &str)]) -> Service {
        let dir = scratch(group, name);
        let cov = dir.join("cov");
        let mut cmd = Command::new(service_bin());
        cmd.args(args)
            .env("LIVECOV_DIR", &cov)
            .env("LIVECOV_DEMANGLE", "0")
            .env("LLVM_PROFILE_FILE", dir.join("exit-%p.profraw"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        Service::spawn(cmd, cov)
    }

    /// Spawns `cmd` (the service, its arguments and environment; `cov` its
    /// `LIVECOV_DIR`) and reads its `listening on ADDR` line.
    pub fn spawn(mut cmd: Command, cov: PathBuf) -> Service {
        let mut child = cmd.stdout(Stdio::piped()).spawn().expect("start the service");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read the service's first line");
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("service said {line:?}, not `listening on ADDR`"));
        let dir = cov.parent().expect("LIVECOV_DIR in a folder").to_owned();
        Service { child, dir, cov, port, stdout }
    }

    pub fn cov_dir(&self) -> PathBuf {
        self.cov.clone()
    }

    /// The instance of process `pid` (the service or a worker), once its socket exists.
    pub fn instance_of(&self, pid: u32) -> String {
        wait_for("the agent's socket", Duration::from_millis(20), || find_instance(&self.cov, "rust", pid))
    }

    pub fn instance(&self) -> String {
        self.instance_of(self.child.id())
    }

    pub fn socket(&self) -> PathBuf {
        self.cov.join("sockets").join(format!("{}.sock", self.instance()))
    }

    /// A request to the service's own API.
    pub fn get(&self, path: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to the service");
        write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").expect("send");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        out
    }

    /// `GET /coverage<query>` straight from the agent's socket; must be a 200.
    pub fn coverage(&self, query: &str) -> String {
        let r = unix_request(&self.socket(), "GET", &format!("/coverage{query}"), &[]);
        assert_eq!(r.status, 200, "GET /coverage{query}: {}", String::from_utf8_lossy(&r.body));
        String::from_utf8(r.body).expect("LCOV is UTF-8")
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill();
    }
}
