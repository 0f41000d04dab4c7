//! A small HTTP/1.1 client for livecov targets: an agent's Unix socket, or
//! an agent (or sidecar) on TCP.
//!
//! Built on hyper 1's connection-level client (`hyper::client::conn::http1`)
//! over tokio streams: one request per connection, no pool, no TLS. Every
//! request is bounded in time ([`Client::timeout`], connecting included) and
//! in response size ([`Client::max_body`]); a bearer token is sent on TCP
//! only (the agent's Unix socket is protected by its file mode instead).
//!
//! [`Client`]'s methods are async (the sidecar fans out over many targets);
//! [`block_on`] runs one on a fresh current-thread runtime for the CLI.
//! Errors are [`ClientError`]s whose messages say what to do.

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use livecov::agent::server::{report_time, TIMING_HEADER};
use tokio::io::{AsyncRead, AsyncWrite};

/// Where an agent (or a sidecar) listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A Unix socket, e.g. `$LIVECOV_DIR/sockets/<instance>.sock`.
    Unix(PathBuf),
    /// `http://host:port[/prefix]`: the routes are under `prefix`.
    Http { host: String, port: u16, prefix: String },
}

impl FromStr for Target {
    type Err = String;

    /// `unix:/path/to.sock`, a path ending in `.sock`, or `http://host:port`.
    fn from_str(s: &str) -> Result<Target, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            // unix:/path and unix:///path
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err("unix: needs a socket path, e.g. unix:/tmp/cov/sockets/rust-1234-ab.sock".into());
            }
            return Ok(Target::Unix(PathBuf::from(path)));
        }
        if let Some(rest) = s.strip_prefix("http://") {
            let (authority, path) = match rest.find('/') {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            };
            let (host, port) = split_host_port(authority)
                .ok_or_else(|| format!("{s:?}: expected http://HOST:PORT, e.g. http://127.0.0.1:9464"))?;
            let prefix = path.trim_end_matches('/').to_owned();
            if prefix.contains(['?', '#']) {
                return Err(format!("{s:?}: a target is http://HOST:PORT[/PREFIX], without a query"));
            }
            return Ok(Target::Http { host, port, prefix });
        }
        if s.starts_with("https://") {
            return Err(format!(
                "{s:?}: livecov speaks plain HTTP to its targets (no TLS); use http://, a Unix socket, \
                 or a port-forward (kubectl port-forward) to reach the target"
            ));
        }
        if s.ends_with(".sock") {
            return Ok(Target::Unix(PathBuf::from(s)));
        }
        Err(format!(
            "{s:?} is not a target: give unix:/path/to.sock, a path ending in .sock \
             (e.g. $LIVECOV_DIR/sockets/<instance>.sock), or http://HOST:PORT"
        ))
    }
}

/// `host:port`, `[v6]:port`, or `host` (port 80).
fn split_host_port(authority: &str) -> Option<(String, u16)> {
    if authority.contains('@') {
        return None;
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        match after {
            "" => (host, None),
            p => (host, Some(p.strip_prefix(':')?)),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            Some(_) => return None,
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return None;
    }
    let port = match port {
        Some(p) => p.parse().ok().filter(|&p| p != 0)?,
        None => 80,
    };
    Some((host.to_owned(), port))
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Unix(path) => write!(f, "{}", path.display()),
            Target::Http { host, port, prefix } if host.contains(':') => write!(f, "http://[{host}]:{port}{prefix}"),
            Target::Http { host, port, prefix } => write!(f, "http://{host}:{port}{prefix}"),
        }
    }
}

/// A response, its body read whole.
#[derive(Debug)]
pub struct Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Response {
    /// The `Livecov-Instance` header: the instance that answered.
    pub fn instance(&self) -> Option<&str> {
        self.headers.get("livecov-instance").and_then(|v| v.to_str().ok())
    }

    pub fn content_type(&self) -> Option<&str> {
        self.headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok())
    }

    /// How long the target took to make the answer, as its
    /// `Server-Timing` says (none from an agent older than it).
    pub fn report_time(&self) -> Option<Duration> {
        self.headers.get(TIMING_HEADER).and_then(|v| v.to_str().ok()).and_then(report_time)
    }
}

/// What `GET /coverage` is asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CoverageQuery {
    /// `?test=NAME`: `TN:NAME` before each record.
    pub test: Option<String>,
    /// `?reset=1`: dump and reset in one step.
    pub reset: bool,
    /// `?format=`: `lcov` (the default), `profraw` or `json`.
    pub format: Option<String>,
}

impl CoverageQuery {
    /// `/coverage` with its query string.
    pub fn path(&self) -> String {
        let mut params = Vec::new();
        if let Some(test) = &self.test {
            params.push(format!("test={}", percent_encode(test)));
        }
        if self.reset {
            params.push("reset=1".to_owned());
        }
        if let Some(format) = &self.format {
            params.push(format!("format={}", percent_encode(format)));
        }
        if params.is_empty() {
            "/coverage".to_owned()
        } else {
            format!("/coverage?{}", params.join("&"))
        }
    }
}

/// Percent-encodes all but RFC 3986's unreserved characters.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Requests to one target.
#[derive(Debug, Clone)]
pub struct Client {
    target: Target,
    token: Option<String>,
    timeout: Duration,
    max_body: usize,
}

/// Default for [`Client::timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default for [`Client::max_body`]: 1 GiB.
pub const DEFAULT_MAX_BODY: usize = 1 << 30;

impl Client {
    pub fn new(target: Target) -> Client {
        Client { target, token: None, timeout: DEFAULT_TIMEOUT, max_body: DEFAULT_MAX_BODY }
    }

    /// The bearer token sent as `Authorization: Bearer` to TCP targets.
    pub fn token(mut self, token: Option<String>) -> Client {
        self.token = token;
        self
    }

    /// The time a request may take, from connecting to the end of the body.
    pub fn timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
        self
    }

    /// The largest response body accepted, in bytes.
    pub fn max_body(mut self, bytes: usize) -> Client {
        self.max_body = bytes;
        self
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// `GET /coverage?...`: the body of a 2xx answer, else an error.
    pub async fn coverage(&self, query: &CoverageQuery) -> Result<Response, ClientError> {
        self.checked(Method::GET, &query.path()).await
    }

    /// `GET /coverage?format=mapping`, naming the build mapping wanted
    /// (`Livecov-Mapping: id`): an agent serves its own, a sidecar the one
    /// of that id.
    pub async fn mapping(&self, id: &str) -> Result<Response, ClientError> {
        self.checked_with(Method::GET, "/coverage?format=mapping", Some(("livecov-mapping", id))).await
    }

    /// `POST /reset`; returns the instance that was reset, when it said.
    pub async fn reset(&self) -> Result<Option<String>, ClientError> {
        let r = self.checked(Method::POST, "/reset").await?;
        Ok(r.instance().map(str::to_owned))
    }

    /// `GET /health`: the instance's metadata (JSON).
    pub async fn health(&self) -> Result<Response, ClientError> {
        self.checked(Method::GET, "/health").await
    }

    /// A request whose answer must be 2xx.
    pub async fn checked(&self, method: Method, path: &str) -> Result<Response, ClientError> {
        self.checked_with(method, path, None).await
    }

    async fn checked_with(&self, method: Method, path: &str, header: Option<(&str, &str)>) -> Result<Response, ClientError> {
        let r = match tokio::time::timeout(self.timeout, self.request_unbounded(method, path, header)).await {
            Ok(r) => r?,
            Err(_) => return Err(ClientError::Timeout { target: self.target.to_string(), after: self.timeout }),
        };
        if r.status.is_success() {
            Ok(r)
        } else {
            Err(ClientError::Status {
                target: self.target.to_string(),
                path: path.to_owned(),
                status: r.status,
                message: error_message(&r.body),
                instance: r.instance().map(str::to_owned),
                token_sent: self.sends_token(),
            })
        }
    }

    fn sends_token(&self) -> bool {
        self.token.is_some() && matches!(self.target, Target::Http { .. })
    }

    /// One request, any status; bounded by the timeout and the body limit.
    pub async fn request(&self, method: Method, path: &str) -> Result<Response, ClientError> {
        match tokio::time::timeout(self.timeout, self.request_unbounded(method, path, None)).await {
            Ok(r) => r,
            Err(_) => Err(ClientError::Timeout { target: self.target.to_string(), after: self.timeout }),
        }
    }

    async fn request_unbounded(&self, method: Method, path: &str, header: Option<(&str, &str)>) -> Result<Response, ClientError> {
        let mut request = Request::builder().method(method);
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        let path = match &self.target {
            Target::Unix(_) => {
                request = request.header(HOST, "localhost");
                path.to_owned()
            }
            Target::Http { host, port, prefix } => {
                let host = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
                request = request.header(HOST, host);
                if let Some(token) = &self.token {
                    let value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                        ClientError::Usage("the token holds characters a header cannot carry (control characters?)".into())
                    })?;
                    request = request.header(AUTHORIZATION, value);
                }
                format!("{prefix}{path}")
            }
        };
        let request = request
            .uri(path)
            .header(CONTENT_LENGTH, "0")
            .body(Empty::<Bytes>::new())
            .map_err(|e| ClientError::Usage(format!("cannot build the request: {e}")))?;
        match &self.target {
            Target::Unix(socket) => {
                let stream = connect_unix(socket).await.map_err(|e| self.connect_error(e))?;
                self.exchange(stream, request).await
            }
            Target::Http { host, port, .. } => {
                let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await.map_err(|e| self.connect_error(e))?;
                let _ = stream.set_nodelay(true);
                self.exchange(stream, request).await
            }
        }
    }

    async fn exchange<S>(&self, stream: S, request: Request<Empty<Bytes>>) -> Result<Response, ClientError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        match exchange(stream, request, self.max_body).await {
            Ok((parts, body)) => Ok(Response { status: parts.status, headers: parts.headers, body }),
            Err(ExchangeError::Http(e)) => Err(ClientError::Protocol { target: self.target.to_string(), detail: e.to_string() }),
            Err(ExchangeError::TooLarge) => Err(ClientError::TooLarge { target: self.target.to_string(), limit: self.max_body }),
        }
    }

    fn connect_error(&self, e: std::io::Error) -> ClientError {
        use std::io::ErrorKind::*;
        let target = self.target.to_string();
        match (&self.target, e.kind()) {
            (Target::Unix(path), NotFound) => ClientError::NoSocket { path: path.clone() },
            (Target::Unix(path), PermissionDenied) => ClientError::PermissionDenied { path: path.clone() },
            (_, ConnectionRefused) => ClientError::Refused { target, unix: matches!(self.target, Target::Unix(_)) },
            _ => ClientError::Connect { target, source: e },
        }
    }
}

/// How [`exchange`] fails.
#[derive(Debug)]
pub enum ExchangeError {
    Http(hyper::Error),
    /// The answer's body is over the limit.
    TooLarge,
}

/// One HTTP/1 request over `stream`, and its answer with a body of at most
/// `max` bytes: how livecov's clients talk, to agents and sidecars and to
/// registries. The connection is driven here rather than spawned: nothing
/// outlives the request, and no runtime flavour is assumed.
pub async fn exchange<S, B>(stream: S, request: Request<B>, max: usize) -> Result<(hyper::http::response::Parts, Bytes), ExchangeError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(ExchangeError::Http)?;
    let exchange = async {
        let response = sender.send_request(request).await.map_err(ExchangeError::Http)?;
        let (parts, mut body) = response.into_parts();
        let declared = parts.headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max as u64) {
            return Err(ExchangeError::TooLarge);
        }
        let mut data = Vec::with_capacity(declared.map_or(0, |n| n as usize));
        while let Some(frame) = body.frame().await {
            if let Ok(chunk) = frame.map_err(ExchangeError::Http)?.into_data() {
                if data.len() + chunk.len() > max {
                    return Err(ExchangeError::TooLarge);
                }
                data.extend_from_slice(&chunk);
            }
        }
        Ok((parts, Bytes::from(data)))
    };
    let mut exchange = std::pin::pin!(exchange);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        biased;
        r = &mut exchange => r,
        // The connection ended (the peer closed it, or it failed): what it
        // delivered is still read, or its error reported.
        _ = &mut conn => exchange.await,
    }
}

/// The `error` of a JSON error body, else the body (shortened), if any.
fn error_message(body: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    if let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(text) {
        if let Some(serde_json::Value::String(e)) = map.get("error") {
            return Some(e.clone());
        }
    }
    Some(text.chars().take(300).collect())
}

/// Runs `future` on a fresh current-thread runtime (for the CLI).
pub fn block_on<F: Future>(future: F) -> std::io::Result<F::Output> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().enable_time().build()?;
    Ok(runtime.block_on(future))
}

/// Why a request failed, and what to do about it.
#[derive(Debug)]
pub enum ClientError {
    /// The socket file does not exist.
    NoSocket { path: PathBuf },
    /// The socket exists but cannot be opened (mode 0600, another user).
    PermissionDenied { path: PathBuf },
    /// Nothing listens: a socket left by a process that is gone, or a TCP port without the agent.
    Refused { target: String, unix: bool },
    Connect { target: String, source: std::io::Error },
    Timeout { target: String, after: Duration },
    /// The peer did not speak HTTP/1.1 as expected, or closed the connection early.
    Protocol { target: String, detail: String },
    TooLarge { target: String, limit: usize },
    /// A non-2xx answer.
    Status {
        target: String,
        path: String,
        status: StatusCode,
        message: Option<String>,
        instance: Option<String>,
        token_sent: bool,
    },
    /// A request that cannot be made as asked.
    Usage(String),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::NoSocket { path } => write!(
                f,
                "no socket at {}: is the process running, with LIVECOV_DIR set? Agents listen on \
                 $LIVECOV_DIR/sockets/<instance>.sock (ls that folder for the instances)",
                path.display()
            ),
            ClientError::PermissionDenied { path } => write!(
                f,
                "permission denied on {}: agent sockets are mode 0600; run livecov as the user \
                 of the process, or start the process with LIVECOV_SOCKET_MODE=0660 (or 0666)",
                path.display()
            ),
            ClientError::Refused { target, unix: true } => write!(
                f,
                "{target} refused the connection: is the process still running? A socket file \
                 stays behind when a process is killed (its last report is in $LIVECOV_DIR/reports/)"
            ),
            ClientError::Refused { target, unix: false } => write!(
                f,
                "{target} refused the connection: is the process running, with LIVECOV_LISTEN set \
                 to this address (and the port reachable from here)?"
            ),
            ClientError::Connect { target, source } => write!(f, "cannot connect to {target}: {source}"),
            ClientError::Timeout { target, after } => write!(
                f,
                "no complete answer from {target} within {}s: is the process stopped (SIGSTOP, a \
                 debugger) or overloaded? Raise --timeout for very large programs",
                after.as_secs_f64()
            ),
            ClientError::Protocol { target, detail } => write!(
                f,
                "{target} did not answer as a livecov agent ({detail}): is this the socket or \
                 port of a livecov agent or sidecar?"
            ),
            ClientError::TooLarge { target, limit } => write!(
                f,
                "the answer of {target} is larger than {} MiB: raise --max-size",
                limit.div_ceil(1 << 20)
            ),
            ClientError::Status { target, path, status, message, instance, token_sent } => {
                let from = match instance {
                    Some(i) => format!("{target} (instance {i})"),
                    None => target.clone(),
                };
                write!(f, "{from} answered {status} to {path}")?;
                if let Some(m) = message {
                    write!(f, ": {m}")?;
                }
                let advice = match (status.as_u16(), token_sent) {
                    (401, false) => {
                        "; send the target's LIVECOV_TOKEN (livecov dump and reset: --token or --token-file; \
                         collect and sidecar: --target-token or --target-token-file)"
                    }
                    (401, true) => {
                        "; the token was refused: compare the token given (--token of dump and reset, \
                         --target-token of collect and sidecar, or their -file forms) with the target's LIVECOV_TOKEN"
                    }
                    (400, _) => "; the query was refused: is the agent older than this livecov (unknown --format?)",
                    (404 | 405, _) => "; is this a livecov agent or sidecar, of a version that has this route?",
                    (503, _) => "; the agent is at its connection limit: retry shortly",
                    (413, _) => "; the request was too large",
                    _ => "",
                };
                f.write_str(advice)
            }
            ClientError::Usage(m) => f.write_str(m),
        }
    }
}

/// Connects to a Unix socket, also one deeper than a socket address holds
/// (agents bind those through their folder, and so does this).
async fn connect_unix(socket: &Path) -> std::io::Result<tokio::net::UnixStream> {
    let (address, _folder) = livecov::agent::connection::socket_address(socket)?;
    tokio::net::UnixStream::connect(address).await
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClientError::Connect { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Reads a token file: its first line, without surrounding whitespace.
/// The bearer token from a value or, failing that, a file (its first
/// line). An empty value, as `LIVECOV_TOKEN=` in the environment, is none.
pub fn resolve_token(token: Option<&String>, file: Option<&std::path::PathBuf>) -> anyhow::Result<Option<String>> {
    if let Some(t) = token.filter(|t| !t.is_empty()) {
        return Ok(Some(t.clone()));
    }
    let Some(path) = file.filter(|p| !p.as_os_str().is_empty()) else { return Ok(None) };
    let t = read_token_file(path).map_err(|e| anyhow::anyhow!("cannot read the token file {}: {e}", path.display()))?;
    if t.is_empty() {
        anyhow::bail!("the token file {} is empty", path.display());
    }
    Ok(Some(t))
}

pub fn read_token_file(path: &Path) -> std::io::Result<String> {
    let text = std::fs::read_to_string(path)?;
    Ok(text.lines().next().unwrap_or("").trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse() {
        assert_eq!("unix:/tmp/a.sock".parse(), Ok(Target::Unix("/tmp/a.sock".into())));
        assert_eq!("unix:///tmp/a".parse(), Ok(Target::Unix("/tmp/a".into())));
        assert_eq!("cov/sockets/x.sock".parse(), Ok(Target::Unix("cov/sockets/x.sock".into())));
        assert_eq!(
            "http://127.0.0.1:9464".parse(),
            Ok(Target::Http { host: "127.0.0.1".into(), port: 9464, prefix: String::new() })
        );
        assert_eq!(
            "http://cov.ns.svc:80/livecov/".parse(),
            Ok(Target::Http { host: "cov.ns.svc".into(), port: 80, prefix: "/livecov".into() })
        );
        assert_eq!("http://[::1]:9464".parse(), Ok(Target::Http { host: "::1".into(), port: 9464, prefix: String::new() }));
        assert_eq!("http://example".parse(), Ok(Target::Http { host: "example".into(), port: 80, prefix: String::new() }));
        for bad in ["", "localhost:9464", "http://:80", "http://h:0", "http://h:x", "http://::1:80", "unix:", "https://h:1", "/tmp/a"] {
            let e = bad.parse::<Target>().expect_err(bad);
            assert!(e.contains("http://") || e.contains("unix:"), "{bad}: {e}");
        }
        let t: Target = "http://[::1]:9464/p".parse().unwrap();
        assert_eq!(t.to_string(), "http://[::1]:9464/p");
    }

    #[test]
    fn coverage_queries_are_encoded() {
        assert_eq!(CoverageQuery::default().path(), "/coverage");
        let q = CoverageQuery { test: Some("login & logout/é".into()), reset: true, format: Some("json".into()) };
        assert_eq!(q.path(), "/coverage?test=login%20%26%20logout%2F%C3%A9&reset=1&format=json");
    }

    #[test]
    fn error_bodies_give_their_message() {
        assert_eq!(error_message(br#"{"error":"unknown format"}"#).as_deref(), Some("unknown format"));
        assert_eq!(error_message(b"plain").as_deref(), Some("plain"));
        assert_eq!(error_message(b"  "), None);
    }

    /// A one-shot server on a Unix socket that answers `reply` and hands back the request.
    fn serve_once(reply: &'static [u8]) -> (tempfile::TempDir, PathBuf, std::thread::JoinHandle<String>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let handle = answer_once(listener, reply);
        (dir, path, handle)
    }

    fn answer_once(listener: std::os::unix::net::UnixListener, reply: &'static [u8]) -> std::thread::JoinHandle<String> {
        use std::io::{Read, Write};
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                req.extend_from_slice(&buf[..n]);
            }
            let _ = s.write_all(reply);
            String::from_utf8_lossy(&req).into_owned()
        })
    }

    #[test]
    fn a_socket_deeper_than_a_socket_address_holds_is_reached() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("d".repeat(60)).join("e".repeat(60));
        std::fs::create_dir_all(&deep).unwrap();
        let (address, _folder) = livecov::agent::connection::socket_address(&deep.join("t.sock")).unwrap();
        let listener = std::os::unix::net::UnixListener::bind(address).unwrap();
        let server = answer_once(listener, b"HTTP/1.1 204 No Content\r\nlivecov-instance: i-1\r\n\r\n");
        let instance = block_on(Client::new(Target::Unix(deep.join("t.sock"))).reset()).unwrap().unwrap();
        assert_eq!(instance.as_deref(), Some("i-1"));
        assert!(server.join().unwrap().starts_with("POST /reset"));
    }

    #[test]
    fn a_response_is_read_with_its_instance() {
        let (_dir, path, server) =
            serve_once(b"HTTP/1.1 200 OK\r\nlivecov-instance: rust-1-ab\r\ncontent-length: 5\r\n\r\nSF:x\n");
        let client = Client::new(Target::Unix(path)).token(Some("secret".into()));
        let r = block_on(client.coverage(&CoverageQuery { test: Some("t".into()), ..Default::default() })).unwrap().unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.instance(), Some("rust-1-ab"));
        assert_eq!(&r.body[..], b"SF:x\n");
        let request = server.join().unwrap();
        assert!(request.starts_with("GET /coverage?test=t HTTP/1.1\r\n"), "{request}");
        assert!(!request.to_ascii_lowercase().contains("authorization"), "a token went to a Unix socket: {request}");
    }

    #[test]
    fn a_body_over_the_limit_is_refused() {
        let (_dir, path, _server) = serve_once(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n");
        let client = Client::new(Target::Unix(path)).max_body(10);
        let e = block_on(client.coverage(&CoverageQuery::default())).unwrap().unwrap_err();
        assert!(matches!(e, ClientError::TooLarge { .. }), "{e}");
        // Without a length: counted as it comes (connection closes the body).
        let (_dir, path, _server) = serve_once(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n0123456789abcdef");
        let client = Client::new(Target::Unix(path)).max_body(10);
        let e = block_on(client.coverage(&CoverageQuery::default())).unwrap().unwrap_err();
        assert!(matches!(e, ClientError::TooLarge { .. }), "{e}");
        assert!(e.to_string().contains("--max-size"), "{e}");
    }

    #[test]
    fn errors_say_what_to_do() {
        let (_dir, path, _server) = serve_once(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 24\r\n\r\n{\"error\":\"unauthorized\"}");
        let e = block_on(Client::new(Target::Unix(path)).reset()).unwrap().unwrap_err();
        let text = e.to_string();
        assert!(text.contains("401") && text.contains("unauthorized") && text.contains("--token"), "{text}");

        let dir = tempfile::tempdir().unwrap();
        let e = block_on(Client::new(Target::Unix(dir.path().join("none.sock"))).reset()).unwrap().unwrap_err();
        assert!(matches!(e, ClientError::NoSocket { .. }) && e.to_string().contains("is the process running"), "{e}");

        // A socket file that nobody listens on any more.
        let dead = dir.path().join("dead.sock");
        drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
        let e = block_on(Client::new(Target::Unix(dead)).reset()).unwrap().unwrap_err();
        assert!(matches!(e, ClientError::Refused { .. }) && e.to_string().contains("still running"), "{e}");

        // Not HTTP.
        let (_dir, path, _server) = serve_once(b"SSH-2.0-OpenSSH\r\n");
        let e = block_on(Client::new(Target::Unix(path)).reset()).unwrap().unwrap_err();
        assert!(matches!(e, ClientError::Protocol { .. }), "{e}");
    }

    #[test]
    fn a_silent_target_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("silent.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let client = Client::new(Target::Unix(path)).timeout(Duration::from_millis(200));
        let start = std::time::Instant::now();
        let e = block_on(client.reset()).unwrap().unwrap_err();
        assert!(matches!(e, ClientError::Timeout { .. }), "{e}");
        assert!(start.elapsed() < Duration::from_secs(5));
        drop(listener);
    }

    #[test]
    fn a_token_goes_to_tcp_targets() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                req.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 204 No Content\r\nlivecov-instance: i\r\n\r\n").unwrap();
            String::from_utf8(req).unwrap()
        });
        let target: Target = format!("http://127.0.0.1:{port}/base").parse().unwrap();
        let instance = block_on(Client::new(target).token(Some("s3cret".into())).reset()).unwrap().unwrap();
        assert_eq!(instance.as_deref(), Some("i"));
        let req = server.join().unwrap();
        assert!(req.starts_with("POST /base/reset HTTP/1.1\r\n"), "{req}");
        assert!(req.to_ascii_lowercase().contains("authorization: bearer s3cret\r\n"), "{req}");
        assert!(req.to_ascii_lowercase().contains(&format!("host: 127.0.0.1:{port}\r\n")), "{req}");
    }
}
