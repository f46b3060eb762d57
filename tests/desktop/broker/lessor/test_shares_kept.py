"""A sample that shows a holder's memory as the one before keeps its leases' shares instead
of figuring them again (`Lessor._observe`, issue 44), and the over-grant watch then reads
only the leases over their grant (`Lessor.over_watch_on`). Whatever changes the shares (a
grant, a release, a resize, memory allocated or freed) shares the memory anew: after every
step the figures are those of the same attribution figured from nothing, on an in-process
broker with a manual clock and real holder processes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rbroker.broker.holders import Holder
from rbroker.broker.leases import Lease
from tests.conftest import GPU0, GPU1
from tests.desktop.inprocess import InProcessBroker, SleeperPool
from tests.fakes.gpu_scenarios import gpu, scenario

pytestmark = pytest.mark.contract  # it starts processes of its own

GPUS = scenario(
    gpu(GPU0, name="Simulated 20 GB", total_mib=20000),
    gpu(GPU1, name="Simulated 20 GB", total_mib=20000),
)


def _figures(h: InProcessBroker) -> dict[str, Any]:
    """Everything attribution decides: each lease's figures, the baselines, the capacity."""
    leases = {
        x.lease_id: (
            dict(x.observed_mib),
            dict(x.baseline_mib),
            x.over_grant,
            x.over_since,
            x.over_mib,
            x.over_noticed,
        )
        for x in h.broker.leases.values()
    }
    capacity = {}
    for uuid in (GPU0, GPU1):
        cap = h.broker.capacity(uuid)
        capacity[uuid] = None if cap is None else cap.as_dict()
    return {"leases": leases, "baselines": dict(h.broker.lessor.baselines), "cap": capacity}


def _sample_and_check(h: InProcessBroker) -> dict[str, Any]:
    """A sample (each GPU, then an admission pass); then the figures it left must be those
    of the same sample shared out again with nothing kept from earlier samples."""
    h.sample()
    kept = _figures(h)
    lessor = h.broker.lessor
    lessor._shared.clear()
    lessor._order.clear()
    for slot in h.broker.slots.values():
        lessor.update_observed(slot)
    assert _figures(h) == kept
    return kept


def _grant(h: InProcessBroker, holder: Holder, mib: int, **params: Any) -> Lease:
    task = h.acquire(holder, mib=mib, wait_s=0.0, ttl_s=3600, **params)
    assert task.done(), "not granted at once"
    return task.result()


def test_shares_kept_between_samples_are_the_ones_figured_anew(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h = make_inprocess(GPUS, persist=False, headroom_mib=1000, over_grant_grace_s=10.0)
    events: list[tuple[str, dict[str, Any]]] = []
    h.broker.subscribe(lambda kind, data: events.append((kind, dict(data))))
    (_, a), (_, b) = pool.spawn(), pool.spawn()
    a1 = _grant(h, a, 4000, gpu_uuid=GPU0)
    a2 = _grant(h, a, 4000, gpu_uuid=GPU0)
    b1 = _grant(h, b, 3000, gpus=2)
    _sample_and_check(h)
    h.fake.allocate(GPU0, a.pid, 6000)
    seen = _sample_and_check(h)
    assert seen["leases"][a1.lease_id][0] == {GPU0: 4000}
    assert seen["leases"][a2.lease_id][0] == {GPU0: 2000}
    assert _sample_and_check(h) == seen  # the same memory: the same shares
    h.fake.allocate(GPU1, b.pid, 5000)
    seen = _sample_and_check(h)
    assert seen["leases"][b1.lease_id][0] == {GPU0: 0, GPU1: 5000}
    assert b1.over_grant
    h.run(h.broker.resize(a2.lease_id, "tester", 1000, 0.0, None))
    seen = _sample_and_check(h)
    assert seen["leases"][a2.lease_id][0] == {GPU0: 2000} and a2.over_grant
    h.broker.release(a1.lease_id, "tester")
    _sample_and_check(h)
    h.fake.free(GPU0, a.pid, 3000)
    _sample_and_check(h)
    for _ in range(11):  # the same memory at every sample, past the over-grant grace
        h.clock.advance(1.0)
        _sample_and_check(h)
    noticed = {d["lease_id"] for kind, d in events if kind == "over_grant"}
    assert noticed == {a2.lease_id, b1.lease_id}
    assert a2.over_noticed and b1.over_noticed
    h.fake.free(GPU1, b.pid)
    _sample_and_check(h)
    assert not b1.over_grant and b1.over_since is None and not b1.over_noticed
