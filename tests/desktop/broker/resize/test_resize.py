"""Resizing a grant (docs/architecture.md §3), on an in-process broker with a manual clock
and real holder processes: a shrink admits a waiter at once, a growth waits behind an
earlier waiter (FIFO), a growth that can never fit is refused as infeasible, bad input is a
stable error with the numbers and leaves the lease unchanged, and — a stateful test mixing
resizes with acquires, releases, allocations and time — the capacity invariant holds at
every step. The same method over the local API and the SDK:
tests/desktop/broker/resize/test_resize_api.py.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from rbroker.broker.holders import Holder
from rbroker.broker.leases import Lease
from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.localapi import MAX_MIB
from tests.conftest import GPU0
from tests.desktop.inprocess import InProcessBroker, SleeperPool
from tests.fakes.gpu_scenarios import gpu, scenario

SCENARIO = scenario(gpu(GPU0))
USABLE = 24576 - 1229  # total − default headroom: 23 347 MiB


@pytest.fixture
def h(make_inprocess: Callable[..., InProcessBroker]) -> InProcessBroker:
    return make_inprocess(SCENARIO)


def _grant(h: InProcessBroker, holder: Holder, mib: int, **kw: Any) -> Lease:
    task = h.acquire(holder, **{"mib": mib, "wait_s": 0.0, **kw})
    if not task.done():
        h.sample()
    assert task.done(), "not granted"
    return task.result()


def _resize(
    h: InProcessBroker, lease: Lease, mib: int, wait_s: float = 0.0, owner: str = "tester"
) -> asyncio.Task[Lease]:
    task = h.loop.create_task(h.broker.resize(lease.lease_id, owner, mib, wait_s, 7))
    h.spin()
    return task


def _error(task: asyncio.Task[Lease]) -> RpcError:
    assert task.done()
    exc = task.exception()
    assert isinstance(exc, RpcError), exc
    return exc


def test_shrink_takes_effect_at_once_and_admits_a_waiter(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    a = _grant(h, pool.spawn()[1], 20000)
    waiting = h.acquire(pool.spawn()[1], mib=10000, wait_s=60.0)
    h.sample()
    assert not waiting.done() and len(h.broker.queue) == 1
    slot = h.broker.slots[GPU0]
    slot.kick.clear()
    shrink = _resize(h, a, 10000)
    assert shrink.done() and shrink.result() is a and a.granted_mib == 10000
    # the freed 10 000 MiB stay booked until a sample that began after the shrink shows
    # what the holder really uses (the release rule); the shrink asked for that sample
    assert slot.kick.is_set() or slot.soon is not None
    assert h.broker.lessor.unconfirmed_mib(GPU0) == 10000 and not waiting.done()
    h.sample()  # the sample the shrink asked for: the waiter is granted in that pass
    assert waiting.done() and waiting.result().granted_mib == 10000
    assert h.broker.queue == [] and h.broker.lessor.unconfirmed_mib(GPU0) == 0
    cap = h.broker.capacity(GPU0)
    assert cap is not None and cap.outstanding_mib == 20000 and cap.available_mib == 3347


def test_shrink_below_what_the_holder_allocated_frees_only_what_it_does_not_use(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    proc, holder = pool.spawn()
    a = _grant(h, holder, 20000)
    h.fake.allocate(GPU0, proc.pid, 15000)  # since the last sample: the broker saw none of it
    h.broker.memory_changed(GPU0)
    _resize(h, a, 10000)
    waiting = h.acquire(pool.spawn()[1], mib=10000, wait_s=60.0)
    cap = h.broker.capacity(GPU0)
    assert cap is not None and cap.available_mib == 3347  # nothing offered on an old sample
    h.sample()
    # the sample shows 15 000 MiB in use (5 000 over the new grant): 8 347 MiB are free
    assert a.observed_mib[GPU0] == 15000 and a.over_grant
    cap = h.broker.capacity(GPU0)
    assert cap is not None and cap.available_mib == 8347
    assert not waiting.done()


def test_growth_waits_behind_an_earlier_waiter(h: InProcessBroker, pool: SleeperPool) -> None:
    a = _grant(h, pool.spawn()[1], 10000)  # 13 347 MiB left
    _, b_holder = pool.spawn()
    b_proc = pool.procs[-1]
    earlier = h.acquire(b_holder, mib=14000, wait_s=60.0)
    h.sample()
    assert not earlier.done()
    growth = _resize(h, a, 12000, wait_s=60.0)  # 2 000 more would fit, but B came first
    for _ in range(3):
        h.sample()
    assert not growth.done() and a.granted_mib == 10000
    (entry,) = [w for w in h.broker.leases_view()["queue"] if w["resize_of"] == a.lease_id]
    assert entry["mib"] == 2000 and entry["ahead"] == 1
    assert "1 request ahead" in entry["reason"]
    b_proc.kill()  # the earlier waiter goes away: the growth is next
    b_proc.wait(10)
    h.tick(0.3)
    h.sample()
    assert growth.done() and growth.result() is a
    assert a.granted_mib == 12000 and a.lease_id in h.broker.leases
    assert earlier.done() and _error(earlier).name is ErrorCode.CANCELLED
    assert a.admission[GPU0]["resized_from_mib"] == 10000
    assert a.admission[GPU0]["extra_mib"] == 2000


def test_growth_not_granted_in_time_says_so_with_numbers(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    a = _grant(h, pool.spawn()[1], 10000)
    _grant(h, pool.spawn()[1], 12000)  # 1 347 MiB left
    growth = _resize(h, a, 14000, wait_s=0.0)
    h.sample()
    h.tick(0.1)
    err = _error(growth)
    assert err.name is ErrorCode.CAPACITY_UNAVAILABLE
    assert err.message.startswith(f"resize of {a.lease_id} from 10 000 to 14 000 MiB (4 000 more)")
    assert err.data["granted_mib"] == 10000 and err.data["requested_mib"] == 14000
    assert err.data["extra_mib"] == 4000 and err.data["available_mib"] == 1347
    assert a.granted_mib == 10000 and h.broker.queue == []


def test_growth_that_can_never_fit_is_refused_as_infeasible(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    a = _grant(h, pool.spawn()[1], 4096)
    err = _error(_resize(h, a, USABLE + 1, wait_s=60.0))
    assert err.name is ErrorCode.INFEASIBLE
    assert err.data["usable_mib"] == USABLE and err.data["requested_mib"] == USABLE + 1
    assert err.data["lease_id"] == a.lease_id and err.data["granted_mib"] == 4096
    assert a.granted_mib == 4096 and h.broker.queue == []
    ok = _resize(h, a, USABLE)  # the whole GPU minus headroom does fit
    h.sample()
    assert ok.done() and ok.result().granted_mib == USABLE


@pytest.mark.parametrize("mib", [0, -1, -20000, MAX_MIB + 1, 10**30])
def test_bad_sizes_are_refused_with_the_numbers(
    h: InProcessBroker, pool: SleeperPool, mib: int
) -> None:
    a = _grant(h, pool.spawn()[1], 4096)
    err = _error(_resize(h, a, mib))
    assert err.name is ErrorCode.INVALID_PARAMS
    assert err.data == {"field": "mib", "requested_mib": mib, "min_mib": 1, "max_mib": MAX_MIB}
    assert a.granted_mib == 4096


def test_resize_of_another_users_or_an_ended_lease_or_twice_is_refused(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    a = _grant(h, pool.spawn()[1], 4096)
    err = _error(_resize(h, a, 2048, owner="someone-else"))
    assert err.name is ErrorCode.NOT_LEASE_OWNER and err.data["lease_id"] == a.lease_id
    assert a.granted_mib == 4096
    _grant(h, pool.spawn()[1], 18000)  # 1 251 MiB left
    pending = _resize(h, a, 8192, wait_s=60.0)
    h.sample()
    assert not pending.done()
    again = _error(_resize(h, a, 2048))
    assert again.name is ErrorCode.RESIZE_PENDING
    assert again.data == {
        "lease_id": a.lease_id,
        "granted_mib": 4096,
        "pending_mib": 8192,
        "requested_mib": 2048,
    }
    assert a.granted_mib == 4096
    h.broker.release(a.lease_id, "tester")  # ending the lease ends its waiting growth
    h.spin()
    assert _error(pending).name is ErrorCode.LEASE_EXPIRED and h.broker.queue == []
    ended = _error(_resize(h, a, 2048))
    assert ended.name is ErrorCode.LEASE_NOT_FOUND and ended.data["state"] == "released"


def test_resize_to_the_same_size_changes_nothing(h: InProcessBroker, pool: SleeperPool) -> None:
    a = _grant(h, pool.spawn()[1], 4096)
    task = _resize(h, a, 4096)
    assert task.done() and task.result().granted_mib == 4096


def test_a_resized_grant_survives_a_broker_restart(h: InProcessBroker, pool: SleeperPool) -> None:
    a = _grant(h, pool.spawn()[1], 4096)
    grow = _resize(h, a, 9000)
    h.sample()
    assert grow.done() and grow.result().granted_mib == 9000
    h.restart()
    restored = h.broker.leases[a.lease_id]
    assert restored.restored and restored.granted_mib == 9000
    cap = h.broker.capacity(GPU0)
    assert cap is not None and cap.outstanding_mib == 9000


# -- stateful: resizes mixed with acquires, releases, allocations and time -----------------
class ResizeMachine(RuleBasedStateMachine):
    """Each lease has its own holder process (so what a holder allocates is its lease's)."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="rbrsm-"))
        (self.tmp / "scenario.toml").write_text(SCENARIO)
        self.pool = SleeperPool()
        self.h = InProcessBroker(self.tmp / "scenario.toml", self.tmp)
        self.acquires: list[asyncio.Task[Lease]] = []
        self.resizes: list[tuple[asyncio.Task[Lease], Lease, int, int]] = []
        self.allocated: dict[int, int] = {}  # holder pid → MiB it allocated

    def _active(self, i: int) -> Lease | None:
        leases = list(self.h.broker.leases.values())
        return leases[i % len(leases)] if leases else None

    def _harvest(self) -> None:
        self.h.spin()
        for task in [t for t in self.acquires if t.done()]:
            self.acquires.remove(task)
            assert task.cancelled() or isinstance(task.exception(), RpcError | type(None))
        for item in [r for r in self.resizes if r[0].done()]:
            self.resizes.remove(item)
            task, lease, old, mib = item
            exc = task.exception()
            if exc is None:
                assert task.result() is lease and lease.granted_mib == mib
            else:
                assert isinstance(exc, RpcError), repr(exc)
                if lease.lease_id in self.h.broker.leases and exc.name is not ErrorCode.CANCELLED:
                    assert lease.granted_mib == old, "a refused resize changed the lease"

    @rule(mib=st.sampled_from([1024, 4096, 8192, 16384]), wait_s=st.sampled_from([0.0, 20.0]))
    def acquire(self, mib: int, wait_s: float) -> None:
        _, holder = self.pool.spawn()
        self.acquires.append(self.h.acquire(holder, mib=mib, wait_s=wait_s))
        self._harvest()

    @rule(
        i=st.integers(0, 7),
        mib=st.sampled_from([512, 2048, 6000, 12000, 20000, USABLE, USABLE + 1]),
        wait_s=st.sampled_from([0.0, 20.0]),
    )
    def resize(self, i: int, mib: int, wait_s: float) -> None:
        lease = self._active(i)
        if lease is None:
            return
        old = lease.granted_mib
        self.resizes.append((_resize(self.h, lease, mib, wait_s), lease, old, mib))
        self._harvest()

    @rule(i=st.integers(0, 7), part=st.sampled_from([0.25, 0.5, 1.0]))
    def allocate(self, i: int, part: float) -> None:
        """A holder allocates within its grant (more is over-grant, not the broker's doing)."""
        lease = self._active(i)
        if lease is None:
            return
        have = self.allocated.get(lease.holder.pid, 0)
        mib = int((lease.granted_mib - have) * part)
        if mib > 0:
            self.h.fake.allocate(GPU0, lease.holder.pid, mib)
            self.allocated[lease.holder.pid] = have + mib
            self.h.broker.memory_changed(GPU0)

    @rule(i=st.integers(0, 7))
    def release(self, i: int) -> None:
        lease = self._active(i)
        if lease is not None:
            self.h.broker.release(lease.lease_id, "tester")
            self.h.fake.free(GPU0, lease.holder.pid)
            self.allocated.pop(lease.holder.pid, None)
            self.h.broker.memory_changed(GPU0)
            self._harvest()

    @rule()
    def sample(self) -> None:
        self.h.sample()
        self._harvest()

    @rule(seconds=st.sampled_from([0.2, 1.0, 25.0]))
    def time_passes(self, seconds: float) -> None:
        for lease in self.h.broker.leases.values():  # holders keep renewing
            self.h.broker.renew(lease.lease_id, "tester")
        self.h.clock.advance(seconds)
        self.h.tick(seconds)
        self._harvest()

    @invariant()
    def capacity_is_never_over_admitted(self) -> None:
        broker = self.h.broker
        cap = broker.capacity(GPU0)
        if cap is not None:  # the broker's own accounting, before its max(0, ...)
            assert cap.device_used_mib + cap.outstanding_mib + cap.headroom_mib <= cap.total_mib
        # the truth: what holders allocated, plus what their grants may still allocate
        committed = sum(
            max(lease.granted_mib, self.allocated.get(lease.holder.pid, 0))
            for lease in broker.leases.values()
        )
        assert committed <= USABLE, (committed, [x.granted_mib for x in broker.leases.values()])

    @invariant()
    def at_most_one_growth_per_lease_waits(self) -> None:
        growths = [w.resize_of for w in self.h.broker.queue if w.resize_of is not None]
        assert len(growths) == len(set(growths))
        assert set(growths) <= set(self.h.broker.leases)

    def teardown(self) -> None:
        try:
            for lease in list(self.h.broker.leases.values()):
                self.h.broker.release(lease.lease_id, "tester")
            self._harvest()
            for task in self.acquires + [r[0] for r in self.resizes]:
                task.cancel()  # still waiting: as when their connections close
            self.h.spin()
        finally:
            self.h.close()
            self.pool.close()
            shutil.rmtree(self.tmp, ignore_errors=True)


ResizeMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_resize_state_machine = ResizeMachine.TestCase
