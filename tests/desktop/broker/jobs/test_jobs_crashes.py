"""Parallel jobs when processes die (issue 6): a worker killed with SIGKILL mid-chunk, and
the broker killed mid-job and restarted on the same data dir. Counts stay exact (the killed
chunk is not counted, nothing is counted twice), the killed worker's lease is freed, and a
job whose workers and declarer are all gone shows `stalled`, never silently done."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

import rbroker
from tests.conftest import BrokerProcess, wait_until
from tests.desktop.jobhelp import Script, counts, declare, job_of, leases_of
from tests.desktop.jobhelp import script as script  # the fixture

MIB = 1024


def _report(c: rbroker.Client, job_id: str, chunk: str, completed: int, failed: int = 0) -> bool:
    """Report a chunk; True when it was a duplicate."""
    result = c.call("job.report", job_id=job_id, chunk_id=chunk, completed=completed, failed=failed)
    return bool(result["duplicate"])


def test_worker_killed_mid_chunk_is_not_counted_and_its_lease_is_freed(
    broker: BrokerProcess, script: Callable[..., Script]
) -> None:
    with broker.client() as c:
        job = declare(c, total_items=1000, workers=2)
        job_id = job["job_id"]
        a = script("job_chunk_worker", broker.socket, job_id, str(MIB))
        b = script("job_chunk_worker", broker.socket, job_id, str(MIB))
        assert a.read_line() == "ready" and b.read_line() == "ready"
        a.send("a-1 10")
        b.send("b-1 20")
        assert a.read_line() == "reported a-1"
        assert b.read_line() == "reported b-1"
        assert len(leases_of(c, job_id)) == 2
        a.send("a-2 30 hang")
        assert a.read_line() == "inside a-2"
        before = {x["lease_id"] for x in leases_of(c, job_id)}
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait(5)
        t0 = time.monotonic()
        wait_until(lambda: len(leases_of(c, job_id)) == 1, timeout_s=5)
        freed_s = time.monotonic() - t0
        assert freed_s < 2.0
        (left,) = leases_of(c, job_id)
        assert left["lease_id"] in before
        after = job_of(c, job_id)
        assert counts(after) == (30, 0, 2)  # a-2 was never reported
        assert after["lease_ids"] == [left["lease_id"]]
        assert after["state"] == "running"  # a worker and the declarer remain
        # the job keeps going: the surviving worker, then a new one, redo a-2
        b.send("a-2 30")
        assert b.read_line() == "reported a-2"
        assert counts(job_of(c, job_id)) == (60, 0, 3)


def test_job_stalls_when_declarer_and_all_workers_are_gone_then_runs_again(
    broker: BrokerProcess, script: Callable[..., Script]
) -> None:
    declarer = broker.client()
    job_id = declare(declarer, total_items=100, workers=1)["job_id"]
    w = script("job_chunk_worker", broker.socket, job_id, str(MIB))
    assert w.read_line() == "ready"
    w.send("c-1 10")
    assert w.read_line() == "reported c-1"
    declarer.close()  # the declarer goes; the worker's lease keeps the job running
    with broker.client() as c:
        time.sleep(0.6)  # > 2 holder checks
        assert job_of(c, job_id)["state"] == "running"
        w.send("c-2 10 hang")
        assert w.read_line() == "inside c-2"
        w.proc.send_signal(signal.SIGKILL)
        wait_until(lambda: job_of(c, job_id)["state"] == "stalled", timeout_s=5)
        stalled = job_of(c, job_id)
        assert counts(stalled) == (10, 0, 1)
        assert stalled["lease_ids"] == []
        assert stalled["finished_at"] is None  # not silently done
        # a new worker picks the job up: running again, and it stays running while it lives
        w2 = script("job_chunk_worker", broker.socket, job_id, str(MIB))
        assert w2.read_line() == "ready"
        w2.send("c-2 10")
        assert w2.read_line() == "reported c-2"
        assert job_of(c, job_id)["state"] == "running"
        time.sleep(0.6)
        job = job_of(c, job_id)
        assert job["state"] == "running"
        assert counts(job) == (20, 0, 2)
        w2.stop()
        wait_until(lambda: job_of(c, job_id)["state"] == "stalled", timeout_s=5)


def test_broker_killed_mid_job_restarts_with_exact_counts(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    bp = broker_factory()
    c = bp.client()
    job_id = declare(c, total_items=1000, workers=2)["job_id"]
    for n in range(10):
        assert _report(c, job_id, f"chunk-{n}", completed=9, failed=1) is False
    before = job_of(c, job_id)
    assert counts(before) == (90, 10, 10)
    bp.stop(signal.SIGKILL)
    c.close()
    bp2 = broker_factory(root=bp.data_dir.parent)
    with bp2.client() as c2:
        after = job_of(c2, job_id)
        assert counts(after) == (90, 10, 10)
        assert after["state"] == "stalled"  # nobody is attached after the restart
        for key in ("project", "purpose", "handler", "total_items", "workers", "declared_at"):
            assert after[key] == before[key]
        # chunks re-sent after the restart (their answers were lost) are duplicates
        for n in range(10):
            assert _report(c2, job_id, f"chunk-{n}", completed=9, failed=1) is True
        assert counts(job_of(c2, job_id)) == (90, 10, 10)
        assert job_of(c2, job_id)["state"] == "stalled"  # a duplicate is no progress
        assert _report(c2, job_id, "chunk-10", completed=10) is False
        assert job_of(c2, job_id)["state"] == "running"
        time.sleep(0.6)  # the reporter is attached: the job does not stall under it
        assert job_of(c2, job_id)["state"] == "running"
        assert counts(job_of(c2, job_id)) == (100, 10, 11)


def test_broker_restart_keeps_worker_leases_linked_and_counts_exact(
    broker_factory: Callable[..., BrokerProcess], script: Callable[..., Script]
) -> None:
    bp = broker_factory()
    with bp.client() as c:
        job_id = declare(c, total_items=1000, workers=2)["job_id"]
        a = script("job_chunk_worker", bp.socket, job_id, str(MIB))
        b = script("job_chunk_worker", bp.socket, job_id, str(MIB))
        assert a.read_line() == "ready" and b.read_line() == "ready"
        a.send("a-1 10")
        b.send("b-1 20")
        assert a.read_line() == "reported a-1" and b.read_line() == "reported b-1"
        linked = job_of(c, job_id)["lease_ids"]
        assert len(linked) == 2
    bp.stop(signal.SIGKILL)
    bp2 = broker_factory(root=bp.data_dir.parent)
    with bp2.client() as c2:
        # the workers are alive: their leases are restored and still belong to the job
        assert sorted(x["lease_id"] for x in leases_of(c2, job_id)) == linked
        job = job_of(c2, job_id)
        assert job["lease_ids"] == linked
        assert job["state"] == "stalled"  # until a worker reports again
        assert counts(job) == (30, 0, 2)
        a.send("a-1 10")  # re-sent after the restart: a duplicate (worker reconnects)
        assert a.read_line() == "reported a-1"
        assert counts(job_of(c2, job_id)) == (30, 0, 2)
        a.send("a-2 5")
        assert a.read_line() == "reported a-2"
        assert job_of(c2, job_id)["state"] == "running"
        assert counts(job_of(c2, job_id)) == (35, 0, 3)
        # a worker killed mid-chunk after the restart: not counted, its lease freed
        b.send("b-2 40 hang")
        assert b.read_line() == "inside b-2"
        b.proc.send_signal(signal.SIGKILL)
        wait_until(lambda: len(job_of(c2, job_id)["lease_ids"]) == 1, timeout_s=5)
        assert job_of(c2, job_id)["state"] == "running"  # worker a is still there
        a.stop()  # the last worker goes (the declarer went with the old broker)
        wait_until(lambda: job_of(c2, job_id)["state"] == "stalled", timeout_s=5)
        final = job_of(c2, job_id)
        assert counts(final) == (35, 0, 3)
        assert final["lease_ids"] == [] and leases_of(c2, job_id) == []


def test_every_state_survives_a_broker_restart(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    bp = broker_factory()
    c = bp.client()
    ids = {name: declare(c, total_items=10)["job_id"] for name in ("queued", "running")}
    _report(c, ids["running"], "c", completed=4, failed=1)
    for end in ("succeeded", "failed", "cancelled"):
        ids[end] = declare(c, total_items=10)["job_id"]
        _report(c, ids[end], "c", completed=3)
        c.call("job.update", job_id=ids[end], state=end, reason=f"{end} by the test")
    before = {name: job_of(c, job_id) for name, job_id in ids.items()}
    bp.stop(signal.SIGKILL)
    c.close()
    bp2 = broker_factory(root=bp.data_dir.parent)
    with bp2.client() as c2:
        after = {name: job_of(c2, job_id) for name, job_id in ids.items()}
        for name in ("queued", "running"):  # nobody is attached any more
            assert after[name]["state"] == "stalled"
            assert after[name]["finished_at"] is None
        for end in ("succeeded", "failed", "cancelled"):
            assert after[end]["state"] == end
            assert after[end]["reason"] == before[end]["reason"]
            assert after[end]["finished_at"] == before[end]["finished_at"]
            with pytest.raises(rbroker.JobFinished):
                _report(c2, ids[end], "d", completed=1)
        for name in ids:
            assert counts(after[name]) == counts(before[name])


def test_pool_worker_killed_mid_chunk_fails_the_job_and_frees_every_lease(
    broker: BrokerProcess, script: Callable[..., Script], tmp_path: Path
) -> None:
    """concurrent.futures cannot go on after a worker is killed (BrokenProcessPool): the
    job ends `failed` with only the exception's type, no chunk is counted, no lease stays."""
    pool = script(
        "job_pool", broker.socket, "futures", "6", "10", "3", str(MIB), str(tmp_path / "go")
    )
    job_id = pool.read_line().split()[1]
    with broker.client() as c:
        wait_until(lambda: len(leases_of(c, job_id)) == 3, timeout_s=30)
        victim = psutil.Process(pool.proc.pid).children()[0]
        victim.send_signal(signal.SIGKILL)
        assert pool.wait() != 0  # the pool script raised BrokenProcessPool
        final = job_of(c, job_id)
        assert final["state"] == "failed"
        assert final["reason"] == "raised BrokenProcessPool"
        assert counts(final) == (0, 0, 0)
        wait_until(lambda: not leases_of(c, job_id), timeout_s=5)


def test_pool_job_survives_a_broker_restart_mid_job(
    broker_factory: Callable[..., BrokerProcess],
    script: Callable[..., Script],
    tmp_path: Path,
) -> None:
    """The whole SDK path: declarer, 3 pool workers on leases, broker SIGKILLed with every
    worker inside a chunk; after the restart the leases re-attach, the reports reconnect,
    and the job succeeds with exact counts."""
    bp = broker_factory()
    go = tmp_path / "go"
    pool = script("job_pool", bp.socket, "futures", "9", "10", "3", str(MIB), str(go))
    job_id = pool.read_line().split()[1]
    with bp.client() as c:
        wait_until(lambda: len(leases_of(c, job_id)) == 3, timeout_s=30)
        linked = job_of(c, job_id)["lease_ids"]
    bp.stop(signal.SIGKILL)
    bp2 = broker_factory(root=bp.data_dir.parent)
    go.touch()
    assert pool.read_line() == "done"
    assert pool.wait() == 0
    with bp2.client() as c2:
        final = job_of(c2, job_id)
        failed = sum(1 for i in range(90) if i % 13 == 0)
        assert counts(final) == (90 - failed, failed, 9)
        assert final["state"] == "succeeded"
        wait_until(lambda: not leases_of(c2, job_id), timeout_s=5)  # the workers exited
        ended = c2.call("leases.list", include_ended=True)["ended"]
        assert {x["lease_id"] for x in ended} >= set(linked)  # the same leases, released


def test_subscribers_see_a_job_stall_and_run_again(broker: BrokerProcess) -> None:
    """The tray learns of a stall from the event stream, not by polling."""
    watcher = broker.client()
    watcher.subscribe()
    declarer = broker.client()
    job_id = declare(declarer)["job_id"]
    _report(declarer, job_id, "c1", completed=1)
    declarer.close()

    def next_job_state() -> str:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            ev = watcher.wait_event(timeout_s=deadline - time.monotonic())
            if ev and ev.get("kind") == "job" and ev["data"].get("job_id") == job_id:
                return str(ev["data"]["state"])
        raise AssertionError("no job event within 5 s")

    states = [next_job_state() for _ in range(3)]  # declared, counted, stalled
    assert states == ["queued", "running", "stalled"]
    with broker.client() as again:
        _report(again, job_id, "c2", completed=1)
        assert next_job_state() == "running"
    assert next_job_state() == "stalled"  # that reporter went too
    watcher.close()
