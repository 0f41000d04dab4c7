//! Connection plumbing shared by the agent's server and `livecov sidecar`:
//! accepting on a Unix socket and TCP at once, idle detection per
//! connection, and the bearer-token check.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::header::HeaderValue;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection from either listener.
pub enum Accepted {
    Unix(tokio::net::UnixStream),
    Tcp(tokio::net::TcpStream),
}

pub async fn accept_unix(l: Option<&tokio::net::UnixListener>) -> io::Result<tokio::net::UnixStream> {
    match l {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

pub async fn accept_tcp(l: Option<&tokio::net::TcpListener>) -> io::Result<tokio::net::TcpStream> {
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
