//! The agent's HTTP server over real sockets, with a fake service, spoken to
//! with plain std streams.
#![cfg(feature = "agent")]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use livecov::agent::server::{ApiError, Body, CoverageQuery, Format, Limits, Listen, Server, Service};

const INSTANCE: &str = "rust-4242-test";
const TOKEN: &str = "s3cret-token";

#[derive(Default)]
struct Fake {
    delay: Duration,
    calls: AtomicUsize,
    resets: AtomicUsize,
    queries: Mutex<Vec<CoverageQuery>>,
    /// Calls of `answer_sent` and of `after_answers`: the names of the
    /// threads they came on.
    answers_sent: Mutex<Vec<String>>,
    after_answers: Mutex<Vec<String>>,
}

impl Fake {
    fn with_delay(ms: u64) -> Arc<Fake> {
        Arc::new(Fake { delay: Duration::from_millis(ms), ..Fake::default() })
    }
}

impl Service for Fake {
    fn coverage(&self, q: &CoverageQuery) -> Result<Body, ApiError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        self.queries.lock().unwrap().push(q.clone());
        std::thread::sleep(self.delay);
        match q.test.as_deref() {
            Some("panic") => panic!("fake service panics"),
            Some("fail") => return Err(ApiError::new(422, "fake \"failure\"")),
            _ => {}
        }
        let content_type = match q.format {
            Format::Lcov => "text/plain; charset=utf-8",
            Format::Profraw => "application/octet-stream",
            Format::Json | Format::LlvmJson => "application/json",
            Format::Counters | Format::Mapping => "application/gzip",
        };
        let tn = q.test.clone().unwrap_or_default();
        Ok(Body { content_type, bytes: format!("TN:{tn}\ncall={n}\nreset={}\nend_of_record\n", q.reset).into_bytes().into(), mapping: None })
    }

    /// Queries of the tests `at-once` and `at-once-panic` only: the others
    /// are asked of `coverage`, on the blocking pool.
    fn coverage_at_once(&self, q: &CoverageQuery) -> Option<Result<Body, ApiError>> {
        match q.test.as_deref() {
            Some("at-once") => {}
            Some("at-once-panic") => panic!("fake service panics at once"),
            _ => return None,
        }
        self.calls.fetch_add(1, Ordering::SeqCst);
        let thread = std::thread::current().name().unwrap_or_default().to_owned();
        Some(Ok(Body { content_type: "text/plain; charset=utf-8", bytes: format!("at once on {thread}\n").into_bytes().into(), mapping: None }))
    }

    fn answer_sent(&self) {
        let thread = std::thread::current().name().unwrap_or_default().to_owned();
        self.answers_sent.lock().unwrap().push(thread);
    }

    fn after_answers(&self) {
        let thread = std::thread::current().name().unwrap_or_default().to_owned();
        self.after_answers.lock().unwrap().push(thread);
    }

    fn reset(&self) -> Result<(), ApiError> {
        self.resets.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn health(&self) -> String {
        format!(r#"{{"instance":"{INSTANCE}","runtime":"rust"}}"#)
    }

    fn instance(&self) -> String {
        INSTANCE.into()
    }
}

fn scratch_dir() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!("lc-srv-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst)));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

struct Fixture {
    server: Option<Server>,
    fake: Arc<Fake>,
    dir: PathBuf,
    sock: PathBuf,
    tcp: SocketAddr,
}

impl Fixture {
    fn new(fake: Arc<Fake>, token: Option<&str>, limits: Limits) -> Fixture {
        let dir = scratch_dir();
        let sock = dir.join("agent.sock");
        let listen = Listen {
            unix: Some((sock.clone(), 0o600)),
            tcp: Some("127.0.0.1:0".parse().unwrap()),
            token: token.map(String::from),
        };
        let server = Server::start(fake.clone(), listen, limits).expect("start");
        let tcp = server.tcp_addr().expect("tcp addr");
        assert_ne!(tcp.port(), 0);
        Fixture { server: Some(server), fake, dir, sock, tcp }
    }

    fn unix(&self) -> Addr {
        Addr::Unix(self.sock.clone())
    }

    fn tcp(&self) -> Addr {
        Addr::Tcp(self.tcp)
    }

    fn both(&self) -> [Addr; 2] {
        [self.unix(), self.tcp()]
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[derive(Clone, Debug)]
enum Addr {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

fn connect(addr: &Addr) -> Box<dyn Stream> {
    let timeout = Some(Duration::from_secs(5));
    match addr {
        Addr::Unix(p) => {
            let s = UnixStream::connect(p).unwrap();
            s.set_read_timeout(timeout).unwrap();
            s.set_write_timeout(timeout).unwrap();
            Box::new(s)
        }
        Addr::Tcp(a) => {
            let s = TcpStream::connect(a).unwrap();
            s.set_read_timeout(timeout).unwrap();
            s.set_write_timeout(timeout).unwrap();
            Box::new(s)
        }
    }
}

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Asserts the shape of every response of ours.
    fn check_common(&self) -> &Resp {
        assert_eq!(self.header("livecov-instance"), Some(INSTANCE), "{self:?}");
        if self.status >= 400 {
            assert_eq!(self.header("content-type"), Some("application/json"), "{self:?}");
            let t = self.text();
            assert!(t.starts_with("{\"error\":\"") && t.ends_with("\"}"), "{t}");
        }
        self
    }
}

fn parse_head(head: &[u8]) -> (u16, Vec<(String, String)>) {
    let head = std::str::from_utf8(head).unwrap();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    assert!(status_line.starts_with("HTTP/1.1 "), "{status_line}");
    let status = status_line[9..12].parse().unwrap();
    let headers = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_string(), v.trim().to_string())
        })
        .collect();
    (status, headers)
}

/// Sends `raw` and reads until the server closes the connection.
fn exchange(addr: &Addr, raw: &[u8]) -> Resp {
    let mut s = connect(addr);
    s.write_all(raw).unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let end = find(&buf, b"\r\n\r\n").unwrap_or_else(|| panic!("no response head in {:?}", String::from_utf8_lossy(&buf)));
    let (status, headers) = parse_head(&buf[..end]);
    Resp { status, headers, body: buf[end + 4..].to_vec() }
}

/// Reads one response with a Content-Length (or none) off a kept-alive stream.
fn read_one(s: &mut dyn Stream) -> Resp {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while find(&buf, b"\r\n\r\n").is_none() {
        let n = s.read(&mut byte).unwrap();
        assert_eq!(n, 1, "connection closed mid-head: {:?}", String::from_utf8_lossy(&buf));
        buf.push(byte[0]);
    }
    let (status, headers) = parse_head(&buf[..buf.len() - 4]);
    let mut r = Resp { status, headers, body: Vec::new() };
    let len: usize = r.header("content-length").map_or(0, |v| v.parse().unwrap());
    r.body = vec![0; len];
    s.read_exact(&mut r.body).unwrap();
    r
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn request(addr: &Addr, method: &str, target: &str, extra: &str) -> Resp {
    let raw = format!("{method} {target} HTTP/1.1\r\nHost: localhost\r\n{extra}Connection: close\r\n\r\n");
    exchange(addr, raw.as_bytes())
}

fn get(addr: &Addr, target: &str) -> Resp {
    request(addr, "GET", target, "")
}

fn bearer() -> String {
    format!("Authorization: Bearer {TOKEN}\r\n")
}

/// A request as the given transport needs it (the token on TCP).
fn get_auth(addr: &Addr, target: &str) -> Resp {
    match addr {
        Addr::Unix(_) => get(addr, target),
        Addr::Tcp(_) => request(addr, "GET", target, &bearer()),
    }
}

#[test]
fn every_route_on_both_transports() {
    let f = Fixture::new(Fake::with_delay(0), None, Limits::default());
    for addr in f.both() {
        let r = get(&addr, "/coverage");
        assert_eq!(r.check_common().status, 200, "{addr:?}");
        assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
        assert_eq!(r.header("cache-control"), Some("no-store"));
        assert!(r.text().starts_with("TN:\n"), "{}", r.text());

        let r = get(&addr, "/coverage?test=login%20flow+2&format=json");
        assert_eq!(r.check_common().status, 200);
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert!(r.text().starts_with("TN:login flow 2\n"), "{}", r.text());
        assert!(r.text().contains("reset=false"));

        let r = get(&addr, "/coverage?reset=1&format=profraw");
        assert_eq!(r.check_common().status, 200);
        assert_eq!(r.header("content-type"), Some("application/octet-stream"));
        assert!(r.text().contains("reset=true"));
        let r = get(&addr, "/coverage?reset=true&format=lcov");
        assert!(r.check_common().text().contains("reset=true"));

        let before = f.fake.resets.load(Ordering::SeqCst);
        let r = request(&addr, "POST", "/reset", "");
        assert_eq!(r.check_common().status, 204);
        assert!(r.body.is_empty());
        assert_eq!(f.fake.resets.load(Ordering::SeqCst), before + 1);

        let r = get(&addr, "/health");
        assert_eq!(r.check_common().status, 200);
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert!(r.text().contains(INSTANCE));

        let r = get(&addr, "/nope");
        assert_eq!(r.check_common().status, 404);
        assert!(r.text().contains("/coverage"), "{}", r.text());
        assert_eq!(get(&addr, "/coverage/").check_common().status, 404);

        let r = request(&addr, "POST", "/coverage", "Content-Length: 0\r\n");
        assert_eq!(r.check_common().status, 405);
        assert_eq!(r.header("allow"), Some("GET"));
        let r = request(&addr, "DELETE", "/health", "");
        assert_eq!(r.check_common().status, 405);
        assert_eq!(r.header("allow"), Some("GET"));
        let r = get(&addr, "/reset");
        assert_eq!(r.check_common().status, 405);
        assert_eq!(r.header("allow"), Some("POST"));

        let r = get(&addr, "/coverage?format=xml");
        assert_eq!(r.check_common().status, 400);
        assert!(r.text().contains("lcov, profraw, json"), "{}", r.text());
        for bad in ["/coverage?reset=yes", "/coverage?tset=a", "/coverage?test=%zz", "/coverage?test=a%0Ab"] {
            assert_eq!(get(&addr, bad).check_common().status, 400, "{bad}");
        }
    }
    let queries = f.fake.queries.lock().unwrap().clone();
    assert!(queries.contains(&CoverageQuery { test: Some("login flow 2".into()), reset: false, format: Format::Json }));
    assert!(queries.contains(&CoverageQuery { test: None, reset: true, format: Format::Profraw }));
}

#[test]
fn service_errors_and_panics_become_json_errors() {
    let f = Fixture::new(Fake::with_delay(0), None, Limits::default());
    let r = get(&f.unix(), "/coverage?test=fail");
    assert_eq!(r.check_common().status, 422);
    assert_eq!(r.text(), r#"{"error":"fake \"failure\""}"#);
    let r = get(&f.unix(), "/coverage?test=panic");
    assert_eq!(r.check_common().status, 500);
    // Still serving.
    assert_eq!(get(&f.unix(), "/health").check_common().status, 200);
    assert_eq!(get(&f.unix(), "/coverage").check_common().status, 200);
}

#[test]
fn token_required_on_tcp_not_on_unix() {
    let f = Fixture::new(Fake::with_delay(0), Some(TOKEN), Limits::default());
    let tcp = f.tcp();
    for target in ["/coverage", "/health", "/nope"] {
        let r = get(&tcp, target);
        assert_eq!(r.check_common().status, 401, "{target}");
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    }
    let r = request(&tcp, "POST", "/reset", "");
    assert_eq!(r.check_common().status, 401);
    assert_eq!(f.fake.resets.load(Ordering::SeqCst), 0);
    for wrong in ["Bearer s3cret-toke", "Bearer s3cret-token2", "Basic s3cret-token", "Bearer"] {
        let r = request(&tcp, "GET", "/health", &format!("Authorization: {wrong}\r\n"));
        assert_eq!(r.check_common().status, 401, "{wrong}");
    }
    assert_eq!(get_auth(&tcp, "/coverage").check_common().status, 200);
    assert_eq!(get_auth(&tcp, "/health").check_common().status, 200);
    assert_eq!(get_auth(&tcp, "/nope").check_common().status, 404);
    assert_eq!(request(&tcp, "POST", "/reset", &bearer()).check_common().status, 204);
    // The Unix socket needs none.
    assert_eq!(get(&f.unix(), "/coverage").check_common().status, 200);
    assert_eq!(get(&f.unix(), "/health").check_common().status, 200);
}

#[test]
fn socket_file_mode_stale_socket_and_removal_on_stop() {
    let dir = scratch_dir();
    let sock = dir.join("x.sock");
    // A stale socket (its listener gone) is replaced.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let fake = Fake::with_delay(0);
    let listen = |mode| Listen { unix: Some((sock.clone(), mode)), tcp: None, token: None };
    let server = Server::start(fake.clone(), listen(0o600), Limits::default()).unwrap();
    assert_eq!(server.tcp_addr(), None);
    let meta = std::fs::symlink_metadata(&sock).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
    assert_eq!(get(&Addr::Unix(sock.clone()), "/health").check_common().status, 200);
    // No temporary leftovers beside the socket.
    let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("x.sock")]);
    let t = Instant::now();
    server.stop();
    assert!(t.elapsed() < Duration::from_secs(1), "stop took {:?}", t.elapsed());
    assert!(!sock.exists(), "stop() removes the socket file");

    // Another mode is honoured.
    let server = Server::start(fake.clone(), listen(0o660), Limits::default()).unwrap();
    assert_eq!(std::fs::metadata(&sock).unwrap().permissions().mode() & 0o7777, 0o660);
    drop(server); // dropping stops too
    assert!(!sock.exists());

    // A regular file is never clobbered.
    std::fs::write(&sock, b"data").unwrap();
    let err = Server::start(fake.clone(), listen(0o600), Limits::default()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    assert_eq!(std::fs::read(&sock).unwrap(), b"data");

    // Nothing to listen on.
    let err = Server::start(fake, Listen::default(), Limits::default()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn stop_frees_the_tcp_port() {
    let f = Fixture::new(Fake::with_delay(0), None, Limits::default());
    let (addr, sock) = (f.tcp, f.sock.clone());
    assert_eq!(get(&f.tcp(), "/health").status, 200);
    drop(f);
    assert!(TcpStream::connect(addr).is_err());
    assert!(!sock.exists());
}

/// Runs `n` requests at once, each on its own connection.
fn concurrently(n: usize, addr: &Addr, target: impl Fn(usize) -> String + Sync) -> Vec<Resp> {
    let barrier = Barrier::new(n);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (barrier, target) = (&barrier, &target);
                s.spawn(move || {
                    let mut stream = connect(addr);
                    barrier.wait();
                    let raw = format!("GET {} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", target(i));
                    stream.write_all(raw.as_bytes()).unwrap();
                    let mut buf = Vec::new();
                    stream.read_to_end(&mut buf).unwrap();
                    let end = find(&buf, b"\r\n\r\n").unwrap();
                    let (status, headers) = parse_head(&buf[..end]);
                    Resp { status, headers, body: buf[end + 4..].to_vec() }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn single_flight() {
    let f = Fixture::new(Fake::with_delay(300), None, Limits::default());
    // 20 identical dumps, half on each transport, while one takes 300 ms.
    let t = Instant::now();
    let (a, b) = std::thread::scope(|s| {
        let u = s.spawn(|| concurrently(10, &f.unix(), |_| "/coverage?test=t1".into()));
        let t = s.spawn(|| concurrently(10, &f.tcp(), |_| "/coverage?test=t1".into()));
        (u.join().unwrap(), t.join().unwrap())
    });
    assert!(t.elapsed() < Duration::from_millis(1500), "{:?}", t.elapsed());
    assert_eq!(f.fake.calls.load(Ordering::SeqCst), 1);
    for r in a.iter().chain(&b) {
        assert_eq!(r.check_common().status, 200);
        assert_eq!(r.text(), "TN:t1\ncall=1\nreset=false\nend_of_record\n");
    }
    // Once done, the next dump computes anew.
    assert!(get(&f.unix(), "/coverage?test=t1").text().contains("call=2"));

    // Different queries are different flights: two names x two formats.
    let before = f.fake.calls.load(Ordering::SeqCst);
    let rs = concurrently(12, &f.unix(), |i| format!("/coverage?test=q{}&format={}", i % 2, ["lcov", "json"][i / 2 % 2]));
    assert!(rs.iter().all(|r| r.status == 200));
    assert_eq!(f.fake.calls.load(Ordering::SeqCst) - before, 4);

    // Dump-and-reset requests are never shared, with plain dumps or each other.
    let before = f.fake.calls.load(Ordering::SeqCst);
    let rs = concurrently(6, &f.unix(), |i| if i < 3 { "/coverage?reset=1".into() } else { "/coverage".into() });
    assert!(rs.iter().all(|r| r.status == 200));
    assert_eq!(f.fake.calls.load(Ordering::SeqCst) - before, 4, "3 resets + 1 shared plain dump");
    let reset_bodies: Vec<_> = rs[..3].iter().map(Resp::text).collect();
    assert!(reset_bodies.iter().all(|t| t.contains("reset=true")));
    assert!(rs[3..].iter().all(|r| r.text().contains("reset=false")));
}

#[test]
fn an_answer_at_once_is_computed_on_the_server_thread_and_the_others_on_the_blocking_pool() {
    let f = Fixture::new(Fake::with_delay(0), None, Limits::default());
    for addr in f.both() {
        let r = get(&addr, "/coverage?test=at-once");
        assert_eq!(r.check_common().status, 200);
        assert_eq!(r.text(), "at once on livecov-agent\n");
        let r = get(&addr, "/coverage?test=other");
        assert_eq!(r.check_common().status, 200);
        assert!(r.text().starts_with("TN:other\ncall="), "{}", r.text());
    }
    assert_eq!(f.fake.calls.load(Ordering::SeqCst), 4);
    assert_eq!(f.fake.queries.lock().unwrap().len(), 2, "only the others reach `coverage`");
    // A panic there is a 500 too, and the server goes on.
    let r = get(&f.unix(), "/coverage?test=at-once-panic");
    assert_eq!(r.check_common().status, 500);
    assert_eq!(get(&f.unix(), "/coverage?test=at-once").text(), "at once on livecov-agent\n");
}

/// `after_answers` calls so far, once they are `n` (or 2 s passed).
fn after_answers(fake: &Fake, n: usize) -> Vec<String> {
    calls(&fake.after_answers, n)
}

/// The `calls` so far, once they are `n` (or 2 s passed).
fn calls(calls: &Mutex<Vec<String>>, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let calls = calls.lock().unwrap().clone();
        if calls.len() >= n || Instant::now() > deadline {
            return calls;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn after_answers_comes_once_the_server_is_idle_with_no_connection_open() {
    let f = Fixture::new(Fake::with_delay(0), None, Limits::default());
    // Other routes are not answers that call for it.
    assert_eq!(get(&f.unix(), "/health").status, 200);
    std::thread::sleep(Duration::from_millis(100));
    assert!(f.fake.after_answers.lock().unwrap().is_empty());
    // A dump, on the blocking pool or at once: once its connection ended,
    // on the server's thread, once.
    for (n, test) in [(1, "pool"), (2, "at-once")] {
        assert_eq!(get(&f.unix(), &format!("/coverage?test={test}")).status, 200);
        let calls = after_answers(&f.fake, n);
        assert_eq!(calls.len(), n, "after a dump ({test})");
        assert_eq!(calls[n - 1], "livecov-agent");
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(f.fake.after_answers.lock().unwrap().len(), 2, "called again with nothing answered");
    // A client that keeps its connection holds the call back until it
    // closes it.
    let mut kept = connect(&f.unix());
    kept.write_all(b"GET /coverage?test=kept HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(read_one(&mut *kept).status, 200);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(f.fake.after_answers.lock().unwrap().len(), 2, "called with a connection open");
    drop(kept);
    assert_eq!(after_answers(&f.fake, 3).len(), 3, "after the kept connection closed");
}

#[test]
fn answer_sent_comes_after_each_answer_with_its_connection_open() {
    let f = Fixture::new(Fake::with_delay(0), None, Limits::default());
    assert_eq!(get(&f.unix(), "/health").status, 200);
    std::thread::sleep(Duration::from_millis(100));
    assert!(f.fake.answers_sent.lock().unwrap().is_empty(), "after /health");
    // Each answer, from the blocking pool, at once, or an error, once it is
    // sent, on the server's thread, whether the connection stays or not.
    let mut kept = connect(&f.unix());
    for (n, test, status) in [(1, "pool", 200), (2, "at-once", 200), (3, "fail", 422)] {
        kept.write_all(format!("GET /coverage?test={test} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes()).unwrap();
        assert_eq!(read_one(&mut *kept).status, status, "{test}");
        let sent = calls(&f.fake.answers_sent, n);
        assert_eq!(sent.len(), n, "after the answer ({test})");
        assert_eq!(sent[n - 1], "livecov-agent");
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(f.fake.answers_sent.lock().unwrap().len(), 3, "called again with nothing answered");
    assert!(f.fake.after_answers.lock().unwrap().is_empty(), "after_answers with a connection open");
    drop(kept);
    assert_eq!(after_answers(&f.fake, 1).len(), 1, "after the connection closed");
    assert_eq!(f.fake.answers_sent.lock().unwrap().len(), 3);
}

#[test]
fn waiters_give_up_after_the_request_timeout() {
    let limits = Limits { request_timeout: Duration::from_millis(150), ..Limits::default() };
    let f = Fixture::new(Fake::with_delay(600), None, limits);
    let t = Instant::now();
    let r = get(&f.unix(), "/coverage");
    assert_eq!(r.check_common().status, 503);
    assert!(r.text().contains("did not finish"), "{}", r.text());
    assert!(t.elapsed() < Duration::from_millis(500));
    // Health is not stuck behind the slow computation.
    assert_eq!(get(&f.unix(), "/health").status, 200);
}

#[test]
fn garbage_gets_400_and_the_server_keeps_answering() {
    let f = Fixture::new(Fake::with_delay(0), None, Limits::default());
    for addr in f.both() {
        for garbage in [&b"\x00\x01\x02 not http at all\r\n\r\n"[..], b"GET / HTTP/9.9 junk\r\n\r\n", b"\xff\xfe\r\n\r\n"] {
            let r = exchange(&addr, garbage);
            assert_eq!(r.status, 400, "{garbage:?}");
        }
        assert_eq!(get_auth(&addr, "/health").check_common().status, 200);
    }
}

#[test]
fn oversized_heads_are_rejected() {
    let f = Fixture::new(Fake::with_delay(0), None, Limits::default());
    let addr = f.unix();
    // A 1 MiB header: 431, or the connection is closed under the client.
    let mut s = connect(&addr);
    let big = format!("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(1 << 20));
    let _ = s.write_all(big.as_bytes()); // may fail once the server closed
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    if !buf.is_empty() {
        assert!(buf.starts_with(b"HTTP/1.1 431"), "{:?}", String::from_utf8_lossy(&buf[..buf.len().min(100)]));
    }
    // Too many headers.
    let many: String = (0..200).map(|i| format!("X-H{i}: v\r\n")).collect();
    let r = request(&addr, "GET", "/health", &many);
    assert_eq!(r.status, 431);
    // 65 with Host and Connection: one over the limit (64), within what
    // hyper itself parses (100): the agent's own 431.
    let many: String = (0..63).map(|i| format!("X-H{i}: v\r\n")).collect();
    assert_eq!(request(&addr, "GET", "/health", &many).check_common().status, 431);
    // Still fine.
    assert_eq!(get(&addr, "/health").check_common().status, 200);
    assert_eq!(get_auth(&f.tcp(), "/health").check_common().status, 200);
}

#[test]
fn stalled_client_is_dropped_after_the_header_timeout() {
    let limits = Limits { header_read_timeout: Duration::from_millis(400), ..Limits::default() };
    let f = Fixture::new(Fake::with_delay(0), None, limits);
    for addr in f.both() {
        let mut stalled = connect(&addr);
        stalled.write_all(b"GET /coverage HTTP/1.1\r\nHost: x\r\nX-Half").unwrap();
        let t = Instant::now();
        // Others are served meanwhile.
        for _ in 0..3 {
            assert_eq!(get_auth(&addr, "/health").status, 200);
        }
        assert!(t.elapsed() < Duration::from_millis(300));
        let mut buf = Vec::new();
        let _ = stalled.read_to_end(&mut buf); // EOF or reset
        let waited = t.elapsed();
        assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(3), "{waited:?}");
        assert!(buf.is_empty() || buf.starts_with(b"HTTP/1.1 408"), "{:?}", String::from_utf8_lossy(&buf));
    }
}

#[test]
fn connection_limit() {
    let limits = Limits { max_connections: 2, header_read_timeout: Duration::from_secs(5), ..Limits::default() };
    let f = Fixture::new(Fake::with_delay(0), None, limits);
    let addr = f.unix();
    // Two idle connections take both slots, on both transports together.
    let mut a = connect(&addr);
    let b = connect(&f.tcp());
    // Make sure the server accepted both before the third.
    a.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(read_one(&mut *a).status, 200);
    std::thread::sleep(Duration::from_millis(50));
    let mut c = connect(&addr);
    let _ = c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut buf = Vec::new();
    let _ = c.read_to_end(&mut buf);
    assert!(buf.is_empty() || buf.starts_with(b"HTTP/1.1 503"), "{:?}", String::from_utf8_lossy(&buf));
    if !buf.is_empty() {
        let text = String::from_utf8_lossy(&buf);
        assert!(text.contains(&format!("livecov-instance: {INSTANCE}")), "{text}");
    }
    // Freeing a slot lets the next one in.
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let mut c = connect(&addr);
        let _ = c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let mut buf = Vec::new();
        let _ = c.read_to_end(&mut buf);
        if buf.starts_with(b"HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < deadline, "slot never freed");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(a);
}

#[test]
fn keep_alive_and_idle_timeout() {
    let limits = Limits {
        idle_timeout: Duration::from_millis(300),
        header_read_timeout: Duration::from_secs(5),
        ..Limits::default()
    };
    let f = Fixture::new(Fake::with_delay(0), None, limits);
    for addr in f.both() {
        let mut s = connect(&addr);
        let auth = if matches!(addr, Addr::Tcp(_)) { bearer() } else { String::new() };
        for target in ["/health", "/coverage?test=ka", "/nope"] {
            s.write_all(format!("GET {target} HTTP/1.1\r\nHost: x\r\n{auth}\r\n").as_bytes()).unwrap();
            let r = read_one(&mut *s);
            r.check_common();
        }
        s.write_all(b"POST /reset HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello").unwrap();
        assert_eq!(read_one(&mut *s).status, 204);
        let t = Instant::now();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        assert!(buf.is_empty());
        let waited = t.elapsed();
        assert!(waited >= Duration::from_millis(200) && waited < Duration::from_secs(2), "{waited:?}");
    }
}

#[test]
fn reset_body_limits() {
    let f = Fixture::new(Fake::with_delay(0), None, Limits::default());
    let addr = f.unix();
    let r = exchange(&addr, b"POST /reset HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\nConnection: close\r\n\r\nhello world");
    assert_eq!(r.check_common().status, 204);
    // Announced too large: refused before reading.
    let r = request(&addr, "POST", "/reset", "Content-Length: 100000\r\n");
    assert_eq!(r.check_common().status, 413);
    // Chunked, growing past the cap.
    let mut s = connect(&addr);
    s.write_all(b"POST /reset HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
    let chunk = format!("4000\r\n{}\r\n", "z".repeat(0x4000));
    let mut buf = Vec::new();
    for _ in 0..5 {
        if s.write_all(chunk.as_bytes()).is_err() {
            break;
        }
    }
    let _ = s.read_to_end(&mut buf);
    assert!(buf.starts_with(b"HTTP/1.1 413"), "{:?}", String::from_utf8_lossy(&buf));
    assert_eq!(f.fake.resets.load(Ordering::SeqCst), 1);
    assert_eq!(get(&addr, "/health").status, 200);
}

#[test]
fn stop_with_a_request_in_flight() {
    let f = Fixture::new(Fake::with_delay(300), None, Limits::default());
    let addr = f.unix();
    let mut f = f;
    let server = f.server.take().unwrap();
    std::thread::scope(|s| {
        let h = s.spawn(|| get(&addr, "/coverage"));
        std::thread::sleep(Duration::from_millis(100));
        let t = Instant::now();
        server.stop();
        assert!(t.elapsed() < Duration::from_secs(3));
        // The in-flight request got its answer.
        assert_eq!(h.join().unwrap().status, 200);
    });
    assert!(!Path::new(&f.sock).exists());
}

#[test]
fn starts_inside_a_host_tokio_runtime_and_survives_odd_limits() {
    // A host that is itself a tokio program: the server has its own runtime.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let limits = Limits {
            max_connections: 0,
            header_read_timeout: Duration::MAX,
            idle_timeout: Duration::MAX,
            max_header_bytes: 100,
            max_headers: 100,
            request_timeout: Duration::MAX,
        };
        let f = Fixture::new(Fake::with_delay(0), None, limits);
        assert_eq!(get(&f.unix(), "/health").check_common().status, 200);
        // 100 bytes of head at most.
        let long = format!("/coverage?test={}", "x".repeat(200));
        assert_eq!(get(&f.unix(), &long).status, 431);
        assert_eq!(get(&f.unix(), "/health").status, 200);
    });
}
