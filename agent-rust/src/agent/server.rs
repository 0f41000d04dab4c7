//! The agent's HTTP/1.1 server: the routes of the livecov protocol over a
//! Unix socket and, optionally, TCP.
//!
//! It runs inside someone else's process, so it keeps to itself:
//!
//! - one thread of its own (`livecov-agent`) running a current-thread tokio
//!   runtime; the [`Service`] calls, which may be slow or take locks, run on
//!   tokio's blocking pool (at most [`MAX_BLOCKING_THREADS`] threads), never
//!   on a host thread. The exception is an LCOV dump whose engine no other
//!   thread holds: [`Service::coverage_at_once`] computes it on the runtime
//!   thread, two thread wake-ups fewer (see there);
//! - no panic crosses into the host: every [`Service`] call and every request
//!   handler runs under `catch_unwind`, and a panic becomes a `500`. (With a
//!   host built with `panic = "abort"` nothing can catch a panic; the server
//!   avoids panicking paths itself.)
//! - bounded resources: at most [`Limits::max_connections`] connections
//!   (extra ones are accepted, answered `503` with one non-blocking write and
//!   closed: they never wait), a bounded request head (size and header count,
//!   `431` beyond), a header read timeout, an idle timeout, request bodies
//!   read only by `POST /reset` and only up to [`MAX_BODY_BYTES`] (`413`
//!   beyond), and a request timeout on every [`Service`] call.
//!
//! # Routes
//!
//! The same on the Unix socket and on TCP:
//!
//! | request | response |
//! |---|---|
//! | `GET /coverage[?test=NAME&reset=1&format=lcov\|profraw\|json\|counters\|mapping]` | `200`, the [`Body`] the service returned (and `Livecov-Mapping` when it names one), with `Server-Timing: report;dur=MS` |
//! | `POST /reset` | `204` |
//! | `GET /health` | `200 application/json` |
//! | any other path | `404` |
//! | another method on a known path | `405` with `Allow` |
//!
//! Every response carries `Livecov-Instance: <instance>` and
//! `Cache-Control: no-store`; errors are `{"error": "..."}` with
//! `Content-Type: application/json`. On TCP, when a token is configured,
//! every route requires `Authorization: Bearer <token>` (compared in
//! constant time), else `401` with `WWW-Authenticate: Bearer`. The Unix
//! socket needs no token: its file mode protects it.
//!
//! The exception: a request hyper cannot parse at all (garbage bytes, a head
//! over its read buffer, a header timeout) is answered by hyper itself with a bare
//! `400`/`431` (or the connection is closed), without `Livecov-Instance` nor
//! a JSON body, since such a request never reaches the router.
//!
//! # Single flight
//!
//! Concurrent `GET /coverage` requests with the same `test` and `format` that
//! arrive while one such computation is running share its result: one call
//! to [`Service::coverage`] serves them all. Requests with `reset=1` are
//! never shared, neither with plain dumps nor with each other: each is its
//! own dump-and-reset, so that two callers who both take (and zero) the
//! counters get disjoint parts, and summing their reports counts nothing
//! twice.

use super::connection::{authorized, socket_address, Surface, MAX_SOCKET_PATH};
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use http_body_util::{BodyExt, Limited};
use hyper::body::{Buf, Bytes, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioTimer;
use tokio::sync::{watch, Semaphore};

/// The largest request body read (by `POST /reset`, which ignores it);
/// larger bodies get `413`.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Threads of the blocking pool that runs [`Service`] calls. More concurrent
/// calls queue (each still bounded by [`Limits::request_timeout`]).
pub const MAX_BLOCKING_THREADS: usize = 4;

/// Name of the header naming the build mapping of `format=counters` and
/// `format=mapping` answers (`crate::fleet`).
pub const MAPPING_HEADER: &str = "livecov-mapping";

/// The header saying how long the agent took to make a report, before
/// sending it: `report;dur=1.234` (milliseconds, as the W3C Server Timing
/// header has them). What a client measures beyond it is the transfer and
/// the client's own time, which the agent cannot make shorter.
pub const TIMING_HEADER: &str = "server-timing";

/// The value of [`TIMING_HEADER`] for a report made in `took` (the
/// agent's and the sidecar's).
pub fn timing(took: Duration) -> String {
    format!("report;dur={:.3}", took.as_secs_f64() * 1e3)
}

/// The time a [`TIMING_HEADER`] value says a report took, if it says one.
pub fn report_time(timing: &str) -> Option<Duration> {
    let ms: f64 = timing.trim().strip_prefix("report;dur=")?.parse().ok()?;
    Duration::try_from_secs_f64(ms / 1e3).ok()
}

/// A report format, from `?format=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Format {
    /// LCOV tracefile (`text/plain`), the default.
    #[default]
    Lcov,
    /// A raw profile (`.profraw`) that the matching `llvm-profdata` reads.
    Profraw,
    /// JSON.
    Json,
    /// The counters, compact (gzip), for an exact merge (`crate::fleet`).
    Counters,
    /// The build mapping (gzip) the counters go with (`crate::fleet`).
    Mapping,
    /// llvm-cov's JSON export (`llvm-cov export -format=text`).
    LlvmJson,
}

impl Format {
    /// The valid `format=` values, for error messages.
    pub const VALID: &'static str = "lcov, profraw, json, counters, mapping, llvm-json";

    /// Parses a `format=` value (exact, lower case).
    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "lcov" => Some(Format::Lcov),
            "profraw" => Some(Format::Profraw),
            "json" => Some(Format::Json),
            "counters" => Some(Format::Counters),
            "mapping" => Some(Format::Mapping),
            "llvm-json" => Some(Format::LlvmJson),
            _ => None,
        }
    }

    /// The `format=` value naming this format.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Lcov => "lcov",
            Format::Profraw => "profraw",
            Format::Json => "json",
            Format::Counters => "counters",
            Format::LlvmJson => "llvm-json",
            Format::Mapping => "mapping",
        }
    }
}

/// What `GET /coverage` asked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct CoverageQuery {
    /// `?test=NAME` (percent-decoded; `+` is a space): the LCOV `TN:` name.
    /// `None` when absent or empty. Never contains control characters
    /// (such a name is refused with `400`).
    pub test: Option<String>,
    /// `?reset=1|true`: dump and reset in one step.
    pub reset: bool,
    /// `?format=` (default [`Format::Lcov`]).
    pub format: Format,
}

/// A response body and its content type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Body {
    /// E.g. `text/plain; charset=utf-8`. Must be a valid header value, else
    /// the response is a `500`.
    pub content_type: &'static str,
    pub bytes: Chunks,
    /// Sent as `Livecov-Mapping`: the build mapping the body goes with.
    pub mapping: Option<String>,
}

/// A body in shared chunks, sent one after the other. A report is the
/// records of its files, which the agent keeps from dump to dump: an answer
/// sends them as they are, and copies none (a report is megabytes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chunks(Vec<Bytes>);

impl Chunks {
    pub fn push(&mut self, chunk: Bytes) {
        if !chunk.is_empty() {
            self.0.push(chunk);
        }
    }

    /// The chunks, to be written one after the other.
    pub fn slices(&self) -> Vec<&[u8]> {
        self.0.iter().map(|b| &b[..]).collect()
    }

    /// The chunks in one text (a report is UTF-8; anything else is shown
    /// lossily).
    pub fn text(&self) -> String {
        String::from_utf8(self.0.concat()).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }
}

impl From<Bytes> for Chunks {
    fn from(bytes: Bytes) -> Chunks {
        let mut chunks = Chunks::default();
        chunks.push(bytes);
        chunks
    }
}

impl From<Vec<u8>> for Chunks {
    fn from(bytes: Vec<u8>) -> Chunks {
        Bytes::from(bytes).into()
    }
}

impl From<String> for Chunks {
    fn from(text: String) -> Chunks {
        Bytes::from(text).into()
    }
}

/// [`Chunks`] as a response body, with its length known (`Content-Length`),
/// in one frame.
struct ResponseBody(Option<ChunksBuf>);

impl hyper::body::Body for ResponseBody {
    type Data = ChunksBuf;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<ChunksBuf>, Infallible>>> {
        Poll::Ready(self.get_mut().0.take().map(|chunks| Ok(Frame::data(chunks))))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.0.as_ref().map_or(0, |c| c.remaining as u64))
    }
}

impl From<Chunks> for ResponseBody {
    fn from(chunks: Chunks) -> ResponseBody {
        let remaining = chunks.0.iter().map(|b| b.len()).sum();
        ResponseBody((remaining > 0).then(|| ChunksBuf { chunks: chunks.0.into(), remaining, answered: None }))
    }
}

/// The chunks of a body not yet written, as one [`Buf`]: hyper queues the
/// frame of a whole report and writes up to 64 of its chunks per `writev`
/// (its `chunks_vectored`). A frame per chunk made it write each time 17
/// KiB were queued (its buffer size, which also bounds a request's head):
/// 50 `writev` calls for redis's report of 1.8 MB in 201 records. Written
/// here: `bytes` chains two buffers, not a list (hyper's own list is
/// private).
struct ChunksBuf {
    /// None empty.
    chunks: std::collections::VecDeque<Bytes>,
    remaining: usize,
    /// Set once hyper drops the buffer, which it does as soon as its last
    /// bytes are written (see [`Service::after_answers`]).
    answered: Option<Arc<AtomicBool>>,
}

impl Drop for ChunksBuf {
    fn drop(&mut self) {
        if let Some(answered) = &self.answered {
            answered.store(true, Ordering::Relaxed);
        }
    }
}

impl Buf for ChunksBuf {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.chunks.front().map_or(&[], |b| &b[..])
    }

    fn advance(&mut self, mut count: usize) {
        while count > 0 {
            let Some(front) = self.chunks.front_mut() else { break };
            let n = count.min(front.len());
            front.advance(n);
            (self.remaining, count) = (self.remaining - n, count - n);
            if front.is_empty() {
                self.chunks.pop_front();
            }
        }
    }

    fn chunks_vectored<'a>(&'a self, slices: &mut [io::IoSlice<'a>]) -> usize {
        let mut n = 0;
        for (slice, chunk) in slices.iter_mut().zip(&self.chunks) {
            *slice = io::IoSlice::new(chunk);
            n += 1;
        }
        n
    }
}

/// An error response: `status` (4xx/5xx) with the JSON body
/// `{"error": message}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into() }
    }

    /// A `500 Internal Server Error`.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, message)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.message)
    }
}

impl std::error::Error for ApiError {}

/// What the server serves; the agent core implements it.
///
/// Every method is called on a thread of tokio's blocking pool (never on a
/// host thread), but [`Self::coverage_at_once`], [`Self::answer_sent`] and
/// [`Self::after_answers`], called on the server's runtime thread; all
/// under `catch_unwind`: a panic becomes a `500` (or, after answers, is
/// let go).
pub trait Service: Send + Sync + 'static {
    /// Blocking: called on a blocking thread (`tokio::task::spawn_blocking`),
    /// may take long. Concurrent identical queries without `reset` are
    /// coalesced by the server (single flight); implementations must still
    /// be safe to call concurrently (different queries, resets).
    fn coverage(&self, query: &CoverageQuery) -> Result<Body, ApiError>;
    /// [`Self::coverage`] on the server's own thread, for an answer that
    /// waits for nothing (no lock another thread holds): `None` for any
    /// other, which the server then asks of `coverage` on the blocking
    /// pool. A dump of a millisecond handed to another thread and back
    /// cost two wake-ups on a busy CPU, and its report was sent from
    /// another CPU's cache than the one that wrote it (on redis under
    /// traffic, 14% of the agent's CPU time per dump). The server answers
    /// nothing else meanwhile (the requests wait in the socket's queue),
    /// and `request_timeout` does not bound it.
    fn coverage_at_once(&self, _query: &CoverageQuery) -> Option<Result<Body, ApiError>> {
        None
    }
    /// Called on the server's thread when it is about to wait, once a
    /// `/coverage` answer was sent (or given up) since the last call: for
    /// work that would delay the answer if done before it, and that the
    /// rest of its connection does not undo.
    fn answer_sent(&self) {}
    /// Called on the server's thread when it goes idle with no connection
    /// open, once a `/coverage` answer was sent since the last call: for
    /// work that would delay answers if done sooner. Ending a connection
    /// runs code too (reading its end, dropping its state), and a client
    /// that keeps its connection delays the call until it closes it.
    fn after_answers(&self) {}
    /// Resets the counters (`POST /reset`).
    fn reset(&self) -> Result<(), ApiError>;
    /// The `GET /health` JSON document.
    fn health(&self) -> String;
    /// The instance id, sent as `Livecov-Instance` on every response. Called
    /// once, by [`Server::start`] (an instance id never changes for the life
    /// of a process; a forked child runs a server of its own).
    fn instance(&self) -> String;
}

/// Where to listen.
#[derive(Debug, Clone, Default)]
pub struct Listen {
    /// A Unix socket path and the socket file's mode (e.g. `0o600`). A stale
    /// socket at that path is replaced; any other kind of file there is an
    /// error (`AddrInUse`).
    pub unix: Option<(PathBuf, u32)>,
    /// A TCP address; port 0 picks a free port ([`Server::tcp_addr`]).
    pub tcp: Option<SocketAddr>,
    /// Bearer token required on TCP (not on the Unix socket). `None` or an
    /// empty token: no authentication.
    pub token: Option<String>,
}

/// Resource limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Concurrent connections, over both listeners. Extra connections are
    /// accepted, answered `503` (one non-blocking write) and closed at once;
    /// they never wait. At least 1.
    pub max_connections: usize,
    /// A request head (request line and headers) must arrive within this,
    /// counted from the moment the server waits for it: after connecting, and
    /// after the previous response on a kept-alive connection, so it also
    /// bounds how long an idle kept-alive connection is kept.
    pub header_read_timeout: Duration,
    /// A connection is closed when no byte moved either way for this long
    /// while no request is being handled: idle kept-alive connections, and
    /// clients that stopped reading their response.
    pub idle_timeout: Duration,
    /// Maximum size of a request head in bytes (`431` beyond).
    pub max_header_bytes: usize,
    /// Maximum number of request headers (`431` beyond).
    pub max_headers: usize,
    /// Maximum time of one request's handling: reading a `POST /reset` body
    /// (`408` beyond) and waiting for a [`Service`] call (`503` beyond; the
    /// call itself cannot be cancelled and finishes in the background).
    pub request_timeout: Duration,
}

impl Limits {
    /// Values the server can use without overflow or panics: at least one
    /// connection, durations of at most a year, hyper's 8 KiB floor being
    /// applied to the read buffer only.
    fn sanitized(self) -> Limits {
        const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);
        Limits {
            max_connections: self.max_connections.clamp(1, 1 << 20),
            header_read_timeout: self.header_read_timeout.min(YEAR),
            idle_timeout: self.idle_timeout.min(YEAR),
            max_header_bytes: self.max_header_bytes,
            max_headers: self.max_headers,
            request_timeout: self.request_timeout.min(YEAR),
        }
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 256,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            max_header_bytes: 16 * 1024,
            max_headers: 64,
            request_timeout: Duration::from_secs(120),
        }
    }
}

/// A running server. [`Server::stop`] (or dropping it) stops it.
///
/// After `fork()`, the child has no server thread: it must not stop or drop
/// the parent's `Server` (use `std::mem::forget`) and starts its own.
pub struct Server {
    shutdown: Option<watch::Sender<bool>>,
    thread: Option<JoinHandle<()>>,
    tcp_addr: Option<SocketAddr>,
    /// The socket file, and its (device, inode) to remove only our own.
    unix: Option<(PathBuf, (u64, u64))>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("tcp_addr", &self.tcp_addr)
            .field("unix", &self.unix.as_ref().map(|u| &u.0))
            .finish()
    }
}

impl Server {
    /// Binds (replacing a stale socket file first; the socket file gets the
    /// given mode without ever being more open than that, whatever the
    /// umask), starts the thread, returns once listening. TCP port 0 is
    /// allowed: [`Server::tcp_addr`] tells the bound address.
    ///
    /// Errors: nothing to listen on (`InvalidInput`), an instance id that is
    /// not a valid header value (`InvalidInput`), binding or thread errors.
    pub fn start(service: Arc<dyn Service>, listen: Listen, limits: Limits) -> io::Result<Server> {
        if listen.unix.is_none() && listen.tcp.is_none() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "livecov: nothing to listen on"));
        }
        let instance = catch_unwind(AssertUnwindSafe(|| service.instance()))
            .map_err(|_| io::Error::other("livecov: Service::instance panicked"))?;
        let instance = HeaderValue::from_str(&instance).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("livecov: instance id {instance:?} is not a valid header value"))
        })?;

        let tcp = match listen.tcp {
            Some(addr) => {
                let l = super::descriptors::moved_up(std::net::TcpListener::bind(addr)?);
                l.set_nonblocking(true)?;
                Some(l)
            }
            None => None,
        };
        let tcp_addr = tcp.as_ref().map(|l| l.local_addr()).transpose()?;
        let (unix, unix_file) = match &listen.unix {
            Some((path, mode)) => {
                let (l, id) = bind_unix(path, *mode)?;
                (Some(l), Some((path.clone(), id)))
            }
            None => (None, None),
        };
        let token = listen.token.filter(|t| !t.is_empty()).map(String::into_bytes);
        let limits = limits.sanitized();
        let ctx = Arc::new(Ctx {
            service,
            instance,
            token,
            flights: Arc::new(Mutex::new(HashMap::new())),
            permits: Arc::new(Semaphore::new(limits.max_connections)),
            limits,
            answered: Arc::new(AtomicBool::new(false)),
            answered_since_idle: AtomicBool::new(false),
        });
        let started = spawn(ctx, unix, tcp);
        match started {
            Ok((shutdown, thread)) => Ok(Server { shutdown: Some(shutdown), thread: Some(thread), tcp_addr, unix: unix_file }),
            Err(e) => {
                if let Some((path, id)) = unix_file {
                    remove_socket_file(&path, id);
                }
                Err(e)
            }
        }
    }

    /// The bound TCP address, if listening on TCP.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp_addr
    }

    /// The Unix socket path, if listening on one.
    pub fn unix_path(&self) -> Option<&Path> {
        self.unix.as_ref().map(|(p, _)| p.as_path())
    }

    /// Stops accepting, lets in-flight requests finish for a short grace
    /// period (2 s), removes the socket file, joins the thread.
    pub fn stop(mut self) {
        self.shutdown_now();
    }

    fn shutdown_now(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some((path, id)) = self.unix.take() {
            remove_socket_file(&path, id);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown_now();
    }
}

/// A server's runtime, and the server it is for, once it has one (its
/// thread, idle, gives back what the last work left: [`Ctx::before_idle`]).
type Runtime = (tokio::runtime::Runtime, Arc<std::sync::OnceLock<Arc<Ctx>>>);

/// A runtime built ahead ([`prebuild_runtime`]), for the next [`spawn`].
static PREBUILT: Mutex<Option<Runtime>> = Mutex::new(None);

/// Builds a server's runtime, its descriptors listed as the agent's.
fn build_runtime() -> io::Result<Runtime> {
    let free = super::descriptors::next_free();
    let server: Arc<std::sync::OnceLock<Arc<Ctx>>> = Arc::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .thread_name("livecov-agent-blocking")
        .on_thread_start(|| {
            super::descriptors::mark_agent_thread();
            super::threads::ask_for_short_slices();
        })
        .on_thread_park({
            let server = server.clone();
            move || server.get().iter().for_each(|ctx| ctx.before_idle())
        })
        .build()?;
    super::descriptors::keep_runtime_descriptors(&free);
    Ok((runtime, server))
}

/// Builds the next server's runtime now, holding the numbers programs use
/// ([`super::descriptors::hold_program_numbers`]), so that its `epoll` and
/// `eventfd` are past them: only where no thread of the program runs (the
/// C shim's constructor, before `main`; a start before the program made a
/// thread). Built on the agent's thread, with `main` running, they took
/// the lowest numbers free, and a `dup2` of the program's onto them
/// stopped the agent's server.
pub fn prebuild_runtime() {
    let _held = super::descriptors::hold_program_numbers();
    if let Ok(runtime) = build_runtime() {
        *lock(&PREBUILT) = Some(runtime);
    }
}

/// In a forked child: a runtime built ahead and not taken is the parent's
/// (its threads are not in the child, and its `epoll` is shared with the
/// parent's), forgotten without a drop, which would wait for them.
pub fn forget_prebuilt_in_child() {
    if let Ok(mut prebuilt) = PREBUILT.try_lock() {
        std::mem::forget(prebuilt.take());
    }
}

/// Starts the runtime thread on bound listeners; returns once it serves.
fn spawn(
    ctx: Arc<Ctx>,
    unix: Option<std::os::unix::net::UnixListener>,
    tcp: Option<std::net::TcpListener>,
) -> io::Result<(watch::Sender<bool>, JoinHandle<()>)> {
    // Not waited for: in a child forked while the parent's agent took it,
    // the lock stays held.
    let prebuilt = PREBUILT.try_lock().ok().and_then(|mut prebuilt| prebuilt.take());
    let (runtime, server) = match prebuilt {
        Some(runtime) => runtime,
        None => build_runtime()?,
    };
    let _ = server.set(ctx.clone());
    unix.iter().for_each(|l| super::descriptors::keep(std::os::fd::AsRawFd::as_raw_fd(l)));
    tcp.iter().for_each(|l| super::descriptors::keep(std::os::fd::AsRawFd::as_raw_fd(l)));
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<io::Result<()>>();
    let thread = super::threads::spawn("livecov-agent", move || {
        super::threads::ask_for_short_slices();
        let run = AssertUnwindSafe(|| {
            runtime.block_on(async move {
                // Registering with the reactor needs the runtime's context.
                let listeners = (|| -> io::Result<_> {
                    let unix = unix.map(tokio::net::UnixListener::from_std).transpose()?;
                    let tcp = tcp.map(tokio::net::TcpListener::from_std).transpose()?;
                    Ok((unix, tcp))
                })();
                match listeners {
                    Ok((unix, tcp)) => {
                        let _ = ready_tx.send(Ok(()));
                        serve(ctx, unix, tcp, shutdown_rx).await;
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
        });
        let _ = catch_unwind(run);
        // Service calls still running past the grace period finish on
        // their own; nothing waits for them.
        runtime.shutdown_background();
    })?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok((shutdown_tx, thread)),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => {
            let _ = thread.join();
            Err(io::Error::other("livecov: the server thread failed to start"))
        }
    }
}

/// Binds a Unix socket at `path` with file mode `mode`. The socket is given
/// the mode before it is bound, and the kernel makes the file with it (less
/// the umask), so the socket is never reachable with a wider mode (the
/// umask is process-wide and cannot be changed safely in a multi-threaded
/// host); then chmod gives the file exactly `mode`. (Bound in a private
/// folder made for it and renamed into place, the folder's `mkdir` and
/// `rmdir` were two fifths of the time a forked child waited for its
/// agent.) A stale socket at `path` is replaced. Returns the listener and
/// the socket file's (device, inode).
fn bind_unix(path: &Path, mode: u32) -> io::Result<(std::os::unix::net::UnixListener, (u64, u64))> {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;

    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)?, // stale
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("livecov: {} exists and is not a socket", path.display()),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // By hand, not `UnixListener::bind`: the mode is set between the
    // socket and its bind, which std cannot do (socket2 can, but would be
    // one more dependency in the lock files of the programs the agent is
    // built into). A deeper LIVECOV_DIR than a socket address holds is
    // reached through the folder's descriptor.
    let (address, _folder) = socket_address(path)?;
    // Safety: a zeroed sockaddr_un is valid; the path is copied in with
    // room for its NUL (checked), and the address is passed with its size.
    let mut un: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    un.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = address.as_os_str().as_bytes();
    if bytes.len() >= un.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "the socket path {} is longer than the {MAX_SOCKET_PATH} bytes a Unix socket address holds: \
                 use a shorter LIVECOV_DIR",
                path.display()
            ),
        ));
    }
    for (to, &from) in un.sun_path.iter_mut().zip(bytes) {
        *to = from as libc::c_char;
    }
    // Safety: a new socket of our own, owned by `socket` from here on.
    let socket = unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        super::descriptors::moved_up(OwnedFd::from_raw_fd(fd))
    };
    use std::os::fd::AsRawFd;
    let fd = socket.as_raw_fd();
    let size = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // Safety: calls on our own socket, with an address of the size given.
    if unsafe { libc::fchmod(fd, (mode & 0o7777) as libc::mode_t) != 0 || libc::bind(fd, (&raw const un).cast(), size) != 0 } {
        return Err(io::Error::last_os_error());
    }
    let listener = std::os::unix::net::UnixListener::from(socket);
    let made = (|| {
        // Safety: listen on our own bound socket.
        if unsafe { libc::listen(fd, libc::SOMAXCONN) } != 0 {
            return Err(io::Error::last_os_error());
        }
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o7777))?;
        listener.set_nonblocking(true)?;
        std::fs::symlink_metadata(path)
    })();
    match made {
        Ok(m) => Ok((listener, (m.dev(), m.ino()))),
        Err(e) => {
            let _ = std::fs::remove_file(path);
            Err(e)
        }
    }
}

/// Removes the socket file if it is still the one we bound.
fn remove_socket_file(path: &Path, id: (u64, u64)) {
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if (m.dev(), m.ino()) == id {
            let _ = std::fs::remove_file(path);
        }
    }
}

// ---------------------------------------------------------------------------
// The runtime side.

/// A dump's content type, body and build mapping id.
type Outcome = Result<(&'static str, Chunks, Option<String>), ApiError>;
type Flights = Arc<Mutex<HashMap<(Option<String>, Format), watch::Receiver<Option<Outcome>>>>>;

struct Ctx {
    service: Arc<dyn Service>,
    instance: HeaderValue,
    token: Option<Vec<u8>>,
    flights: Flights,
    limits: Limits,
    /// One per connection open (at most `limits.max_connections`).
    permits: Arc<Semaphore>,
    /// A `/coverage` answer was sent since the last
    /// [`Service::answer_sent`].
    answered: Arc<AtomicBool>,
    /// One was since the last [`Service::after_answers`].
    answered_since_idle: AtomicBool,
}

impl Ctx {
    /// Before the server's thread waits for work: the service's
    /// [`Service::answer_sent`] and [`Service::after_answers`], if due.
    fn before_idle(&self) {
        if self.answered.swap(false, Ordering::Relaxed) {
            let _ = catch_unwind(AssertUnwindSafe(|| self.service.answer_sent()));
            self.answered_since_idle.store(true, Ordering::Relaxed);
        }
        let open = self.limits.max_connections - self.permits.available_permits();
        if open == 0 && self.answered_since_idle.swap(false, Ordering::Relaxed) {
            let _ = catch_unwind(AssertUnwindSafe(|| self.service.after_answers()));
        }
    }
}

async fn serve(
    ctx: Arc<Ctx>,
    unix: Option<tokio::net::UnixListener>,
    tcp: Option<tokio::net::TcpListener>,
    shutdown: watch::Receiver<bool>,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(ctx.limits.header_read_timeout)
        // The read buffer bounds what hyper holds of a head (`431` beyond;
        // hyper's minimum is 8192, it panics below). The exact limits are
        // checked on the parsed head by `head_over_limits`: hyper 1.1, the
        // oldest the agent builds with (services lock it), has no
        // `max_header_size` nor `max_headers`.
        .max_buf_size(ctx.limits.max_header_bytes.saturating_add(1024).max(8192))
        .keep_alive(true);
    let surface = Surface {
        http,
        permits: ctx.permits.clone(),
        instance: ctx.instance.clone(),
        idle_timeout: ctx.limits.idle_timeout,
        listed: true,
    };
    super::connection::serve(surface, unix, tcp, shutdown, move |req, tcp| {
        let answer = CatchUnwind { inner: Box::pin(handle(ctx.clone(), tcp, req)) };
        async move { answer.await.unwrap_or_else(|()| error(&ApiError::internal("internal error in the livecov agent"))) }
    })
    .await
}

/// Runs a future, turning a panic while polling it into `Err(())`.
struct CatchUnwind<F> {
    inner: Pin<Box<F>>,
}

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, ()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.get_mut().inner.as_mut();
        match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(_) => Poll::Ready(Err(())),
        }
    }
}

type Resp = Response<ResponseBody>;

const ROUTES: &str = "GET /coverage, POST /reset, GET /health";

async fn handle(ctx: Arc<Ctx>, tcp: bool, req: Request<Incoming>) -> Resp {
    if let Some(e) = head_over_limits(&req, &ctx.limits) {
        return error(&e);
    }
    if tcp {
        if let Some(token) = &ctx.token {
            if !authorized(req.headers().get(header::AUTHORIZATION), token) {
                let mut r = error(&ApiError::new(401, "missing or wrong bearer token (Authorization: Bearer <token>)"));
                r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                return r;
            }
        }
    }
    let path = req.uri().path();
    let (allow, allow_str) = match path {
        "/coverage" | "/health" => (Method::GET, "GET"),
        "/reset" => (Method::POST, "POST"),
        _ => {
            let msg = format!("no route {} (routes: {ROUTES})", clip(path));
            return error(&ApiError::new(404, msg));
        }
    };
    if req.method() != allow {
        let msg = format!("method {} not allowed on {path} (allowed: {allow})", clip(req.method().as_str()));
        let mut r = error(&ApiError::new(405, msg));
        r.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allow_str));
        return r;
    }
    let result = match path {
        "/coverage" => match parse_query(req.uri().query()) {
            Ok(q) => {
                let started = std::time::Instant::now();
                let outcome = coverage(&ctx, q).await;
                let took = timing(started.elapsed());
                let mut answered = Some(ctx.answered.clone());
                let result = outcome.map(|(ct, bytes, mapping)| {
                    let mut r = ok(StatusCode::OK, ct, bytes);
                    // A body is written in parts: it tells when its last
                    // bytes are.
                    if let Some(body) = &mut r.body_mut().0 {
                        body.answered = answered.take();
                    }
                    if let Some(v) = mapping.and_then(|m| HeaderValue::from_str(&m).ok()) {
                        r.headers_mut().insert(MAPPING_HEADER, v);
                    }
                    if let Ok(v) = HeaderValue::from_str(&took) {
                        r.headers_mut().insert(TIMING_HEADER, v);
                    }
                    r
                });
                // An error or an empty body goes in one write.
                if let Some(answered) = answered {
                    answered.store(true, Ordering::Relaxed);
                }
                result
            }
            Err(e) => Err(e),
        },
        "/health" => {
            let svc = ctx.service.clone();
            blocking(&ctx, "health", move || Ok(svc.health()))
                .await
                .map(|doc| ok(StatusCode::OK, "application/json", Bytes::from(doc)))
        }
        _ => match read_body(&ctx, req.into_body()).await {
            Err(mut r) => {
                r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
                return r;
            }
            Ok(()) => {
                let svc = ctx.service.clone();
                blocking(&ctx, "reset", move || svc.reset())
                    .await
                    .map(|()| ok(StatusCode::NO_CONTENT, "", Bytes::new()))
            }
        },
    };
    result.unwrap_or_else(|e| error(&e))
}

/// `431` for a head with more than [`Limits::max_headers`] headers or over
/// [`Limits::max_header_bytes`], counted as sent up to optional whitespace:
/// the request line, each `name: value` line and the blank line.
fn head_over_limits<B>(req: &Request<B>, limits: &Limits) -> Option<ApiError> {
    let headers = req.headers();
    if headers.len() > limits.max_headers {
        return Some(ApiError::new(431, format!("more than {} request headers", limits.max_headers)));
    }
    let uri = req.uri();
    let target = uri.scheme_str().map_or(0, |s| s.len() + "://".len())
        + uri.authority().map_or(0, |a| a.as_str().len())
        + uri.path_and_query().map_or(0, |p| p.as_str().len());
    let line = req.method().as_str().len() + " ".len() + target + " HTTP/1.1\r\n".len();
    let fields: usize = headers.iter().map(|(k, v)| k.as_str().len() + ": ".len() + v.len() + "\r\n".len()).sum();
    let size = line + fields + "\r\n".len();
    (size > limits.max_header_bytes)
        .then(|| ApiError::new(431, format!("request head over {} bytes", limits.max_header_bytes)))
}

/// Reads (and discards) a request body of at most [`MAX_BODY_BYTES`].
async fn read_body(ctx: &Ctx, body: Incoming) -> Result<(), Resp> {
    use hyper::body::Body as _;
    if body.size_hint().lower() > MAX_BODY_BYTES as u64 {
        return Err(error(&ApiError::new(413, format!("request body over {MAX_BODY_BYTES} bytes"))));
    }
    match tokio::time::timeout(ctx.limits.request_timeout, Limited::new(body, MAX_BODY_BYTES).collect()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            Err(error(&ApiError::new(413, format!("request body over {MAX_BODY_BYTES} bytes"))))
        }
        Ok(Err(e)) => Err(error(&ApiError::new(400, format!("could not read the request body: {e}")))),
        Err(_) => Err(error(&ApiError::new(408, "request body not received in time"))),
    }
}

/// Runs a [`Service`] call on the blocking pool under `catch_unwind`,
/// waiting at most [`Limits::request_timeout`].
async fn blocking<T, F>(ctx: &Ctx, what: &'static str, f: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ApiError> + Send + 'static,
{
    let task = tokio::task::spawn_blocking(move || guarded(what, f));
    match tokio::time::timeout(ctx.limits.request_timeout, task).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(ApiError::new(503, "the livecov agent is shutting down")),
        Err(_) => Err(timed_out(what, ctx.limits.request_timeout)),
    }
}

fn guarded<T>(what: &'static str, f: impl FnOnce() -> Result<T, ApiError>) -> Result<T, ApiError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| Err(ApiError::internal(format!("{what} failed: the livecov agent panicked"))))
}

fn timed_out(what: &str, after: Duration) -> ApiError {
    ApiError::new(503, format!("{what} did not finish within {} ms", after.as_millis()))
}

/// `GET /coverage`, with single flight for queries without `reset`.
async fn coverage(ctx: &Arc<Ctx>, q: CoverageQuery) -> Outcome {
    let convert = |b: Body| (b.content_type, b.bytes, b.mapping);
    if q.reset {
        let svc = ctx.service.clone();
        return blocking(ctx, "coverage", move || svc.coverage(&q).map(convert)).await;
    }
    let key = (q.test.clone(), q.format);
    let (mut rx, started) = {
        let mut map = lock(&ctx.flights);
        match map.get(&key) {
            Some(rx) => (rx.clone(), None),
            None => {
                let (tx, rx) = watch::channel(None);
                map.insert(key.clone(), rx.clone());
                (rx.clone(), Some((tx, rx)))
            }
        }
    };
    // Started once the map is unlocked: the thread that computes may run
    // at once, and the first thing it would do with a quick answer is to
    // lock the map, held by this thread it just took the CPU from.
    if let Some((tx, mine)) = started {
        let (svc, flights, key) = (ctx.service.clone(), ctx.flights.clone(), key.clone());
        // The computation owns its map entry: it ends it whether or not
        // the requests that wait for it are still there.
        let answer = move |out: Outcome| {
            remove_flight(&flights, &key, &mine);
            drop(mine);
            let _ = tx.send(Some(out));
        };
        match guarded("coverage", || svc.coverage_at_once(&q).transpose()) {
            Ok(Some(body)) => answer(Ok(convert(body))),
            Err(e) => answer(Err(e)),
            Ok(None) => {
                tokio::task::spawn_blocking(move || answer(guarded("coverage", || svc.coverage(&q).map(convert))));
            }
        }
    }
    let waited = tokio::time::timeout(ctx.limits.request_timeout, async {
        rx.wait_for(Option::is_some).await.map(|v| v.clone()).ok().flatten()
    })
    .await;
    match waited {
        Ok(Some(out)) => out,
        Ok(None) => {
            // The computation was dropped without an answer (runtime
            // shutting down): never leave a dead entry behind.
            remove_flight(&ctx.flights, &key, &rx);
            Err(ApiError::new(503, "the livecov agent is shutting down"))
        }
        Err(_) => Err(timed_out("coverage", ctx.limits.request_timeout)),
    }
}

fn remove_flight(flights: &Flights, key: &(Option<String>, Format), rx: &watch::Receiver<Option<Outcome>>) {
    let mut map = lock(flights);
    if map.get(key).is_some_and(|r| r.same_channel(rx)) {
        map.remove(key);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Parses the query of `GET /coverage`. Unknown, repeated or invalid
/// parameters are refused (`400`) so that a typo never goes unnoticed.
pub fn parse_query(query: Option<&str>) -> Result<CoverageQuery, ApiError> {
    let bad = |msg: String| ApiError::new(400, msg);
    let mut out = CoverageQuery::default();
    let mut seen: [bool; 3] = [false; 3];
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (k, v) = (percent_decode(k)?, percent_decode(v)?);
        let slot = match k.as_str() {
            "test" => 0,
            "reset" => 1,
            "format" => 2,
            _ => return Err(bad(format!("unknown query parameter {} (valid: test, reset, format)", json_clip(&k)))),
        };
        if std::mem::replace(&mut seen[slot], true) {
            return Err(bad(format!("query parameter {k} given more than once")));
        }
        match slot {
            0 => {
                if v.chars().any(char::is_control) {
                    return Err(bad("test name must not contain control characters".into()));
                }
                out.test = (!v.is_empty()).then_some(v);
            }
            1 => {
                out.reset = match v.as_str() {
                    "1" | "true" => true,
                    "0" | "false" => false,
                    _ => return Err(bad(format!("invalid reset value {} (valid: 1, true, 0, false)", json_clip(&v)))),
                }
            }
            _ => {
                out.format = Format::parse(&v).ok_or_else(|| {
                    bad(format!("invalid format {} (valid: {})", json_clip(&v), Format::VALID))
                })?;
            }
        }
    }
    if out.format == Format::Mapping && out.reset {
        return Err(bad("format=mapping is not a dump: reset does not apply to it".into()));
    }
    Ok(out)
}

/// Decodes `%XX` escapes and `+` (a space), then UTF-8.
fn percent_decode(s: &str) -> Result<String, ApiError> {
    fn hex(b: u8) -> Option<u8> {
        match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            b'A'..=b'F' => Some(b - b'A' + 10),
            _ => None,
        }
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' => {
                let v = b.get(i + 1).copied().and_then(hex).zip(b.get(i + 2).copied().and_then(hex));
                let Some((hi, lo)) = v else {
                    return Err(ApiError::new(400, "invalid percent-encoding in the query"));
                };
                out.push(hi << 4 | lo);
                i += 3;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| ApiError::new(400, "the query is not UTF-8 once percent-decoded"))
}

/// A client-given string for an error message: quoted, at most 100 chars.
fn json_clip(s: &str) -> String {
    format!("{:?}", clip(s))
}

fn clip(s: &str) -> &str {
    match s.char_indices().nth(100) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn ok(status: StatusCode, content_type: &'static str, bytes: impl Into<Chunks>) -> Resp {
    let mut r = Response::new(ResponseBody::from(bytes.into()));
    *r.status_mut() = status;
    if status != StatusCode::NO_CONTENT {
        match HeaderValue::from_str(content_type) {
            Ok(v) => {
                r.headers_mut().insert(header::CONTENT_TYPE, v);
            }
            Err(_) => return error(&ApiError::internal(format!("invalid content type {content_type:?}"))),
        }
    }
    r
}

/// The JSON error response `{"error": message}`.
fn error(e: &ApiError) -> Resp {
    let status = StatusCode::from_u16(e.status)
        .ok()
        .filter(|s| s.is_client_error() || s.is_server_error())
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut body = String::with_capacity(e.message.len() + 16);
    body.push_str("{\"error\":");
    json_string(&mut body, &e.message);
    body.push('}');
    let mut r = Response::new(ResponseBody::from(Chunks::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn json_string(out: &mut String, s: &str) {
    use std::fmt::Write as _;
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a `writev` of `slots` buffers would send of `buf` now.
    fn vectored(buf: &ChunksBuf, slots: usize) -> Vec<u8> {
        let mut slices = vec![io::IoSlice::new(&[]); slots];
        let n = buf.chunks_vectored(&mut slices);
        slices[..n].iter().flat_map(|s| s.iter().copied()).collect()
    }

    #[test]
    fn a_body_is_written_in_parts_as_the_socket_takes_them() {
        let mut chunks = Chunks::default();
        for part in ["ab", "", "cde", "f"] {
            chunks.push(Bytes::from(part));
        }
        let ResponseBody(Some(mut buf)) = ResponseBody::from(chunks) else { panic!("a body of 6 bytes") };
        assert_eq!((buf.remaining(), buf.chunk()), (6, &b"ab"[..]));
        assert_eq!(vectored(&buf, 64), b"abcdef");
        // A write that took part of a chunk, then one that ended another.
        buf.advance(1);
        assert_eq!((buf.remaining(), vectored(&buf, 2)), (5, b"bcde".to_vec()));
        buf.advance(3);
        assert_eq!((buf.remaining(), buf.chunk(), vectored(&buf, 64)), (2, &b"e"[..], b"ef".to_vec()));
        // More than is left ends it, as a whole write would.
        buf.advance(10);
        assert_eq!((buf.remaining(), buf.chunk(), vectored(&buf, 64)), (0, &b""[..], Vec::new()));
        assert!(ResponseBody::from(Chunks::default()).0.is_none());
    }

    #[test]
    fn a_socket_deeper_than_a_socket_address_holds_is_bound_through_its_folder() {
        let dir = std::env::temp_dir().join(format!("livecov-{}-{}", std::process::id(), "d".repeat(100)));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.sock");
        assert!(path.as_os_str().len() > MAX_SOCKET_PATH);
        let (listener, id) = bind_unix(&path, 0o600).unwrap();
        let m = std::fs::symlink_metadata(&path).unwrap();
        assert!(m.file_type().is_socket() && m.permissions().mode() & 0o777 == 0o600);
        assert_eq!((m.dev(), m.ino()), id);
        // A client reaches it the same way.
        let (address, _folder) = socket_address(&path).unwrap();
        std::os::unix::net::UnixStream::connect(address).unwrap();
        drop(listener);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_socket_has_its_mode_and_replaces_a_stale_one_not_another_file() {
        let dir = std::env::temp_dir().join(format!("livecov-bind-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.sock");
        for mode in [0o600, 0o660, 0o666] {
            // The last one's socket, left behind (stale), is replaced.
            let (listener, id) = bind_unix(&path, mode).unwrap();
            let m = std::fs::symlink_metadata(&path).unwrap();
            assert!(m.file_type().is_socket(), "{mode:o}");
            assert_eq!((m.permissions().mode() & 0o7777, (m.dev(), m.ino())), (mode, id));
            std::os::unix::net::UnixStream::connect(&path).unwrap();
            drop(listener);
        }
        let file = dir.join("file");
        std::fs::write(&file, "program").unwrap();
        assert_eq!(bind_unix(&file, 0o600).unwrap_err().kind(), io::ErrorKind::AddrInUse);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "program");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn query_parsing() {
        let q = parse_query(Some("test=a%20b+c&reset=true&format=json")).unwrap();
        assert_eq!(q, CoverageQuery { test: Some("a b c".into()), reset: true, format: Format::Json });
        assert_eq!(parse_query(None).unwrap(), CoverageQuery::default());
        assert_eq!(parse_query(Some("test=&reset=0")).unwrap(), CoverageQuery::default());
        let e = parse_query(Some("format=xml")).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("lcov, profraw, json"), "{}", e.message);
        for bad in ["reset=yes", "rest=1", "test=a%0Ab", "test=%zz", "test=%ff", "test=a&test=b"] {
            assert_eq!(parse_query(Some(bad)).unwrap_err().status, 400, "{bad}");
        }
    }

    #[test]
    fn a_report_time_is_read_as_it_was_written() {
        let took = report_time(&timing(Duration::from_micros(1_234_567))).expect("a time");
        assert_eq!(took, Duration::from_micros(1_234_567));
        assert_eq!(report_time(" report;dur=0.5 "), Some(Duration::from_micros(500)));
        for other in ["", "report", "report;dur=", "report;dur=-1", "report;dur=NaN", "report;dur=inf", "cache;dur=1", "report;desc=x"] {
            assert_eq!(report_time(other), None, "{other:?}");
        }
    }

    #[test]
    fn bearer() {
        let h = |s: &'static str| HeaderValue::from_static(s);
        assert!(authorized(Some(&h("Bearer s3cret")), b"s3cret"));
        assert!(authorized(Some(&h("bearer  s3cret ")), b"s3cret"));
        assert!(!authorized(Some(&h("Bearer s3cre")), b"s3cret"));
        assert!(!authorized(Some(&h("Basic s3cret")), b"s3cret"));
        assert!(!authorized(Some(&h("Bearer")), b"s3cret"));
        assert!(!authorized(None, b"s3cret"));
    }

    #[test]
    fn json_errors() {
        let r = error(&ApiError::new(400, "x"));
        assert_eq!(r.status(), 400);
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        let mut s = String::new();
        json_string(&mut s, "a \"b\"\n\u{1}\\");
        assert_eq!(s, r#""a \"b\"\n\u0001\\""#);
        assert_eq!(error(&ApiError::new(200, "x")).status(), 500);
    }
}
