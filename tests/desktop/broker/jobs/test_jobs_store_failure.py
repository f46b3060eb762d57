"""A chunk report or job update that cannot be written (SQLite error: disk full, I/O
error) changes nothing, in memory or on disk; a retry then counts the chunk exactly once
(issue 6: counts cumulative and persisted, nothing corrupted)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from rbroker.broker.clock import SystemClock
from rbroker.broker.jobs import JobTable
from rbroker.broker.store import LeaseStore


class FlakyStore(LeaseStore):
    """A real store whose next write fails when `fail_next` is set."""

    fail_next = False

    def _maybe_fail(self) -> None:
        if self.fail_next:
            self.fail_next = False
            raise sqlite3.OperationalError("disk I/O error")

    def add_chunk(self, *args: Any) -> None:
        self._maybe_fail()
        super().add_chunk(*args)

    def put_job(self, *args: Any) -> None:
        self._maybe_fail()
        super().put_job(*args)


def _state(table: JobTable, job_id: str) -> tuple[Any, ...]:
    j = table.jobs[job_id]
    return (j.state, j.reason, j.workers, j.completed_items, j.failed_items, dict(j.chunks))


def test_failed_write_changes_nothing_and_a_retry_counts_once(tmp_path: Path) -> None:
    store = FlakyStore(tmp_path / "broker.sqlite3")
    table = JobTable(SystemClock(), store)
    job = table.declare("alice", "p", "purpose", "h.x", 100, 2, conn_id=1)
    table.report(job.job_id, "alice", "c1", 10, 1, conn_id=1)
    before = _state(table, job.job_id)

    store.fail_next = True
    with pytest.raises(sqlite3.OperationalError):
        table.report(job.job_id, "alice", "c2", 20, 2, conn_id=1)
    assert _state(table, job.job_id) == before
    store.fail_next = True
    with pytest.raises(sqlite3.OperationalError):
        table.update(job.job_id, "alice", "cancelled", "stop", 5, conn_id=1)
    assert _state(table, job.job_id) == before
    assert _state(JobTable(SystemClock(), store), job.job_id)[3:] == before[3:]  # on disk

    _, duplicate = table.report(job.job_id, "alice", "c2", 20, 2, conn_id=1)
    assert duplicate is False  # the retry is counted: the failed attempt left no trace
    assert table.report(job.job_id, "alice", "c2", 20, 2, conn_id=1)[1] is True
    after = _state(table, job.job_id)
    assert after[3:5] == (30, 3)
    reloaded = JobTable(SystemClock(), store)
    assert _state(reloaded, job.job_id)[3:] == after[3:]
    store.close()
