"""One instance: this process's hook, its threads, and its hooks into the process.

Threads of its own, all daemons, never measured, and blocking every
asynchronous signal for their whole life (_threads.py), so that the
program's signals reach the program's threads as they would without the hook:
- `livecov-engine` does every coverage.py call (dumps, resets, reports): one
  thread, one in-memory database connection, jobs taken in order from a queue
  (identical dumps waiting together share one snapshot); it also writes the
  periodic reports and the final one on a signal;
- `livecov-accept` and one `livecov-conn` per connection serve the API
  (_server.py) and hand their work to the engine thread.

Hooks into the process, installed once:
- atexit: the final report (state `exited`), written by the engine thread
  while the interpreter waits for it;
- os._exit, which skips atexit (multiprocessing's forked children end with
  it): replaced by a function that writes the same final report, then calls
  the original with the program's status;
- os.execv and os.execve (which os.execvp and the other os.exec* call): the
  program that takes the process's place takes the hook's threads with it,
  and its socket would be left where nothing answers. Replaced by functions
  that write the same final report, naming that program (`exec`), then call
  the original;
- os.fork and os.forkpty on Python 3.12+: replaced by functions that call
  the originals without the warning about a multi-threaded process when
  only the hook's threads make it one, as it would be without the hook;
- SIGTERM/SIGINT, only where the program left the default action (SIG_DFL):
  the handler puts the default back and wakes the engine thread, nothing
  else; that thread writes the final report and raises the signal again, so
  the process ends with the status the signal gives. SIGINT under Python's
  own default_int_handler is left alone: KeyboardInterrupt unwinds the
  program (its `finally` blocks run), atexit writes the final report and
  Python ends the process with SIGINT itself. A handler the program
  installs, before or after, is never replaced;
- fork: the forked child is a new instance (socket, metadata, threads: none
  of the parent's threads exist there) whose counts start from zero, so
  parent and child add up to what ran. A fork waits for a coverage.py call
  in progress to end, so the child never inherits a half-done one.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import queue
import re
import signal
import sys
import threading
import time
import warnings
from typing import Callable, NoReturn, TypeVar

from . import __version__, _threads
from ._config import Config, ConfigError, from_env
from ._engine import Engine, summary_json
from ._server import REQUEST_TIMEOUT, ApiError, Query, Server
from ._stderr import complain

# The longest the interpreter's exit waits for the final report.
EXIT_TIMEOUT = 30.0
# The longest a fork waits for a coverage.py call in progress.
FORK_TIMEOUT = 10.0

_current: Agent | None = None
# start() tries once per process: the .pth file may run twice (site.py
# processes a venv's site-packages twice in some Python versions).
_tried = False
_hooks_installed = False
# The agent whose lock the forking thread holds (see _before_fork).
_fork_held: Agent | None = None
# The server whose accepting a fork waits for (see Server.hold_for_fork).
_fork_server: Server | None = None
T = TypeVar("T")
# CPython 3.12+'s warning at os.fork() (and os.forkpty()) with more than one
# thread in the process; it counts the threads in /proc/self/stat.
_FORK_WARNING = r"This process \(pid=\d+\) is multi-threaded, use of fork(pty)?\(\) may lead to deadlocks"


def start() -> str | None:
    """Starts the hook as the environment says; the instance id, or None when
    LIVECOV_DIR and LIVECOV_LISTEN are unset or the hook cannot start."""
    global _current, _tried
    if _current is not None or _tried:
        return _current.instance if _current is not None else None
    _tried = True
    try:
        config = from_env()
    except ConfigError as e:
        complain(f"not started: {e}")
        return None
    if config is None:
        return None
    if config.tcp_refusal is not None:
        complain(f"{config.tcp_refusal} (the socket in LIVECOV_DIR serves)")
    agent = None
    try:
        engine = Engine(config)
        agent = Agent(config, engine)
        # A request that comes at once waits for coverage.py to have started.
        with agent.lock:
            agent.launch()
            # Our threads run already, so coverage.py never traces them.
            engine.start()
    except Exception as e:
        if agent is not None and agent.server is not None:
            agent.server.close()
        complain(f"not started: {e}")
        return None
    _current = agent
    _install_hooks()
    return agent.instance


class _Waiter:
    """A request thread waiting for the engine thread's answer."""

    __slots__ = ("_done", "value")

    def __init__(self) -> None:
        self._done = threading.Event()
        self.value: object = None

    def set(self, value: object) -> None:
        self.value = value
        self._done.set()

    def done(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def wait(self, timeout: float, what: str) -> object:
        if not self._done.wait(timeout):
            raise ApiError(503, f"{what} did not finish within {int(timeout * 1000)} ms")
        if isinstance(self.value, ApiError):
            raise self.value
        return self.value


class Agent:
    """This process's instance."""

    def __init__(self, config: Config, engine: Engine) -> None:
        self.config = config
        self.engine = engine
        self.instance = f"python-{os.getpid()}-{os.urandom(8).hex()}"
        self.started = time.time()
        self._clock = time.monotonic()
        # SimpleQueue.put is reentrant: the signal handler may call it.
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        # Held by the engine thread around every coverage.py call; a fork waits for it.
        self.lock = threading.Lock()
        self.finished = False
        # The program that took the process's place (os.exec*), and the
        # files of the final report before it.
        self.exec_path: str | None = None
        self._final_files: list[str] = []
        self.engine_running = False
        self.server: Server | None = None
        self._thread = _threads.Thread(target=self._run, name="livecov-engine", daemon=True)

    # -- start ---------------------------------------------------------------

    def launch(self) -> None:
        """Makes the directories, listens, writes the metadata, starts the threads."""
        directory = self.config.dir
        unix = None
        if directory is not None:
            for sub in ("sockets", "reports"):
                os.makedirs(os.path.join(directory, sub), exist_ok=True)
            unix = (os.path.join(directory, "sockets", f"{self.instance}.sock"), self.config.socket_mode)
        try:
            self.server = Server(self, self.instance, unix, self.config.listen, self.config.token)
        except OSError as e:
            raise OSError(f"cannot listen: {e.strerror or e}" + (f" ({e.filename})" if e.filename else "")) from None
        try:
            self._write_metadata("running", [])
            _threads.start(self._thread)
            self.server.start()
        except BaseException:
            self.server.close()
            raise

    # -- the API (called on connection threads) --------------------------------

    def coverage(self, query: Query) -> tuple[str, bytes]:
        waiter = _Waiter()
        self.jobs.put(("coverage", query, waiter))
        return waiter.wait(REQUEST_TIMEOUT, "coverage")  # type: ignore[return-value]

    def reset(self) -> None:
        waiter = _Waiter()
        self.jobs.put(("reset", waiter))
        waiter.wait(REQUEST_TIMEOUT, "reset")

    def health(self) -> str:
        waiter = _Waiter()
        self.jobs.put(("health", waiter))
        return waiter.wait(REQUEST_TIMEOUT, "health")  # type: ignore[return-value]

    # -- the engine thread ------------------------------------------------------

    def _run(self) -> None:
        sys.settrace(None)  # the hook's own threads are not measured
        self.engine_running = True
        try:
            while True:
                try:
                    job = self.jobs.get(timeout=self.config.flush_secs)
                except queue.Empty:
                    if not self.finished:
                        with self.lock:
                            self._write_report()
                    continue
                batch = [job]
                while True:
                    try:
                        batch.append(self.jobs.get_nowait())
                    except queue.Empty:
                        break
                self._work(batch)
        finally:
            self.engine_running = False

    def _work(self, batch: list[tuple]) -> None:
        # The last plain dump of this batch: later identical ones share it,
        # unless something changed the counts in between.
        shared: tuple[tuple[str | None, str], object] | None = None
        for job in batch:
            kind = job[0]
            if kind == "signal":
                try:
                    self._finish()
                finally:
                    os.kill(os.getpid(), job[1])
                continue
            try:
                if kind == "exit":
                    self._finish()
                    job[1].set(None)
                elif kind == "health" and self.finished:
                    job[1].set(self._metadata("exited", []))
                elif self.finished:
                    # coverage.py may already be shutting down with the interpreter.
                    job[-1].set(ApiError(503, "the process is exiting"))
                elif kind == "coverage":
                    query, waiter = job[1], job[2]
                    key = (query.test, query.format)
                    if not query.reset and shared is not None and shared[0] == key:
                        waiter.set(shared[1])
                        continue
                    result = self._dump(query)
                    waiter.set(result)
                    shared = None if query.reset else (key, result)
                elif kind == "reset":
                    with self.lock:
                        self.engine.reset()
                    shared = None
                    job[1].set(None)
                elif kind == "health":
                    with self.lock:
                        files = self.engine.files()
                    job[1].set(self._metadata("running", files))
            except Exception as e:
                complain(f"internal error ({kind}): {e}")
                job[-1].set(ApiError(500, f"internal error in the livecov hook: {e}"))

    def _dump(self, query: Query) -> object:
        try:
            with self.lock:
                lcov = self.engine.lcov(query.test, query.reset)
        except Exception as e:
            return ApiError(500, f"coverage failed: {e}")
        if query.format == "json":
            return ("application/json", summary_json(lcov).encode())
        return ("text/plain; charset=utf-8", lcov.encode())

    def _finish(self) -> None:
        """The final report, once: no new connections, the report, the
        metadata with state `exited`."""
        if self.finished:
            return
        self.finished = True
        if self.server is not None:
            self.server.close()
        with self.lock:
            self._write_report()
            try:
                files = self.engine.files()
            except Exception:
                files = []
        self._final_files = files
        self._write_metadata("exited", files)

    def end_for_exec(self, path: object) -> None:
        """Before an exec of `path`: the final report, the program named in
        the metadata. Named again at each exec tried (os.execvp tries each
        folder of PATH until one runs): the last is the program that ran.
        An exec that fails leaves the instance ended."""
        if isinstance(path, int):  # os.execve(fd, ...), as fexecve
            try:
                name = os.readlink(f"/proc/self/fd/{path}")
            except OSError:
                name = f"/proc/self/fd/{path}"
        else:
            name = os.path.abspath(os.fsdecode(path))
        if not self.finished:
            self.exec_path = name
            _final_report()
        elif self.exec_path is not None:
            self.exec_path = name
            self._write_metadata("exited", self._final_files)

    # -- files in reports/ ------------------------------------------------------

    def _report_path(self, extension: str) -> str | None:
        if self.config.dir is None:
            return None
        return os.path.join(self.config.dir, "reports", f"{self.instance}.{extension}")

    def _write_report(self) -> None:
        path = self._report_path("lcov")
        if path is None:
            return
        try:
            report = self.engine.lcov()
        except Exception as e:
            complain(f"no report: {e}")
            return
        _write_atomically(path, report.encode())

    def _write_metadata(self, state: str, files: list[str]) -> None:
        path = self._report_path("json")
        if path is not None:
            _write_atomically(path, self._metadata(state, files).encode())

    def _metadata(self, state: str, files: list[str]) -> str:
        return json.dumps({
            "instance": self.instance,
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "runtime": "python",
            "livecov_version": __version__,
            "program": _program(),
            "build_id": None,
            "modules": files,
            "tcp": self.server.tcp_address if self.server is not None else None,
            "start_time": int(self.started),
            "uptime_secs": time.monotonic() - self._clock,
            "state": "exited" if self.finished else state,
            "engine": f"coverage.py {self.engine.version}",
            "python": sys.version.split()[0],
            **({"exec": self.exec_path} if self.exec_path is not None else {}),
        })


def _program() -> str:
    """The script the interpreter runs, else the interpreter."""
    argv = getattr(sys, "argv", None) or [""]
    if argv[0] and os.path.isfile(argv[0]):
        return os.path.abspath(argv[0])
    return sys.executable


def _write_atomically(path: str, data: bytes) -> None:
    """To a temporary name beside `path`, then renamed: readers never see a torn file."""
    temporary = f"{path}.tmp{os.getpid()}"
    try:
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except OSError as e:
        complain(f"cannot write {path}: {e.strerror or e}")
        try:
            os.unlink(temporary)
        except OSError:
            pass


# -- process hooks ---------------------------------------------------------------


def _install_hooks() -> None:
    global _hooks_installed
    _install_signal_handlers()
    if _hooks_installed:
        return
    _hooks_installed = True
    # After coverage.py's own atexit handler was registered (at its start),
    # so ours runs first, while it still measures.
    atexit.register(_final_report)
    # Looked up as os._exit at every call (multiprocessing's popen_fork does),
    # so replacing the attribute reaches every caller but C code.
    os._exit = _exit_after_final_report
    # Looked up at every call too, by os.execvp and the other os.exec*.
    os.execv = _final_report_before_exec(os.execv)
    os.execve = _final_report_before_exec(os.execve)
    if sys.version_info >= (3, 12):
        os.fork = _without_our_fork_warning(os.fork)
        os.forkpty = _without_our_fork_warning(os.forkpty)
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)


def _install_signal_handlers() -> None:
    # Python lets the main thread alone set handlers; a start elsewhere goes
    # without (the atexit report still comes).
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            if signal.getsignal(signum) == signal.SIG_DFL:
                signal.signal(signum, _on_signal)
        except (OSError, ValueError):
            pass


def _on_signal(signum: int, frame: object) -> None:
    """Wakes the engine thread, which writes the final report and raises the
    signal again. The default action is back before that, so the second
    raise ends the process (and a second signal meanwhile ends it at once)."""
    try:
        signal.signal(signum, signal.SIG_DFL)
    except (OSError, ValueError):
        pass
    agent = _current
    if agent is None or agent.finished or not agent.engine_running:
        os.kill(os.getpid(), signum)
        return
    agent.jobs.put(("signal", signum))


def _final_report() -> None:
    """At the process's end: the final report, written by the engine thread
    (whose coverage.py connection it is) while this thread waits."""
    agent = _current
    if agent is None or agent.finished:
        return
    try:
        if agent.engine_running:
            waiter = _Waiter()
            agent.jobs.put(("exit", waiter))
            if not waiter.done(EXIT_TIMEOUT):
                complain(f"no final report: not written within {EXIT_TIMEOUT:.0f} s")
        else:
            agent._finish()
    except Exception as e:
        complain(f"no final report: {e}")


_os_exit = os._exit


@functools.wraps(_os_exit)
def _exit_after_final_report(status: int, /) -> NoReturn:
    _final_report()
    _os_exit(status)


def _final_report_before_exec(exec_function: Callable[..., NoReturn]) -> Callable[..., NoReturn]:
    """`exec_function` (os.execv, os.execve) after the final report."""

    @functools.wraps(exec_function)
    def exec_after_final_report(path: object, *args: object) -> NoReturn:
        agent = _current
        if agent is not None:
            try:
                agent.end_for_exec(path)
            except Exception as e:
                complain(f"no final report before exec: {e}")
        exec_function(path, *args)

    return exec_after_final_report


def _before_fork() -> None:
    """The child must not inherit a coverage.py call half done (its database
    and locks would stay in that state): wait for the one in progress."""
    global _fork_held, _fork_server
    _fork_held = _fork_server = None
    agent = _current
    try:
        if agent is not None and agent.lock.acquire(timeout=FORK_TIMEOUT):
            _fork_held = agent
        server = agent.server if agent is not None else None
        if server is not None and server.hold_for_fork(FORK_TIMEOUT):
            _fork_server = server
    except Exception as e:
        complain(f"before fork: {e}")


def _without_our_fork_warning(fork: Callable[[], T]) -> Callable[[], T]:
    """`fork` (os.fork, os.forkpty) without Python 3.12+'s warning about a
    multi-threaded process when the hook's threads are what makes it so. The
    warning comes after the fork's hooks in some versions (3.13), before them
    in others (3.12), so this is around the whole call. CPython would
    attribute it to this function: it is caught here and, when the program
    has threads of its own, warned again from the program's call, where the
    program's filters treat it as they would without the hook."""

    @functools.wraps(fork)
    def fork_quietly() -> T:
        with warnings.catch_warnings(record=True) as caught:
            # Whatever the program's filters say, recorded here; they apply below.
            warnings.filterwarnings("always", message=_FORK_WARNING, category=DeprecationWarning)
            ours_only = _threads_in_process() - _threads.count() <= 1
            pid = fork()
        for w in caught:
            if w.category is DeprecationWarning and re.match(_FORK_WARNING, str(w.message)):
                if not ours_only:
                    try:
                        warnings.warn(w.message, stacklevel=2)
                    except Exception:
                        pass  # an "error" filter: CPython drops its own failing warning too
            else:  # another warning, already filtered: shown as it would have been
                warnings.showwarning(w.message, w.category, w.filename, w.lineno, w.file, w.line)
        return pid

    return fork_quietly


def _threads_in_process() -> int:
    """The process's threads, as CPython counts them for its fork warning."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # Fields after the command name (which may hold spaces), from the 3rd on.
        return int(stat[stat.rindex(b")") + 2 :].split()[17])
    except (OSError, ValueError, IndexError):
        return threading.active_count()


def _after_fork_in_parent() -> None:
    global _fork_held, _fork_server
    if _fork_server is not None:
        _fork_server.release_after_fork()
        _fork_server = None
    if _fork_held is not None:
        _fork_held.lock.release()
        _fork_held = None


def _forked_to_exec() -> bool:
    """Whether this fork is subprocess's to run a program with a preexec_fn:
    the child runs the preexec_fn and execs at once, which would take an
    instance started here with it, its socket left behind and its metadata
    `running`. Its caller is then subprocess's `_execute_child` (the fork
    itself is C code, which runs the fork hooks only with a preexec_fn)."""
    try:
        caller = sys._getframe(2)
    except ValueError:  # forked from C code with no Python caller
        return False
    return caller.f_code.co_name == "_execute_child" and caller.f_globals.get("__name__") == "subprocess"


def _after_fork_in_child() -> None:
    """A new instance: the parent's threads are gone, and its locks may have
    been held by them, so nothing of the parent's agent is used again but its
    configuration and coverage.py (idle, see _before_fork)."""
    global _current, _fork_held, _fork_server
    parent = _current
    held, _fork_held, _fork_server = _fork_held, None, None
    if parent is None:
        return
    _current = None
    try:
        if parent.server is not None:
            parent.server.abandon()
        if parent.finished or _forked_to_exec():
            return
        if held is not parent:
            complain(f"not started in forked child {os.getpid()}: the parent's hook was busy for {FORK_TIMEOUT:.0f} s")
            return
        parent.engine.reset()  # the child counts from zero
        child = Agent(parent.config, parent.engine)
        child.launch()
        _current = child
    except Exception as e:
        complain(f"not started in forked child {os.getpid()}: {e}")
