"""What the tray shows at a glance: one state and a one-line summary from a broker snapshot.

Pure data, no Qt: the icon, the tooltip and the window banner are all derived here, so the
rules are tested without a display.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rbroker.broker.capacity import fmt_mib

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

    `jobs` is None when the broker has no `jobs.list` method (older brokers).
    """

    gpus: list[dict[str, Any]] = field(default_factory=list)
    leases: list[dict[str, Any]] = field(default_factory=list)
    queue: list[dict[str, Any]] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    jobs: list[dict[str, Any]] | None = None
    taken_at: float = field(default_factory=time.time)

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


def gpu_full(gpu: dict[str, Any]) -> bool:
    """No room left for any new lease on this GPU (available is 0 with a good sample)."""
    return gpu.get("total_mib") is not None and int(gpu.get("available_mib", 0)) <= 0


def derive_state(snapshot: Snapshot | None) -> TrayState:
    """The most urgent state: broker down > telemetry problem > requests waiting > a GPU
    full > coordinator unreachable > leases active > idle. `None` means no broker answers."""
    if snapshot is None:
        return TrayState.BROKER_DOWN
    if any(g.get("telemetry") != "ok" for g in snapshot.gpus):
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
    15 155 MiB available on 2 GPUs · simulated`."""
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
    avail = sum(int(g.get("available_mib", 0)) for g in snapshot.gpus)
    ngpu = len(snapshot.gpus)
    parts.append(f"{fmt_mib(avail)} MiB available on {ngpu} GPU{'s' if ngpu != 1 else ''}")
    if state is TrayState.TELEMETRY:
        bad = [g for g in snapshot.gpus if g.get("telemetry") != "ok"]
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
    """A MiB figure for the `rbroker run` snippet: `default`, or less when no GPU has it."""
    if snapshot is None or not snapshot.gpus:
        return default
    best = max(int(g.get("available_mib", 0)) for g in snapshot.gpus)
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
