"""Parallel jobs under concurrency (issue 6): 8 reporter processes sending overlapping chunk
ids count each distinct chunk exactly once; process pools (concurrent.futures and
multiprocessing) report per chunk, each pool worker holding its own lease linked to the job."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import BrokerProcess, wait_until
from tests.desktop.jobhelp import Script, counts, declare, job_of, leases_of
from tests.desktop.jobhelp import script as script  # the fixture

REPORTERS = 8
STRIDE = 25
SPAN = 50  # reporter i sends chunks i*STRIDE .. i*STRIDE+SPAN-1: neighbours overlap by half


def _chunk_counts(n: int) -> tuple[int, int]:
    return n % 7 + 1, n % 3  # what tests/workers/job_reporter.py sends for chunk n


def test_eight_reporters_with_overlapping_chunks_count_each_chunk_once(
    broker: BrokerProcess, script: Callable[..., Script]
) -> None:
    distinct = range((REPORTERS - 1) * STRIDE + SPAN)
    want_completed = sum(_chunk_counts(n)[0] for n in distinct)
    want_failed = sum(_chunk_counts(n)[1] for n in distinct)
    with broker.client() as c:
        job = declare(c, total_items=want_completed + want_failed, workers=REPORTERS)
        reporters = [
            script(
                "job_reporter",
                broker.socket,
                job["job_id"],
                str(i * STRIDE),
                str(i * STRIDE + SPAN - 1),
                "2",  # and every chunk twice in a row by the same reporter
            )
            for i in range(REPORTERS)
        ]
        for r in reporters:
            assert r.read_line() == "ready"
        for r in reporters:  # all connected: start them together
            r.send("go")
        results = [r.read_line().split() for r in reporters]
        assert all(r.wait() == 0 for r in reporters)
        new = sum(int(x[1]) for x in results)
        duplicates = sum(int(x[3]) for x in results)
        assert new == len(distinct)  # each distinct chunk acknowledged as new exactly once
        assert new + duplicates == REPORTERS * SPAN * 2
        final = job_of(c, job["job_id"])
        assert counts(final) == (want_completed, want_failed, len(distinct))
        assert final["completed_items"] + final["failed_items"] == final["total_items"]
        assert final["state"] == "running"  # the declarer (this connection) is still here


def test_same_chunk_with_different_counts_from_racing_reporters_counts_one(
    broker: BrokerProcess,
) -> None:
    with broker.client() as a, broker.client() as b:
        job = declare(a, total_items=100)
        first = a.call("job.report", job_id=job["job_id"], chunk_id="c", completed=5, failed=1)
        assert first["duplicate"] is False
        with pytest.raises(Exception) as err:
            b.call("job.report", job_id=job["job_id"], chunk_id="c", completed=6, failed=0)
        assert err.value.code == "invalid_params"  # type: ignore[attr-defined]
        assert "completed=5, failed=1" in str(err.value)
        assert counts(job_of(b, job["job_id"])) == (5, 1, 1)


CHUNKS, PER_CHUNK, WORKERS, WORKER_MIB = 9, 20, 3, 2048


@pytest.mark.parametrize("kind", ["futures", "mp"])
def test_pool_workers_each_hold_a_lease_linked_to_the_job(
    broker: BrokerProcess, script: Callable[..., Script], tmp_path: Path, kind: str
) -> None:
    go = tmp_path / "go"
    pool = script(
        "job_pool",
        broker.socket,
        kind,
        str(CHUNKS),
        str(PER_CHUNK),
        str(WORKERS),
        str(WORKER_MIB),
        str(go),
    )
    job_id = pool.read_line().split()[1]
    with broker.client() as c:
        # every pool worker took its chunk and its own lease; the chunks wait for `go`
        wait_until(lambda: len(leases_of(c, job_id)) == WORKERS, timeout_s=30)
        leases = leases_of(c, job_id)
        job = job_of(c, job_id)
        assert job["state"] == "running"
        assert job["lease_ids"] == sorted(x["lease_id"] for x in leases)
        assert {x["granted_mib"] for x in leases} == {WORKER_MIB}
        assert counts(job) == (0, 0, 0)  # nothing reported yet: progress does not move alone
        go.touch()
        assert pool.read_line() == "done"
        assert pool.wait() == 0
        final = job_of(c, job_id)
        items = range(CHUNKS * PER_CHUNK)
        failed = sum(1 for i in items if i % 13 == 0)
        assert counts(final) == (len(items) - failed, failed, CHUNKS)
        assert final["state"] == "succeeded"
        # the pool is gone: so are its workers' leases
        wait_until(lambda: not leases_of(c, job_id), timeout_s=5)
        assert job_of(c, job_id)["lease_ids"] == []


def test_pool_forked_after_the_parent_ran_a_chunk_gives_each_worker_its_own_lease(
    broker: BrokerProcess, script: Callable[..., Script], tmp_path: Path
) -> None:
    """Forked pool workers must not inherit the parent's connection and lease."""
    go = tmp_path / "go"
    pool = script(
        "job_pool",
        broker.socket,
        "futures",
        str(CHUNKS),
        str(PER_CHUNK),
        str(WORKERS),
        str(WORKER_MIB),
        str(go),
        "warm",
    )
    job_id = pool.read_line().split()[1]
    assert pool.read_line() == "warm"  # the parent ran chunk-000 on its own lease
    with broker.client() as c:
        wait_until(lambda: len(leases_of(c, job_id)) == WORKERS + 1, timeout_s=30)
        assert len(job_of(c, job_id)["lease_ids"]) == WORKERS + 1
        assert counts(job_of(c, job_id)) == (PER_CHUNK - 2, 2, 1)  # items 0 and 13 fail
        go.touch()
        assert pool.read_line() == "done"
        assert pool.wait() == 0
        items = range(CHUNKS * PER_CHUNK)
        failed = sum(1 for i in items if i % 13 == 0)
        final = job_of(c, job_id)
        assert counts(final) == (len(items) - failed, failed, CHUNKS)
        assert final["state"] == "succeeded"
