"""A full data directory loses nothing and invents nothing (docs/architecture.md §3,
"Storage faults"): on a real, small, full file system (a 4 MiB tmpfs mounted for the test),
a grant that the lease journal cannot keep refuses its request in one line,
`storage_unavailable`, and books nothing: the GPU's room is what it was, and no lease that
belongs to nobody is left (a refused 1 024 MiB request used to leave leases in the books
that no one held). Once there is room, requests are granted again, and a restart restores
exactly the leases that were granted. A resize, a re-attach or a job call the disk cannot
keep is refused the same way and changes nothing; an end (release, expiry, holder exit,
closed connection) is kept in the reserve and survives a stop before there is room, so no
ended lease comes back; once there is room, the tick writes what was kept back. On the
in-process broker (manual clock)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rbroker.broker.leases import Lease
from rbroker_protocol.errors import ErrorCode, RpcError
from tests.conftest import SINGLE_24G
from tests.desktop.inprocess import InProcessBroker, SleeperPool

pytestmark = [
    pytest.mark.contract,
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or os.geteuid() != 0 or shutil.which("mount") is None,
        reason="mounts a small tmpfs: Linux, as root (CI is)",
    ),
]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs at `tmp_path/disk`, unmounted at the end."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "rbt-small", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path) -> Path:
    """Fill `disk` to the last byte with one file; its path."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        with contextlib.suppress(OSError):  # the last partial block, a byte at a time
            while True:
                f.write(b"\0")
    return filler


def _available(h: InProcessBroker) -> int:
    return int(h.broker.gpus_view()[0]["available_mib"])


def test_a_grant_the_disk_cannot_keep_is_refused_and_books_nothing(
    small_disk: Path, pool: SleeperPool
) -> None:
    scenario = small_disk.parent / "scenario.toml"
    scenario.write_text(SINGLE_24G)
    h = InProcessBroker(scenario, small_disk / "data", persist=True)
    try:
        first = h.acquire(pool.spawn()[1], mib=1024).result()
        filler = _fill(small_disk)
        granted: list[Lease] = [first]
        refused: RpcError | None = None
        # the journal's last block may still take a few lines: ask until it is full
        for _ in range(50):
            before = _available(h)
            task = h.acquire(pool.spawn()[1], mib=1024)
            h.spin()
            exc = task.exception()
            if exc is None:
                granted.append(task.result())
                continue
            assert isinstance(exc, RpcError), exc
            refused = exc
            assert _available(h) == before  # nothing booked
            break
        assert refused is not None, "the full disk never refused a grant"
        assert refused.name is ErrorCode.STORAGE_UNAVAILABLE
        assert "\n" not in refused.message and "data directory" in refused.message
        assert refused.data["reason"]
        assert {x.lease_id for x in h.broker.leases.values()} == {x.lease_id for x in granted}
        assert not h.broker.queue
        filler.unlink()  # room again
        again = h.acquire(pool.spawn()[1], mib=1024).result()
        granted.append(again)
        h.restart()
        assert set(h.broker.leases) == {x.lease_id for x in granted}
    finally:
        h.close()


# -- every other write: resize, re-attach, ends, waiting requests, jobs, recovery ----------
def _exhaust(h: InProcessBroker, lease: Lease) -> None:
    """Re-attach `lease` (each a journal line) until the journal's last block is full too."""
    for _ in range(200):
        try:
            lease = h.broker.attach(lease.lease_id, lease.token, "tester", lease.conn_id)
        except RpcError as exc:
            assert _code(exc) is ErrorCode.STORAGE_UNAVAILABLE
            return
    raise AssertionError("the full disk never refused a re-attach")


def _code(exc: BaseException | None) -> ErrorCode:
    assert isinstance(exc, RpcError), exc
    assert "\n" not in exc.message and exc.data["reason"], exc
    return exc.name


def _code_of(task: asyncio.Task[Any]) -> ErrorCode:
    exc = task.exception()
    assert isinstance(exc, RpcError), exc
    return exc.name


def _stored_states(data: Path) -> dict[str, str]:
    with contextlib.closing(sqlite3.connect(data / "broker.sqlite3")) as db:
        return dict(db.execute("SELECT lease_id, state FROM leases").fetchall())


@pytest.fixture
def disk_broker(small_disk: Path) -> Iterator[InProcessBroker]:
    scenario = small_disk.parent / "scenario.toml"
    scenario.write_text(SINGLE_24G)
    h = InProcessBroker(scenario, small_disk / "data", persist=True)
    try:
        yield h
    finally:
        h.close()


def test_a_resize_the_disk_cannot_keep_is_refused_and_changes_nothing(
    small_disk: Path, disk_broker: InProcessBroker, pool: SleeperPool
) -> None:
    h = disk_broker
    spare = h.acquire(pool.spawn()[1], mib=1, ttl_s=3600).result()
    big = h.acquire(pool.spawn()[1], mib=20000).result()
    lease = h.acquire(pool.spawn()[1], mib=1024).result()
    filler = _fill(small_disk)
    _exhaust(h, spare)
    shrink = h.loop.create_task(h.broker.resize(lease.lease_id, "tester", 512, 0.0, 1))
    h.spin()
    assert _code(shrink.exception()) is ErrorCode.STORAGE_UNAVAILABLE
    assert "not resized" in str(shrink.exception())
    assert h.broker.leases[lease.lease_id].granted_mib == 1024
    waiting = h.loop.create_task(h.broker.resize(lease.lease_id, "tester", 4096, 30.0, 1))
    h.spin()
    assert not waiting.done()  # queued: 20 000 + 1 024 + 3 072 do not fit beside headroom
    before = _available(h)
    h.broker.release(big.lease_id, "tester")  # its end goes to the reserve
    h.clock.advance(1.0)
    h.sample()  # the pass grants the growth; the store refuses it; the pass goes on
    assert _code(waiting.exception()) is ErrorCode.STORAGE_UNAVAILABLE
    assert h.broker.leases[lease.lease_id].granted_mib == 1024
    assert not h.broker.queue and not h.broker.resizes.pending
    assert _available(h) >= before  # the growth booked nothing
    filler.unlink()
    grown = h.loop.create_task(h.broker.resize(lease.lease_id, "tester", 2048, 0.0, 1))
    h.spin()
    assert grown.result().granted_mib == 2048
    h.restart()
    assert h.broker.leases[lease.lease_id].granted_mib == 2048
    assert big.lease_id not in h.broker.leases


def test_a_reattach_the_disk_cannot_keep_is_refused_and_the_old_token_still_works(
    small_disk: Path, disk_broker: InProcessBroker, pool: SleeperPool
) -> None:
    h = disk_broker
    spare = h.acquire(pool.spawn()[1], mib=1, ttl_s=3600).result()
    lease = h.acquire(pool.spawn()[1], mib=1024).result()
    token = lease.token
    h.restart()
    filler = _fill(small_disk)
    _exhaust(h, spare)
    with pytest.raises(RpcError) as refused:
        h.broker.attach(lease.lease_id, token, "tester", 7)
    assert _code(refused.value) is ErrorCode.STORAGE_UNAVAILABLE
    restored = h.broker.leases[lease.lease_id]
    assert restored.conn_id is None and restored.reattach_by is not None  # unchanged
    filler.unlink()
    again = h.broker.attach(lease.lease_id, token, "tester", 7)
    assert again.conn_id == 7 and again.token != token
    h.restart()
    assert h.broker.attach(lease.lease_id, again.token, "tester", 8).conn_id == 8


def test_ends_on_a_full_disk_are_neither_lost_nor_resurrected_by_a_restart(
    small_disk: Path, disk_broker: InProcessBroker, pool: SleeperPool
) -> None:
    """Released, expired for want of a heartbeat, holder exited, connection closed: each
    end a full disk cannot journal goes to the reserve, and a broker stopped before there
    is room (its journal not folded) comes back with those leases ended, not restored; a
    waiting request removed meanwhile is not restored either."""
    h = disk_broker
    spare = h.acquire(pool.spawn()[1], mib=1, ttl_s=3600).result()
    kept = h.acquire(pool.spawn()[1], mib=1024, ttl_s=3600).result()
    released = h.acquire(pool.spawn()[1], mib=1024, ttl_s=3600).result()
    expired = h.acquire(pool.spawn()[1], mib=1024, ttl_s=5).result()
    proc, holder = pool.spawn()
    exited = h.acquire(holder, mib=1024, ttl_s=3600).result()
    closed = h.acquire(pool.spawn()[1], conn_id=9, mib=1024, ttl_s=3600).result()
    waiter = h.acquire(pool.spawn()[1], mib=23000, wait_s=60, request_key="k-1")
    assert not waiter.done()
    filler = _fill(small_disk)
    _exhaust(h, spare)
    h.broker.release(released.lease_id, "tester")
    proc.kill()
    proc.wait()
    h.broker.connection_closed(9)
    h.broker.cancel_request(h.broker.queue[0].request_id, "tester")
    h.spin()
    assert _code_of(waiter) is ErrorCode.CANCELLED
    for _ in range(12):  # renew the others: only `expired` misses its heartbeats
        h.clock.advance(0.5)
        h.broker.renew(kept.lease_id, "tester")
        h.tick(0.5)
    gone = {released.lease_id, expired.lease_id, exited.lease_id, closed.lease_id}
    assert set(h.broker.leases) == {kept.lease_id, spare.lease_id}
    assert h.broker.store is not None and h.broker.store.owing
    with contextlib.suppress(sqlite3.Error):  # stopped while full: nothing folded
        h.broker.store.close()
    filler.unlink()
    h.restart()
    assert set(h.broker.leases) == {kept.lease_id, spare.lease_id}
    assert not h.broker.queue
    states = _stored_states(h.data_dir)
    assert {states[x] for x in gone} <= {"released", "expired", "holder_exited"}
    assert states[expired.lease_id] == "expired" and states[released.lease_id] == "released"


def test_recovery_once_there_is_room_again(
    small_disk: Path, disk_broker: InProcessBroker, pool: SleeperPool
) -> None:
    """Fill, act, free space, act, restart: what was kept back is written by the tick, and
    the broker goes on as if the disk had never been full."""
    h = disk_broker
    spare = h.acquire(pool.spawn()[1], mib=1, ttl_s=3600).result()
    a = h.acquire(pool.spawn()[1], mib=1024, ttl_s=3600).result()
    b = h.acquire(pool.spawn()[1], mib=1024, ttl_s=3600).result()
    filler = _fill(small_disk)
    _exhaust(h, spare)
    h.broker.release(a.lease_id, "tester")
    store = h.broker.store
    assert store is not None and store.owing
    filler.unlink()
    h.clock.advance(2.0)
    h.tick(2.0)
    assert not store.owing
    assert (small_disk / "data" / "broker.leases.jsonl").stat().st_size == 0
    c = h.acquire(pool.spawn()[1], mib=1024, ttl_s=3600).result()
    waiting = h.acquire(pool.spawn()[1], mib=23000, wait_s=60, request_key="k-2")
    assert not waiting.done()
    h.restart()
    assert waiting.cancelled()  # its client's connection broke with the old broker
    assert set(h.broker.leases) == {b.lease_id, c.lease_id, spare.lease_id}
    assert [w.request_key for w in h.broker.queue] == ["k-2"]
    assert _stored_states(h.data_dir)[a.lease_id] == "released"


def test_job_calls_on_a_full_disk_are_refused_and_change_nothing(
    small_disk: Path, disk_broker: InProcessBroker, pool: SleeperPool
) -> None:
    h = disk_broker
    spare = h.acquire(pool.spawn()[1], mib=1, ttl_s=3600).result()
    job = h.broker.declare_job("tester", "tests", "full disk", "h", 100, 1, 1)
    job_id = job["job_id"]
    h.broker.report_job(job_id, "tester", "c-0", 1, 0, 1)
    filler = _fill(small_disk)
    _exhaust(h, spare)
    count = len(h.broker.jobs.jobs)
    with pytest.raises(RpcError) as declared:
        h.broker.declare_job("tester", "tests", "refused", "h", 10, 1, 1)
    assert _code(declared.value) is ErrorCode.STORAGE_UNAVAILABLE
    assert len(h.broker.jobs.jobs) == count
    for n in range(1, 30):  # SQLite's last page may take a few: until refused
        try:
            h.broker.report_job(job_id, "tester", f"c-{n}", 1, 0, 1)
        except RpcError as exc:
            assert _code(exc) is ErrorCode.STORAGE_UNAVAILABLE
            break
    else:
        raise AssertionError("the full disk never refused a report")
    refused_chunk = f"c-{n}"
    counted = h.broker.jobs.jobs[job_id].completed_items
    assert refused_chunk not in h.broker.jobs.jobs[job_id].chunks
    with pytest.raises(RpcError) as updated:
        h.broker.update_job(job_id, "tester", "cancelled", "stop", None, 1)
    assert _code(updated.value) is ErrorCode.STORAGE_UNAVAILABLE
    assert h.broker.jobs.jobs[job_id].state == "running"
    h.broker.connection_closed(1)  # the job stalls: not written, so not stalled yet
    h.tick(0.5)
    h.broker._check_holders()
    assert h.broker.jobs.jobs[job_id].state == "running"
    filler.unlink()
    h.broker._check_holders()  # tried again: written now
    assert h.broker.jobs.jobs[job_id].state == "stalled"
    h.broker.report_job(job_id, "tester", refused_chunk, 1, 0, 2)
    h.restart()
    again = h.broker.jobs.jobs[job_id]
    assert again.completed_items == counted + 1 and refused_chunk in again.chunks
