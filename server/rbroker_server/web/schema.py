"""What the pages show, already worked out: capacity bar segments, lease ages, job rates."""

from __future__ import annotations

from dataclasses import dataclass, field

from rbroker_protocol.fleet import ComputerView, FleetGpuView


@dataclass(frozen=True, slots=True)
class Segment:
    """One part of a capacity bar, in MiB and as a share of the bar (percent, 0–100).

    `key` is one of `leased`, `reserved`, `others`, `available`, `headroom` (the tray's
    split and colours: rbroker.tray.widgets.SEGMENTS).
    """

    key: str
    label: str
    mib: int | None
    """None: not reported (failed telemetry)."""
    x_pct: float
    width_pct: float


@dataclass(frozen=True, slots=True)
class GpuCard:
    """A GPU with its bar; `state_text` is the GPU's own state in words."""

    gpu: FleetGpuView
    state_text: str
    segments: list[Segment]
    total_mib: int | None
    summary: str
    """The bar as one sentence, for screen readers."""


@dataclass(frozen=True, slots=True)
class JobRow:
    """A job with its progress: `done` = completed + failed; rates from the history."""

    job_id: str
    project: str
    purpose: str
    handler: str
    state: str
    workers: int
    total_items: int | None
    completed_items: int
    failed_items: int
    done: int
    percent: float | None
    items_per_s: float | None
    eta_text: str


@dataclass(frozen=True, slots=True)
class LeaseRow:
    """A lease as a table row; `age_text` from the computer's grant time and the server clock
    corrected by the computer's clock skew."""

    owner: str
    project: str
    session: str
    purpose: str
    granted_mib: int
    gpus: str
    age_text: str
    over_grant: bool
    idle_text: str = ""
    """`idle 2 h 10 min` for a lease the computer reports idle (as of its report), else ''."""


@dataclass(frozen=True, slots=True)
class TimelineBar:
    """One booking on a GPU's timeline: its lane (overlapping bookings stack), where it starts
    and how wide it is as a share of the window (percent, 0–100), its state (`booked`,
    `held`, `claimed`) and what it is in words (the bar's tooltip)."""

    lane: int
    x_pct: float
    width_pct: float
    state: str
    text: str


@dataclass(frozen=True, slots=True)
class GpuTimeline:
    """A GPU's bookings over the window (`Timelines`)."""

    index: int
    uuid: str
    lanes: int
    bars: list[TimelineBar]
    summary: str
    """The timeline as one sentence, for screen readers."""


@dataclass(frozen=True, slots=True)
class Timelines:
    """The next 24 hours of a computer's bookings per GPU (GPUs without any left out), from
    the start of the server's current hour (UTC); `ticks` label the window every 6 hours,
    `now_pct` is where now falls in it (percent)."""

    ticks: list[str]
    now_pct: float
    gpus: list[GpuTimeline]


@dataclass(frozen=True, slots=True)
class BookingRow:
    """A live booking as a table row; `window` in UTC, `gpus` by index where known."""

    owner: str
    project: str
    session: str
    purpose: str
    mib: int
    claimed_mib: int
    gpus: str
    window: str
    state: str


@dataclass(frozen=True, slots=True)
class ComputerPage:
    """One computer as the pages show it."""

    view: ComputerView
    gpus: list[GpuCard]
    leases: list[LeaseRow]
    jobs: list[JobRow]
    queue_reasons: list[str] = field(default_factory=list)
    timelines: Timelines | None = None
    """None: no booking in the window."""
    bookings: list[BookingRow] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class JobsSummary:
    """A computer's jobs in one line: how many in each state, and the items of those with a
    declared total (`done_items` = completed + failed, of `total_items`)."""

    count: int
    by_state: list[tuple[str, int]]
    """(state, jobs), most common first."""
    done_items: int
    failed_items: int
    total_items: int
    percent: float | None
    """`done_items` of `total_items` (0–100); None when no job declared a total."""


@dataclass(frozen=True, slots=True)
class FleetRow:
    """One computer on the fleet page: its GPUs' bars and counts, never its lists (the
    computer page lists leases, waiting requests and jobs)."""

    view: ComputerView
    """Its figures without the lists (`leases`, `queue` and `jobs` are empty here)."""
    gpus: list[GpuCard]
    leases: int
    granted_mib: int
    """Sum of the leases' grants, MiB."""
    waiting: int
    jobs: JobsSummary
    left_out: dict[str, int]
    """Per list, entries the computer's report left out (`ComputerView.left_out`)."""
    timelines: Timelines | None = None
    """Its bookings over the next 24 hours (None: none)."""
