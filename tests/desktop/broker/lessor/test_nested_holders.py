"""Nested holders and the pre-grant part of a baseline (docs/architecture.md §2), on an
in-process broker with a manual clock and real process trees (`sh` → `sh` → `sleep`).

- A process's memory belongs to one holder per GPU: the nearest in its own chain that holds
  a lease there. A parent holder's lease never observes a descendant holder's memory, at any
  depth; a descendant without a lease on that GPU stays in its parent's tree.
- What a sample begun before a grant put into the holder's baseline ("held before the
  grant") comes down once later samples show the holder freed it, never before.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator

import psutil
import pytest

from rbroker.broker.capacity import Capacity
from rbroker.broker.holders import Holder
from rbroker.broker.leases import Lease
from tests.conftest import GPU0, GPU1
from tests.desktop.inprocess import InProcessBroker, SleeperPool
from tests.fakes.gpu_scenarios import gpu, scenario

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

GPUS = scenario(
    gpu(GPU0, name="Simulated 20 GB", total_mib=20000),
    gpu(GPU1, name="Simulated 20 GB", total_mib=20000),
)
USABLE = 20000 - 1000  # headroom 1000


@pytest.fixture
def h(make_inprocess: Callable[..., InProcessBroker]) -> InProcessBroker:
    return make_inprocess(GPUS, persist=False, headroom_mib=1000)


# A sleeper that first says `depth pid` on the shared stdout, then starts a sleeper of its own,
# `argv[1]` levels deep (Python, so that the same tree stands on Windows, which has no sh).
# Each process names itself: asking psutil for a just-started child's parent is unreliable
# under Wine, whose creation time for a process that is still starting can change between
# two reads, which psutil takes for a reused PID.
_NESTED = (
    "import os, subprocess, sys, time\n"
    "d = int(sys.argv[1])\n"
    "print(d, os.getpid(), flush=True)\n"
    "if d: subprocess.Popen([sys.executable, '-c', sys.argv[2], str(d - 1), sys.argv[2]])\n"
    "time.sleep(600)\n"
)


@pytest.fixture
def tree() -> Iterator[list[Holder]]:
    """`[parent, child, grandchild]`: three real processes, each the parent of the next."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _NESTED, "2", _NESTED], stdout=subprocess.PIPE, text=True
    )
    pids: dict[int, int] = {}
    try:
        assert proc.stdout is not None
        while len(pids) < 3:
            line = proc.stdout.readline()
            assert line, f"the tree ended before all three said their pids: {pids}"
            depth, pid = map(int, line.split())
            pids[depth] = pid
        yield [Holder.of(pids[2]), Holder.of(pids[1]), Holder.of(pids[0])]
    finally:
        for pid in pids.values():
            with contextlib.suppress(psutil.Error, OSError):
                psutil.Process(pid).kill()
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def _cap(h: InProcessBroker, uuid: str = GPU0) -> Capacity:
    cap = h.broker.capacity(uuid)
    assert cap is not None
    return cap


def _grant(h: InProcessBroker, holder: Holder, mib: int, uuid: str = GPU0) -> Lease:
    task = h.acquire(holder, mib=mib, gpu_uuid=uuid, wait_s=0.0)
    assert task.done(), "not granted at once"
    return task.result()


def test_a_child_holder_over_its_grant_leaves_its_parents_grant_booked(
    h: InProcessBroker, tree: list[Holder]
) -> None:
    parent, child, _ = tree
    a = _grant(h, parent, 4096)
    b = _grant(h, child, 4096)
    h.fake.allocate(GPU0, child.pid, 6000)
    h.sample()
    assert (a.observed_mib[GPU0], a.over_grant) == (0, False)
    assert (b.observed_mib[GPU0], b.over_grant) == (6000, True)
    assert _cap(h).available_mib == USABLE - 6000 - 4096  # 8 904
    task = h.acquire(parent, mib=USABLE - 6000 - 4096 + 1, gpu_uuid=GPU0, wait_s=0.0)
    h.tick(0.1)
    assert task.done() and task.exception() is not None, "over-admitted"


def test_a_grandchild_holder_is_its_own_and_skips_a_holder_without_a_lease_between(
    h: InProcessBroker, tree: list[Holder]
) -> None:
    parent, child, grandchild = tree
    a = _grant(h, parent, 4096)
    c = _grant(h, grandchild, 2048)
    h.fake.allocate(GPU0, grandchild.pid, 3000)
    h.fake.allocate(GPU0, child.pid, 1000)  # the child holds no lease: its parent's tree
    h.sample()
    assert (a.observed_mib[GPU0], c.observed_mib[GPU0]) == (1000, 3000)
    assert c.over_grant and not a.over_grant
    assert _cap(h).available_mib == USABLE - 4000 - (4096 - 1000)
    # the child takes a lease of its own here: its 1 000 MiB leave the parent's lease at the
    # grant (held before it: the child's baseline); the grandchild is still the nearest
    b = _grant(h, child, 1024)
    assert a.observed_mib[GPU0] == 0
    assert _cap(h).available_mib == USABLE - 4000 - 4096 - 1024
    h.sample()
    assert (a.observed_mib[GPU0], b.observed_mib[GPU0], c.observed_mib[GPU0]) == (0, 0, 3000)
    assert _cap(h).available_mib == USABLE - 4000 - 4096 - 1024


def test_a_child_holder_with_a_lease_on_another_gpu_stays_in_its_parents_tree_here(
    h: InProcessBroker, tree: list[Holder]
) -> None:
    parent, child, _ = tree
    a = _grant(h, parent, 4096, GPU0)
    b = _grant(h, child, 4096, GPU1)
    h.fake.allocate(GPU0, child.pid, 3000)
    h.sample()
    assert a.observed_mib[GPU0] == 3000 and b.observed_mib.get(GPU1, 0) == 0
    assert _cap(h, GPU0).available_mib == USABLE - 3000 - 1096
    assert _cap(h, GPU1).available_mib == USABLE - 4096


def test_a_child_holders_end_keeps_what_it_still_holds_outside_its_parents_lease(
    h: InProcessBroker, tree: list[Holder]
) -> None:
    parent, child, _ = tree
    a = _grant(h, parent, 4096)
    b = _grant(h, child, 4096)
    h.fake.allocate(GPU0, child.pid, 4096)
    h.sample()
    assert (a.observed_mib[GPU0], b.observed_mib[GPU0]) == (0, 4096)
    h.broker.release(b.lease_id, "tester")
    h.sample()
    # the child's 4 096 MiB are in the parent's tree now, but not the parent's lease use
    assert a.observed_mib[GPU0] == 0
    assert _cap(h).available_mib == USABLE - 4096 - 4096
    h.fake.free(GPU0, child.pid)
    h.sample()
    assert _cap(h).available_mib == USABLE - 4096


def test_the_pre_grant_part_of_a_baseline_comes_down_once_the_overage_is_freed(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    proc, holder = pool.spawn()
    l1 = _grant(h, holder, 4096)
    h.fake.allocate(GPU0, proc.pid, 6000)  # 1 904 over its grant
    h.sample()
    assert l1.observed_mib[GPU0] == 6000 and l1.over_grant
    l2 = _grant(h, holder, 4096)  # on the sample that showed the 6 000: 1 904 to the baseline
    assert _cap(h).available_mib == USABLE - 6000 - 4096
    h.sample()  # nothing freed yet: the 1 904 stay outside the leases
    assert (l1.observed_mib[GPU0], l2.observed_mib[GPU0]) == (4096, 0)
    assert _cap(h).available_mib == USABLE - 6000 - 4096
    h.fake.free(GPU0, proc.pid, 1904)  # the overage is freed: holds exactly L1's grant
    h.sample()
    assert _cap(h).available_mib == USABLE - 4096 - 4096
    h.fake.allocate(GPU0, proc.pid, 4096)  # L2's use: holds L1 + L2
    h.sample()
    assert (l1.observed_mib[GPU0], l2.observed_mib[GPU0]) == (4096, 4096)
    assert _cap(h).outstanding_mib == 0
    assert _cap(h).available_mib == USABLE - 8192  # 10 808


def test_the_pre_grant_part_never_comes_down_by_memory_no_sample_showed_freed(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    proc, holder = pool.spawn()
    _grant(h, holder, 4096)
    h.fake.allocate(GPU0, proc.pid, 6000)
    h.sample()
    l2 = _grant(h, holder, 4096)
    h.fake.allocate(GPU0, proc.pid, 2000)  # grows (L2's use), then frees as much again
    h.sample()
    assert l2.observed_mib[GPU0] == 2000
    h.fake.free(GPU0, proc.pid, 2000)
    h.sample()
    # back at 6 000: the 1 904 held before L2's grant are still outside its leases
    assert l2.observed_mib[GPU0] == 0
    assert _cap(h).available_mib == USABLE - 6000 - 4096


def test_a_childs_kept_memory_comes_out_of_the_baseline_once_it_is_freed(
    h: InProcessBroker, tree: list[Holder]
) -> None:
    """Before: a child's memory kept past its lease's end went into the parent's plain
    baseline, which comes down only when the parent's whole use falls below it; the child
    freeing it left the parent's own use counted as baseline and its lease booked twice, for
    the lease's whole life. Right: it comes down by what later samples show freed."""
    parent, child, _ = tree
    a = _grant(h, parent, 8000)
    h.fake.allocate(GPU0, parent.pid, 8000)
    c = _grant(h, child, 4000)
    h.fake.allocate(GPU0, child.pid, 4000)
    h.sample()
    assert _cap(h).available_mib == USABLE - 12000
    h.broker.release(c.lease_id, "tester")  # the child keeps its 4 000 MiB
    h.sample()
    assert a.observed_mib[GPU0] == 8000
    assert _cap(h).available_mib == USABLE - 12000, "the kept memory freed the parent's grant"
    h.fake.free(GPU0, child.pid)
    h.sample()
    assert a.observed_mib[GPU0] == 8000
    cap = _cap(h)
    assert (cap.device_used_mib, cap.outstanding_mib) == (8000, 0)
    assert cap.available_mib == USABLE - 8000
