"""Memory NVML attributes to a lease's holder and its descendants (architecture.md §2, §3).

outstanding = Σ max(0, granted − observed): what a lease holds but has not allocated yet.
Workers are real processes that "allocate" simulated memory with `sim.allocate`, which
makes their pid show that memory in the fake NVML, as a CUDA allocation would.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

import rbroker
from tests.conftest import GPU0, BrokerProcess, wait_until
from tests.desktop.conftest import WorkerProcess

TOTAL, HEADROOM = 24576, 1024


def _gpu(c: rbroker.Client) -> dict[str, Any]:
    (gpu,) = c.gpus()
    return dict(gpu)


def _settled(c: rbroker.Client, **expected: int) -> dict[str, Any]:
    """Wait until gpus.list shows `expected` figures (samples arrive about once a second)."""

    def check() -> dict[str, Any] | None:
        gpu = _gpu(c)
        return gpu if all(gpu.get(k) == v for k, v in expected.items()) else None

    try:
        found = wait_until(check, timeout_s=5)
    except AssertionError:
        raise AssertionError(f"expected {expected}, last seen {_gpu(c)}") from None
    assert isinstance(found, dict)
    return found


def _start(worker: Callable[..., WorkerProcess], broker: BrokerProcess, *args: str) -> str:
    w = worker("sim_worker", broker.socket, *args)
    lease_id = ""
    while (line := w.read_line()) != "ready":
        if line.startswith("granted "):
            lease_id = line.split()[1]
    return lease_id


def test_allocated_part_of_a_lease_is_no_longer_outstanding(
    broker_factory: Callable[..., BrokerProcess], worker: Callable[..., WorkerProcess]
) -> None:
    broker = broker_factory(headroom_mib=HEADROOM)
    with broker.client() as c:
        lease_id = _start(worker, broker, "--lease", "8192", "--after", "6000")
        gpu = _settled(c, device_used_mib=6000, outstanding_mib=2192)
        assert gpu["leased_in_use_mib"] == 6000
        assert gpu["other_in_use_mib"] == 0
        assert gpu["available_mib"] == TOTAL - HEADROOM - 6000 - 2192
        (lease,) = c.leases()["leases"]
        assert lease["lease_id"] == lease_id
        assert lease["observed_mib"] == {GPU0: 6000}
        assert lease["over_grant"] is False


def test_a_lease_using_more_than_granted_is_flagged(
    broker_factory: Callable[..., BrokerProcess], worker: Callable[..., WorkerProcess]
) -> None:
    broker = broker_factory(headroom_mib=HEADROOM)
    with broker.client() as c:
        _start(worker, broker, "--lease", "8192", "--after", "10000")
        gpu = _settled(c, device_used_mib=10000, outstanding_mib=0)
        assert gpu["available_mib"] == TOTAL - HEADROOM - 10000
        (lease,) = c.leases()["leases"]
        assert lease["over_grant"] is True
        assert "over_grant" in lease["flags"]


def test_memory_of_a_child_process_belongs_to_the_lease(
    broker_factory: Callable[..., BrokerProcess], worker: Callable[..., WorkerProcess]
) -> None:
    broker = broker_factory(headroom_mib=HEADROOM)
    with broker.client() as c:
        _start(worker, broker, "--lease", "8192", "--child", "5000")
        gpu = _settled(c, device_used_mib=5000, outstanding_mib=3192)
        assert gpu["leased_in_use_mib"] == 5000
        (lease,) = c.leases()["leases"]
        assert lease["observed_mib"] == {GPU0: 5000}


def test_memory_of_an_unrelated_process_is_not_the_lease(
    broker_factory: Callable[..., BrokerProcess], worker: Callable[..., WorkerProcess]
) -> None:
    broker = broker_factory(headroom_mib=HEADROOM)
    with broker.client() as c:
        _start(worker, broker, "--lease", "8192")
        _start(worker, broker, "--after", "5000")  # no lease: someone else's memory
        gpu = _settled(c, device_used_mib=5000, outstanding_mib=8192)
        assert gpu["other_in_use_mib"] == 5000
        assert gpu["leased_in_use_mib"] == 0
        assert gpu["available_mib"] == TOTAL - HEADROOM - 5000 - 8192


def test_memory_held_before_the_lease_is_not_counted_against_it(
    broker_factory: Callable[..., BrokerProcess], worker: Callable[..., WorkerProcess]
) -> None:
    """A process already using 4 000 MiB takes an 8 192 MiB lease (no adopt): the lease's
    8 192 stay outstanding until the process allocates more."""
    broker = broker_factory(headroom_mib=HEADROOM)
    with broker.client() as c:
        w = worker("sim_worker", broker.socket, "--before", "4000", "--lease", "8192")
        while w.read_line() != "ready":
            pass
        gpu = _settled(c, device_used_mib=4000, outstanding_mib=8192)
        assert gpu["available_mib"] == TOTAL - HEADROOM - 4000 - 8192
        (lease,) = c.leases()["leases"]
        assert lease["observed_mib"] == {GPU0: 0}


def test_adopting_memory_already_held_checks_only_the_extra(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    """16 000 MiB in use by this process leave 7 552 available; it can take a lease of
    20 000 with adopt (only the 4 000 extra is checked), but not without."""
    broker = broker_factory(headroom_mib=HEADROOM)
    params: dict[str, Any] = {
        "project": "tests",
        "session": "adopt",
        "purpose": "adopt held memory",
    }
    with broker.client() as c:
        c.sim_allocate(16000, gpu_uuid=GPU0)
        _settled(c, device_used_mib=16000, available_mib=7552)
        with pytest.raises(rbroker.CapacityUnavailable) as refused:
            c.call("lease.acquire", mib=20000, **params)
        assert refused.value.data["available_mib"] == 7552

        lease = c.call("lease.acquire", mib=20000, adopt=True, **params)["lease"]
        assert lease["adopt"] is True
        assert lease["admission"][GPU0]["extra_mib"] == 4000
        gpu = _settled(c, device_used_mib=16000, outstanding_mib=4000)
        assert gpu["available_mib"] == TOTAL - HEADROOM - 16000 - 4000
        (listed,) = c.leases()["leases"]
        assert listed["observed_mib"] == {GPU0: 16000}

        c.sim_allocate(4000, gpu_uuid=GPU0)  # the process grows into its lease
        _settled(
            c, device_used_mib=20000, outstanding_mib=0, available_mib=TOTAL - HEADROOM - 20000
        )


def test_killed_holder_frees_its_lease_and_its_memory(
    broker_factory: Callable[..., BrokerProcess], worker: Callable[..., WorkerProcess]
) -> None:
    broker = broker_factory(headroom_mib=HEADROOM)
    with broker.client() as c:
        w = worker("sim_worker", broker.socket, "--lease", "8192", "--after", "8192")
        while w.read_line() != "ready":
            pass
        _settled(c, device_used_mib=8192, outstanding_mib=0)
        os.kill(w.pid, signal.SIGKILL)
        w.proc.wait(10)
        gpu = _settled(c, device_used_mib=0, outstanding_mib=0)
        assert gpu["available_mib"] == TOTAL - HEADROOM
        assert c.leases()["leases"] == []


def test_memory_kept_after_releasing_one_of_two_leases_is_not_the_others(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    """This process holds leases A (4 000) and B (6 000) and has allocated A's 4 000. It
    releases A but keeps the memory: B has still allocated nothing, so B's 6 000 stay
    outstanding (counting A's leftover as B's use would over-admit by 4 000)."""
    broker = broker_factory(headroom_mib=HEADROOM)
    params: dict[str, Any] = {"project": "tests", "session": "two", "purpose": "two leases"}
    with broker.client() as a, broker.client() as b, broker.client() as c:
        lease_a = a.call("lease.acquire", mib=4000, **params)["lease"]
        b.call("lease.acquire", mib=6000, **params)
        c.sim_allocate(4000, gpu_uuid=GPU0)
        _settled(c, device_used_mib=4000, outstanding_mib=6000)
        a.call("lease.release", lease_id=lease_a["lease_id"])
        gpu = _settled(c, device_used_mib=4000, leases=1)
        time.sleep(1.5)  # a few more samples
        gpu = _gpu(c)
        assert gpu["outstanding_mib"] == 6000, gpu
        assert gpu["available_mib"] == TOTAL - HEADROOM - 4000 - 6000


def test_memory_held_before_a_lease_and_freed_after_is_not_counted_twice(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    """4 000 MiB held before an 8 192 MiB lease, then freed, then 8 192 allocated for the
    lease: the lease has allocated all of it, nothing is outstanding."""
    broker = broker_factory(headroom_mib=HEADROOM)
    params: dict[str, Any] = {"project": "tests", "session": "freed", "purpose": "free then use"}
    with broker.client() as c:
        c.sim_allocate(4000, gpu_uuid=GPU0)
        _settled(c, device_used_mib=4000)
        c.call("lease.acquire", mib=8192, **params)
        _settled(c, device_used_mib=4000, outstanding_mib=8192)
        c.sim_free(gpu_uuid=GPU0)
        _settled(c, device_used_mib=0, outstanding_mib=8192)
        c.sim_allocate(8192, gpu_uuid=GPU0)
        _settled(c, device_used_mib=8192, outstanding_mib=0)
