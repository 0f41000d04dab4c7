"""The livecov protocol over HTTP/1.1, on a Unix socket and optionally TCP.

It runs inside someone else's process, with the standard library only, and
keeps to itself:

- one accept thread (a selector over the listeners and a wake-up pipe, so
  closing is immediate) and one daemon thread per connection, each
  blocking the program's asynchronous signals (_threads.py), at most
  MAX_CONNECTIONS of them: a connection over the limit is answered 503 in one
  non-blocking write and closed;
- bounded requests: a head of at most MAX_HEAD_BYTES and MAX_HEADERS headers
  (431 beyond), a body of at most MAX_BODY_BYTES (413), a head or body that
  does not arrive within READ_TIMEOUT (408, or a silent close of an idle
  kept-alive connection), and REQUEST_TIMEOUT for the engine's answer (503);
- no exception ever leaves a thread of its own: a failing request is a JSON
  error, a failing connection is closed.

Routes, as every livecov agent serves them:

    GET  /coverage[?test=NAME&reset=1&format=lcov|json]   200
    POST /reset                                            204
    GET  /health                                           200 application/json

Every response carries Livecov-Instance and Cache-Control: no-store; errors
are {"error": "..."} with a 4xx/5xx status. On TCP, when a token is
configured, every route wants `Authorization: Bearer <token>` (compared with
hmac.compare_digest), else 401. The Unix socket needs none: its file mode
protects it.
"""

from __future__ import annotations

import hmac
import json
import os
import selectors
import socket
import stat
import sys
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus

from . import _threads
from ._stderr import complain

MAX_HEAD_BYTES = 16 * 1024
MAX_HEADERS = 64
MAX_BODY_BYTES = 64 * 1024
MAX_CONNECTIONS = 64
# A request head (or body) must arrive within this; it is also how long an
# idle kept-alive connection is kept.
READ_TIMEOUT = 10.0
# A client that does not read its response for this long is dropped.
WRITE_TIMEOUT = 30.0
# The longest wait for the engine's answer to one request.
REQUEST_TIMEOUT = 120.0

ROUTES = "GET /coverage, POST /reset, GET /health"
FORMATS = "lcov, json"


class ApiError(Exception):
    """An error response: `status` with the body {"error": message}."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Query:
    """What GET /coverage asked for."""

    test: str | None = None
    reset: bool = False
    format: str = "lcov"


def parse_query(query: str) -> Query:
    """The query of GET /coverage. Unknown, repeated or invalid parameters
    are refused (400), so that a typo never goes unnoticed."""
    values: dict[str, str] = {}
    for pair in filter(None, query.split("&")):
        key, _, value = pair.partition("=")
        key, value = _percent_decode(key), _percent_decode(value)
        if key not in ("test", "reset", "format"):
            raise ApiError(400, f"unknown query parameter {_clip(key)!r} (valid: test, reset, format)")
        if key in values:
            raise ApiError(400, f"query parameter {key} given more than once")
        values[key] = value
    test = values.get("test") or None
    if test is not None and any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in test):
        raise ApiError(400, "test name must not contain control characters")
    reset = values.get("reset", "0")
    if reset not in ("1", "true", "0", "false"):
        raise ApiError(400, f"invalid reset value {_clip(reset)!r} (valid: 1, true, 0, false)")
    fmt = values.get("format", "lcov")
    if fmt == "profraw":
        raise ApiError(400, "format profraw is the raw profile of LLVM-instrumented programs; "
                            f"a Python process serves {FORMATS}")
    if fmt not in ("lcov", "json"):
        raise ApiError(400, f"invalid format {_clip(fmt)!r} (valid: {FORMATS})")
    return Query(test=test, reset=reset in ("1", "true"), format=fmt)


def _percent_decode(text: str) -> str:
    """%XX escapes and + (a space), then UTF-8; a bad escape is a 400."""
    raw = text.replace("+", " ").encode("latin-1")
    out = bytearray()
    i = 0
    while i < len(raw):
        if raw[i] == 0x25:  # %
            digits = raw[i + 1 : i + 3]
            if len(digits) != 2 or not all(d in b"0123456789abcdefABCDEF" for d in digits):
                raise ApiError(400, "invalid percent-encoding in the query")
            out.append(int(digits, 16))
            i += 3
        else:
            out.append(raw[i])
            i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "the query is not UTF-8 once percent-decoded") from None


def _clip(text: str) -> str:
    return text[:100]


def authorized(value: str | None, token: bytes) -> bool:
    """`Authorization: Bearer <token>`, the token compared in constant time."""
    if value is None:
        return False
    scheme, sep, rest = value.partition(" ")
    if not sep or scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(rest.strip(" \t").encode("latin-1"), token)


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]
    keep_alive: bool


class _Closed(Exception):
    """The client went away (or stayed idle) between requests."""


def read_request(sock: socket.socket, buf: bytearray) -> Request:
    """Reads one request from `sock` (bytes already read in `buf`, which keeps
    what follows the request). Raises ApiError for a bad request, _Closed when
    the connection ends before one starts."""
    while True:
        while buf[:2] == b"\r\n":  # stray line ends between requests
            del buf[:2]
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            break
        if len(buf) > MAX_HEAD_BYTES:
            raise ApiError(431, f"request head over {MAX_HEAD_BYTES} bytes")
        chunk = _recv(sock, bool(buf), "request head")
        buf += chunk
    if end > MAX_HEAD_BYTES:
        raise ApiError(431, f"request head over {MAX_HEAD_BYTES} bytes")
    lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
    del buf[: end + 4]
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1] or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
        raise ApiError(400, "malformed request line")
    if len(lines) - 1 > MAX_HEADERS:
        raise ApiError(431, f"more than {MAX_HEADERS} request headers")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or any(c in name for c in " \t\"(),/;<=>?@[\\]{}"):
            raise ApiError(400, "malformed request header")
        name = name.lower()
        value = value.strip(" \t")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    connection = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    if parts[2] == "HTTP/1.1":
        keep_alive = "close" not in connection
    else:
        keep_alive = "keep-alive" in connection
    if "transfer-encoding" in headers:
        raise ApiError(400, "chunked request bodies are not supported: send Content-Length")
    length_text = headers.get("content-length", "0")
    if not length_text.isdigit():
        raise ApiError(400, "invalid Content-Length")
    length = int(length_text)
    if length > MAX_BODY_BYTES:
        raise ApiError(413, f"request body over {MAX_BODY_BYTES} bytes")
    # Every route ignores the body; it is read only to keep the connection usable.
    while len(buf) < length:
        buf += _recv(sock, True, "request body")
    del buf[:length]
    return Request(parts[0], parts[1], headers, keep_alive)


def _recv(sock: socket.socket, started: bool, what: str) -> bytes:
    try:
        chunk = sock.recv(65536)
    except TimeoutError:
        if started:
            raise ApiError(408, f"{what} not received in time") from None
        raise _Closed from None
    if not chunk:
        if started:
            raise ApiError(400, f"connection closed in the middle of the {what}")
        raise _Closed
    return chunk


def response(
    status: int,
    instance: str,
    content_type: str = "",
    body: bytes = b"",
    keep_alive: bool = False,
    extra: tuple[tuple[str, str], ...] = (),
) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Error"
    head = [f"HTTP/1.1 {status} {reason}"]
    if status != 204:
        head.append(f"content-type: {content_type}")
        head.append(f"content-length: {len(body)}")
    head.append(f"livecov-instance: {instance}")
    head.append("cache-control: no-store")
    head.append("connection: " + ("keep-alive" if keep_alive else "close"))
    head.extend(f"{name}: {value}" for name, value in extra)
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def timing(started: float) -> tuple[str, str]:
    """The Server-Timing header of a report made since `started` (a
    `time.perf_counter()`), in milliseconds as every agent writes it."""
    return ("server-timing", f"report;dur={(time.perf_counter() - started) * 1e3:.3f}")


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


class Server:
    """Listens on the Unix socket and/or TCP and serves `service`, which has
    `coverage(Query) -> (content_type, bytes)`, `reset()`, `health() -> str`
    (each may raise ApiError) and the `instance` id."""

    def __init__(self, service, instance: str, unix: tuple[str, int] | None,
                 tcp: tuple[str, int] | None, token: bytes | None) -> None:
        self._service = service
        self._instance = instance
        self._token = token or None
        self._listeners: list[tuple[socket.socket, bool]] = []
        self._unix_file: tuple[str, tuple[int, int]] | None = None
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.tcp_address: str | None = None
        try:
            if tcp is not None:
                host, port = tcp
                family = socket.AF_INET6 if ":" in host else socket.AF_INET
                listener = socket.create_server((host, port), family=family, backlog=64)
                self._listeners.append((listener, True))
                bound = listener.getsockname()
                self.tcp_address = f"[{bound[0]}]:{bound[1]}" if family == socket.AF_INET6 else f"{bound[0]}:{bound[1]}"
            if unix is not None:
                listener, identity = _bind_unix(*unix)
                self._listeners.append((listener, False))
                self._unix_file = (unix[0], identity)
            self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        except BaseException:
            self._close_listeners()
            self._remove_socket_file()
            raise
        self._closing = False
        self._thread = _threads.Thread(target=self._serve, name="livecov-accept", daemon=True)

    def start(self) -> None:
        _threads.start(self._thread)

    def close(self) -> None:
        """Stops accepting (the accept thread closes the listeners) and removes
        the socket file if it is still ours. In-flight requests finish."""
        if self._closing:
            return
        self._closing = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        # Closed once and forgotten: a later write or close could reach a file
        # that reused the number.
        fd, self._wake_w = self._wake_w, -1
        os.close(fd)
        self._remove_socket_file()

    def hold_for_fork(self, timeout: float) -> bool:
        """Waits until no connection is being accepted, and keeps it so until
        release_after_fork (in the parent): the child's abandon then knows
        every connection. Whether it could within `timeout` seconds."""
        return self._lock.acquire(timeout=timeout)

    def release_after_fork(self) -> None:
        self._lock.release()

    def abandon(self) -> None:
        """In a forked child: the parent's server has no thread here, and the
        file descriptors it holds must not keep the parent's clients waiting.
        Closes them without taking a lock (another thread may have held it at
        the fork) and leaves the socket file to the parent."""
        for listener, _ in self._listeners:
            listener.close()
        for conn in list(self._connections):
            conn.close()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)

    def _close_listeners(self) -> None:
        for listener, _ in self._listeners:
            listener.close()

    def _remove_socket_file(self) -> None:
        if self._unix_file is None:
            return
        path, identity = self._unix_file
        try:
            st = os.lstat(path)
            if (st.st_dev, st.st_ino) == identity:
                os.unlink(path)
        except OSError:
            pass

    def _serve(self) -> None:
        sys.settrace(None)  # the hook's own threads are not measured
        selector = selectors.DefaultSelector()
        try:
            for listener, tcp in self._listeners:
                listener.setblocking(False)
                selector.register(listener, selectors.EVENT_READ, tcp)
            selector.register(self._wake_r, selectors.EVENT_READ, None)
            while True:
                for key, _ in selector.select():
                    if key.data is None:
                        return
                    self._accept(key.fileobj, key.data)
        except Exception as e:
            complain(f"the API stopped serving: {e}")
        finally:
            selector.close()
            self._close_listeners()
            fd, self._wake_r = self._wake_r, -1
            os.close(fd)

    def _accept(self, listener: socket.socket, tcp: bool) -> None:
        # Accepted and kept under the lock, which a fork waits for (see
        # hold_for_fork): a child forked in between would not know the
        # connection to close it, and would hold it open after this process
        # answered and closed it, a client reading to the end waiting for as
        # long as the child lives (a gunicorn worker).
        with self._lock:
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError:
                conn = None
            else:
                full = len(self._connections) >= MAX_CONNECTIONS
                if not full:
                    self._connections.add(conn)
        if conn is None:
            # Out of file descriptors and the like: back off instead of spinning.
            time.sleep(0.05)
            return
        if full:
            try:
                conn.setblocking(False)
                conn.send(response(503, self._instance, "application/json", error_body("too many connections")))
            except OSError:
                pass
            conn.close()
            return
        try:
            # Started from the accept thread, which blocks the signals already;
            # through _threads all the same, so that no thread of the hook
            # depends on who started it.
            _threads.start(_threads.Thread(target=self._connection, args=(conn, tcp), name="livecov-conn", daemon=True))
        except RuntimeError:  # no thread to be had (interpreter shutting down)
            self._forget(conn)

    def _forget(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.discard(conn)
        conn.close()

    def _connection(self, conn: socket.socket, tcp: bool) -> None:
        sys.settrace(None)
        buf = bytearray()
        try:
            while True:
                conn.settimeout(READ_TIMEOUT)
                try:
                    request = read_request(conn, buf)
                except _Closed:
                    return
                except ApiError as e:
                    conn.settimeout(WRITE_TIMEOUT)
                    conn.sendall(response(e.status, self._instance, "application/json", error_body(e.message)))
                    return
                reply = self._handle(request, tcp)
                conn.settimeout(WRITE_TIMEOUT)
                conn.sendall(reply)
                if not request.keep_alive:
                    return
        except Exception:
            # The client went away or stalled: nothing to tell anyone.
            pass
        finally:
            self._forget(conn)

    def _handle(self, request: Request, tcp: bool) -> bytes:
        keep = request.keep_alive

        def fail(e: ApiError, extra: tuple[tuple[str, str], ...] = ()) -> bytes:
            return response(e.status, self._instance, "application/json", error_body(e.message), keep, extra)

        if tcp and self._token is not None and not authorized(request.headers.get("authorization"), self._token):
            return fail(ApiError(401, "missing or wrong bearer token (Authorization: Bearer <token>)"),
                        (("www-authenticate", "Bearer"),))
        path, _, query = request.target.partition("?")
        allowed = {"/coverage": "GET", "/health": "GET", "/reset": "POST"}.get(path)
        if allowed is None:
            return fail(ApiError(404, f"no route {_clip(path)} (routes: {ROUTES})"))
        if request.method != allowed:
            return fail(ApiError(405, f"method {_clip(request.method)} not allowed on {path} (allowed: {allowed})"),
                        (("allow", allowed),))
        try:
            if path == "/coverage":
                started = time.perf_counter()
                content_type, body = self._service.coverage(parse_query(query))
                return response(200, self._instance, content_type, body, keep, (timing(started),))
            if path == "/health":
                return response(200, self._instance, "application/json", self._service.health().encode(), keep)
            self._service.reset()
            return response(204, self._instance, keep_alive=keep)
        except ApiError as e:
            return fail(e)
        except Exception as e:
            return fail(ApiError(500, f"internal error in the livecov hook: {e}"))


def _bind_unix(path: str, mode: int) -> tuple[socket.socket, tuple[int, int]]:
    """A listening Unix socket at `path` with file mode `mode`, never reachable
    with a wider mode: bound in a fresh private directory beside it (0700),
    chmod-ed, then renamed into place (the umask is process-wide and cannot be
    changed safely in a threaded host). Binds in place and chmods when that
    does not work (e.g. a path too long for a socket in that directory). A stale socket at `path` is replaced; any other
    file there is an error. Returns the socket and the file's (device, inode)."""
    try:
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise OSError(f"{path} exists and is not a socket")
        os.unlink(path)
    except FileNotFoundError:
        pass
    try:
        sock = _bind_privately(path, mode)
    except OSError:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            os.chmod(path, mode)
        except BaseException:
            sock.close()
            raise
    try:
        sock.listen(64)
        st = os.lstat(path)
        return sock, (st.st_dev, st.st_ino)
    except BaseException:
        sock.close()
        raise


def _bind_privately(path: str, mode: int) -> socket.socket:
    private = os.path.join(os.path.dirname(path), f".livecov-{os.getpid()}-{threading.get_native_id()}.tmp")
    os.mkdir(private, 0o700)
    temporary = os.path.join(private, "s")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # A socket address holds at most 107 bytes of path: a deeper
        # LIVECOV_DIR is reached through the folder's descriptor.
        folder = os.open(private, os.O_RDONLY | os.O_DIRECTORY)
        try:
            sock.bind(temporary if len(os.fsencode(temporary)) <= 107 else f"/proc/self/fd/{folder}/s")
        finally:
            os.close(folder)
        os.chmod(temporary, mode)
        os.rename(temporary, path)
        return sock
    except BaseException:
        sock.close()
        raise
    finally:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        os.rmdir(private)
