"""What the tray shows at a glance: one state and a one-line summary from a broker snapshot.

Pure data, no Qt: the icon, the tooltip and the window banner are all derived here, so the
rules are tested without a display.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import cast

from rbroker.base.display import fmt_mib
from rbroker_protocol.results import (
    BookingsListResult,
    BrokerStatus,
    GpuView,
    JobView,
    ListedLease,
    QueuedRequest,
)

COORDINATOR_PROBLEM_LINKS = (
    "retrying",
    "rejected",
    "error",
    "config error",
    "key unavailable",
    "unreachable",
)
"""Beginnings of `broker.status().coordinator.link` values that mean reports are not getting
through (`ok`, `connecting` and `not enrolled` are fine)."""


class TrayState(StrEnum):
    """The tray icon's states, most urgent first (see `derive_state`)."""

    BROKER_DOWN = "broker-down"
    TELEMETRY = "telemetry"
    WAITING = "waiting"
    FULL = "full"
    COORDINATOR = "coordinator"
    ACTIVE = "active"
    IDLE = "idle"


STATE_TEXT: dict[TrayState, str] = {
    TrayState.BROKER_DOWN: "broker not running",
    TrayState.TELEMETRY: "GPU telemetry problem",
    TrayState.WAITING: "requests waiting",
    TrayState.FULL: "a GPU is full",
    TrayState.COORDINATOR: "coordinator unreachable",
    TrayState.ACTIVE: "leases active",
    TrayState.IDLE: "idle",
}


@dataclass(frozen=True)
class Snapshot:
    """One consistent read of the local broker through the local API.

    `jobs` is None when the broker has no `jobs.list` method (older brokers), `bookings` when
    it has no `bookings.list` (or in a snapshot built by hand). `status` is `{}` until set (a
    snapshot built by hand, in tests and screenshots): read it with `.get`.
    """

    gpus: list[GpuView] = field(default_factory=list)
    leases: list[ListedLease] = field(default_factory=list)
    queue: list[QueuedRequest] = field(default_factory=list)
    status: BrokerStatus = field(default_factory=lambda: cast(BrokerStatus, {}))
    jobs: list[JobView] | None = None
    taken_at: float = field(default_factory=time.time)
    leases_left_out: int = 0
    """Leases of other users the broker did not list (`leases.list`'s `leases_left_out`)."""
    queue_left_out: int = 0
    """Waiting requests of other users not listed (`queue_left_out`)."""
    bookings: BookingsListResult | None = None
    """`bookings.list`: the live bookings, the broker's wall clock and each GPU's usable MiB."""

    @property
    def paused(self) -> bool:
        return bool(self.status.get("paused"))

    @property
    def simulated(self) -> bool:
        return bool(self.status.get("simulated"))

    @property
    def coordinator_link(self) -> str:
        coord = self.status.get("coordinator") or {}
        return str(coord.get("link") or "not enrolled")


def gpu_full(gpu: GpuView) -> bool:
    """No room left for any new lease on this GPU (available is 0 with a good sample)."""
    return gpu.get("total_mib") is not None and int(gpu.get("available_mib", 0)) <= 0


def telemetry_ok(gpu: GpuView) -> bool:
    """This GPU's figures come from a current sample (`telemetry` is `ok`).

    A `stale`, `unavailable` or `lost` GPU keeps showing its last known values, but nothing can
    be admitted on it (the broker fails closed), so its `available_mib` is not capacity anyone
    can have: it never counts in a total or a suggestion.
    """
    return gpu.get("telemetry") == "ok"


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' if n != 1 else ''}"


def derive_state(snapshot: Snapshot | None) -> TrayState:
    """The most urgent state: broker down > telemetry problem > requests waiting > a GPU
    full > coordinator unreachable > leases active > idle. `None` means no broker answers."""
    if snapshot is None:
        return TrayState.BROKER_DOWN
    if not all(telemetry_ok(g) for g in snapshot.gpus):
        return TrayState.TELEMETRY
    if snapshot.queue:
        return TrayState.WAITING
    if any(gpu_full(g) for g in snapshot.gpus):
        return TrayState.FULL
    if snapshot.coordinator_link.startswith(COORDINATOR_PROBLEM_LINKS):
        return TrayState.COORDINATOR
    if snapshot.leases:
        return TrayState.ACTIVE
    return TrayState.IDLE


def summary(snapshot: Snapshot | None) -> str:
    """The tooltip: one line, e.g. `rbroker: 2 leases (18 432 MiB) · 1 waiting ·
    15 155 MiB available on 2 GPUs · simulated`.

    Only GPUs whose telemetry is `ok` count in the available total; the others are named
    beside it (`23 347 MiB available on 1 GPU (1 GPU without telemetry)`), since their last
    known figures cannot be granted."""
    if snapshot is None:
        return "rbroker: broker not running"
    parts: list[str] = []
    state = derive_state(snapshot)
    n = len(snapshot.leases)
    if n:
        mib = sum(int(lease.get("granted_mib", 0)) for lease in snapshot.leases)
        parts.append(f"{n} lease{'s' if n != 1 else ''} ({fmt_mib(mib)} MiB)")
    else:
        parts.append("no leases")
    if snapshot.queue:
        parts.append(f"{len(snapshot.queue)} waiting")
    good = [g for g in snapshot.gpus if telemetry_ok(g)]
    bad = [g for g in snapshot.gpus if not telemetry_ok(g)]
    avail = sum(int(g.get("available_mib") or 0) for g in good)
    text = f"{fmt_mib(avail)} MiB available on {_gpus(len(good))}"
    if bad:
        text += f" ({_gpus(len(bad))} without telemetry)"
    parts.append(text)
    if state is TrayState.TELEMETRY:
        parts.append(f"telemetry {bad[0].get('telemetry')} on GPU {bad[0].get('index')}")
    elif state is TrayState.FULL:
        parts.append("GPU full")
    elif state is TrayState.COORDINATOR:
        parts.append("coordinator unreachable")
    if snapshot.paused:
        parts.append("admissions paused")
    if snapshot.simulated:
        parts.append("simulated")
    return "rbroker: " + " · ".join(parts)


def suggested_mib(snapshot: Snapshot | None, default: int = 8192) -> int:
    """A MiB figure for the `rbroker run` snippet: `default`, or less (whole GiB, at least
    1 024) when no GPU with `ok` telemetry has it; GPUs without telemetry offer nothing."""
    if snapshot is None or not snapshot.gpus:
        return default
    best = max(
        (int(g.get("available_mib") or 0) for g in snapshot.gpus if telemetry_ok(g)), default=0
    )
    if best >= default:
        return default
    return max(1024, best // 1024 * 1024)


def run_snippet(snapshot: Snapshot | None, socket: str | None = None) -> str:
    """A `rbroker run` command line to paste into a terminal."""
    prefix = f"RBROKER_SOCKET={socket} " if socket else ""
    return (
        f"{prefix}rbroker run --mib {suggested_mib(snapshot)} --project my-project "
        '--purpose "describe the run" --wait 600 -- python train.py'
    )


def age_text(seconds: float | None) -> str:
    """`42 s`, `7 min`, `3 h 5 min`, `2 d` (display only)."""
    if seconds is None:
        return "–"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        h, m = divmod(s // 60, 60)
        return f"{h} h {m} min" if m else f"{h} h"
    return f"{s // 86400} d"
