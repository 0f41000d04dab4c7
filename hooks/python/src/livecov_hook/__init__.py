"""livecov's hook for Python: a process's live coverage over the livecov protocol.

Installing the package puts `livecov_hook.pth` into site-packages. At every
interpreter start it checks two environment variables and, when LIVECOV_DIR
or LIVECOV_LISTEN is set, calls `_autostart()`: coverage.py starts measuring
(branch coverage, data in memory) and the process serves its coverage on
`$LIVECOV_DIR/sockets/<instance>.sock` (and TCP with LIVECOV_LISTEN), writes
reports to `$LIVECOV_DIR/reports/`, and leaves a final report when it ends.
Otherwise nothing is imported and nothing happens.

`start()` does the same from code, for an interpreter started without site
(`python -S`) or a program that sets the environment itself.
"""

__version__ = "0.1.0"


def start() -> str | None:
    """Starts the hook as the LIVECOV_* environment says (nothing the second
    time). Returns the instance id, or None when the hook is off; never
    raises: a problem is one line on stderr, prefixed `livecov:`."""
    from ._agent import start as start_agent
    from ._stderr import complain

    try:
        return start_agent()
    except Exception as e:
        complain(f"not started: internal error: {e}")
        return None


def _autostart() -> None:
    """Called by livecov_hook.pth when LIVECOV_DIR or LIVECOV_LISTEN is set."""
    start()
