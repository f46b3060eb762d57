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
