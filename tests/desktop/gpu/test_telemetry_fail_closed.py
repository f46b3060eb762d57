"""The broker fails closed when GPU telemetry fails (architecture.md §2), seen through a broker
process.

A hung NVML call, a lost GPU or NVML errors never make a GPU look free: requests wait or are
refused with a reason, existing leases keep renewing, the local API keeps answering, and the
GPU is reported with its last-known figures and a telemetry state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

import rbroker
from tests.conftest import GPU0, BrokerProcess, wait_until
from tests.desktop.conftest import RawConnection

PARAMS: dict[str, Any] = {"project": "tests", "session": "telemetry", "purpose": "fail closed"}


def _gpu(c: rbroker.Client) -> dict[str, Any]:
    (gpu,) = c.gpus()
    return dict(gpu)


@pytest.mark.parametrize(
    ("error", "state"),
    [("gpu_lost", "lost"), ("version_mismatch", "unavailable"), ("unknown", "unavailable")],
)
def test_nvml_errors_refuse_new_work_and_keep_leases(
    broker: BrokerProcess, error: str, state: str
) -> None:
    with broker.client() as c:
        held = c.call("lease.acquire", mib=4096, ttl_s=5, **PARAMS)["lease"]
        before = _gpu(c)
        c.sim_set(GPU0, error=error)
        wait_until(lambda: _gpu(c)["telemetry"] == state)

        gpu = _gpu(c)
        assert gpu["telemetry_reason"]
        # last-known figures, never "free"
        assert gpu["total_mib"] == before["total_mib"] == 24576
        assert gpu["outstanding_mib"] == 4096

        with pytest.raises(rbroker.TelemetryUnavailable) as refused:
            c.call("lease.acquire", mib=1024, **PARAMS)
        assert refused.value.data["telemetry"] == state
        assert "telemetry" in refused.value.message or state in refused.value.message

        for _ in range(3):  # existing leases keep renewing
            renewed = c.call("lease.renew", lease_id=held["lease_id"])["lease"]
            assert renewed["state"] == "active"
        (lease,) = c.leases()["leases"]
        assert lease["gpu_telemetry"] == {GPU0: state}

        c.sim_set(GPU0, error="")
        wait_until(lambda: _gpu(c)["telemetry"] == "ok")
        granted = c.call("lease.acquire", mib=1024, wait_s=5, **PARAMS)["lease"]
        assert granted["granted_mib"] == 1024


def test_waiting_request_survives_an_outage_and_is_admitted_after(
    broker: BrokerProcess, raw_connect: Callable[[str], RawConnection]
) -> None:
    with broker.client() as c:
        c.sim_set(GPU0, error="unknown")
        wait_until(lambda: _gpu(c)["telemetry"] == "unavailable")
        waiter = raw_connect(broker.socket)
        request_id = waiter.send_request(
            "lease.acquire", {"mib": 2048, "wait_s": 30, **PARAMS, "session": "outage"}
        )

        def queued_on_telemetry() -> dict[str, Any] | None:
            for q in c.leases()["queue"]:
                if q["session"] == "outage" and q["reason_kind"] == "telemetry":
                    return dict(q)
            return None

        entry = wait_until(queued_on_telemetry)
        assert isinstance(entry, dict)
        assert "unavailable" in entry["reason"]
        assert c.leases()["leases"] == []

        c.sim_set(GPU0, error="")
        answer = waiter.read_answer(request_id)
        assert answer["result"]["lease"]["granted_mib"] == 2048
        assert c.leases()["queue"] == []


def test_hung_nvml_never_blocks_the_local_api(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory()
    with broker.client(timeout_s=5) as c:
        held = c.call("lease.acquire", mib=4096, ttl_s=3, **PARAMS)["lease"]
        c.sim_set(GPU0, delay_s=60.0)  # a hung driver: every NVML call takes a minute
        hung_at = time.monotonic()
        wait_until(lambda: _gpu(c)["telemetry"] == "stale", timeout_s=10)

        # The API answers quickly while the NVML call hangs.
        for _ in range(20):
            started = time.monotonic()
            c.hello()
            c.call("lease.renew", lease_id=held["lease_id"])
            assert time.monotonic() - started < 1.0  # the NVML call hangs for 60 s

        # A new request is refused with a reason (no fresh sample), never admitted blind.
        with pytest.raises(rbroker.TelemetryUnavailable) as refused:
            c.call("lease.acquire", mib=1024, **PARAMS)
        assert refused.value.data["telemetry"] == "stale"

        # The lease outlives its 3 s TTL through renewals while telemetry is stale.
        while time.monotonic() - hung_at < 4.0:
            c.call("lease.renew", lease_id=held["lease_id"])
            time.sleep(0.5)
        assert [x["lease_id"] for x in c.leases()["leases"]] == [held["lease_id"]]

        c.sim_set(GPU0, delay_s=0.0)
        wait_until(lambda: _gpu(c)["telemetry"] == "ok", timeout_s=10)
        granted = c.call("lease.acquire", mib=1024, wait_s=5, **PARAMS)["lease"]
        assert granted["granted_mib"] == 1024
    assert broker.proc.poll() is None


def test_pinned_request_for_a_lost_gpu_is_refused_at_once(broker: BrokerProcess) -> None:
    with broker.client() as c:
        c.sim_set(GPU0, error="gpu_lost")
        wait_until(lambda: _gpu(c)["telemetry"] == "lost")
        started = time.monotonic()
        with pytest.raises(rbroker.TelemetryUnavailable) as refused:
            c.call("lease.acquire", mib=1024, gpu_uuid=GPU0, wait_s=30, **PARAMS)
        assert time.monotonic() - started < 1.0
        assert refused.value.data["reason"] == "gpu_lost"
