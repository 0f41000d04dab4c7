//! A tiny HTTP/1.1 client for the agent's and the sidecar's endpoints (over
//! a Unix socket or TCP) and its response parser.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).expect("a UTF-8 body")
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

/// A whole response as read until the server closed the connection; a
/// chunked body is put back together.
pub fn parse_response(raw: &[u8]) -> Response {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("not a complete HTTP response: {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|s| s.parse().ok()).expect("status");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':').map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned())))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers.iter().any(|(n, v)| n.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked")) {
        body = dechunk(&body);
    }
    Response { status, headers, body }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
    out
}

/// Sends `METHOD PATH` with `host: localhost`, `connection: close` and
/// `headers` on `s`, and reads the response to the end.
pub fn exchange(mut s: impl Read + Write, method: &str, path: &str, headers: &[&str]) -> Response {
    let mut request = format!("{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n");
    for h in headers {
        request.push_str(h);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    s.write_all(request.as_bytes()).expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    parse_response(&raw)
}

/// `GET path` on `s`, a connection kept open for more requests: the
/// response read to its `content-length`, and no byte past it.
pub fn get_keeping_the_connection(s: &mut (impl Read + Write), path: &str) -> Response {
    write!(s, "GET {path} HTTP/1.1\r\nhost: localhost\r\n\r\n").expect("send");
    let mut reader = BufReader::new(s);
    let mut raw = Vec::new();
    while !raw.ends_with(b"\r\n\r\n") {
        assert!(reader.read_until(b'\n', &mut raw).expect("read the head") > 0, "the connection ended in the head");
    }
    let mut response = parse_response(&raw);
    let length = response.header("content-length").and_then(|v| v.parse().ok()).expect("a content-length");
    response.body = vec![0; length];
    reader.read_exact(&mut response.body).expect("read the body");
    assert!(reader.buffer().is_empty(), "bytes past the body");
    response
}

/// `GET path` (a `/coverage` of any runtime) on the Unix socket: a `200`
/// that says how long its report took to make (`Server-Timing:
/// report;dur=<ms>`), more than nothing and no more than the client waited
/// (an answer in µs or in s would not be).
pub fn get_report(socket: &Path, path: &str) -> Response {
    let asked = std::time::Instant::now();
    let r = unix_request(socket, "GET", path, &[]);
    let wall_ms = asked.elapsed().as_secs_f64() * 1e3;
    assert_eq!(r.status, 200, "GET {path}: {}", r.text());
    let timing = r.header("server-timing").unwrap_or_else(|| panic!("GET {path}: no Server-Timing header"));
    let ms: f64 = timing.strip_prefix("report;dur=").and_then(|d| d.parse().ok()).unwrap_or_else(|| panic!("{timing:?}"));
    assert!(ms > 0.0 && ms <= wall_ms, "GET {path}: {timing:?} for a request of {wall_ms:.3} ms");
    r
}

/// A request on the Unix socket `socket`. An answer that does not end
/// within two minutes fails the test, rather than hang it.
pub fn unix_request(socket: &Path, method: &str, path: &str, headers: &[&str]) -> Response {
    let s = connect_unix(socket);
    s.set_read_timeout(Some(std::time::Duration::from_secs(120))).expect("a read timeout");
    exchange(s, method, path, headers)
}

/// A connection to the Unix socket `socket`, also one deeper than the 107
/// bytes a socket address holds (a checkout in a deep folder): through the
/// descriptor of its folder, as livecov's own clients do.
pub fn connect_unix(socket: &Path) -> UnixStream {
    try_connect_unix(socket).unwrap_or_else(|e| panic!("connect to {}: {e}", socket.display()))
}

/// [`connect_unix`], for a socket that may not listen yet.
pub fn try_connect_unix(socket: &Path) -> std::io::Result<UnixStream> {
    livecov::agent::connection::socket_address(socket).and_then(|(address, _folder)| UnixStream::connect(address))
}
