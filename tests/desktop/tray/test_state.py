"""The tray's state and summary rules (no Qt): which icon, which tooltip, which snippet."""

from __future__ import annotations

from typing import Any

import pytest

from rbroker.tray.state import (
    Snapshot,
    TrayState,
    age_text,
    derive_state,
    run_snippet,
    suggested_mib,
    summary,
)


def gpu(available: int = 20000, telemetry: str = "ok", **kw: Any) -> dict[str, Any]:
    return {
        "uuid": "GPU-1",
        "index": 0,
        "name": "Simulated RTX 4090",
        "telemetry": telemetry,
        "total_mib": 24576,
        "available_mib": available,
        **kw,
    }


LEASE = {"lease_id": "lease-1", "granted_mib": 8192}
WAITER = {"request_id": 1, "mib": 30000, "reason": "waiting: ..."}


@pytest.mark.parametrize(
    ("snap", "state"),
    [
        (None, TrayState.BROKER_DOWN),
        (Snapshot(gpus=[gpu()]), TrayState.IDLE),
        (Snapshot(gpus=[gpu()], leases=[LEASE]), TrayState.ACTIVE),
        (Snapshot(gpus=[gpu(available=0)], leases=[LEASE]), TrayState.FULL),
        (Snapshot(gpus=[gpu(available=0)], leases=[LEASE], queue=[WAITER]), TrayState.WAITING),
        (
            Snapshot(gpus=[gpu(telemetry="stale")], leases=[LEASE], queue=[WAITER]),
            TrayState.TELEMETRY,
        ),
        (
            Snapshot(gpus=[gpu()], leases=[LEASE], status={"coordinator": {"link": "unreachable"}}),
            TrayState.COORDINATOR,
        ),
        (
            Snapshot(gpus=[gpu()], status={"coordinator": {"link": "not enrolled"}}),
            TrayState.IDLE,
        ),
        (
            Snapshot(
                gpus=[gpu()],
                status={"coordinator": {"link": "retrying since 2026-11-30T09:00:00Z"}},
            ),
            TrayState.COORDINATOR,
        ),
        (
            Snapshot(gpus=[gpu()], status={"coordinator": {"link": "rejected: 401 bad sig"}}),
            TrayState.COORDINATOR,
        ),
        (Snapshot(gpus=[gpu()], status={"coordinator": {"link": "ok"}}), TrayState.IDLE),
        (Snapshot(gpus=[gpu()], status={"coordinator": {"link": "connecting"}}), TrayState.IDLE),
    ],
)
def test_state_priorities(snap: Snapshot | None, state: TrayState) -> None:
    assert derive_state(snap) is state


def test_a_gpu_without_a_sample_is_not_full() -> None:
    assert derive_state(Snapshot(gpus=[{"uuid": "GPU-1", "telemetry": "ok"}])) is TrayState.IDLE


def test_summary_is_one_line_with_the_numbers() -> None:
    snap = Snapshot(
        gpus=[gpu(available=7211), gpu(available=12011, index=1)],
        leases=[LEASE, {"lease_id": "lease-2", "granted_mib": 6144}],
        queue=[WAITER],
        status={"simulated": True, "paused": True},
    )
    text = summary(snap)
    assert "\n" not in text
    assert text == (
        "rbroker: 2 leases (14 336 MiB) · 1 waiting · 19 222 MiB available on 2 GPUs · "
        "admissions paused · simulated"
    )
    assert summary(None) == "rbroker: broker not running"
    assert "telemetry lost on GPU 0" in summary(Snapshot(gpus=[gpu(telemetry="lost")]))


def test_run_snippet_asks_for_what_fits() -> None:
    assert suggested_mib(None) == 8192
    assert suggested_mib(Snapshot(gpus=[gpu(available=5000)])) == 4096
    assert suggested_mib(Snapshot(gpus=[gpu(available=100)])) == 1024
    text = run_snippet(Snapshot(gpus=[gpu()]), socket="/tmp/b.sock")
    assert text.startswith("RBROKER_SOCKET=/tmp/b.sock rbroker run --mib 8192 ")
    assert text.endswith("-- python train.py")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "–"),
        (0, "0 s"),
        (59.9, "59 s"),
        (61, "1 min"),
        (3600, "1 h"),
        (3 * 3600 + 600, "3 h 10 min"),
        (2 * 86400, "2 d"),
    ],
)
def test_age_text(seconds: float | None, text: str) -> None:
    assert age_text(seconds) == text


@pytest.mark.parametrize("telemetry", ["stale", "unavailable", "lost"])
def test_gpus_without_telemetry_offer_nothing(telemetry: str) -> None:
    snap = Snapshot(gpus=[gpu(available=3000), gpu(available=23347, telemetry=telemetry, index=1)])
    assert summary(snap) == (
        "rbroker: no leases · 3 000 MiB available on 1 GPU (1 GPU without telemetry) · "
        f"telemetry {telemetry} on GPU 1"
    )
    assert suggested_mib(snap) == 2048
    only_bad = Snapshot(gpus=[gpu(available=23347, telemetry=telemetry)])
    assert "0 MiB available on 0 GPUs (1 GPU without telemetry)" in summary(only_bad)
    assert suggested_mib(only_bad) == 1024  # nothing can be granted now: the smallest ask
