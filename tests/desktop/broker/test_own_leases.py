"""Waiting on oneself (architecture.md §3, issue 26): a request that can only fit after its
requester's own leases end is refused at once as `infeasible`, with the arithmetic. The
requester is the requesting process and its ancestors (a nested `rbroker run` or SDK lease
inside a process that holds one); a sibling's leases may end, so a sibling waits as before.

An in-process broker with a manual clock on one (or two) empty 24 576 MiB GPUs, default
headroom 1 229 MiB: 23 347 MiB usable on each. Holders are real processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from rbroker.broker.holders import Holder, lineage
from rbroker.broker.leases import Lease
from rbroker_protocol.errors import RpcError
from tests.conftest import GPU0, GPU1
from tests.desktop.inprocess import SLEEPER, InProcessBroker, SleeperPool
from tests.fakes.gpu_scenarios import gpu, scenario

USABLE = 24576 - 1229  # 23 347

TWO_GPUS = scenario(gpu(GPU0), gpu(GPU1))

#: Starts its arguments as a child, says the child's pid, waits for it.
_PARENT = (
    "import subprocess, sys\n"
    "child = subprocess.Popen(sys.argv[1:])\n"
    "print(child.pid, flush=True)\n"
    "child.wait()\n"
)


@pytest.fixture
def family() -> Iterator[tuple[Holder, Holder]]:
    """`(parent, child)`: two real processes, the second started by the first."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _PARENT, *SLEEPER], stdout=subprocess.PIPE, text=True
    )
    child_pid = 0
    try:
        assert proc.stdout is not None
        child_pid = int(proc.stdout.readline())
        yield Holder.of(proc.pid), Holder.of(child_pid)
    finally:
        with contextlib.suppress(psutil.Error, OSError):
            if child_pid:
                psutil.Process(child_pid).kill()
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def _grant(h: InProcessBroker, holder: Holder, mib: int, **kw: Any) -> Lease:
    task = h.acquire(holder, mib=mib, wait_s=0.0, **kw)
    assert task.done(), "not granted at once"
    return task.result()


def _refused(task: asyncio.Task[Lease]) -> RpcError:
    assert task.done(), "not refused at once"
    err = task.exception()
    assert isinstance(err, RpcError), err
    return err


def test_the_same_process_is_refused_at_once_with_the_numbers(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    _, me = pool.spawn()
    held = _grant(h, me, 20000)
    err = _refused(h.acquire(me, mib=10000, wait_s=600.0))
    assert err.name == "infeasible"
    assert err.message == (
        f"infeasible: 10 000 MiB can only fit on GPU-5a1e00…0001 after your own leases end "
        f"({held.lease_id} 20 000 MiB, held by this process); total 24 576 − headroom 1 229 − "
        "your leases 20 000 = 3 347 MiB; release or shrink them first, or ask for at most "
        "3 347 MiB"
    )
    assert err.data["reason"] == "own_leases"
    assert (err.data["gpu_uuid"], err.data["requested_mib"]) == (GPU0, 10000)
    assert (err.data["usable_mib"], err.data["own_leased_mib"], err.data["offer_mib"]) == (
        USABLE,
        20000,
        USABLE - 20000,
    )
    assert err.data["own_lease_ids"] == [held.lease_id]
    assert h.broker.queue == []
    # wait_s 0: refused by the same rule, not "no room now"
    assert _refused(h.acquire(me, mib=10000, wait_s=0.0)).name == "infeasible"
    # what fits beside its own lease is granted to the same process
    assert _grant(h, me, 3000).granted_mib == 3000


@pytest.mark.contract  # it starts a child of its own
def test_a_child_of_the_holder_is_refused(
    h: InProcessBroker, family: tuple[Holder, Holder]
) -> None:
    parent, child = family
    assert parent in lineage(child)
    held = _grant(h, parent, 20000)
    err = _refused(h.acquire(child, mib=10000, wait_s=600.0))
    assert err.name == "infeasible" and err.data["reason"] == "own_leases"
    assert f"({held.lease_id} 20 000 MiB, held by a parent process)" in err.message
    assert err.data["offer_mib"] == USABLE - 20000
    # the other way round the leases are not the requester's: a child's lease may end
    h.broker.release(held.lease_id, "tester")
    h.sample()
    _grant(h, child, 20000)
    waiting = h.acquire(parent, mib=10000, wait_s=600.0)
    assert not waiting.done() and len(h.broker.queue) == 1


def test_a_sibling_waits_as_before(h: InProcessBroker, pool: SleeperPool) -> None:
    _, first = pool.spawn()
    _, sibling = pool.spawn()
    assert first not in lineage(sibling)
    held = _grant(h, first, 20000)
    waiting = h.acquire(sibling, mib=10000, wait_s=600.0)
    assert not waiting.done() and len(h.broker.queue) == 1
    now = h.acquire(sibling, mib=10000, wait_s=0.0)
    h.tick(0.1)
    assert _refused(now).name == "capacity_unavailable"  # its refusal as before
    h.broker.release(held.lease_id, "tester")
    h.sample()
    assert waiting.done() and waiting.result().granted_mib == 10000


def test_the_boundary_fitting_exactly_once_others_end_waits(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    _, me = pool.spawn()
    _, other = pool.spawn()
    _grant(h, me, 10000)
    theirs = _grant(h, other, 10000)  # 3 347 MiB left now
    exact = h.acquire(me, mib=USABLE - 10000, wait_s=600.0)  # fits once theirs ends
    assert not exact.done() and len(h.broker.queue) == 1
    err = _refused(h.acquire(me, mib=USABLE - 10000 + 1, wait_s=600.0))
    assert err.name == "infeasible" and err.data["offer_mib"] == USABLE - 10000
    assert "total 24 576 − headroom 1 229 − your leases 10 000 = 13 347 MiB" in err.message
    h.broker.release(theirs.lease_id, "tester")
    h.sample()
    assert exact.done() and exact.result().granted_mib == USABLE - 10000


def test_what_a_lease_uses_beyond_its_grant_counts(h: InProcessBroker, pool: SleeperPool) -> None:
    proc, me = pool.spawn()
    _grant(h, me, 10000)
    h.fake.allocate(GPU0, proc.pid, 15000)  # 5 000 over its grant: booked as observed
    h.sample()
    err = _refused(h.acquire(me, mib=10000, wait_s=600.0))
    assert (err.data["own_leased_mib"], err.data["offer_mib"]) == (15000, USABLE - 15000)


def test_multi_gpu_requests_are_all_or_nothing(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h = make_inprocess(textwrap.dedent(TWO_GPUS), persist=False)
    _, me = pool.spawn()
    _, other = pool.spawn()
    mine = _grant(h, me, 20000, gpu_uuid=GPU0)
    _grant(h, other, 20000, gpu_uuid=GPU1)
    # two GPUs at once: GPU0 can never hold 10 000 beside its own lease
    err = _refused(h.acquire(me, mib=10000, gpus=2, wait_s=600.0))
    assert err.name == "infeasible" and err.data["requested_gpus"] == 2
    assert err.message == (
        "infeasible: 10 000 MiB on each of 2 GPUs can only fit on GPU-5a1e00…0001 after your "
        "own leases end (only 1 of its 2 GPUs could hold it while they stay); "
        f"GPU-5a1e00…0001: ({mine.lease_id} 20 000 MiB, held by this process); total 24 576 "
        "− headroom 1 229 − your leases 20 000 = 3 347 MiB; release or shrink them first, or "
        "ask for less"
    )
    assert [b["gpu_uuid"] for b in err.data["blocked"]] == [GPU0]
    # one GPU: GPU1 frees when the other process's lease ends, so it waits
    one = h.acquire(me, mib=10000, wait_s=600.0)
    assert not one.done() and len(h.broker.queue) == 1
    # own leases on both GPUs: every GPU is named with its numbers
    _, third = pool.spawn()
    h2 = make_inprocess(textwrap.dedent(TWO_GPUS), persist=False)
    _grant(h2, third, 15000, gpu_uuid=GPU0)
    _grant(h2, third, 18000, gpu_uuid=GPU1)
    both = _refused(h2.acquire(third, mib=10000, wait_s=600.0))
    assert [b["gpu_uuid"] for b in both.data["blocked"]] == [GPU0, GPU1]  # most offered first
    assert "can only fit on GPU-5a1e00…0001 or GPU-5a1e00…0002 after" in both.message
    assert "GPU-5a1e00…0002: (" in both.message and "= 5 347 MiB" in both.message
    assert "ask for at most 8 347 MiB" in both.message


def _resize(h: InProcessBroker, lease: Lease, mib: int, wait_s: float) -> asyncio.Task[Lease]:
    task = h.loop.create_task(h.broker.resize(lease.lease_id, "tester", mib, wait_s, 7))
    h.spin()
    return task


def test_a_growth_behind_the_holders_other_leases_is_refused(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    _, me = pool.spawn()
    _, other = pool.spawn()
    grown = _grant(h, me, 4096)
    _grant(h, me, 18000)
    err = _refused(_resize(h, grown, 8192, 60.0))
    assert err.name == "infeasible" and err.data["reason"] == "own_leases"
    assert err.message.startswith(f"resize of {grown.lease_id} refused: infeasible: 8 192 MiB")
    assert "your leases 18 000 = 5 347 MiB" in err.message  # the resized lease left out
    assert (err.data["lease_id"], err.data["granted_mib"]) == (grown.lease_id, 4096)
    assert grown.granted_mib == 4096 and h.broker.queue == []
    # within what its other leases leave, a growth that does not fit now waits for others
    theirs = _grant(h, other, 1000)
    waits = _resize(h, grown, 5347, 60.0)
    assert not waits.done() and len(h.broker.queue) == 1
    h.broker.release(theirs.lease_id, "tester")
    h.sample()
    assert waits.done() and waits.result().granted_mib == 5347
