"""Wire schema of the fleet reads (`/api/v1/fleet`, `/api/v1/computers/{id}[/history]`):
the models of `rbroker_protocol.fleet`."""

from __future__ import annotations

from rbroker_protocol.fleet import (
    ComputerView,
    Flag,
    FleetView,
    Freshness,
    FreshnessState,
    GpuState,
    GpuView,
    HistoryPointView,
    HistoryView,
    JobView,
    LeaseView,
)

__all__ = [
    "ComputerView",
    "Flag",
    "FleetView",
    "Freshness",
    "FreshnessState",
    "GpuState",
    "GpuView",
    "HistoryPointView",
    "HistoryView",
    "JobView",
    "LeaseView",
]
