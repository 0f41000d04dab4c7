//! What tests/tests/sidecar.rs and tests/tests/collect.rs share: the
//! `livecov` binary, the fixture service with the agent as replicas on
//! loopback addresses (127.0.0.2, 127.0.0.3, ...) sharing one port, a real
//! DNS server (dnsmasq on a loopback port) standing in for cluster DNS, the
//! sidecar as a process, small fake targets that misbehave, and llvm-cov 22
//! as the oracle of an exact merge.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use livecov_tests::http::Response;
use livecov_tests::dns::free_dns_port;
use livecov_tests::http::exchange;
pub use livecov_tests::livecov_bin;
use livecov_tests::service::{find_instance, service_bin, Service};
pub use livecov_tests::service::scratch;

/// The name the DNS server answers for the replicas.
pub const NAME: &str = "replicas.livecov.test";
/// Its SRV record.
pub const SRV: &str = "_coverage._tcp.replicas.livecov.test";

// ---------------------------------------------------------------- binaries

/// `livecov ARGS`, without tokens from the environment.
pub fn livecov(args: &[&str]) -> Output {
    Command::new(livecov_bin())
        .args(args)
        .env_remove("LIVECOV_TOKEN")
        .env_remove("LIVECOV_TOKEN_FILE")
        .env_remove("LIVECOV_SIDECAR_TOKEN")
        .env_remove("LIVECOV_SIDECAR_TOKEN_FILE")
        .stdin(Stdio::null())
        .output()
        .expect("run livecov")
}

pub fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    livecov_tests::wait_for(what, Duration::from_millis(50), f)
}

/// A TCP port free on 127.0.0.1 now (and, in practice, on 127.0.0.N).
pub use livecov_tests::free_port;

// ---------------------------------------------------------------- HTTP

pub fn tcp_request(addr: SocketAddr, method: &str, path: &str, token: Option<&str>) -> Response {
    let s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    match token {
        Some(t) => exchange(s, method, path, &["content-length: 0", &format!("authorization: Bearer {t}")]),
        None => exchange(s, method, path, &["content-length: 0"]),
    }
}

pub fn unix_request(socket: &Path, method: &str, path: &str) -> Response {
    let s = livecov_tests::http::connect_unix(socket);
    s.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    exchange(s, method, path, &["content-length: 0"])
}

// ---------------------------------------------------------------- replicas

/// The fixture service with the agent: its own API on `--addr`, the
/// agent's on `LIVECOV_LISTEN` (TCP, with a token) and on its socket.
pub struct Replica {
    /// The process; its `cov` is `LIVECOV_DIR`, its `port` the service's own (traffic).
    pub service: Service,
    pub ip: String,
}

impl Replica {
    /// A replica on `ip`: the agent on `ip:agent_port` (when given) with
    /// `token`, the service on `ip:0`, coverage in `cov`.
    pub fn start(ip: &str, agent_port: Option<u16>, token: Option<&str>, cov: &Path, env: &[(&str, &str)]) -> Replica {
        let mut cmd = Command::new(service_bin());
        cmd.args(["--addr", &format!("{ip}:0")])
            .env("LIVECOV_DIR", cov)
            .env("LIVECOV_DEMANGLE", "0")
            .env_remove("LIVECOV_TOKEN")
            .env_remove("LIVECOV_LISTEN")
            .env("LLVM_PROFILE_FILE", cov.with_file_name(format!("exit-{ip}-%p.profraw")));
        if let Some(port) = agent_port {
            cmd.env("LIVECOV_LISTEN", format!("{ip}:{port}"));
        }
        if let Some(t) = token {
            cmd.env("LIVECOV_TOKEN", t);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        Replica { service: Service::spawn(cmd, cov.to_owned()), ip: ip.to_owned() }
    }

    pub fn pid(&self) -> u32 {
        self.service.child.id()
    }

    pub fn instance(&self) -> String {
        let pid = self.pid();
        wait_for("the agent's socket", || find_instance(&self.service.cov, "rust", pid))
    }

    pub fn socket(&self) -> PathBuf {
        self.service.cov.join("sockets").join(format!("{}.sock", self.instance()))
    }

    /// A request to the service itself (traffic).
    pub fn get(&self, path: &str) -> String {
        let addr: SocketAddr = format!("{}:{}", self.ip, self.service.port).parse().expect("address");
        let r = tcp_request(addr, "GET", path, None);
        assert_eq!(r.status, 200, "GET {path} on the service: {}", String::from_utf8_lossy(&r.body));
        r.text()
    }

    /// The replica's own dump (GET /coverage on its socket).
    pub fn own_dump(&self) -> String {
        let r = unix_request(&self.socket(), "GET", "/coverage");
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        r.text()
    }

    pub fn report(&self, instance: &str) -> PathBuf {
        self.service.cov.join("reports").join(format!("{instance}.lcov"))
    }

    pub fn kill(&mut self) {
        self.service.kill();
    }

    /// `GET /quit`: the service exits 0 and its agent writes the final report.
    pub fn quit(&mut self) {
        let _ = self.get("/quit");
        let status = self.service.child.wait().expect("wait for the service");
        assert!(status.success(), "the service exited with {status}");
    }
}

// ---------------------------------------------------------------- DNS

/// dnsmasq on a loopback port: `NAME` has one A record per replica, and
/// `SRV` points at `NAME` on the replicas' port (or the records given to
/// [`Dns::with_records`]).
pub struct Dns {
    child: Child,
    pub addr: SocketAddr,
    dir: PathBuf,
    hosts: PathBuf,
}

impl Dns {
    pub fn start(dir: &Path, ips: &[&str], srv_port: u16) -> Dns {
        Dns::start_with(dir, ips, srv_port, &[])
    }

    /// As [`Dns::start`], with more dnsmasq options: `--local=/livecov.test/`
    /// makes the names of that domain it does not know NXDOMAIN (not REFUSED).
    pub fn start_with(dir: &Path, ips: &[&str], srv_port: u16, options: &[String]) -> Dns {
        let hosts = dir.join("dns-hosts");
        write_hosts(&hosts, ips);
        let mut records = vec![format!("--addn-hosts={}", hosts.display()), format!("--srv-host={SRV},{NAME},{srv_port}")];
        records.extend_from_slice(options);
        let mut dns = Dns::with_records(dir, &records, NAME, ips);
        dns.hosts = hosts;
        dns
    }

    /// dnsmasq answering with `records` (dnsmasq options such as
    /// `--host-record=...`), once it answers `ips` for `name`.
    pub fn with_records(dir: &Path, records: &[String], name: &str, ips: &[&str]) -> Dns {
        let port = free_dns_port();
        let mut cmd = Command::new("dnsmasq");
        cmd.args([
            "--no-daemon",
            &format!("--port={port}"),
            "--listen-address=127.0.0.1",
            "--bind-interfaces",
            "--no-resolv",
            "--no-hosts",
            "--conf-file=/dev/null",
            "--log-facility=-",
            &format!("--pid-file={}", dir.join("dnsmasq.pid").display()),
        ]);
        cmd.args(records);
        // As root dnsmasq would switch to an unprivileged user that may not
        // read the hosts file in the scratch folder.
        if unsafe { libc::geteuid() } == 0 {
            cmd.arg("--user=root");
        }
        let log = std::fs::File::create(dir.join("dnsmasq.log")).expect("dnsmasq log");
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("run dnsmasq (install it: tests/scripts/install-deps.sh)");
        let dns = Dns { child, addr: SocketAddr::from(([127, 0, 0, 1], port)), dir: dir.to_owned(), hosts: PathBuf::new() };
        dns.wait_for_answer(name, ips);
        dns
    }

    pub fn arg(&self) -> String {
        self.addr.to_string()
    }

    /// Rewrites the hosts file and reloads dnsmasq (SIGHUP).
    pub fn set(&self, ips: &[&str]) {
        write_hosts(&self.hosts, ips);
        // Safety: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGHUP) };
        self.wait_for_answer(NAME, ips);
    }

    fn wait_for_answer(&self, name: &str, ips: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut want: Vec<Ipv4Addr> = ips.iter().map(|ip| ip.parse().expect("IPv4")).collect();
        want.sort();
        loop {
            if let Some(mut got) = query_a(self.addr, name) {
                got.sort();
                if got == want {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "dnsmasq does not answer {want:?} for {name}; its log: {}",
                std::fs::read_to_string(self.dir.join("dnsmasq.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_hosts(path: &Path, ips: &[&str]) {
    let text: String = ips.iter().map(|ip| format!("{ip} {NAME}\n")).collect();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write the hosts file");
    std::fs::rename(&tmp, path).expect("rename the hosts file");
}

/// The A records of `name` from the server at `server` (one UDP query);
/// `None` when it does not answer.
pub fn query_a(server: SocketAddr, name: &str) -> Option<Vec<Ipv4Addr>> {
    let socket = UdpSocket::bind("127.0.0.1:0").ok()?;
    socket.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    socket.send_to(&q, server).ok()?;
    let mut buf = [0u8; 1500];
    let (n, _) = socket.recv_from(&mut buf).ok()?;
    let b = &buf[..n];
    if b.len() < 12 || b[0..2] != [0x12, 0x34] {
        return None;
    }
    let answers = u16::from_be_bytes([b[6], b[7]]);
    let mut i = 12;
    i = skip_name(b, i)? + 4;
    let mut out = Vec::new();
    for _ in 0..answers {
        i = skip_name(b, i)?;
        let rtype = u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?]);
        let len = u16::from_be_bytes([*b.get(i + 8)?, *b.get(i + 9)?]) as usize;
        let data = b.get(i + 10..i + 10 + len)?;
        if rtype == 1 && len == 4 {
            out.push(Ipv4Addr::new(data[0], data[1], data[2], data[3]));
        }
        i += 10 + len;
    }
    Some(out)
}

fn skip_name(b: &[u8], mut i: usize) -> Option<usize> {
    loop {
        let len = *b.get(i)?;
        if len == 0 {
            return Some(i + 1);
        }
        if len & 0xc0 == 0xc0 {
            return Some(i + 2);
        }
        i += 1 + len as usize;
    }
}

// ---------------------------------------------------------------- the sidecar

pub struct Sidecar {
    pub child: Child,
    pub addr: Option<SocketAddr>,
    pub socket: Option<PathBuf>,
    pub instance: String,
    pub token: Option<String>,
}

impl Sidecar {
    /// `livecov sidecar ARGS`; `token`: the `--token` clients must send.
    pub fn start(args: &[&str], token: Option<&str>) -> Sidecar {
        Sidecar::start_logging(args, token, Stdio::inherit())
    }

    /// As [`Sidecar::start`], its standard error (its log) to `stderr`.
    pub fn start_logging(args: &[&str], token: Option<&str>, stderr: Stdio) -> Sidecar {
        let mut cmd = Command::new(livecov_bin());
        cmd.arg("sidecar").args(args);
        if let Some(t) = token {
            cmd.args(["--token", t]);
        }
        let mut child = cmd
            .env_remove("LIVECOV_TOKEN")
            .env_remove("LIVECOV_TOKEN_FILE")
            .env_remove("LIVECOV_SIDECAR_TOKEN")
            .env_remove("LIVECOV_SIDECAR_TOKEN_FILE")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start livecov sidecar");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let (mut addr, mut socket, mut instance) = (None, None, String::new());
        let want_tcp = args.contains(&"--listen");
        let want_unix = args.contains(&"--socket");
        loop {
            let mut line = String::new();
            let n = stdout.read_line(&mut line).expect("read the sidecar's output");
            assert!(n > 0, "the sidecar exited before listening: {:?}", child.wait());
            let line = line.trim();
            if let Some(i) = line.strip_prefix("livecov sidecar: instance ") {
                instance = i.to_owned();
            } else if let Some(a) = line.strip_prefix("listening on http://") {
                addr = Some(a.parse().expect("an address"));
            } else if let Some(p) = line.strip_prefix("listening on unix:") {
                socket = Some(PathBuf::from(p));
            }
            if (!want_tcp || addr.is_some()) && (!want_unix || socket.is_some()) && !instance.is_empty() {
                break;
            }
        }
        // Keep reading (and dropping) its standard output.
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = stdout.read_to_end(&mut sink);
        });
        Sidecar { child, addr, socket, instance, token: token.map(str::to_owned) }
    }

    /// A request on TCP with the sidecar's token.
    pub fn get(&self, path: &str) -> Response {
        tcp_request(self.addr.expect("a TCP listener"), "GET", path, self.token.as_deref())
    }

    pub fn post(&self, path: &str) -> Response {
        tcp_request(self.addr.expect("a TCP listener"), "POST", path, self.token.as_deref())
    }

    pub fn coverage(&self, query: &str) -> String {
        let r = self.get(&format!("/coverage{query}"));
        assert_eq!(r.status, 200, "GET /coverage{query}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.header("livecov-instance"), Some(self.instance.as_str()));
        r.text()
    }

    pub fn targets(&self) -> Vec<serde_json::Value> {
        let r = self.get("/targets");
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        r.json()["targets"].as_array().expect("targets").clone()
    }

    /// The row of /targets whose address contains `needle`.
    pub fn target(&self, needle: &str) -> Option<serde_json::Value> {
        self.targets().into_iter().find(|t| t["address"].as_str().is_some_and(|a| a.contains(needle)))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        // Safety: signalling our own child; SIGTERM stops it cleanly.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------- fakes

/// How a fake target misbehaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bad {
    /// Not HTTP at all.
    Garbage,
    /// HTTP with a Livecov-Instance, but a body that is not LCOV.
    Malformed,
    /// An HTML page, without Livecov-Instance.
    NotLivecov,
    /// Accepts, reads, never answers.
    Hang,
    /// A 200 whose body never ends.
    Endless,
}

/// A small misbehaving server on 127.0.0.1.
pub struct Fake {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Fake {
    pub fn start(bad: Bad) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("address");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut handlers = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        let flag = flag.clone();
                        handlers.push(std::thread::spawn(move || misbehave(s, bad, &flag)));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
            for h in handlers {
                let _ = h.join();
            }
        });
        Fake { addr, stop, thread: Some(thread) }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn misbehave(mut s: TcpStream, bad: Bad, stop: &AtomicBool) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    // Read the request head (or what comes within the timeout).
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let http = |ct: &str, extra: &str, body: &str| {
        format!("HTTP/1.1 200 OK\r\ncontent-type: {ct}\r\n{extra}content-length: {}\r\n\r\n{body}", body.len())
    };
    match bad {
        Bad::Garbage => {
            let _ = s.write_all(b"SSH-2.0-OpenSSH_9.6\r\n\x00\xff\xfe garbage \x01\x02\r\n\r\n");
        }
        Bad::Malformed => {
            let _ = s.write_all(http("text/plain", "livecov-instance: fake-malformed\r\n", "SF:/src/x.rs\nDA:one,1\nend_of_record\n").as_bytes());
        }
        Bad::NotLivecov => {
            let _ = s.write_all(http("text/html", "", "<html><body>hello</body></html>\n").as_bytes());
        }
        Bad::Hang => {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Bad::Endless => {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nlivecov-instance: fake-endless\r\n\r\n");
            let chunk: Vec<u8> = "SF:/src/endless.rs\nDA:1,1\nend_of_record\n".repeat(1500).into_bytes();
            while !stop.load(Ordering::Relaxed) {
                if s.write_all(&chunk).is_err() {
                    break;
                }
            }
        }
    }
}

/// A TCP address nobody listens on.
pub fn refused_url() -> String {
    let port = free_port();
    format!("http://127.0.0.1:{port}")
}

// ---------------------------------------------------------------- LCOV

/// Merges LCOV reports as `livecov merge` does.
pub fn merge(reports: &[&str]) -> String {
    livecov_cli::merge::merge(reports.iter().map(|r| ("report", *r))).expect("valid LCOV")
}

/// FNDA counts of the functions whose (mangled) name ends with `function`.
pub fn function_count(lcov: &str, function: &str) -> u64 {
    lcov.lines()
        .filter_map(|l| l.strip_prefix("FNDA:"))
        .filter_map(|l| l.split_once(','))
        .filter(|(_, name)| name.ends_with(function))
        .map(|(c, _)| c.parse::<u64>().expect("a count"))
        .sum()
}

/// Lines with a count > 0, per file (only files with some).
pub fn lines_hit(lcov: &str) -> BTreeMap<String, Vec<u32>> {
    livecov_tests::lcov::lines_hit(lcov).into_iter().filter(|(_, lines)| !lines.is_empty()).collect()
}

/// The test names of the records (`TN:` lines).
pub fn test_names(lcov: &str) -> Vec<String> {
    let mut names: Vec<String> = lcov.lines().filter_map(|l| l.strip_prefix("TN:")).map(str::to_owned).collect();
    names.sort();
    names.dedup();
    names
}

pub const HELLO: &str = "handlers5hello";
pub const FIB: &str = "handlers3fib";
pub const PRIMES: &str = "handlers6primes";

/// Peak resident memory of a process, in KiB (VmHWM).
pub fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

// ---------------------------------------------------------------- the oracle

/// llvm-cov 22 over `profraws` merged (profiles of the fixture service,
/// and of `objects` loaded into it), filtered as the agent filters: what an
/// exact merge of those instances must print.
pub fn llvm_cov(profraws: &[PathBuf], objects: &[&Path], dir: &Path) -> String {
    let profdata = dir.join(format!("merged-{}.profdata", profraws.len() + objects.len() * 100));
    let status = Command::new(livecov_tests::llvm_tool("llvm-profdata")).arg("merge").args(profraws).arg("-o").arg(&profdata).status();
    assert!(status.expect("run llvm-profdata").success(), "llvm-profdata merge failed");
    let mut cmd = Command::new(livecov_tests::llvm_tool("llvm-cov"));
    cmd.args(["export", "-format=lcov"]).arg(service_bin());
    for o in objects {
        cmd.arg("-object").arg(o);
    }
    let own: String = format!("{}/", livecov_tests::workspace_root().join("agent-rust/src").display())
        .chars()
        .map(|c| if "\\.+*?()|[]{}^$".contains(c) { format!("\\{c}") } else { c.to_string() })
        .collect();
    cmd.arg("-instr-profile")
        .arg(&profdata)
        .arg(format!("-ignore-filename-regex={}", livecov::agent::DEFAULT_IGNORE))
        .arg(format!("-ignore-filename-regex={own}"));
    let out = cmd.output().expect("run llvm-cov");
    assert!(out.status.success(), "llvm-cov export failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

/// The replica's own raw profile now.
pub fn profraw(r: &Replica, dir: &Path) -> PathBuf {
    let resp = unix_request(&r.socket(), "GET", "/coverage?format=profraw");
    assert_eq!(resp.status, 200);
    let path = dir.join(format!("{}.profraw", r.instance()));
    std::fs::write(&path, &resp.body).expect("write the profile");
    path
}
