"""Starting the hook's threads so that they never take the program's signals.

The kernel delivers a process-directed signal to any thread that does not
block it, and CPython's C handler runs in that thread. A hook thread that
left a signal unblocked would take a signal the program blocks in its own
threads to wait for it (signal.sigwait, sigtimedwait): with SIG_DFL the
process would die of it instead, and sigwait would never return. So every
thread of the hook blocks all asynchronous signals for its whole life. A
thread starts with its creator's mask, and Python has no way to set a new
thread's mask before it runs, so the creating thread blocks them around
Thread.start() and puts its own mask back at once.

count() tells how many there are, for the fork warning of Python 3.12+
(_agent.py).

The synchronous signals stay unblocked: the kernel sends them to the thread
that faulted, and blocked they would kill the process instead of reaching a
handler (faulthandler's, for one).
"""

from __future__ import annotations

import signal
import threading

_SYNCHRONOUS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTRAP, signal.SIGSYS}
ASYNCHRONOUS = frozenset(signal.valid_signals()) - _SYNCHRONOUS


class Thread(threading.Thread):
    """A thread of the hook: what count() counts."""


def start(thread: Thread) -> None:
    """`thread.start()`, the thread blocking every asynchronous signal."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, ASYNCHRONOUS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def count() -> int:
    """How many threads of the hook run now."""
    return sum(isinstance(t, Thread) for t in threading.enumerate())
