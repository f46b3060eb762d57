"""Rich renderables for the broker's state: capacity bars, leases, queue.

Shared by `rbroker status` (printed once) and `rbroker demo` (a live view).
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from rbroker.broker.capacity import fmt_mib, short_uuid

BAR_WIDTH = 30


def capacity_bar(gpu: dict[str, Any], width: int = BAR_WIDTH) -> Text:
    """One GPU as a bar: leases in use █ (green), granted not yet allocated ▒ (cyan),
    others ▓ (magenta), headroom ░ (yellow), available · (dim)."""
    total = gpu.get("total_mib") or 0
    if not total:
        return Text("capacity unknown", style="red")
    parts = [
        (gpu.get("leased_in_use_mib", 0), "█", "green"),
        (gpu.get("outstanding_mib", 0), "▒", "cyan"),
        (gpu.get("other_in_use_mib", 0), "▓", "magenta"),
        (gpu.get("headroom_mib", 0), "░", "yellow"),
    ]
    bar = Text()
    used_cells = 0
    for mib, ch, style in parts:
        cells = round(width * mib / total)
        cells = min(cells, width - used_cells)
        bar.append(ch * cells, style=style)
        used_cells += cells
    bar.append("·" * (width - used_cells), style="dim")
    return bar


def gpu_table(gpus: list[dict[str, Any]]) -> Table:
    """Per GPU: the capacity split of DESIGN §2 in MiB, with a bar."""
    table = Table(title="GPUs", title_justify="left", expand=False)
    for col in (
        "GPU",
        "telemetry",
        "capacity",
        "total",
        "headroom",
        "leases use",
        "granted, not allocated",
        "others use",
        "available",
        "waiting",
    ):
        table.add_column(
            col, justify="right" if col not in ("GPU", "telemetry", "capacity") else "left"
        )
    for g in gpus:
        tele = g.get("telemetry", "?")
        style = "green" if tele == "ok" else "red"
        table.add_row(
            f"{g.get('index', '?')} {short_uuid(g['uuid'])}",
            Text(
                tele + (f" ({g['telemetry_reason']})" if g.get("telemetry_reason") else ""),
                style=style,
            ),
            capacity_bar(g),
            fmt_mib(g.get("total_mib", 0)),
            fmt_mib(g.get("headroom_mib", 0)),
            fmt_mib(g.get("leased_in_use_mib", 0)),
            fmt_mib(g.get("outstanding_mib", 0)),
            fmt_mib(g.get("other_in_use_mib", 0)),
            Text(fmt_mib(g.get("available_mib", 0)), style="bold"),
            str(g.get("waiting", 0)),
        )
    return table


def _age(since_wall: float) -> str:
    seconds = max(0.0, time.time() - since_wall)
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def lease_table(leases: list[dict[str, Any]]) -> Table:
    """Active leases: owner, project, session, purpose, MiB, GPU, state, age, expires in."""
    table = Table(title=f"Leases ({len(leases)})", title_justify="left")
    for col in (
        "lease",
        "owner",
        "project",
        "session",
        "purpose",
        "MiB",
        "in use",
        "GPU",
        "state",
        "age",
        "expires in",
    ):
        table.add_column(col, justify="right" if col in ("MiB", "in use") else "left")
    for lease in leases:
        observed = sum(lease.get("observed_mib", {}).values())
        table.add_row(
            lease["lease_id"],
            lease["owner"],
            lease["project"],
            lease["session"],
            lease["purpose"],
            fmt_mib(lease["granted_mib"]),
            Text(fmt_mib(observed), style="red" if lease.get("over_grant") else ""),
            ",".join(short_uuid(u) for u in lease["gpu_uuids"]),
            lease["state"],
            _age(lease["granted_at"]),
            f"{lease['expires_in_s']:.0f} s",
        )
    return table


def queue_table(queue: list[dict[str, Any]]) -> Table:
    """Waiting requests, FIFO order, with the reason and its numbers."""
    table = Table(title=f"Queue ({len(queue)})", title_justify="left")
    for col in ("owner", "project", "purpose", "MiB", "waiting", "reason"):
        table.add_column(
            col, justify="right" if col in ("MiB", "waiting") else "left", overflow="fold"
        )
    for w in queue:
        table.add_row(
            w["owner"],
            w["project"],
            w["purpose"],
            fmt_mib(w["mib"]),
            f"{w['waiting_s']:.1f} s",
            w["reason"],
        )
    return table


def legend() -> Text:
    """What the bar characters mean."""
    t = Text("bar: ")
    for ch, style, name in (
        ("█", "green", "leases use"),
        ("▒", "cyan", "granted, not allocated"),
        ("▓", "magenta", "others use"),
        ("░", "yellow", "headroom"),
        ("·", "dim", "available"),
    ):
        t.append(ch, style=style)
        t.append(f" {name}  ")
    return t


def broker_view(
    gpus: list[dict[str, Any]],
    leases: dict[str, Any],
    header: str = "",
    jobs: list[dict[str, Any]] | None = None,
) -> Group:
    """Everything in one renderable."""
    items: list[Any] = []
    if header:
        items.append(Text(header, style="bold"))
    items += [gpu_table(gpus), legend(), lease_table(leases["leases"])]
    items.append(queue_table(leases["queue"]))
    if jobs:
        items.append(jobs_table(jobs))
    return Group(*items)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def progress_bar(job: dict[str, Any], width: int = 24) -> Text:
    """Completed █ (green) and failed █ (red) items out of total_items (or counts only)."""
    total = job.get("total_items")
    done, failed = job["completed_items"], job["failed_items"]
    if not total:
        return Text(f"{fmt_mib(done)} done, {fmt_mib(failed)} failed")
    ok_cells = round(width * done / total)
    bad_cells = min(width - ok_cells, round(width * failed / total))
    bar = Text()
    bar.append("█" * ok_cells, style="green")
    bar.append("█" * bad_cells, style="red")
    bar.append("·" * (width - ok_cells - bad_cells), style="dim")
    bar.append(f" {100 * (done + failed) / total:5.1f} %")
    return bar


def jobs_table(jobs: list[dict[str, Any]]) -> Table:
    """Jobs: project, purpose, handler, state, workers, progress, items/s, ETA."""
    table = Table(title=f"Jobs ({len(jobs)})", title_justify="left")
    for col in (
        "job",
        "project",
        "purpose",
        "handler",
        "state",
        "workers",
        "progress",
        "completed",
        "failed",
        "items/s",
        "ETA",
    ):
        table.add_column(
            col,
            justify="right"
            if col in ("workers", "completed", "failed", "items/s", "ETA")
            else "left",
        )
    styles = {"running": "green", "stalled": "yellow", "failed": "red", "succeeded": "cyan"}
    for j in jobs:
        state = j["state"] + (f" ({j['reason']})" if j.get("reason") else "")
        rate = j.get("items_per_s")
        table.add_row(
            j["job_id"],
            j["project"],
            j["purpose"],
            j["handler"],
            Text(state, style=styles.get(j["state"], "")),
            f"{len(j.get('lease_ids', []))}/{j['workers']}",
            progress_bar(j),
            fmt_mib(j["completed_items"]),
            fmt_mib(j["failed_items"]),
            f"{rate:.1f}" if rate else "—",
            _duration(j.get("eta_s")),
        )
    return table
