"""Freshness from the server's receive time; GPU states separate from computer freshness."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rbroker_protocol.reports import GpuReport, LeaseReport
from tests.fakes.reports import gpu_report, payload
from tests.server.conftest import Coordinator

STALE_S = 1.5
OFFLINE_S = 6.0
"""Far enough past `STALE_S` that a read meant to land between them still does on a loaded
machine (at 3.0 s, a read sent at 1.8 s was answered as offline: 2.5 s late under a full
suite on 2 cores)."""


def _gpu(uuid: str, index: int, **kw: Any) -> GpuReport:
    return gpu_report(uuid, index, name="Sim", **kw)


def test_online_stale_offline_by_server_receive_time(
    coordinator_factory: Callable[..., Coordinator],
) -> None:
    c = coordinator_factory(stale_after_s=STALE_S, offline_after_s=OFFLINE_S)
    c.group("vision")
    pc = c.enroll("vision")
    # The computer's clock is an hour behind: freshness ignores it, skew is a warning.
    sent = time.monotonic()
    assert pc.report(payload(generated_at=time.time() - 3600)).json()["applied"]
    view = c.fleet("vision")["computers"][0]
    assert view["freshness"]["state"] == "online", view["freshness"]
    assert view["clock_skew_s"] < -3500
    assert "behind" in view["clock_warning"]
    assert view["freshness"]["last_seen_at"].endswith(("Z", "+00:00"))

    time.sleep(max(0.0, sent + STALE_S + 0.3 - time.monotonic()))
    view = c.computer("vision", pc.id)
    assert view["freshness"]["state"] == "stale"
    assert view["freshness"]["text"].startswith("last known")
    assert view["freshness"]["age_s"] > STALE_S
    assert view["gpus"][0]["available_mib"] == 22847  # values kept

    time.sleep(max(0.0, sent + OFFLINE_S + 0.3 - time.monotonic()))
    view = c.computer("vision", pc.id)
    assert view["freshness"]["state"] == "offline"
    assert view["gpus"] and view["gpus"][0]["total_mib"] == 24576  # last known values shown

    # A new report brings it back online at once.
    assert pc.report().json()["applied"]
    assert c.computer("vision", pc.id)["freshness"]["state"] == "online"


def test_clock_ahead_does_not_make_a_silent_computer_look_fresh(
    coordinator_factory: Callable[..., Coordinator],
) -> None:
    c = coordinator_factory(stale_after_s=STALE_S, offline_after_s=OFFLINE_S)
    c.group("vision")
    pc = c.enroll("vision")
    sent = time.monotonic()
    assert pc.report(payload(generated_at=time.time() + 7200)).json()["applied"]
    time.sleep(max(0.0, sent + STALE_S + 0.3 - time.monotonic()))
    view = c.computer("vision", pc.id)
    assert view["freshness"]["state"] == "stale"
    assert "ahead" in view["clock_warning"]


def test_never_reported_computer_is_offline(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    view = coordinator.computer("vision", pc.id)
    assert view["freshness"] == {
        "state": "offline",
        "last_seen_at": None,
        "age_s": None,
        "text": "never reported",
    }
    assert view["gpus"] == []


def test_gpu_states_and_a_full_gpu_is_never_offline(
    coordinator_factory: Callable[..., Coordinator],
) -> None:
    c = coordinator_factory(stale_after_s=0.3, offline_after_s=0.6)
    c.group("vision")
    pc = c.enroll("vision")
    gpus = [
        _gpu("GPU-full", 0, available_mib=0, device_used_mib=23347, leased_in_use_mib=23000),
        _gpu("GPU-busy", 1, available_mib=15155, outstanding_mib=8192),
        _gpu("GPU-free", 2),
        _gpu("GPU-lost", 3, telemetry="lost"),
        _gpu("GPU-blind", 4, telemetry="unavailable", available_mib=None),
    ]
    leases = [
        LeaseReport(lease_id="l1", gpu_uuids=["GPU-full"], granted_mib=23000, project="vision"),
        LeaseReport(lease_id="l2", gpu_uuids=["GPU-busy"], granted_mib=8192, project="vision"),
    ]
    assert pc.report(payload(gpus=gpus, leases=leases)).json()["applied"]
    expected = {
        "GPU-full": "full",
        "GPU-busy": "busy",
        "GPU-free": "free",
        "GPU-lost": "lost",
        "GPU-blind": "telemetry_unavailable",
    }
    view = c.computer("vision", pc.id)
    assert {g["uuid"]: g["state"] for g in view["gpus"]} == expected
    assert {g["uuid"]: g["leases"] for g in view["gpus"]}["GPU-full"] == 1
    time.sleep(0.8)
    view = c.fleet("vision")["computers"][0]
    assert view["freshness"]["state"] == "offline"
    assert {g["uuid"]: g["state"] for g in view["gpus"]} == expected
