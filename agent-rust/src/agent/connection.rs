//! The HTTP surface shared by the agent's server and `livecov sidecar`:
//! the loop that accepts on a Unix socket and TCP at once and serves each
//! connection ([`serve`]), refusing over the connection limit, idle
//! detection per connection, the bearer-token check, and the address of a
//! Unix socket deeper than a socket address holds. Each side brings its
//! own routes.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{watch, Semaphore};

use super::descriptors::{self, Listed};

/// The longest path a Unix socket address holds (108 bytes with the NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// The address to bind or connect the Unix socket `path` by: the path
/// itself, or, deeper than [`MAX_SOCKET_PATH`], the same file reached
/// through the descriptor of its folder (`/proc/self/fd/N/<name>`), valid
/// while the returned folder stays open.
pub fn socket_address(path: &Path) -> io::Result<(PathBuf, Option<std::fs::File>)> {
    if path.as_os_str().len() <= MAX_SOCKET_PATH {
        return Ok((path.to_owned(), None));
    }
    let (Some(folder), Some(name)) = (path.parent(), path.file_name()) else {
        return Ok((path.to_owned(), None));
    };
    let folder = std::fs::File::open(if folder.as_os_str().is_empty() { Path::new(".") } else { folder })?;
    let mut short = PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&folder)));
    short.push(name);
    Ok((short, Some(folder)))
}

/// The header of every response that names who answered it.
const INSTANCE_HEADER: &str = "livecov-instance";

/// How long open connections get to finish once the server is told to
/// stop.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// What a server built on [`serve`] is.
pub struct Surface {
    pub http: hyper::server::conn::http1::Builder,
    /// A permit per open connection, all free when [`serve`] starts; with
    /// none left, a connection is answered `503` and closed.
    pub permits: Arc<Semaphore>,
    /// The `Livecov-Instance` of every response.
    pub instance: HeaderValue,
    /// A connection with no request being answered and no byte moved for
    /// this long is closed.
    pub idle_timeout: Duration,
    /// Whether each connection is listed while it is open (see
    /// [`descriptors::accept_listed`]): the agent's, in a program whose
    /// forked children close them.
    pub listed: bool,
}

/// Serves the connections of both listeners until `shutdown` changes,
/// each request by `handle(request, over_tcp)`, which must not panic (each
/// side catches its own: the agent where it polls, the sidecar in a task).
/// Every response gets `Livecov-Instance` and `Cache-Control: no-store`.
/// Once stopped, the listeners close at once and open connections finish
/// their request within `STOP_GRACE`.
pub async fn serve<H, F, B>(
    surface: Surface,
    unix: Option<tokio::net::UnixListener>,
    tcp: Option<tokio::net::TcpListener>,
    mut shutdown: watch::Receiver<bool>,
    handle: H,
) where
    H: Fn(Request<Incoming>, bool) -> F + Clone + Send + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let max = surface.permits.available_permits();
    let surface = Arc::new(surface);
    while let Some(stream) = next_connection(unix.as_ref(), tcp.as_ref(), surface.listed, &mut shutdown).await {
        let Ok(permit) = surface.permits.clone().try_acquire_owned() else {
            refuse(&stream, surface.instance.as_bytes());
            continue;
        };
        let (surface, handle, shutdown) = (surface.clone(), handle.clone(), shutdown.clone());
        tokio::spawn(async move {
            match stream {
                Accepted::Unix(listed, s) => connection(&surface, (listed, s), false, shutdown, handle).await,
                Accepted::Tcp(listed, s) => {
                    let _ = s.set_nodelay(true);
                    connection(&surface, (listed, s), true, shutdown, handle).await
                }
            }
            drop(permit);
        });
    }
    drop(unix);
    drop(tcp);
    let _ = tokio::time::timeout(STOP_GRACE + Duration::from_millis(200), surface.permits.acquire_many(max as u32)).await;
}

async fn connection<S, H, F, B>(
    surface: &Surface,
    (listed, stream): (Option<Listed>, S),
    tcp: bool,
    mut shutdown: watch::Receiver<bool>,
    handle: H,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Incoming>, bool) -> F + Send + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let state = ConnState::new();
    let io = TokioIo::new(Tracked { _listed: listed, inner: stream, state: state.clone() });
    let (svc_state, instance) = (state.clone(), surface.instance.clone());
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let busy = BusyGuard::new(&svc_state);
        let answer = handle(req, tcp);
        let instance = instance.clone();
        async move {
            let mut resp = answer.await;
            let h = resp.headers_mut();
            h.insert(INSTANCE_HEADER, instance);
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            drop(busy);
            Ok::<_, Infallible>(resp)
        }
    });
    let conn = surface.http.serve_connection(io, svc);
    tokio::pin!(conn);
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        let grace = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = conn.as_mut() => break,
            // Dropping the connection closes it.
            _ = idle_expired(&state, surface.idle_timeout) => break,
            _ = grace => break,
            _ = shutdown.changed(), if deadline.is_none() => {
                conn.as_mut().graceful_shutdown();
                deadline = Some(tokio::time::Instant::now() + STOP_GRACE);
            }
        }
    }
}

/// A connection from either listener, after its place on the list of open
/// connections, which it leaves before it is closed (see [`Listed`]).
enum Accepted {
    Unix(Option<Listed>, tokio::net::UnixStream),
    Tcp(Option<Listed>, tokio::net::TcpStream),
}

/// The next connection from either listener; `None` once `shutdown`
/// changes. Failed accepts are skipped, after a pause when the failure is
/// not about that one connection (EMFILE and the like: no spinning).
async fn next_connection(
    unix: Option<&tokio::net::UnixListener>,
    tcp: Option<&tokio::net::TcpListener>,
    listed: bool,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
) -> Option<Accepted> {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return None,
            r = accept_unix(unix, listed) => r.map(|(l, s)| Accepted::Unix(l, s)),
            r = accept_tcp(tcp, listed) => r.map(|(l, s)| Accepted::Tcp(l, s)),
        };
        match accepted {
            Ok(stream) => return Some(stream),
            Err(e) => {
                use io::ErrorKind::*;
                if !matches!(e.kind(), ConnectionAborted | ConnectionReset | Interrupted | WouldBlock) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// Over the connection limit: a best-effort `503` in one non-blocking
/// write; the caller then drops (closes) the stream.
fn refuse(stream: &Accepted, instance: &[u8]) {
    let body = br#"{"error":"too many connections"}"#;
    let mut msg = Vec::with_capacity(256);
    msg.extend_from_slice(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nlivecov-instance: ");
    msg.extend_from_slice(instance);
    msg.extend_from_slice(format!("\r\nconnection: close\r\ncontent-length: {}\r\n\r\n", body.len()).as_bytes());
    msg.extend_from_slice(body);
    let _ = match stream {
        Accepted::Unix(_, s) => s.try_write(&msg),
        Accepted::Tcp(_, s) => s.try_write(&msg),
    };
}

async fn accept_unix(l: Option<&tokio::net::UnixListener>, listed: bool) -> io::Result<(Option<Listed>, tokio::net::UnixStream)> {
    match l {
        Some(l) => std::future::poll_fn(|cx| accept(listed, || l.poll_accept(cx).map_ok(|(s, _)| s))).await.map(|(l, s)| {
            widen_send_buffer(&s);
            (l, s)
        }),
        None => std::future::pending().await,
    }
}

/// `poll_accept`, the connection it accepted listed when `listed` (see
/// [`Surface::listed`]).
fn accept<S: std::os::fd::AsRawFd>(
    listed: bool,
    poll_accept: impl FnOnce() -> Poll<io::Result<S>>,
) -> Poll<io::Result<(Option<Listed>, S)>> {
    match listed {
        true => descriptors::accept_listed(poll_accept).map_ok(|(s, l)| (Some(l), s)),
        false => poll_accept().map_ok(|s| (None, s)),
    }
}

/// Asks for a send buffer a report fits in (the kernel caps it at
/// `net.core.wmem_max`, and takes the memory only as it is written): with
/// the default 208 KiB, a report of a few MiB made the agent's thread wait
/// for the reader about ten times, each a switch to another task and back
/// (on redis under load, 0.3 ms of a 4 ms dump).
fn widen_send_buffer(stream: &tokio::net::UnixStream) {
    use std::os::fd::AsRawFd;
    const REPORT_BYTES: libc::c_int = 4 << 20;
    // Safety: an option of a socket this function borrows, from a value
    // of the size given. A refusal leaves the default, which works.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&REPORT_BYTES as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

async fn accept_tcp(l: Option<&tokio::net::TcpListener>, listed: bool) -> io::Result<(Option<Listed>, tokio::net::TcpStream)> {
    match l {
        Some(l) => std::future::poll_fn(|cx| accept(listed, || l.poll_accept(cx).map_ok(|(s, _)| s))).await,
        None => std::future::pending().await,
    }
}

/// Per-connection activity, for the idle timeout.
struct ConnState {
    start: Instant,
    /// Milliseconds since `start` of the last byte read or written.
    last_io: AtomicU64,
    /// Requests being handled (between the head and the response).
    busy: AtomicUsize,
}

impl ConnState {
    fn new() -> Arc<ConnState> {
        Arc::new(ConnState { start: Instant::now(), last_io: AtomicU64::new(0), busy: AtomicUsize::new(0) })
    }

    fn touch(&self) {
        self.last_io.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

struct BusyGuard(Arc<ConnState>);

impl BusyGuard {
    fn new(state: &Arc<ConnState>) -> BusyGuard {
        state.busy.fetch_add(1, Ordering::Relaxed);
        BusyGuard(state.clone())
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// A stream that records when bytes last moved; after its place on the
/// list of open connections, which it leaves first when dropped.
struct Tracked<S> {
    _listed: Option<Listed>,
    inner: S,
    state: Arc<ConnState>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.state.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.state.touch();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.state.touch();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Resolves when the connection has been idle (no request being handled, no
/// byte moved) for `idle`.
async fn idle_expired(state: &ConnState, idle: Duration) {
    loop {
        let now = state.start.elapsed();
        let last = Duration::from_millis(state.last_io.load(Ordering::Relaxed));
        let due = last.saturating_add(idle);
        if state.busy.load(Ordering::Relaxed) == 0 && now >= due {
            return;
        }
        let wait = if now >= due { idle } else { due - now };
        tokio::time::sleep(wait.max(Duration::from_millis(10))).await;
    }
}

/// `Authorization: Bearer <token>`, the token compared in constant time.
pub fn authorized(value: Option<&HeaderValue>, token: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    let Some(value) = value else { return false };
    let value = value.as_bytes();
    let Some(space) = value.iter().position(|&b| b == b' ') else { return false };
    let (scheme, rest) = value.split_at(space);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return false;
    }
    let given = trim_spaces(rest);
    bool::from(given.ct_eq(token))
}

fn trim_spaces(mut b: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = b {
        b = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = b {
        b = rest;
    }
    b
}
