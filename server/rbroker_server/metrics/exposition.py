"""A group's fleet as Prometheus metrics (prometheus-client's text exposition format).

Names follow Prometheus' conventions: base units (bytes, seconds), `_bytes` and `_seconds`
suffixes, counters end in `_total`. Figures are the same ones `/api/v1/fleet` shows at the
same instant, MiB turned into bytes (x 1 048 576). A figure the computer did not report
(unknown, e.g. failed telemetry) is left out rather than written as 0.

What a sum over computers means "now" counts only computers that report: an offline
computer keeps `rbroker_computer_freshness`, `rbroker_computer_last_report_age_seconds` and
`rbroker_gpu_info`, and its last-known GPU figures, GPU states, leases, waiting requests,
bookings and jobs are left out (the web view shows them as last known). Jobs are exported
while they run and for at most `FINISHED_JOBS_KEPT_S` (1 h) after they finished
(`live_jobs`; less where the history is kept for less), not for ever: a broker keeps its
finished jobs in its reports.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.engine import Engine

from rbroker_protocol.fleet import FleetView

MIB = 1024 * 1024
FINISHED_JOBS_KEPT_S = 3600.0
"""How long a finished job (succeeded, failed, cancelled) stays on `/metrics` (seconds); at
most the history window (`Settings.history_window_s`), which it is read from."""
FINISHED_JOB_STATES = frozenset({"succeeded", "failed", "cancelled"})

GPU_BYTES: tuple[tuple[str, str, str], ...] = (
    ("rbroker_gpu_total_bytes", "total_mib", "GPU memory in total."),
    ("rbroker_gpu_headroom_bytes", "headroom_mib", "Memory the broker never grants."),
    ("rbroker_gpu_in_use_bytes", "device_used_mib", "Memory in use on the device (total - free)."),
    (
        "rbroker_gpu_outstanding_bytes",
        "outstanding_mib",
        "Granted to leases but not allocated yet.",
    ),
    ("rbroker_gpu_available_bytes", "available_mib", "What a new lease could be granted now."),
    (
        "rbroker_gpu_booked_bytes",
        "booked_mib",
        "Memory live bookings protect now (booked less what their claims hold).",
    ),
)
"""(metric, FleetGpuView field in MiB, help)."""

GPU_STATES = ("free", "busy", "full", "telemetry_unavailable", "lost")
FRESHNESS_STATES = ("online", "stale", "offline")
BOOKING_STATES = ("booked", "held", "claimed")
"""The live booking states a report carries (architecture.md §2a)."""

COMPUTER_LABELS = ["computer_id", "computer"]
GPU_LABELS = [*COMPUTER_LABELS, "gpu_uuid", "gpu_index"]
JOB_LABELS = [*COMPUTER_LABELS, "job_id"]
"""Identifying labels only; descriptive ones (GPU name, job project, purpose and handler) are
on the `_info` metrics (value 1), joined in queries by these labels."""


class FleetCollector(Collector):
    """Yields the metric families of one fleet view (made fresh for every scrape)."""

    def __init__(self, view: FleetView) -> None:
        self.view = view

    def collect(self) -> Iterable[Metric]:
        return list(self._families())

    def _families(self) -> Iterator[Metric]:
        view = self.view
        gpu_bytes = {
            name: GaugeMetricFamily(name, doc, labels=GPU_LABELS) for name, _, doc in GPU_BYTES
        }
        gpu_info = GaugeMetricFamily(
            "rbroker_gpu_info", "The GPU's name (value 1).", labels=[*GPU_LABELS, "gpu_name"]
        )
        gpu_state = GaugeMetricFamily(
            "rbroker_gpu_state",
            "1 for the GPU's current state (free, busy, full, telemetry_unavailable, lost).",
            labels=[*GPU_LABELS, "state"],
        )
        leases = GaugeMetricFamily(
            "rbroker_computer_leases", "Active leases on the computer.", labels=COMPUTER_LABELS
        )
        waiting = GaugeMetricFamily(
            "rbroker_computer_waiting_requests",
            "Lease requests waiting in the computer's queue.",
            labels=COMPUTER_LABELS,
        )
        bookings = GaugeMetricFamily(
            "rbroker_computer_bookings",
            "Live bookings on the computer at its last report, by state (booked, held, claimed).",
            labels=[*COMPUTER_LABELS, "state"],
        )
        age = GaugeMetricFamily(
            "rbroker_computer_last_report_age_seconds",
            "Seconds since the coordinator received the computer's last applied report.",
            labels=COMPUTER_LABELS,
        )
        freshness = GaugeMetricFamily(
            "rbroker_computer_freshness",
            "1 for the computer's freshness (online, stale, offline).",
            labels=[*COMPUTER_LABELS, "state"],
        )
        completed = CounterMetricFamily(
            "rbroker_job_items_completed",
            "Items a job's chunks reported completed (cumulative).",
            labels=JOB_LABELS,
        )
        failed = CounterMetricFamily(
            "rbroker_job_items_failed",
            "Items a job's chunks reported failed (cumulative).",
            labels=JOB_LABELS,
        )
        total = GaugeMetricFamily(
            "rbroker_job_items", "Items a job declared in total.", labels=JOB_LABELS
        )
        job_info = GaugeMetricFamily(
            "rbroker_job_info",
            "A job's declared project, purpose, handler and state (value 1).",
            labels=[*JOB_LABELS, "project", "purpose", "handler", "state"],
        )
        for c in view.computers:
            who = [c.id, c.name]
            if c.freshness.age_s is not None:
                age.add_metric(who, c.freshness.age_s)
            for state in FRESHNESS_STATES:
                freshness.add_metric([*who, state], 1.0 if c.freshness.state == state else 0.0)
            for g in c.gpus:
                gpu_info.add_metric([*who, g.uuid, str(g.index), g.name], 1.0)
            if c.freshness.state == "offline":
                continue  # last known: not "now" (its jobs neither: they may have ended)
            for j in c.jobs:
                labels = [*who, j.job_id]
                job_info.add_metric([*labels, j.project, j.purpose, j.handler, j.state], 1.0)
                completed.add_metric(labels, float(j.completed_items))
                failed.add_metric(labels, float(j.failed_items))
                if j.total_items is not None:
                    total.add_metric(labels, float(j.total_items))
            for g in c.gpus:
                labels = [*who, g.uuid, str(g.index)]
                for name, field, _ in GPU_BYTES:
                    mib = getattr(g, field)
                    if mib is not None:
                        gpu_bytes[name].add_metric(labels, float(mib * MIB))
                for state in GPU_STATES:
                    gpu_state.add_metric([*labels, state], 1.0 if g.state == state else 0.0)
            leases.add_metric(who, float(len(c.leases)))
            waiting.add_metric(who, float(len(c.queue)))
            by_state = dict.fromkeys(BOOKING_STATES, 0)
            for b in c.bookings:
                if b.state in by_state:
                    by_state[b.state] += 1
            for state, count in by_state.items():
                bookings.add_metric([*who, state], float(count))
        yield from gpu_bytes.values()
        yield from (gpu_info, gpu_state, leases, waiting, bookings, age, freshness)
        yield from (completed, failed, total, job_info)


def live_jobs(engine: Engine, view: FleetView, now: datetime) -> FleetView:
    """`view` without the jobs that finished more than `FINISHED_JOBS_KEPT_S` ago.

    A computer's first history point of the last `FINISHED_JOBS_KEPT_S` (one per
    `history_step_s`) tells: a finished job that was already finished there has been for
    about that long and is left out; one running there or not there yet is kept. A computer
    without a point in that time (its history shorter than an hour, a new computer, one
    that reported nothing new for long) keeps its running jobs and loses its finished ones
    (it exported no job at all, the running ones too, until its next point)."""
    from rbroker_server.db.tables import HISTORY as h

    ids = [c.id for c in view.computers if c.jobs]
    if not ids:
        return view
    since = now - timedelta(seconds=FINISHED_JOBS_KEPT_S)
    first = (
        sa.select(h.c.computer_id, sa.func.min(h.c.at).label("at"))
        .where(h.c.computer_id.in_(ids), h.c.at >= since)
        .group_by(h.c.computer_id)
        .subquery()
    )
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(h.c.computer_id, h.c.data).join(
                first, sa.and_(h.c.computer_id == first.c.computer_id, h.c.at == first.c.at)
            )
        ).all()
    finished_then = {
        str(cid): {
            str(j.get("job_id"))
            for j in (data or {}).get("jobs", [])
            if j.get("state") in FINISHED_JOB_STATES
        }
        for cid, data in rows
    }
    computers = []
    for c in view.computers:
        if c.jobs:
            old = finished_then.get(c.id)
            jobs = [
                j
                for j in c.jobs
                if j.state not in FINISHED_JOB_STATES or (old is not None and j.job_id not in old)
            ]
            if len(jobs) != len(c.jobs):
                c = c.model_copy(update={"jobs": jobs})
        computers.append(c)
    return view.model_copy(update={"computers": computers})


def queued_deliveries(engine: Engine, group_id: int) -> int:
    """The group's webhook deliveries waiting to be sent."""
    from rbroker_server.db.tables import DELIVERIES as d
    from rbroker_server.db.tables import WEBHOOKS as w

    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count())
                .select_from(d.join(w, d.c.webhook_id == w.c.id))
                .where(w.c.group_id == group_id, d.c.state == "queued")
            ).scalar_one()
        )


def exposition(view: FleetView) -> bytes:
    """The text exposition of `view`: Prometheus' text format 1.0.0, as
    `controller.MEDIA_TYPE` declares (prometheus-client's `generate_latest`; for these
    names, all of the legacy character set, the same bytes as format 0.0.4)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(view))
    return generate_latest(registry)
