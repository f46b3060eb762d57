"""The coordinator's fleet reads (`/api/v1/fleet`, `/api/v1/fleet/room`,
`/api/v1/computers/{id}[/history]`, architecture.md §7): what the coordinator answers and
the desktop's uplink reads."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from rbroker_protocol.reports import BookingReport, GpuReport, JobSnapshot, LeaseReport, QueueEntry

FreshnessState = Literal["online", "stale", "offline"]
GpuState = Literal["free", "busy", "full", "telemetry_unavailable", "lost"]


class Freshness(BaseModel):
    """How recent the computer's last applied report is, by the server's receive time.

    `online`: within `stale_after_s`; `stale`: values are the last known ones, `age_s` old;
    `offline`: past `offline_after_s` (or never reported); last known values still shown.
    """

    state: FreshnessState
    last_seen_at: datetime | None
    age_s: float | None
    text: str


class FleetGpuView(GpuReport):
    """A GPU's last known figures and its state, separate from the computer's freshness:
    a full GPU is `full`, never `offline`.

    Stored values are shown as stored: an identifier or state the report schema checks may
    be `[redacted]` (it broke a description rule) or predate the check, so they are plain
    text here (likewise in `FleetLeaseView` and `FleetJobView`)."""

    uuid: str  # type: ignore[assignment, unused-ignore]
    telemetry: str = "ok"  # type: ignore[assignment, unused-ignore]
    state: GpuState
    leases: int = 0
    booked_mib: int = 0
    """MiB the computer's live bookings protect on it now (by the coordinator's clock: each
    booking whose window holds now, less what its claims hold); not part of
    `available_mib`, which is the broker's figure without bookings."""


class FleetLeaseView(LeaseReport):
    """An active lease as stored (see `FleetGpuView` on identifiers and states)."""

    lease_id: str  # type: ignore[assignment, unused-ignore]
    gpu_uuids: list[str]  # type: ignore[assignment, unused-ignore]
    state: str = "active"  # type: ignore[assignment, unused-ignore]
    observed_mib: dict[str, int] = Field(default_factory=dict)  # type: ignore[assignment, unused-ignore]
    idle_state: str = "unknown"  # type: ignore[assignment, unused-ignore]


class FleetBookingView(BookingReport):
    """A live booking as stored (see `FleetGpuView` on identifiers and states): `mib` on
    each of `gpu_uuids` for [`start_at`, `end_at`) (the computer's wall clock, Unix
    seconds, UTC)."""

    booking_id: str  # type: ignore[assignment, unused-ignore]
    gpu_uuids: list[str]  # type: ignore[assignment, unused-ignore]
    state: str = "booked"  # type: ignore[assignment, unused-ignore]


class FleetJobView(JobSnapshot):
    """A declared job as stored (see `FleetGpuView` on identifiers and states)."""

    job_id: str  # type: ignore[assignment, unused-ignore]
    state: str = "running"  # type: ignore[assignment, unused-ignore]


class Flag(BaseModel):
    """A description field that broke a rule and was stored redacted."""

    field: str
    rule: str


class ComputerView(BaseModel):
    """One computer of the group with its latest (redacted) state."""

    id: str
    name: str
    reported_name: str | None
    freshness: Freshness
    clock_skew_s: float | None
    clock_warning: str | None
    broker_version: str | None
    telemetry_source: str | None
    enrolled_at: datetime
    revoked: bool
    flagged: bool
    flagged_at: datetime | None
    flags: list[Flag]
    run_id: str | None
    seq: int | None
    reports_applied: int
    gpus: list[FleetGpuView]
    leases: list[FleetLeaseView]
    queue: list[QueueEntry]
    jobs: list[FleetJobView]
    left_out: dict[str, int] = {}
    """Per list (`leases`, `queue`, `jobs`), how many entries the computer's last report
    left out to fit its size limit ("N jobs not shown")."""
    bookings: list[FleetBookingView] = []
    """Its live bookings at its last report, by start (empty from brokers before report
    version 6)."""
    bookings_left_out: int = 0
    """How many of its live bookings that report left out (the furthest)."""


class FleetView(BaseModel):
    """The caller's group and its computers (revoked ones left out), by name then id; when
    asked a page (`?limit=N`), `next_after` is the `after` of the next page (None: the last
    page, or all of them)."""

    group: str
    generated_at: datetime
    stale_after_s: float
    offline_after_s: float
    computers: list[ComputerView]
    next_after: str | None = None


class RoomGpuView(BaseModel):
    """A GPU where the asked MiB fit at its computer's last report: its broker's admission
    figure (`available_mib`, `GpuReport`'s: total − headroom − in use − granted not yet in
    use) and its total, in MiB; what live bookings protect on it now (`booked_mib`) and
    the room left (`room_mib`: available − booked, at least the asked MiB); when a booking
    to come would take the asked MiB (`until_at`: its start; None when none would within
    the bookings reported), and that in words (`text`)."""

    uuid: str
    index: int
    name: str
    available_mib: int
    total_mib: int | None
    booked_mib: int = 0
    room_mib: int = 0
    until_at: datetime | None = None
    text: str = ""
    """`room for 10 000 MiB now`, or `room for 10 000 MiB now, and until 14:00 UTC` when a
    booking comes (the date before the time when it is not the same UTC day)."""


class RoomComputerView(BaseModel):
    """A computer with room: how fresh its last report is (`freshness.age_s`, seconds, and
    its state), its GPUs where the asked MiB fit (most available first; at least the asked
    number of them), and how many requests were waiting in its queue at that report (they
    come first there)."""

    id: str
    name: str
    freshness: Freshness
    gpus: list[RoomGpuView]
    waiting: int
    until_at: datetime | None = None
    """Until when it keeps room on the asked number of GPUs: the latest `until_at` it can
    still pick that many GPUs by (None: no booking reported takes it)."""


class RoomView(BaseModel):
    """`GET /api/v1/fleet/room?mib=N&gpus=K`: the caller's group's computers with `gpus` GPUs
    each having `mib` MiB available at the last report, freshest first (online, then stale,
    then offline; by report age within each). A view of the last reports: it places nothing
    and reserves nothing, and another request may take the room before yours asks for it."""

    group: str
    generated_at: datetime
    mib: int
    """MiB asked for on each GPU."""
    gpus: int
    """How many GPUs of one computer must each have `mib` available."""
    computers: list[RoomComputerView]


class HistoryPointView(BaseModel):
    """One downsampled point: per-GPU MiB figures, lease and queue counts, and each job's
    cumulative counts (`job_id`, `purpose`, `state`, `total_items`, `completed_items`,
    `failed_items`; empty for points written before jobs were kept)."""

    at: datetime
    gpus: list[dict[str, Any]]
    leases: int
    queue: int
    jobs: list[dict[str, Any]] = []


class HistoryView(BaseModel):
    """A computer's history inside the window, oldest first."""

    computer_id: str
    window_s: float
    step_s: float
    points: list[HistoryPointView]


__all__ = [
    "ComputerView",
    "Flag",
    "FleetBookingView",
    "FleetGpuView",
    "FleetJobView",
    "FleetLeaseView",
    "FleetView",
    "Freshness",
    "FreshnessState",
    "GpuState",
    "HistoryPointView",
    "HistoryView",
    "RoomComputerView",
    "RoomGpuView",
    "RoomView",
]
