"""The hook's configuration: the LIVECOV_* environment every livecov agent reads.

Kept free of heavy imports: it runs at interpreter start, before the program.
A bad value is a ConfigError whose message says what to write instead; the
hook then stays off and the program runs as if it were not installed.
"""

from __future__ import annotations

import ipaddress
import os
import re
import sysconfig
from dataclasses import dataclass, field


class ConfigError(Exception):
    """A LIVECOV_* variable the hook cannot use."""


@dataclass
class Config:
    # The coverage directory: sockets/ and reports/ are made in it.
    dir: str | None = None
    # A TCP (host, port) for the same API; port 0 picks a free port.
    listen: tuple[str, int] | None = None
    # Bearer token required on TCP (never on the Unix socket).
    token: bytes | None = None
    # LIVECOV_IGNORE; None means the default (site-packages, dist-packages, the stdlib).
    ignore: re.Pattern[str] | None = None
    # Period of report writes to reports/; None: only the final report.
    flush_secs: float | None = None
    # SF: path prefix rewrites, in order; the first matching prefix applies.
    path_map: list[tuple[str, str]] = field(default_factory=list)
    # Mode of the socket file.
    socket_mode: int = 0o600
    # Why LIVECOV_LISTEN is not served (see _tcp_refusal), said once on stderr.
    tcp_refusal: str | None = None


def from_env(environ: os._Environ[str] | dict[str, str] = os.environ) -> Config | None:
    """The configuration the environment asks for; None when neither LIVECOV_DIR
    nor LIVECOV_LISTEN is set (the hook then stays off)."""

    def var(name: str) -> str | None:
        value = environ.get("LIVECOV_" + name)
        return value if value else None

    directory = var("DIR")
    listen = _parse_listen(var("LISTEN"))
    if directory is None and listen is None:
        return None
    config = Config(dir=os.path.abspath(directory) if directory else None, listen=listen)

    token, token_file = var("TOKEN"), var("TOKEN_FILE")
    if token is not None:
        config.token = token.encode()
    elif token_file is not None:
        try:
            with open(token_file, "rb") as f:
                config.token = f.read().strip()
        except OSError as e:
            raise ConfigError(f"LIVECOV_TOKEN_FILE={token_file}: {e.strerror or e}") from None
    config.tcp_refusal = _tcp_refusal(config, var("LISTEN_WITHOUT_TOKEN"))
    if config.tcp_refusal is not None:
        if config.dir is None:
            raise ConfigError(config.tcp_refusal)
        config.listen = None

    ignore = var("IGNORE")
    if ignore is not None:
        try:
            config.ignore = re.compile(ignore)
        except re.error as e:
            raise ConfigError(f"LIVECOV_IGNORE is not a valid regular expression: {e}") from None

    flush = var("FLUSH_SECS")
    if flush is not None:
        try:
            secs = float(flush)
        except ValueError:
            secs = -1.0
        if not (secs > 0 and secs != float("inf")):
            raise ConfigError(f"LIVECOV_FLUSH_SECS={flush!r} is not a positive number of seconds")
        config.flush_secs = secs

    path_map = var("PATH_MAP")
    if path_map is not None:
        for pair in filter(None, path_map.split(",")):
            source, sep, target = pair.partition("=")
            if not sep:
                raise ConfigError(f"LIVECOV_PATH_MAP entry {pair!r} is not from=to")
            config.path_map.append((source, target))

    mode = var("SOCKET_MODE")
    if mode is not None:
        try:
            value = int(mode.removeprefix("0o"), 8)
        except ValueError:
            value = -1
        if not 0 <= value <= 0o777:
            raise ConfigError(f"LIVECOV_SOCKET_MODE={mode!r} is not an octal file mode such as 0600")
        config.socket_mode = value
    return config


def _tcp_refusal(config: Config, without_token: str | None) -> str | None:
    """Why config.listen is not served, or None: an address other than
    loopback without a token would give the coverage and POST /reset to anyone
    who reaches the port, so it takes a token or LIVECOV_LISTEN_WITHOUT_TOKEN=1
    (as the native agents)."""
    if config.listen is None or config.token:
        return None
    host, port = config.listen
    if ipaddress.ip_address(host).is_loopback or (without_token is not None and without_token != "0"):
        return None
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return (
        f"not listening on {shown}: it is reachable from other hosts and no token is set; set LIVECOV_TOKEN "
        "(or LIVECOV_TOKEN_FILE) to require one, listen on 127.0.0.1, or set LIVECOV_LISTEN_WITHOUT_TOKEN=1 "
        "to serve it to anyone who reaches the port"
    )


def _parse_listen(value: str | None) -> tuple[str, int] | None:
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ipaddress.ip_address(host)
        number = int(port)
        if not sep or not 0 <= number <= 65535:
            raise ValueError
    except ValueError:
        raise ConfigError(
            f"LIVECOV_LISTEN={value!r} is not an address such as 0.0.0.0:9464 or 127.0.0.1:9464"
        ) from None
    return host, number


def default_ignore() -> re.Pattern[str]:
    """Installed packages, the standard library and the interpreter's site
    customization (Debian's sitecustomize.py lives in /etc): code no report of
    a program wants (coverage.py does not measure most of it either, unless
    LIVECOV_IGNORE is set)."""
    parts = [r"/site-packages/", r"/dist-packages/", r"(^|/)(site|user)customize\.py$"]
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib"):
        if paths.get(key):
            parts.append("^" + re.escape(os.path.realpath(paths[key]) + os.sep))
    return re.compile("|".join(dict.fromkeys(parts)))


def own_sources() -> re.Pattern[str]:
    """The hook's own code and coverage.py's: never in a report, whatever
    LIVECOV_IGNORE says."""
    import coverage

    dirs = [os.path.dirname(os.path.realpath(__file__)), os.path.dirname(os.path.realpath(coverage.__file__))]
    return re.compile("|".join("^" + re.escape(d + os.sep) for d in dirs))
