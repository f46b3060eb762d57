"""A holder's baseline survives a broker restart as it was last, not as at its lease's grant
(`rbroker.broker.lessor.Baselines`; docs/architecture.md §2, §3 persistence).

Before: lease records were written at the grant only, so a restarted broker restored the
baseline of that time, and the first sample after the restart counted memory held outside
the leases as lease use: two over-admissions found by review, each a test here (an in-process
broker with its store, a manual clock, the fake NVML keeping its allocations across the
restart as a real GPU would, and real process trees).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rbroker.broker.holders import Holder
from rbroker.broker.leases import Lease
from tests.conftest import GPU0
from tests.desktop.broker.lessor.test_nested_holders import GPUS, USABLE, tree  # noqa: F401 - a fixture
from tests.desktop.inprocess import InProcessBroker


@pytest.fixture
def h(make_inprocess: Callable[..., InProcessBroker]) -> InProcessBroker:
    return make_inprocess(GPUS, headroom_mib=1000)  # with its store: restart() restores


def _grant(h: InProcessBroker, holder: Holder, mib: int) -> Lease:
    task = h.acquire(holder, mib=mib, gpu_uuid=GPU0, wait_s=0.0)
    assert task.done(), "not granted at once"
    return task.result()


def _available(h: InProcessBroker) -> int:
    cap = h.broker.capacity(GPU0)
    assert cap is not None
    return cap.available_mib


def _restart_and_sample(h: InProcessBroker) -> None:
    h.restart()
    h.sample()


@pytest.mark.contract  # it starts processes of its own
def test_a_childs_kept_memory_stays_outside_the_parents_lease_after_a_restart(
    h: InProcessBroker,
    tree: list[Holder],  # noqa: F811 - the imported fixture
) -> None:
    parent, child, _ = tree
    _grant(h, parent, 8000)  # never used
    mine = _grant(h, child, 4000)
    h.fake.allocate(GPU0, child.pid, 4000)
    h.sample()
    h.broker.release(mine.lease_id, "tester")  # the child keeps its 4 000 MiB
    h.sample()
    assert _available(h) == USABLE - 4000 - 8000  # 7 000: the parent's grant still booked
    _restart_and_sample(h)
    assert _available(h) == USABLE - 4000 - 8000, "the child's memory became lease use"
    task = h.acquire(parent, mib=USABLE - 4000 - 8000 + 1, gpu_uuid=GPU0, wait_s=0.0)
    h.tick(0.1)
    assert task.done() and task.exception() is not None, "over-admitted"


@pytest.mark.contract  # it starts processes of its own
def test_memory_held_before_a_grant_stays_outside_the_new_lease_after_a_restart(
    h: InProcessBroker,
    tree: list[Holder],  # noqa: F811 - the imported fixture
) -> None:
    holder = tree[0]
    _grant(h, holder, 4000)
    h.fake.allocate(GPU0, holder.pid, 6000)  # 2 000 over its grant
    h.sample()
    second = _grant(h, holder, 4000)  # the 2 000 over were held before this grant
    h.sample()
    assert second.observed_mib[GPU0] == 0
    assert _available(h) == USABLE - 6000 - 4000  # 9 000
    _restart_and_sample(h)
    restored = h.broker.leases[second.lease_id]
    assert restored.observed_mib[GPU0] == 0, "the older lease's overrun became the new one's use"
    assert _available(h) == USABLE - 6000 - 4000


@pytest.mark.contract  # it starts processes of its own
def test_the_stored_baseline_goes_with_the_holders_last_lease(
    h: InProcessBroker,
    tree: list[Holder],  # noqa: F811 - the imported fixture
) -> None:
    holder = tree[0]
    first = _grant(h, holder, 4000)
    h.fake.allocate(GPU0, holder.pid, 6000)
    h.sample()
    _grant(h, holder, 4000)
    h.sample()
    store = h.broker.store
    assert store is not None
    assert [(p, u, m) for p, _, u, m in store.baselines()] == [(holder.pid, GPU0, 2000)]
    for lease in list(h.broker.leases.values()):
        h.broker.release(lease.lease_id, "tester")
    assert store.baselines() == []
    del first
