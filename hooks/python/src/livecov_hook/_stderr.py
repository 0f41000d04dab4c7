"""The hook's lines on the program's stderr."""

from __future__ import annotations

import sys


def complain(message: str) -> None:
    """One line on stderr, `livecov: ` and the message. The hook never raises
    into the program: a line that cannot be written (a pipe nobody reads, a
    full disk, no sys.stderr) is lost, and nothing else."""
    try:
        sys.stderr.write(f"livecov: {message}\n")
        sys.stderr.flush()
    except Exception:
        pass
