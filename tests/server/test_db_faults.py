"""Database faults: 503 with Retry-After and a reason (never a bare 500), one log line per
fault episode and one when it recovers, a health check that proves a write, and nothing
answered 2xx lost.

PostgreSQL is stopped for real (a private cluster, `tests.private_pg`: the shared server is
never touched); the full disk is a small tmpfs under the SQLite data dir (root only).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from rbroker_protocol.reports import LeaseReport
from rbroker_server.db.models import HealthCheck
from rbroker_server.settings import Settings
from tests.fakes.reports import payload
from tests.private_pg import private_postgres
from tests.server.conftest import Coordinator, EnrolledComputer, start_coordinator, wait_until_true


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, record.getMessage()))

    def faults(self) -> list[str]:
        return [m for lvl, m in self.lines if lvl >= logging.ERROR and "database fault" in m]

    def recoveries(self) -> list[str]:
        return [m for _, m in self.lines if "database recovered" in m]


@pytest.fixture
def fault_log() -> Iterator[_Records]:
    """The lines of `rbroker_server.db.faults` (a handler on its own logger)."""
    logger = logging.getLogger("rbroker_server.db.faults")
    records = _Records()
    logger.addHandler(records)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        logger.removeHandler(records)
        logger.setLevel(old)


def _assert_503(r: httpx.Response, reason: str | tuple[str, ...]) -> None:
    assert r.status_code == 503, r.text
    assert int(r.headers["retry-after"]) >= 1
    detail = r.json()["detail"]
    reasons = (reason,) if isinstance(reason, str) else reason
    assert any(why in detail for why in reasons), detail


def _applied(pc: EnrolledComputer, r: httpx.Response, applied: list[int]) -> None:
    """Remember the seq of a report answered 2xx and applied."""
    if r.status_code // 100 == 2 and r.json()["applied"]:
        applied.append(r.json()["seq"])


def _assert_all_stored(c: Coordinator, pc: EnrolledComputer, applied: list[int]) -> None:
    row = c.row(pc.id)
    assert row.seq == max(applied)
    assert row.reports_applied == len(applied)


@pytest.mark.skipif(
    os.name != "posix", reason="POSIX only: a private PostgreSQL cluster run as its own OS user"
)
def test_postgresql_stopped_gives_503_one_line_and_recovers(
    tmp_path: Path, fault_log: _Records
) -> None:
    with private_postgres() as cluster:
        settings = Settings(
            data_dir=tmp_path / "data", database_url=cluster.url, db_retry_after_s=0.5
        )
        c = start_coordinator(settings, "postgresql")
        try:
            c.group("vision")
            pc = c.enroll("vision")
            applied: list[int] = []
            for _ in range(3):
                r = pc.report()
                assert r.status_code == 200, r.text
                _applied(pc, r, applied)
            assert c.http.get("/healthz").status_code == 200

            cluster.stop()
            unreachable = "the database server cannot be reached"
            for _ in range(10):
                _assert_503(pc.report(), unreachable)
            _assert_503(c.http.get("/api/v1/fleet", headers=c.viewer("vision")), unreachable)
            _assert_503(c.http.get("/healthz"), unreachable)
            _assert_503(pc.get("/api/v1/fleet"), unreachable)
            # a browser on the web view gets a page, not the API's JSON body
            page = c.http.get("/fleet", headers={"Cookie": "rbroker_session=" + "s" * 40})
            assert page.status_code == 503, page.text
            assert page.headers["content-type"].startswith("text/html")
            assert int(page.headers["retry-after"]) >= 1
            assert "<h1>The coordinator cannot reach its database</h1>" in page.text
            assert unreachable in page.text and "psycopg" not in page.text.lower()
            time.sleep(1.2)  # two probe intervals: the probe fails quietly
            _assert_503(pc.report(), unreachable)
            assert len(fault_log.faults()) == 1, fault_log.lines
            assert fault_log.recoveries() == []

            cluster.start()
            wait_until_true(lambda: bool(fault_log.recoveries()), timeout_s=20)
            assert len(fault_log.recoveries()) == 1
            assert "requests were answered 503" in fault_log.recoveries()[0]
            for _ in range(3):
                r = pc.report()
                assert r.status_code == 200, r.text
                _applied(pc, r, applied)
            assert c.http.get("/healthz").status_code == 200
            assert len(fault_log.faults()) == 1
            _assert_all_stored(c, pc, applied)
        finally:
            c.stop()
            c.engine.dispose()


def test_healthz_proves_a_write(coordinator: Coordinator) -> None:
    table = HealthCheck.__table__  # type: ignore[attr-defined]
    assert coordinator.http.get("/healthz").status_code == 200
    with coordinator.engine.connect() as conn:
        first = conn.execute(sa.select(table.c.checked_at)).scalar_one()
    time.sleep(0.01)
    assert coordinator.http.get("/healthz").status_code == 200
    with coordinator.engine.connect() as conn:
        assert conn.execute(sa.select(table.c.checked_at)).scalar_one() > first


@contextlib.contextmanager
def _tmpfs(size_mib: int) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a full disk needs root to mount a small tmpfs")
    mnt = Path(tempfile.mkdtemp(prefix="rbfull-"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        mnt.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        mnt.rmdir()


def _fill(path: Path) -> None:
    """Write `path` until the file system is full."""
    chunk = os.urandom(1 << 16)
    with path.open("wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
        for size in (4096, 512, 1):  # the last scraps too
            with contextlib.suppress(OSError):
                while True:
                    f.write(chunk[:size])


def _big_report(pc: EnrolledComputer, n: int) -> httpx.Response:
    leases = [
        LeaseReport(
            lease_id=f"lease-{n}-{i}",
            gpu_uuids=["GPU-5a1e0000-0000-0000-0000-000000000001"],
            granted_mib=1,
            project="vision",
            purpose=f"fine-tune batch {n}-{i} " + "of the evaluation set " * 4,
        )
        for i in range(1500)
    ]
    return pc.report(payload(leases=leases))


@pytest.mark.skipif(
    sys.platform != "linux", reason="Linux only: the full disk is a small tmpfs mounted as root"
)
def test_full_disk_gives_503_one_line_and_healthz_fails(fault_log: _Records) -> None:
    with _tmpfs(12) as mnt:
        settings = Settings(data_dir=mnt / "data", db_retry_after_s=0.5, min_free_mib=1)
        c = start_coordinator(settings, "sqlite")
        try:
            c.group("vision")
            pc = c.enroll("vision")
            applied: list[int] = []
            r = _big_report(pc, 0)
            assert r.status_code == 200, r.text
            _applied(pc, r, applied)
            assert c.http.get("/healthz").status_code == 200

            filler = mnt / "filler"
            _fill(filler)
            full = ("the database disk is full", "the database cannot write to its disk")
            _assert_503(c.http.get("/healthz"), "the database disk is full")
            answers: list[int] = []
            for n in range(1, 30):
                r = _big_report(pc, n)
                answers.append(r.status_code)
                assert r.status_code in (200, 503), r.text
                _applied(pc, r, applied)
                if r.status_code == 503:
                    _assert_503(r, full)
            assert 503 in answers, answers
            assert len(fault_log.faults()) == 1, fault_log.lines
            assert fault_log.recoveries() == []

            filler.unlink()
            wait_until_true(lambda: bool(fault_log.recoveries()), timeout_s=20)
            assert len(fault_log.recoveries()) == 1
            r = _big_report(pc, 100)
            assert r.status_code == 200, r.text
            _applied(pc, r, applied)
            assert c.http.get("/healthz").status_code == 200
            _assert_all_stored(c, pc, applied)
        finally:
            c.stop()
            c.engine.dispose()


def test_fault_reasons_never_show_the_error_text() -> None:
    from rbroker_server.db.faults import reason

    secret_host = "db.internal.example.org"
    exc: Any = sa.exc.OperationalError(
        "SELECT 1", {}, Exception(f'connection to server at "{secret_host}" failed')
    )
    assert reason(exc) == "the database server cannot be reached"
    full: Any = sa.exc.OperationalError("UPDATE", {}, Exception("database or disk is full"))
    assert reason(full) == "the database disk is full"
