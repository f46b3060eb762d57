"""Turns fleet views into page models: bar segments, lease ages, job rates and ETAs.

Job rates come from the downsampled history (docs/architecture.md §7): the items done now
against the oldest point of the last `RATE_WINDOW_S` seconds that has the job, over the time
between the two reports (server receive times).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from rbroker_protocol.eta import eta_words
from rbroker_protocol.fleet import ComputerView, FleetGpuView
from rbroker_protocol.reports import QueueEntry
from rbroker_server.db.tables import HISTORY
from rbroker_server.fleet.bookings import protected_mib
from rbroker_server.fleet.service import age_text, idle_text
from rbroker_server.web.schema import (
    BookingRow,
    ComputerPage,
    FleetRow,
    GpuCard,
    GpuTimeline,
    JobRow,
    JobsSummary,
    LeaseRow,
    Segment,
    TimelineBar,
    Timelines,
)

RATE_WINDOW_S = 600.0
"""Items per second are measured over (at most) the last ten minutes of history."""

LIST_CAP = 500
"""A computer page lists at most this many leases, waiting requests and jobs each, then says
how many more (a report of 1 MiB holds a few thousand leases)."""

SEGMENTS: tuple[tuple[str, str, str], ...] = (
    ("leased", "in use by leases", "leased_in_use_mib"),
    ("reserved", "granted, not yet in use", "outstanding_mib"),
    ("others", "in use by others", "other_in_use_mib"),
    ("available", "available", "available_mib"),
    ("headroom", "headroom", "headroom_mib"),
)
"""The tray's split, in the tray's order (rbroker.tray.widgets.SEGMENTS)."""

GPU_STATE_TEXT = {
    "free": "free",
    "busy": "busy",
    "full": "full",
    "telemetry_unavailable": "telemetry unavailable",
    "lost": "lost",
}


def fmt_mib(mib: int | float | None) -> str:
    """`24 576` (thin grouping like the CLI and tray), `?` when unknown."""
    return "?" if mib is None else f"{int(mib):,}".replace(",", "\u202f")


def gpu_card(gpu: FleetGpuView) -> GpuCard:
    """The bar of one GPU: segments proportional to its total (scaled when over-committed).
    Figures the computer did not report (failed telemetry) stay unknown (`None`, shown as
    `?`), never 0."""
    values = [(key, label, getattr(gpu, attr)) for key, label, attr in SEGMENTS]
    total = gpu.total_mib
    scale = max(total or 0, sum(v or 0 for _, _, v in values), 1)
    segments, x = [], 0.0
    for key, label, mib in values:
        width = 100.0 * (mib or 0) / scale
        segments.append(Segment(key, label, mib, round(x, 3), round(width, 3)))
        x += width
    state_text = GPU_STATE_TEXT.get(gpu.state, gpu.state)
    parts = ", ".join(f"{label} {fmt_mib(mib)} MiB" for _, label, mib in values)
    summary = f"GPU {gpu.index} {state_text}: {parts}; total {fmt_mib(total)} MiB"
    return GpuCard(gpu, state_text, segments, total, summary)


def _lease_rows(view: ComputerView, now: datetime) -> list[LeaseRow]:
    rows = []
    skew = view.clock_skew_s or 0.0
    for lease in view.leases:
        age = "?"
        if lease.granted_at is not None:
            age = age_text(max(0.0, now.timestamp() + skew - lease.granted_at))
        rows.append(
            LeaseRow(
                owner=lease.owner,
                project=lease.project,
                session=lease.session,
                purpose=lease.purpose,
                granted_mib=lease.granted_mib,
                gpus=", ".join(lease.gpu_uuids),
                age_text=age,
                over_grant=lease.over_grant,
                idle_text=idle_text(lease.idle_s or 0.0) if lease.idle_state == "idle" else "",
            )
        )
    return rows


def eta_text(seconds: float | None) -> str:
    """`12 s`, `4 min`, `2 h` or `—` when unknown."""
    return "—" if seconds is None else age_text(max(0.0, seconds))


def _job_rows(view: ComputerView, earliest: dict[str, tuple[float, int]]) -> list[JobRow]:
    rows = []
    seen_at = view.freshness.last_seen_at.timestamp() if view.freshness.last_seen_at else None
    for job in view.jobs:
        done = job.completed_items + job.failed_items
        percent = None
        if job.total_items:
            percent = min(100.0, 100.0 * done / job.total_items)
        rate = None
        first = earliest.get(job.job_id)
        if first is not None and seen_at is not None and seen_at - first[0] > 0:
            rate = max(0.0, (done - first[1]) / (seen_at - first[0]))
        eta = None
        if job.state == "running" and rate and job.total_items is not None:
            eta = max(0, job.total_items - done) / rate
        rows.append(
            JobRow(
                job_id=job.job_id,
                project=job.project,
                purpose=job.purpose,
                handler=job.handler,
                state=job.state,
                workers=job.workers,
                total_items=job.total_items,
                completed_items=job.completed_items,
                failed_items=job.failed_items,
                done=done,
                percent=percent,
                items_per_s=rate,
                eta_text=eta_text(eta) if job.state == "running" else "—",
            )
        )
    return rows


def job_history(
    engine: Engine, computer_ids: Iterable[str], now: datetime
) -> dict[str, dict[str, tuple[float, int]]]:
    """Per computer, per job: (receive time, items done) at the oldest history point of the
    last `RATE_WINDOW_S` seconds that has the job."""
    ids = list(computer_ids)
    if not ids:
        return {}
    since = now - timedelta(seconds=RATE_WINDOW_S)
    out: dict[str, dict[str, tuple[float, int]]] = {}
    with engine.connect() as conn:
        points = conn.execute(
            sa.select(HISTORY.c.computer_id, HISTORY.c.at, HISTORY.c.data)
            .where(HISTORY.c.computer_id.in_(ids), HISTORY.c.at >= since)
            .order_by(HISTORY.c.at)
        ).all()
    for p in points:
        data: dict[str, Any] = p.data or {}
        at = data.get("received_at")
        if not isinstance(at, int | float):
            continue
        jobs = out.setdefault(p.computer_id, {})
        for job in data.get("jobs", []):
            jobs.setdefault(
                str(job.get("job_id")),
                (float(at), int(job.get("completed_items", 0)) + int(job.get("failed_items", 0))),
            )
    return out


TIMELINE_S = 24 * 3600
"""The bookings timeline shows this many seconds from the start of the current hour."""
TICK_S = 6 * 3600


def _utc(at: float) -> datetime:
    return datetime.fromtimestamp(at, UTC)


def booking_window(start_at: float, end_at: float) -> str:
    """`2026-12-07 14:00–16:00 UTC` within one UTC day, else `2026-12-07 22:00 – 2026-12-08
    02:00 UTC`."""
    start, end = _utc(start_at), _utc(end_at)
    if start.date() == end.date():
        return f"{start:%Y-%m-%d %H:%M}–{end:%H:%M} UTC"
    return f"{start:%Y-%m-%d %H:%M} – {end:%Y-%m-%d %H:%M} UTC"


def booking_text(b: Mapping[str, Any]) -> str:
    """One booking in words: `alice · vision · fine-tune: 10 000 MiB, 2026-12-07 14:00–16:00
    UTC, held` (and `, 4 096 claimed` when claimed); the template escapes it."""
    who = " · ".join(str(b.get(k) or "") for k in ("owner", "project", "purpose") if b.get(k))
    text = f"{who or 'booking'}: {fmt_mib(_as_int(b.get('mib')))} MiB, "
    text += f"{booking_window(float(b['start_at']), float(b['end_at']))}, {b.get('state', '')}"
    claimed = _as_int(b.get("claimed_mib"))
    return f"{text}, {fmt_mib(claimed)} claimed" if claimed else text


def booking_timelines(
    gpus: list[FleetGpuView], bookings: Iterable[Mapping[str, Any]], now: datetime
) -> Timelines | None:
    """The bookings over [the start of `now`'s hour, + 24 h) per GPU, as bars in lanes (a
    booking goes in the first lane free at its start); None when no booking meets the
    window. GPUs without a booking in it are left out; a booking's GPU the report does not
    list is shown by its UUID."""
    t0 = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0).timestamp()
    t1 = t0 + TIMELINE_S
    per: dict[str, list[Mapping[str, Any]]] = {}
    for b in bookings:
        if float(b["end_at"]) > t0 and float(b["start_at"]) < t1:
            for uuid in b.get("gpu_uuids") or ():
                per.setdefault(str(uuid), []).append(b)
    if not per:
        return None
    index = {g.uuid: g.index for g in gpus}
    lines = []
    for uuid, items in sorted(per.items(), key=lambda kv: (index.get(kv[0], 1 << 20), kv[0])):
        items.sort(key=lambda b: (float(b["start_at"]), str(b.get("booking_id", ""))))
        lane_ends: list[float] = []
        bars = []
        for b in items:
            start, end = max(float(b["start_at"]), t0), min(float(b["end_at"]), t1)
            lane = next((i for i, e in enumerate(lane_ends) if e <= start), len(lane_ends))
            if lane == len(lane_ends):
                lane_ends.append(end)
            lane_ends[lane] = end
            x = 100.0 * (start - t0) / TIMELINE_S
            width = max(0.3, 100.0 * (end - start) / TIMELINE_S)
            state = str(b.get("state", ""))
            bars.append(TimelineBar(lane, round(x, 2), round(width, 2), state, booking_text(b)))
        name = f"GPU {index[uuid]}" if uuid in index else uuid
        count = len(items)
        booked = max((protected_mib(b) for b in items), default=0)
        summary = (
            f"{name}: {count} booking{'' if count == 1 else 's'} in the next 24 hours"
            f" (the largest protects {fmt_mib(booked)} MiB)"
        )
        lines.append(GpuTimeline(index.get(uuid, -1), uuid, len(lane_ends), bars, summary))
    ticks = [f"{_utc(t0 + k * TICK_S):%H:%M}" for k in range(TIMELINE_S // TICK_S + 1)]
    ticks[0] += " UTC"
    now_pct = round(100.0 * (now.timestamp() - t0) / TIMELINE_S)  # a step every 14.4 min
    return Timelines(ticks, now_pct, lines)


def booking_rows(view: ComputerView) -> list[BookingRow]:
    """The computer's live bookings as table rows (at most `LIST_CAP`), by start."""
    index = {g.uuid: g.index for g in view.gpus}
    return [
        BookingRow(
            owner=b.owner,
            project=b.project,
            session=b.session,
            purpose=b.purpose,
            mib=b.mib,
            claimed_mib=b.claimed_mib,
            gpus=", ".join(f"GPU {index[u]}" if u in index else u for u in b.gpu_uuids),
            window=booking_window(b.start_at, b.end_at),
            state=b.state,
        )
        for b in view.bookings[:LIST_CAP]
    ]


def computer_pages(engine: Engine, views: list[ComputerView], now: datetime) -> list[ComputerPage]:
    """Page models of `views` (one history query for all the computers with jobs)."""
    history = job_history(engine, [v.id for v in views if v.jobs], now)
    return [
        ComputerPage(
            view=v,
            gpus=[gpu_card(g) for g in v.gpus],
            leases=_lease_rows(v, now),
            jobs=_job_rows(v, history.get(v.id, {})),
            queue_reasons=[q.reason for q in v.queue],
            timelines=booking_timelines(v.gpus, [b.model_dump() for b in v.bookings], now),
            bookings=booking_rows(v),
        )
        for v in views
    ]


def queue_eta(entry: QueueEntry) -> str:
    """When a waiting request will likely fit, in the words of every face
    (`rbroker_protocol.eta`), as of its computer's report; "" from a broker before report
    version 4 (no `eta_s`, no `eta_reason`)."""
    if entry.eta_s is None and not entry.eta_reason:
        return ""
    return eta_words(entry.model_dump()) or ""


def _as_int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def jobs_summary(jobs: list[dict[str, Any]]) -> JobsSummary:
    """`jobs` (stored job snapshots) in one line: counts by state, items done of the totals
    declared (jobs without a total count in `count` and `by_state` only)."""
    states: dict[str, int] = {}
    done = failed = total = 0
    for job in jobs:
        state = str(job.get("state", "running"))
        states[state] = states.get(state, 0) + 1
        failed += _as_int(job.get("failed_items"))
        if job.get("total_items") is not None:
            total += _as_int(job.get("total_items"))
            done += _as_int(job.get("completed_items")) + _as_int(job.get("failed_items"))
    by_state = sorted(states.items(), key=lambda kv: (-kv[1], kv[0]))
    percent = min(100.0, 100.0 * done / total) if total else None
    return JobsSummary(len(jobs), by_state, done, failed, total, percent)


def fleet_rows(
    views: list[ComputerView], states: list[dict[str, Any]], now: datetime | None = None
) -> list[FleetRow]:
    """The fleet page's rows: each computer's view (without lists) and its stored state
    (`fleet.service.fleet_summary`), counted, never listed; its bookings drawn on a
    timeline of the 24 hours from `now`'s hour (None: no timelines)."""
    rows = []
    for view, state in zip(views, states, strict=True):
        leases = state.get("leases") or []
        rows.append(
            FleetRow(
                view=view,
                gpus=[gpu_card(g) for g in view.gpus],
                leases=len(leases),
                granted_mib=sum(_as_int(lease.get("granted_mib")) for lease in leases),
                waiting=len(state.get("queue") or []),
                jobs=jobs_summary(state.get("jobs") or []),
                left_out=view.left_out,
                timelines=None
                if now is None
                else booking_timelines(view.gpus, state.get("bookings") or [], now),
            )
        )
    return rows
