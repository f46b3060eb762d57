"""A step of the wall clock frees no memory that is in use (issue 26; docs/architecture.md §3).

A holder is a pid plus its start time. psutil's `create_time()` is the boot time plus the
start ticks, and it re-reads the boot time from `/proc/stat` `btime`, which the kernel moves
with the wall clock: after a step (chrony makestep, `date -s`, a VM resumed from a snapshot)
every live holder looked like another process, its leases ended `holder_exited`, and their
memory was admitted again. The step is made here by moving what the broker process reads:
the boot time psutil reads and the broker's wall clock, by ±5 s and ±1 h, live and across a
restart; the control moves the wall clock alone. Linux only: the btime step is Linux's
(Windows and macOS keep a process's creation time as stored when it began).

The numbers: two holders of 4 096 MiB on a 24 576 MiB GPU with 1 024 MiB headroom leave
15 360 MiB, so 15 361 MiB must be refused.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from collections.abc import Callable

import psutil
import pytest

from rbroker.base.proctime import linux_stat, start_s
from rbroker.broker.holders import Holder
from rbroker.broker.leases import Lease, LeaseState
from tests.conftest import GPU0, SINGLE_24G
from tests.desktop.inprocess import InProcessBroker, SleeperPool

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"),
    reason="Linux only: the boot time that moves with the wall clock is /proc/stat btime",
)

HEADROOM_MIB = 1024
LEFT_MIB = 24576 - HEADROOM_MIB - 2 * 4096  # 15 360
STEPS_S = [5.0, -5.0, 3600.0, -3600.0]


@pytest.fixture
def h(make_inprocess: Callable[..., InProcessBroker]) -> InProcessBroker:
    return make_inprocess(SINGLE_24G, headroom_mib=HEADROOM_MIB)  # with its store


def _step_clock(h: InProcessBroker, monkeypatch: pytest.MonkeyPatch, step_s: float) -> None:
    """The wall clock steps by `step_s`: psutil's boot time (btime) and the broker's wall
    clock move with it; monotonic and boot clocks do not."""
    booted = psutil.boot_time()
    monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: booted + step_s)  # type: ignore[attr-defined]
    h.clock.wall_s += step_s


def _two_holders(h: InProcessBroker, pool: SleeperPool) -> list[Lease]:
    leases = []
    for _ in range(2):
        _, holder = pool.spawn()
        task = h.acquire(holder, mib=4096, gpu_uuid=GPU0, wait_s=0.0, ttl_s=30)
        assert task.done(), "not granted at once"
        leases.append(task.result())
    h.sample()
    return leases


def _refuses_one_mib_more(h: InProcessBroker) -> None:
    me = Holder.of(os.getpid())
    over = h.acquire(me, mib=LEFT_MIB + 1, gpu_uuid=GPU0, wait_s=0.0)
    h.tick(0.1)
    assert over.done() and over.exception() is not None, "over-admitted"
    fits = h.acquire(me, mib=LEFT_MIB, gpu_uuid=GPU0, wait_s=0.0)
    h.tick(0.1)
    assert fits.done() and fits.exception() is None, "the arithmetic is not the one above"


def _live(h: InProcessBroker, leases: list[Lease]) -> list[LeaseState]:
    return [
        h.broker.leases[x.lease_id].state if x.lease_id in h.broker.leases else x.state
        for x in leases
    ]


@pytest.mark.parametrize("step_s", STEPS_S)
def test_a_clock_step_ends_no_live_lease(
    h: InProcessBroker, pool: SleeperPool, monkeypatch: pytest.MonkeyPatch, step_s: float
) -> None:
    leases = _two_holders(h, pool)
    _step_clock(h, monkeypatch, step_s)
    for _ in range(3):  # 3 s of ticks and samples: the reaper ran every turn
        h.clock.advance(1.0)
        h.tick(1.0)
        h.sample()
    assert _live(h, leases) == [LeaseState.ACTIVE, LeaseState.ACTIVE]
    _refuses_one_mib_more(h)


def test_control_a_wall_clock_alone_ends_no_live_lease(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    leases = _two_holders(h, pool)
    h.clock.wall_s += 3600.0
    h.clock.advance(1.0)
    h.tick(1.0)
    h.sample()
    assert _live(h, leases) == [LeaseState.ACTIVE, LeaseState.ACTIVE]
    _refuses_one_mib_more(h)


@pytest.mark.parametrize("step_s", STEPS_S)
def test_a_clock_step_while_the_broker_is_down_ends_no_restored_lease(
    h: InProcessBroker, pool: SleeperPool, monkeypatch: pytest.MonkeyPatch, step_s: float
) -> None:
    leases = _two_holders(h, pool)
    _step_clock(h, monkeypatch, step_s)
    h.restart()
    h.sample()
    assert [x.lease_id in h.broker.leases for x in leases] == [True, True]
    _refuses_one_mib_more(h)


def test_start_times_of_another_boot_are_never_compared(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    """Since-boot start times repeat across boots: a store written in another boot holds
    no live holder, even where a pid and its start ticks match one running now."""
    leases = _two_holders(h, pool)
    store = h.broker.store
    assert store is not None
    assert (store.meta("holder_clock") or "").startswith("since-boot ")
    store.set_meta("holder_clock", "since-boot 00000000-0000-0000-0000-000000000000")
    h.restart()
    assert [x.lease_id in h.broker.leases for x in leases] == [False, False]
    ended = {x.lease_id: x for x in h.broker.lessor.ended}
    assert [ended[x.lease_id].ended_reason for x in leases] == [
        "holder exited while the broker was down"
    ] * 2


def test_a_store_from_before_the_boot_clock_keeps_its_live_leases(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    """A store written by an earlier version holds psutil's Unix start times and no
    `holder_clock`: its live holders are recognised once, and the figures stored anew."""
    leases = _two_holders(h, pool)
    store = h.broker.store
    assert store is not None
    store.flush()  # the journal's grants into the database, to be rewritten as of old
    db = sqlite3.connect(store.path)
    with db:
        for x in leases:
            unix_start = psutil.Process(x.holder.pid).create_time()
            db.execute(
                "UPDATE leases SET record = json_set(record, '$.holder_start', ?)"
                " WHERE lease_id = ?",
                (unix_start, x.lease_id),
            )
        db.execute("DELETE FROM meta WHERE key = 'holder_clock'")
    db.close()
    h.restart()
    assert [x.lease_id in h.broker.leases for x in leases] == [True, True]
    assert [h.broker.leases[x.lease_id].holder for x in leases] == [x.holder for x in leases]
    _refuses_one_mib_more(h)


def test_a_restored_waiter_keeps_its_wait_whatever_the_wall_clock_did(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    """The wait left is measured on the boot clock: 100 s into a 600 s wait, with the wall
    clock an hour back, 500 s are left (the wall clock said 4 100)."""
    _, big = pool.spawn()
    assert h.acquire(big, mib=20000, gpu_uuid=GPU0, wait_s=0.0).done()
    _, waiter_holder = pool.spawn()
    h.acquire(waiter_holder, mib=8000, gpu_uuid=GPU0, wait_s=600.0, request_key="k-600")
    assert len(h.broker.queue) == 1
    h.clock.advance(100.0)
    h.clock.wall_s -= 3600.0
    h.restart()
    [restored] = h.broker.queue
    assert restored.deadline - h.clock.monotonic() == pytest.approx(500.0, abs=0.01)


def test_a_holder_is_alive_until_its_process_is_a_zombie_or_gone(pool: SleeperPool) -> None:
    """`Holder.alive` answers from one read of /proc/PID/stat (`linux_stat`), as psutil's
    start time and status did: alive while the process runs, not once it is a zombie
    (exited, not reaped yet) nor once it is reaped, and never for another start time."""
    proc, holder = pool.spawn()
    assert holder.alive()
    start, state = linux_stat(holder.pid)
    assert start == start_s(psutil.Process(holder.pid)) == holder.start_time
    assert state in ("R", "S")  # running, or asleep (a sleeper just started may still run)
    assert not Holder(holder.pid, holder.start_time + 0.01).alive()  # another process
    proc.kill()
    while psutil.Process(holder.pid).status() != psutil.STATUS_ZOMBIE:
        pass
    assert linux_stat(holder.pid)[1] == "Z"
    assert not holder.alive()
    proc.wait()
    assert not holder.alive()
