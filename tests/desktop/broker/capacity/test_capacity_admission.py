"""Admission against current safe capacity (architecture.md §2), end to end through a broker
process.

available = total − headroom − device_used − outstanding, with device_used = total − free
(the same for NVML memory v1 and v2) and unknown per-process memory counted as 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

import rbroker
from tests.conftest import GPU0, SINGLE_24G, BrokerProcess, wait_until
from tests.desktop.conftest import RawConnection, WorkerProcess
from tests.fakes.gpu_scenarios import gpu, scenario

UNKNOWN_PROCESS_MEMORY = scenario(
    gpu(
        GPU0,
        name="Simulated WDDM GPU",
        per_process_memory=False,
        processes=[(4000, 10240), (4001, 10240)],
    )
)


def _acquire_params(mib: int, session: str, wait_s: float) -> dict[str, Any]:
    return {
        "mib": mib,
        "project": "tests",
        "session": session,
        "purpose": "capacity arithmetic",
        "wait_s": wait_s,
    }


def _queued(c: rbroker.Client, session: str) -> dict[str, Any] | None:
    for entry in c.leases()["queue"]:
        if entry["session"] == session and entry["reason_kind"] == "capacity":
            return dict(entry)
    return None


def test_unknown_process_memory_counts_inside_device_used(
    broker_factory: Callable[..., BrokerProcess],
    raw_connect: Callable[[str], RawConnection],
) -> None:
    broker = broker_factory(UNKNOWN_PROCESS_MEMORY, headroom_mib=1024)
    with broker.client() as c:
        (gpu,) = c.gpus()
        assert (gpu["total_mib"], gpu["device_used_mib"], gpu["headroom_mib"]) == (
            24576,
            20480,
            1024,
        )
        assert gpu["available_mib"] == 3072

        waiting = raw_connect(broker.socket)
        waiting.send_request("lease.acquire", _acquire_params(6144, "big", wait_s=60))
        entry = wait_until(lambda: _queued(c, "big"))
        assert isinstance(entry, dict)
        data = entry["reason_data"]
        assert data["available_mib"] == 3072
        assert data["total_mib"] == 24576
        assert data["headroom_mib"] == 1024
        assert data["device_used_mib"] == 20480
        assert data["outstanding_mib"] == 0
        assert data["requested_mib"] == 6144
        for figure in ("3 072", "24 576", "1 024", "20 480", "6 144"):
            assert figure in entry["reason"], entry["reason"]
        assert c.leases()["leases"] == []

        # FIFO: while the 6 144 MiB request waits, a small one queues behind it.
        with pytest.raises(rbroker.CapacityUnavailable) as behind:
            c.call("lease.acquire", **_acquire_params(2048, "small-behind", wait_s=0))
        assert behind.value.data["ahead"] == 1

        waiting.close()  # the waiter leaves: nothing of it stays behind
        wait_until(lambda: c.leases()["queue"] == [])

        granted = c.call("lease.acquire", **_acquire_params(2048, "small", wait_s=5))
        assert granted["lease"]["granted_mib"] == 2048
        assert granted["lease"]["gpu_uuid"] == GPU0
        admission = granted["lease"]["admission"][GPU0]
        assert admission["available_mib"] == 3072
        assert admission["device_used_mib"] == 20480


def _nvml_scenario(api: str, reserved: int, used: int) -> str:
    return scenario(
        gpu(
            GPU0,
            name="Simulated H100 80GB",
            total_mib=81920,
            reserved_mib=reserved,
            used_mib=used,
            memory_api=api,
        )
    )


@pytest.mark.parametrize(
    ("api", "reserved", "used"),
    [("v2", 726, 8), ("v1", 0, 734)],
    ids=["nvml-v2-reserved-726", "nvml-v1-used-734"],
)
def test_v1_and_v2_memory_give_the_same_available(
    broker_factory: Callable[..., BrokerProcess], api: str, reserved: int, used: int
) -> None:
    broker = broker_factory(_nvml_scenario(api, reserved, used), headroom_mib=1024)
    with broker.client() as c:
        (gpu,) = c.gpus()
        assert gpu["memory_api"] == api
        assert gpu["total_mib"] == 81920
        assert gpu["device_used_mib"] == 734
        assert gpu["available_mib"] == 81920 - 1024 - 734 == 80162

        with pytest.raises(rbroker.CapacityUnavailable) as refused:
            c.call("lease.acquire", **_acquire_params(80500, "too-big", wait_s=0))
        assert refused.value.code == "capacity_unavailable"
        assert refused.value.data["available_mib"] == 80162
        assert refused.value.data["requested_mib"] == 80500
        assert "80 162" in refused.value.message

        # A request for exactly what is available is admitted; one MiB more is not.
        with pytest.raises(rbroker.CapacityUnavailable):
            c.call("lease.acquire", **_acquire_params(80163, "one-more", wait_s=0))
        granted = c.call("lease.acquire", **_acquire_params(80162, "exact", wait_s=5))
        assert granted["lease"]["granted_mib"] == 80162


def test_waiting_request_is_admitted_when_room_appears(
    broker_factory: Callable[..., BrokerProcess],
    raw_connect: Callable[[str], RawConnection],
) -> None:
    broker = broker_factory(_nvml_scenario("v2", 726, 8), headroom_mib=1024)
    with broker.client() as c:
        waiting = raw_connect(broker.socket)
        request_id = waiting.send_request(
            "lease.acquire", _acquire_params(80500, "too-big", wait_s=60)
        )
        wait_until(lambda: _queued(c, "too-big"))
        # Another process frees memory: the driver now reports 8 MiB used, 0 reserved.
        broker.write_scenario(_nvml_scenario("v2", 0, 8))
        answer = waiting.read_answer(request_id)
        assert answer["result"]["lease"]["granted_mib"] == 80500
        assert answer["result"]["lease"]["admission"][GPU0]["available_mib"] == 80888


def test_headroom_larger_than_the_gpu_makes_every_request_infeasible(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    """A headroom at least the GPU's total is refused when the broker starts
    (tests/desktop/hosting/test_startup_failures.py); a GPU that shrinks below it later (a MIG
    reconfiguration, here a rewritten scenario) refuses every request as infeasible."""
    broker = broker_factory(headroom_mib=20000)
    broker.write_scenario(SINGLE_24G.replace("24576", "16384"))
    with broker.client() as c:
        wait_until(lambda: c.gpus()[0].get("total_mib") == 16384, timeout_s=10)
        (gpu,) = c.gpus()
        assert gpu["available_mib"] == 0
        with pytest.raises(rbroker.Infeasible) as refused:
            c.call("lease.acquire", **_acquire_params(1, "tiny", wait_s=30))
        assert refused.value.data["usable_mib"] == 0
        assert refused.value.data["headroom_mib"] == 20000
        assert "never offer more than 0 MiB" in refused.value.message


def test_a_waiter_that_can_no_longer_ever_fit_is_refused(
    broker_factory: Callable[..., BrokerProcess],
    raw_connect: Callable[[str], RawConnection],
    worker: Callable[..., WorkerProcess],
) -> None:
    """The GPU shrinks while a request waits (a MIG reconfiguration, a rewritten scenario):
    the request is refused as infeasible, not left queued until its wait runs out."""
    broker = broker_factory(headroom_mib=1024)
    with broker.client() as c:
        # held by another process: behind its own process's lease it would be refused at once
        held = worker("hold_lease", broker.socket, "10000", "holder", "0").read_line()
        assert held.startswith("granted "), held
        waiting = raw_connect(broker.socket)
        request_id = waiting.send_request(
            "lease.acquire", _acquire_params(20000, "big", wait_s=300)
        )
        wait_until(lambda: _queued(c, "big"))
        c.sim_set(GPU0, total_mib=16384)
        started = time.monotonic()
        answer = waiting.read_answer(request_id)
        assert time.monotonic() - started < 5
        err = answer["error"]
        assert err["data"]["name"] == "infeasible"
        assert err["data"]["usable_mib"] == 16384 - 1024
        assert "15 360" in err["message"]
        assert c.leases()["queue"] == []


def test_a_negative_headroom_is_refused_at_start(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    """A negative headroom would admit more than the GPU holds."""
    with pytest.raises(RuntimeError) as refused:
        broker_factory(headroom_mib=-4096)
    assert "headroom_mib must be 0 MiB or more, got -4 096" in str(refused.value)
