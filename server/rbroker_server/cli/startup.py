"""`rbroker-server serve` startup: every failure to start is one line with the fix and its own
exit code (`rbroker_protocol.startup`), never a traceback.

Before uvicorn runs, the database is opened and migrated, the TLS files are loaded and the
address is bound here, so each of these can fail with a clear answer; uvicorn then serves on
the bound socket (its own bind would log the error and exit 1, and a failed migration at
application startup would print a traceback).
"""

from __future__ import annotations

import re
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from rbroker_protocol.files import private_dir
from rbroker_protocol.startup import (
    EXIT_ADDRESS_IN_USE,
    EXIT_DATABASE,
    EXIT_PERMISSION,
    EXIT_TLS,
    EXIT_USAGE,
    one_line,
    os_error_code,
    os_error_text,
)
from rbroker_server.settings import CONFIG_NAME, Settings


class StartupFailure(Exception):
    """The coordinator cannot start; `line` says why and how to fix it, `code` is the exit
    code."""

    def __init__(self, code: int, line: str) -> None:
        super().__init__(one_line(line))
        self.code = code
        self.line = one_line(line)


def _redact(url: str) -> str:
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


def check_database(settings: Settings) -> str:
    """Open the configured database and bring its schema to the newest revision; returns
    the revision.

    Raises:
        StartupFailure: a SQLite file's directory cannot be written, or the database cannot
            be reached, opened or migrated.
    """
    import sqlalchemy as sa

    from rbroker_server.db import engine as db

    url = settings.db_url
    where = f"database_url in {settings.data_dir / CONFIG_NAME}"
    try:
        if url.startswith("sqlite"):
            path = sa.engine.make_url(url).database
            if path and path != ":memory:":
                directory = private_dir(Path(path).parent)
                try:  # SQLite's journal and WAL files need the directory writable
                    with tempfile.TemporaryFile(dir=directory):
                        pass
                except OSError as exc:
                    raise OSError(exc.errno, exc.strerror, str(directory)) from None
        engine = db.make_engine(url)
    except OSError as exc:
        raise StartupFailure(
            os_error_code(exc),
            f"cannot start: the database directory: {os_error_text(exc)}; let this user write "
            f"there or point {where} elsewhere",
        ) from None
    try:
        return db.upgrade(engine)
    except sa.exc.SQLAlchemyError as exc:
        raise database_failure(url, exc, where, "cannot start: ") from None
    finally:
        engine.dispose()


def database_failure(url: str, exc: Exception, where: str, lead: str = "") -> StartupFailure:
    """The one-line failure (exit code `EXIT_DATABASE`, 15) for database `url` that could
    not be reached, opened or migrated: `exc` is the SQLAlchemy error (its driver's first
    line is kept, the password in `url` is not), `where` names the setting to check (e.g.
    `database_url in /srv/config.toml` or `--database-url`), `lead` starts the line."""
    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return StartupFailure(
        EXIT_DATABASE,
        f"{lead}the database {_redact(url)} cannot be opened or migrated: "
        f"{reason[0] if reason else type(exc).__name__}; check {where} and that the database "
        "server runs and accepts this user",
    )


LISTEN_BACKLOG = 2048
"""The listen backlog (uvicorn's default)."""


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host:port` (what uvicorn's own bind does, listen included:
    a second coordinator on the same port fails here, even one started at the same moment).

    Raises:
        StartupFailure: the address is in use, needs privileges, or is not on this machine.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if sys.platform != "win32":
            # POSIX: rebind at once after a restart (connections in TIME_WAIT). Never on
            # Windows, where SO_REUSEADDR lets another program bind the same port beside a
            # listening one (and a restart rebinds without it), as `socket.create_server` does
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))  # OverflowError for a port outside 0–65535
        # listening here, not later in uvicorn: with SO_REUSEADDR two sockets can both bind
        # a port nobody listens on yet, and the second coordinator then served nothing
        sock.listen(LISTEN_BACKLOG)
    except OverflowError:
        sock.close()
        raise StartupFailure(
            EXIT_USAGE, f"cannot listen on port {port}: a TCP port is 1 to 65535; choose --port"
        ) from None
    except OSError as exc:
        sock.close()
        code = os_error_code(exc)
        if code == EXIT_ADDRESS_IN_USE:
            fix = "another process (another coordinator?) listens there: stop it or choose --port"
        elif code == EXIT_PERMISSION and sys.platform == "win32":
            # WSAEACCES: Windows has no privileged ports; another program holds this one
            # exclusively, or it lies in a range Windows reserves
            fix = (
                "another program holds this port exclusively, or Windows reserves it (see "
                "`netsh interface ipv4 show excludedportrange protocol=tcp`): choose --port"
            )
        elif code == EXIT_PERMISSION:
            fix = (
                "ports below 1024 need root or CAP_NET_BIND_SERVICE: choose --port 1024 or "
                "above (8787 by default), or put a reverse proxy in front"
            )
        else:
            fix = "choose an address of this machine with --host (0.0.0.0: all of them)"
        raise StartupFailure(
            code, f"cannot listen on {host}:{port}: {os_error_text(exc)}; {fix}"
        ) from None
    sock.set_inheritable(True)
    return sock


def prepare(app: Any, host: str, port: int, **uvicorn_kw: Any) -> tuple[Any, socket.socket]:
    """Load the TLS files and bind `host:port`; returns uvicorn's config and the socket for
    `run`. Nothing is logged here, so a failure is the one line of the `StartupFailure`.

    Raises:
        StartupFailure: the TLS certificate or key cannot be loaded, or the bind failed.
    """
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, **uvicorn_kw)
    try:
        config.load()  # builds the TLS context from the certificate and key files
    except OSError as exc:  # ssl.SSLError, a missing or unreadable file
        files = f"{uvicorn_kw.get('ssl_certfile')}, {uvicorn_kw.get('ssl_keyfile')}"
        code = EXIT_PERMISSION if isinstance(exc, PermissionError) else EXIT_TLS
        raise StartupFailure(
            code,
            f"cannot load the TLS certificate and key ({files}): {os_error_text(exc)}; fix "
            "tls_cert and tls_key in the config, or run `rbroker-server setup --force "
            "--self-signed` for a new pair",
        ) from None
    return config, bind(host, port)


def raise_fd_limit() -> tuple[int, int] | None:
    """Raise this process's soft limit of open files (`RLIMIT_NOFILE`) to its hard limit,
    since every connection holds one (systemd's default soft limit is 1024); returns
    (before, after), or None where the OS has no such limit (Windows) or refuses.
    Never raises."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        if soft == resource.RLIM_INFINITY or (target != resource.RLIM_INFINITY and soft >= target):
            return soft, soft
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return soft, target
    except (OSError, ValueError):
        return None


def run(config: Any, sock: socket.socket) -> None:
    """Serve with uvicorn on the socket from `prepare` until stopped."""
    import uvicorn

    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
