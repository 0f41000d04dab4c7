//! Connection plumbing shared by the agent's server and `livecov sidecar`:
//! accepting on a Unix socket and TCP at once, refusing over the connection
//! limit, idle detection per connection, the bearer-token check, and the
//! address of a Unix socket deeper than a socket address holds.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::header::HeaderValue;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

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

/// A connection from either listener.
pub enum Accepted {
    Unix(tokio::net::UnixStream),
    Tcp(tokio::net::TcpStream),
}

/// The next connection from either listener; `None` once `shutdown`
/// changes. Failed accepts are skipped, after a pause when the failure is
/// not about that one connection (EMFILE and the like: no spinning).
pub async fn next_connection(
    unix: Option<&tokio::net::UnixListener>,
    tcp: Option<&tokio::net::TcpListener>,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
) -> Option<Accepted> {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => return None,
            r = accept_unix(unix) => r.map(Accepted::Unix),
            r = accept_tcp(tcp) => r.map(Accepted::Tcp),
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
pub fn refuse(stream: &Accepted, instance: &[u8]) {
    let body = br#"{"error":"too many connections"}"#;
    let mut msg = Vec::with_capacity(256);
    msg.extend_from_slice(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nlivecov-instance: ");
    msg.extend_from_slice(instance);
    msg.extend_from_slice(format!("\r\nconnection: close\r\ncontent-length: {}\r\n\r\n", body.len()).as_bytes());
    msg.extend_from_slice(body);
    let _ = match stream {
        Accepted::Unix(s) => s.try_write(&msg),
        Accepted::Tcp(s) => s.try_write(&msg),
    };
}

async fn accept_unix(l: Option<&tokio::net::UnixListener>) -> io::Result<tokio::net::UnixStream> {
    match l {
        Some(l) => l.accept().await.map(|(s, _)| {
            widen_send_buffer(&s);
            s
        }),
        None => std::future::pending().await,
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

async fn accept_tcp(l: Option<&tokio::net::TcpListener>) -> io::Result<tokio::net::TcpStream> {
    match l {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

/// Per-connection activity, for the idle timeout.
pub struct ConnState {
    start: Instant,
    /// Milliseconds since `start` of the last byte read or written.
    last_io: AtomicU64,
    /// Requests being handled (between the head and the response).
    busy: AtomicUsize,
}

impl ConnState {
    pub fn new() -> Arc<ConnState> {
        Arc::new(ConnState { start: Instant::now(), last_io: AtomicU64::new(0), busy: AtomicUsize::new(0) })
    }

    fn touch(&self) {
        self.last_io.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

pub struct BusyGuard(Arc<ConnState>);

impl BusyGuard {
    pub fn new(state: &Arc<ConnState>) -> BusyGuard {
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

/// A stream that records when bytes last moved.
pub struct Tracked<S> {
    inner: S,
    state: Arc<ConnState>,
}

impl<S> Tracked<S> {
    pub fn new(inner: S, state: Arc<ConnState>) -> Self {
        Tracked { inner, state }
    }
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
pub async fn idle_expired(state: &ConnState, idle: Duration) {
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
