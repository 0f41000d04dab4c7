"""coverage.py measuring this process, and LCOV of what it has measured so far.

coverage.py is the engine: branch coverage, data kept in memory (an in-memory
SQLite database, no .coverage file), and its own LCOV writer for the records,
so a report here reads exactly like `coverage lcov` of the same run.

Every method but start() runs on the hook's one engine thread: coverage.py's
in-memory database keeps one connection per thread, and one thread keeps it to
one. Taking a snapshot never stops measurement: coverage.py copies what the
tracers recorded (each copy atomic under the GIL) and removes only what it
copied, so a line recorded meanwhile is in this snapshot or the next one.
"""

from __future__ import annotations

import io
import os

from ._config import Config, default_ignore, own_sources
from ._stderr import complain

# coverage.py warnings that would only be noise in a program's stderr: a hooked
# process measures from interpreter start, may run no code of its own at all,
# and reports files it could not parse as errors of its own (below).
_QUIET_WARNINGS = [
    "no-data-collected",
    "module-not-imported",
    "module-not-measured",
    "module-not-python",
    "include-ignored",
    "couldnt-parse",
    "already-imported",
]


class Engine:
    """One process's coverage.py, started at interpreter start."""

    def __init__(self, config: Config) -> None:
        import coverage

        # With LIVECOV_IGNORE set, that pattern alone decides what is left out,
        # so everything is measured (coverage.py skips installed packages and
        # the stdlib by default, which is also what the default pattern drops).
        self._cov = coverage.Coverage(
            data_file=None,
            branch=True,
            config_file=False,
            auto_data=False,
            include=["*"] if config.ignore is not None else None,
        )
        # The C tracer: on 3.11 the only fast core; on 3.12 and 3.13 too,
        # since coverage.py measures branches with sys.monitoring (core
        # sysmon) from 3.14 on only. It records a line every time it runs, so
        # lines come back after a reset; sysmon (coverage.py's default on
        # 3.14) disables each line after its first hit and would not report
        # it again.
        self._cov.set_option("run:core", "ctrace")
        self._cov.set_option("run:disable_warnings", _QUIET_WARNINGS)
        self._ignore = [config.ignore or default_ignore(), own_sources()]
        self._path_map = config.path_map
        # File reporters (parsed sources) by file, with the (mtime, size) they
        # were parsed at: later dumps only parse a file again when it changed.
        self._reporters: dict[str, tuple[tuple[int, int] | None, object]] = {}
        # The LCOV record (from SF: on) of each file by what it was made of,
        # the source's (mtime, size) and what ran in it: a dump writes only
        # the records of files where something new ran.
        self._records: dict[str, tuple[tuple, str]] = {}
        self._complained: set[str] = set()
        self.version = coverage.__version__

    def start(self) -> None:
        self._cov.start()

    def lcov(self, test: str | None = None, reset: bool = False) -> str:
        """The LCOV of what ran since start or the last reset. With `reset`,
        the next report starts from here: a line that runs while this one is
        computed is in this report or in the next."""
        from coverage.lcovreport import LcovReporter
        from coverage.results import analysis_from_file_reporter

        # One flush, the snapshot: reporting from `data` alone (not through
        # Coverage's own report calls, which flush again per file) keeps lines
        # recorded meanwhile for the next report, so a reset cannot drop them.
        data = self._cov.get_data()
        files = sorted(f for f in data.measured_files() if not self.ignored(f))
        writer = LcovReporter(self._cov)
        precision = self._cov.config.precision
        out = io.StringIO()
        for filename in files:
            try:
                stamp = _stamp(filename)
                ran = data.arcs(filename) if data.has_arcs() else data.lines(filename)
                key = (stamp, frozenset(ran or ()))
                cached = self._records.get(filename)
                if cached is not None and stamp is not None and cached[0] == key:
                    record = cached[1]
                else:
                    reporter = self._file_reporter(filename, stamp)
                    analysis = analysis_from_file_reporter(data, precision, reporter, filename)
                    text = io.StringIO()
                    writer.lcov_file(self._mapped(filename), reporter, analysis, text)
                    record = text.getvalue()
                    self._records[filename] = (key, record)
            except Exception as e:  # a source removed or changed beyond parsing
                self._complain(filename, e)
                continue
            if test:
                out.write(f"TN:{test}\n")
            out.write(record)
        if reset:
            _erase(data)
        return out.getvalue()

    def reset(self) -> None:
        """Counts start from zero: what ran so far leaves every later report."""
        _erase(self._cov.get_data())

    def files(self) -> list[str]:
        """The files measured so far (after LIVECOV_IGNORE), as reports name them."""
        data = self._cov.get_data()
        return sorted(self._mapped(f) for f in data.measured_files() if not self.ignored(f))

    def ignored(self, filename: str) -> bool:
        return any(p.search(filename) for p in self._ignore)

    def _mapped(self, filename: str) -> str:
        for source, target in self._path_map:
            if filename.startswith(source):
                return target + filename[len(source):]
        return filename

    def _file_reporter(self, filename: str, stamp: tuple[int, int] | None):
        cached = self._reporters.get(filename)
        if cached is not None and stamp is not None and cached[0] == stamp:
            return cached[1]
        reporter = _reporter_class()(filename, self._cov)
        self._reporters[filename] = (stamp, reporter)
        return reporter

    def _complain(self, filename: str, error: Exception) -> None:
        if filename not in self._complained:
            self._complained.add(filename)
            message = str(error).replace("\n", " ") or type(error).__name__
            complain(f"{filename} left out of reports: {message}")


def _stamp(filename: str) -> tuple[int, int] | None:
    """A source file's (mtime, size): a change means parsing it again."""
    try:
        st = os.stat(filename)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def _erase(data) -> None:
    """Empties coverage.py's data but keeps the files it knows, so that later
    reports still list them (with nothing hit) as other livecov agents do."""
    known = data.measured_files()
    data.erase()
    if known:
        data.touch_files(known)


_REPORTER = None


def _reporter_class():
    """coverage.py's reporter for Python files, keeping its code regions
    (functions, for FN records) between dumps instead of parsing them again."""
    global _REPORTER
    if _REPORTER is None:
        from coverage.python import PythonFileReporter

        class Reporter(PythonFileReporter):
            _regions = None

            def code_regions(self):
                if self._regions is None:
                    self._regions = list(super().code_regions())
                return self._regions

        _REPORTER = Reporter
    return _REPORTER


def summary_json(lcov: str) -> str:
    """Per-file and total line, function and branch counts of an LCOV report,
    the same document as the other livecov agents' `?format=json`."""
    import json

    tags = ("LF:", "LH:", "FNF:", "FNH:", "BRF:", "BRH:")
    names = ("lines", "lines_hit", "functions", "functions_hit", "branches", "branches_hit")
    files = []
    totals = [0] * 6
    current: tuple[str, list[int]] | None = None
    for line in lcov.splitlines():
        if line.startswith("SF:"):
            current = (line[3:], [0] * 6)
        elif current is not None and line == "end_of_record":
            path, counts = current
            totals = [t + c for t, c in zip(totals, counts)]
            files.append({"file": path, **dict(zip(names, counts))})
            current = None
        elif current is not None:
            for i, tag in enumerate(tags):
                if line.startswith(tag) and line[len(tag):].isdigit():
                    current[1][i] = int(line[len(tag):])
    return json.dumps({"files": files, "totals": dict(zip(names, totals))})
