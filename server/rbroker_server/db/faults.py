"""Database faults as honest answers: 503 with `Retry-After` and a reason, one log line per
fault episode, and a health probe that proves a write.

When a request fails because the database cannot be reached or cannot write (PostgreSQL
stopped, a full disk, a locked or unreadable SQLite file), the app's exception handler
answers 503 with `Retry-After: Settings.db_retry_after_s` and a reason in words
(`DatabaseFaults.answer`). The first fault of an episode logs one ERROR line; later faults
only count. A background thread then probes every `db_retry_after_s` seconds with
`probe_write` and, once a write commits again, logs one WARNING line with the episode's
length and how many requests it refused. Nothing is retried on the client's behalf: a
request answered 503 wrote nothing, one answered 2xx was committed before the answer.
"""

from __future__ import annotations

import logging
import shutil
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import sqlalchemy as sa
from litestar import Request, Response
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine

from rbroker_server.db.engine import utcnow
from rbroker_server.db.tables import HEALTH
from rbroker_server.metrics import health
from rbroker_server.settings import Settings

log = logging.getLogger(__name__)

FAULTS: Final[tuple[type[Exception], ...]] = (
    sa.exc.OperationalError,
    sa.exc.InterfaceError,
    sa.exc.InternalError,
    sa.exc.DisconnectionError,
    sa.exc.TimeoutError,
)
"""Exceptions that mean the database is unavailable, not that a request was wrong."""

STATE_KEY: Final = "db_faults"
"""Key of the app's `DatabaseFaults` in its `state`."""


class DiskFull(sa.exc.OperationalError):
    """The SQLite database's file system has less than `Settings.min_free_mib` free."""

    def __init__(self, detail: str) -> None:
        super().__init__(None, None, OSError(detail))


def reason(exc: BaseException) -> str:
    """What went wrong in words a client may see (no host names, paths or SQL)."""
    text = str(getattr(exc, "orig", None) or exc).lower()
    if (
        isinstance(exc, DiskFull)
        or "disk is full" in text
        or "mib free" in text
        or "no space" in text
    ):
        return "the database disk is full"
    if "disk i/o" in text or "readonly" in text or "read-only" in text:
        return "the database cannot write to its disk"
    if "unable to open database" in text:
        return "the database file cannot be opened"
    if "locked" in text or isinstance(exc, sa.exc.TimeoutError):
        return "the database is busy"
    if "connect" in text or "terminat" in text or "closed" in text or "shutdown" in text:
        return "the database server cannot be reached"
    return "the database is unavailable"


def free_mib(engine: Engine) -> float | None:
    """Free MiB on the file system of a SQLite database file (None: not SQLite on disk)."""
    path = engine.url.database if engine.dialect.name == "sqlite" else None
    if not path or path == ":memory:":
        return None
    return shutil.disk_usage(Path(path).parent).free / 2**20


def probe_write(engine: Engine, settings: Settings) -> None:
    """Prove the database writes: commit an upsert of this host's `health_checks` row,
    and for SQLite first check at least `settings.min_free_mib` MiB are free.

    Raises:
        DiskFull: too little free space for SQLite.
        sqlalchemy.exc.SQLAlchemyError: the write did not commit.
    """
    free = free_mib(engine)
    if free is not None and free < settings.min_free_mib:
        raise DiskFull(f"{free:.1f} MiB free, {settings.min_free_mib} MiB needed")
    insert = (postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert)(HEALTH)
    now = utcnow()
    statement = insert.values(name=socket.gethostname()[:255], checked_at=now)
    statement = statement.on_conflict_do_update(index_elements=["name"], set_={"checked_at": now})
    with engine.begin() as conn:
        conn.execute(statement)


class DatabaseFaults:
    """Fault episodes of one app's database (thread-safe).

    Args:
        engine, settings: the app's.
        probe: proves the database works again (`probe_write` by default).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        *,
        probe: Callable[[Engine, Settings], None] = probe_write,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self._probe = probe
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None
        self._refused = 0
        self._stop = threading.Event()
        self._prober: threading.Thread | None = None

    @property
    def in_fault(self) -> bool:
        """True from the first fault of an episode until a probe writes again."""
        return self._since is not None

    def fault(self, exc: BaseException) -> str:
        """Record a refused request; log the episode's first. Returns `reason(exc)`."""
        why = reason(exc)
        health.DATABASE_ERRORS.inc()
        with self._lock:
            self._refused += 1
            if self._since is not None:
                return why
            self._since = self._clock()
            if not self._stop.is_set():
                self._prober = threading.Thread(
                    target=self._probe_until_recovered, name="db-fault-probe", daemon=True
                )
                self._prober.start()
        orig = getattr(exc, "orig", None) or exc
        lines = str(orig).strip().splitlines()
        log.error(
            "database fault: %s (%s: %s); answering 503 with Retry-After %d s until a "
            "write succeeds again",
            why,
            type(orig).__name__,
            lines[0][:200] if lines else "",
            self.retry_after_s,
        )
        return why

    @property
    def retry_after_s(self) -> int:
        """The `Retry-After` of a 503, whole seconds (at least 1)."""
        return max(1, round(self.settings.db_retry_after_s))

    def answer(self, request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
        """The app's exception handler for `FAULTS`: 503, Retry-After, the reason."""
        why = self.fault(exc)
        return Response(
            {"status_code": 503, "detail": f"{why}; try again later"},
            status_code=503,
            headers={"Retry-After": str(self.retry_after_s)},
        )

    def _probe_until_recovered(self) -> None:
        while not self._stop.wait(self.settings.db_retry_after_s):
            try:
                self._probe(self.engine, self.settings)
            except FAULTS:
                continue
            with self._lock:
                since, refused = self._since, self._refused
                self._since, self._refused, self._prober = None, 0, None
            if since is not None:
                log.warning(
                    "database recovered after %.1f s; %d requests were answered 503",
                    self._clock() - since,
                    refused,
                )
            return

    def close(self) -> None:
        """Stop probing (at app shutdown)."""
        self._stop.set()
        prober = self._prober
        if prober is not None and prober is not threading.current_thread():
            prober.join(5)
