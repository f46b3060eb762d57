"""`capacity` events go out when a sample changes what the views show of a GPU (its
telemetry, its capacity figures, a lease's observed MiB), not at every sample: an idle
broker's subscribers (the tray, `rbroker watch`, the uplink) read nothing (issue 44; the
tray attached to an idle broker used 3–4 % of a core re-reading the same answers at each
of its samples)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.conftest import GPU0
from tests.desktop.inprocess import InProcessBroker, SleeperPool
from tests.fakes.gpu_scenarios import gpu, scenario

ONE_GPU = scenario(gpu(GPU0, name="Simulated 20 GB", total_mib=20000))


def test_capacity_is_told_when_it_changes_not_at_every_sample(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h = make_inprocess(ONE_GPU, headroom_mib=1000)
    h.broker.gateway.foreign_pids = False  # the simulated driver lists this machine's pids
    told: list[dict[str, Any]] = []
    h.broker.subscribe(lambda kind, data: told.append(data) if kind == "capacity" else None)
    h.sample()
    h.sample()
    h.sample()
    assert len(told) <= 1  # the first sample after subscribing may tell what it saw
    told.clear()
    _, outsider = pool.spawn()
    h.fake.allocate(GPU0, outsider.pid, 2000)  # memory used outside any lease: figures change
    h.sample()
    assert told == [{"gpu_uuid": GPU0}]
    h.sample()
    assert told == [{"gpu_uuid": GPU0}]  # unchanged since: nothing more
    _, holder = pool.spawn()
    h.acquire(holder, mib=4000, ttl_s=60).result()
    told.clear()
    h.fake.allocate(GPU0, holder.pid, 1500)  # the lease's observed MiB changes
    h.sample()
    assert told == [{"gpu_uuid": GPU0}]
    told.clear()
    h.fake.set_gpu(GPU0, error="gpu_lost")  # telemetry fails: told, fail closed
    h.sample()
    assert told == [{"gpu_uuid": GPU0}]


def test_the_leases_kept_between_samples_are_the_ones_read_anew(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    """What a `capacity` event compares of the leases (each one's observed MiB and idle
    state) is kept between samples while nothing in it can have changed
    (`Broker._leases_seen`); at every step it is what the leases show read anew: through
    grants and an end, memory allocated, activity, utilization unknown and known again,
    and leases turning idle by the clock alone, at the very moment they do."""
    idle_after_s = 600.0
    h = make_inprocess(ONE_GPU, headroom_mib=1000, idle_after_s=idle_after_s)
    h.broker.gateway.foreign_pids = False  # the simulated driver lists this machine's pids
    (_, a), (_, b) = pool.spawn(), pool.spawn()
    h.sample()
    first = h.acquire(a, mib=3000, ttl_s=3600).result()
    states = []

    def check() -> None:
        kept = h.broker._leases_seen(GPU0)
        h.broker._leases_said.clear()
        assert h.broker._leases_seen(GPU0) == kept
        states.append({str(x[0]): str(x[2]) for x in kept if isinstance(x, tuple)})

    h.sample()
    check()
    h.fake.allocate(GPU0, a.pid, 1000)
    h.sample()
    check()
    h.clock.advance(300.0)
    h.sample()
    second = h.acquire(b, mib=2000, ttl_s=3600).result()
    h.sample()
    check()
    h.clock.advance(first.granted_at + idle_after_s - h.clock.monotonic() - 0.001)
    h.sample()  # the sample moves the clock 1 ms: exactly idle_after_s after the grant
    check()
    assert states[-1] == {first.lease_id: "idle", second.lease_id: "active"}
    h.fake.set_utilization(GPU0, a.pid, 50)  # busy again
    h.sample()
    check()
    assert states[-1][first.lease_id] == "active"
    h.fake.set_utilization(GPU0, a.pid, 0)
    h.fake.set_gpu(GPU0, utilization_error="not_supported")
    h.sample()
    check()
    assert set(states[-1].values()) == {"unknown"}
    h.fake.set_gpu(GPU0, utilization_error="")
    h.sample()
    check()
    for _ in range(7):  # both turn idle again by the clock alone
        h.clock.advance(100.0)
        h.sample()
        check()
    assert set(states[-1].values()) == {"idle"}
    h.broker.release(second.lease_id, "tester")
    h.sample()
    check()
    assert list(states[-1]) == [first.lease_id]


def test_a_lease_idle_between_two_samples_and_busy_at_both_is_told(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    """Both samples show the lease active, but between them it turned idle by the clock and a
    reader was shown it idle: the second sample tells (the tray, whose read after the last
    event came later than `idle_after_s`, showed `idle 1 s` for good under a loaded Wine);
    a lease busy at every sample, never idle between, tells nothing more."""
    idle_after_s = 600.0
    h = make_inprocess(ONE_GPU, headroom_mib=1000, idle_after_s=idle_after_s)
    h.broker.gateway.foreign_pids = False  # the simulated driver lists this machine's pids
    _, holder = pool.spawn()
    lease = h.acquire(holder, mib=3000, ttl_s=3600).result()
    h.fake.allocate(GPU0, holder.pid, 1000)
    h.fake.set_utilization(GPU0, holder.pid, 50)
    told: list[dict[str, Any]] = []
    h.broker.subscribe(lambda kind, data: told.append(data) if kind == "capacity" else None)
    h.sample()
    h.clock.advance(idle_after_s / 2)
    h.sample()
    told.clear()
    h.clock.advance(idle_after_s / 2)  # busy at the last sample, busy at the next
    h.sample()
    assert told == []  # active all along: nothing to tell
    h.clock.advance(idle_after_s + 1)  # no sample for longer than idle_after_s
    shown = next(x for x in h.broker.leases_view()["leases"] if x["lease_id"] == lease.lease_id)
    assert shown["idle_state"] == "idle"  # what a reader between the samples was shown
    h.sample()  # busy again: the same state as the last sample told, yet news
    assert told == [{"gpu_uuid": GPU0}]
    shown = next(x for x in h.broker.leases_view()["leases"] if x["lease_id"] == lease.lease_id)
    assert shown["idle_state"] == "active"
