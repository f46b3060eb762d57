"""The broker's state as tables: capacity bars, leases, queue, jobs, and a group's fleet.

Shared by `rbroker status` (printed once), `rbroker jobs`, `rbroker fleet` and the demo's live
view. Every table is a `Sheet` (see `rbroker.cli.sheet`): it fits an 80-column terminal
without cutting a number or a header, uses the full width when there is more, and prints
plain, untruncated rows when the output is not a terminal (`View.plain()`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

from rbroker.base.display import REQUEST_PREFIX, fmt_count, fmt_mib, idle_words, short_uuid
from rbroker.base.when import fmt_duration, fmt_when
from rbroker.cli.sheet import Cell, Column, Sheet, bar_column, unique_prefixes
from rbroker_protocol.eta import eta_words as protocol_eta_words
from rbroker_protocol.results import (
    GpuView,
    JobsListResult,
    JobView,
    LeasesListResult,
    ListedLease,
    QueuedRequest,
    ShareView,
)

if TYPE_CHECKING:  # pydantic models: `rbroker fleet` validates the answer, `status` loads none
    from rbroker_protocol.fleet import FleetView, RoomView

BAR_WIDTH = 30
LEASE_PREFIX = "lease-"
"""How `rbroker status` names a waiting request (`req-7`) and `rbroker release` takes it."""


class View:
    """Several tables and lines as one renderable; `plain()` gives the pipe form."""

    def __init__(self, *parts: Sheet | Text) -> None:
        self.parts = list(parts)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from self.parts

    def plain(self) -> str:
        """Every table as plain rows (see `Sheet.plain`), separated by blank lines."""
        out = []
        for part in self.parts:
            if isinstance(part, Sheet):
                out.append(part.plain())
            elif not isinstance(part, Legend):
                out.append(part.plain + "\n")
        return "\n".join(out)


def print_view(console: Console, view: View | Sheet) -> None:
    """`view` laid out for a terminal, or as plain rows when `console` is not one."""
    if console.is_terminal:
        console.print(view)
    else:
        console.file.write(view.plain())
        console.file.flush()


def _num(value: int | float | None, style: str = "") -> Cell:
    """A MiB figure or count: grouped (`24 576`) in a terminal, bare (`24576`) in plain."""
    n = int(value or 0)
    return Cell(Text(fmt_mib(n), style=style), plain=str(n))


def _in_use(observed: int, lease: ListedLease) -> Cell:
    """A lease's observed MiB; over its grant it is red and says by how much:
    `6 000 (+1 904 over)` (plain: `6000 (+1904 over)`)."""
    over = int(lease.get("over_grant_mib") or 0)
    if not lease.get("over_grant") or over <= 0:
        return _num(observed)
    return Cell(
        Text(f"{fmt_mib(observed)} (+{fmt_mib(over)} over)", style="red"),
        plain=f"{observed} (+{over} over)",
    )


def gpu_labels(gpus: Sequence[GpuView]) -> dict[str, str]:
    """`{uuid: "GPU 0"}`; where an index is shared (MIG slices of one GPU) or unknown the
    label ends with the UUID's last characters: `GPU 0 …0002`."""
    return _labels([(g["uuid"], g.get("index")) for g in gpus])


def _labels(gpus: Sequence[tuple[str, int | None]]) -> dict[str, str]:
    """`gpu_labels` of (uuid, index) pairs (the local API's GPUs, or the fleet's)."""
    counts = Counter(index for _, index in gpus)
    labels = {}
    for uuid, index in gpus:
        label = f"GPU {index}" if index is not None else "GPU"
        if index is None or counts[index] > 1:
            label += f" …{uuid[-4:]}"
        labels[uuid] = label
    return labels


def capacity_bar(gpu: GpuView, width: int = BAR_WIDTH) -> Text:
    """One GPU as a bar: leases in use █ (green), granted not yet allocated ▒ (cyan),
    others ▓ (magenta), headroom ░ (yellow), available · (dim)."""
    total = gpu.get("total_mib") or 0
    if not total:
        return Text("unknown", style="red")
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


def gpu_table(gpus: Sequence[GpuView]) -> Sheet:
    """Per GPU: the capacity split of architecture.md §2 in MiB, with a bar. At 80 columns: label,
    bar, total, available, leases' use, granted, others' use; headroom, waiting, telemetry
    and UUID join when the width allows (a GPU whose telemetry is not ok, and one whose
    bookings hold memory back from requests of now, get a note line under the table in any
    case)."""
    sheet = Sheet(
        "GPUs (MiB)",
        [
            Column("GPU"),
            bar_column("memory", bar_min=10, bar_max=BAR_WIDTH),
            Column("total", "right"),
            Column("available", "right"),
            Column("leases use", "right"),
            Column("granted", "right"),
            Column("others use", "right"),
            Column("headroom", "right", optional=True),
            Column("waiting", "right", optional=True),
            Column("telemetry", optional=True),
            Column("UUID", optional=True),
        ],
        empty="no GPUs",
    )
    labels = gpu_labels(gpus)
    for g in gpus:
        tele = str(g.get("telemetry", "?"))
        reason = g.get("telemetry_reason")
        ok = tele == "ok"
        sheet.add(
            labels[g["uuid"]],
            Cell(bar=partial(capacity_bar, g)),
            _num(g.get("total_mib")),
            _num(g.get("available_mib"), "bold"),
            _num(g.get("leased_in_use_mib")),
            _num(g.get("outstanding_mib")),
            _num(g.get("other_in_use_mib")),
            _num(g.get("headroom_mib")),
            _num(g.get("waiting")),
            Cell(Text(tele, style="green" if ok else "red")),
            Cell(short_uuid(g["uuid"]), plain=g["uuid"]),
        )
        if not ok:
            sheet.notes.append(
                Text(
                    f"{labels[g['uuid']]}: telemetry {tele}" + (f" ({reason})" if reason else ""),
                    style="red",
                )
            )
        booked = int(g.get("booked_mib") or 0)
        if booked and g.get("available_mib") is not None:
            hours = fmt_duration(float(g.get("booked_within_s") or 0))
            left = max(0, int(g.get("available_mib") or 0) - booked)
            sheet.notes.append(
                Text(
                    f"{labels[g['uuid']]}: {fmt_mib(booked)} MiB booked within {hours}: a "
                    f"request that declares no end gets at most {fmt_mib(left)} "
                    "(rbroker bookings)",
                    style="yellow",
                )
            )
    return sheet


def _age(since_wall: float) -> str:
    seconds = max(0.0, time.time() - since_wall)
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def lease_state(lease: Mapping[str, Any]) -> str:
    """A listed lease's state cell: its idleness in words where the broker measured it idle
    or could not (`idle_words`: `idle 2 h 10 min`, `idle: unknown`), else its state
    (`active`; also from a broker older than the idle fields)."""
    return idle_words(lease.get("idle_state"), lease.get("idle_s")) or str(lease["state"])


def lease_table(leases: Sequence[ListedLease], gpus: Sequence[GpuView] = ()) -> Sheet:
    """Active leases: id (a short unique prefix when the width is tight, accepted by
    `rbroker release`), owner, project, session, purpose, MiB, in use, GPU, state
    (`lease_state`), age, expires (seconds to the TTL's end)."""
    sheet = Sheet(
        f"Leases ({fmt_count(len(leases))})",
        [
            Column("lease"),
            Column("owner", free_text=True, min_free=5),
            Column("project", free_text=True, min_free=7),
            Column("session", free_text=True, min_free=7),
            Column("purpose", free_text=True, min_free=7),
            Column("MiB", "right"),
            Column("in use", "right"),
            Column("GPU"),
            Column("state", optional=True),
            Column("age", "right", optional=True),
            Column("expires", "right"),
        ],
        empty="no leases",
    )
    labels = gpu_labels(gpus)
    short = unique_prefixes([x["lease_id"] for x in leases], strip=LEASE_PREFIX)
    for lease in leases:
        observed = sum(lease.get("observed_mib", {}).values())
        uuids = lease["gpu_uuids"]
        sheet.add(
            Cell(lease["lease_id"], short=short[lease["lease_id"]]),
            lease["owner"],
            lease["project"],
            lease["session"],
            lease["purpose"],
            _num(lease["granted_mib"]),
            _in_use(observed, lease),
            Cell(
                ",".join(labels.get(u, short_uuid(u)) for u in uuids),
                plain=",".join(uuids),
            ),
            lease_state(lease),
            _age(lease["granted_at"]),
            f"{lease['expires_in_s']:.0f} s",
        )
    return sheet


def eta_words(entry: Mapping[str, Any]) -> str | None:
    """A waiting request's estimate in words: `likely in ~7 min (because …)` from `eta_s`
    (seconds from now) and `eta_reason`, `no estimate yet (…)` when `eta_s` is None, or None
    when the entry has no `eta_s` (a broker older than the estimate); the wording of every
    face, `rbroker_protocol.eta.eta_words`."""
    return protocol_eta_words(entry)


def queue_table(queue: Sequence[QueuedRequest]) -> Sheet:
    """Waiting requests, FIFO order: id (`req-N`, accepted by `rbroker release`), owner,
    project, purpose, MiB, time waiting and the reason with its numbers, after the estimate
    of when it will fit where the broker gives one (`eta_words`; whole at any width: it wraps
    within its column in a terminal, one line in plain output)."""
    sheet = Sheet(
        f"Queue ({fmt_count(len(queue))})",
        [
            Column("request"),
            Column("owner", free_text=True, min_free=5),
            Column("project", free_text=True, min_free=7),
            Column("purpose", free_text=True, min_free=7),
            Column("MiB", "right"),
            Column("waiting", "right"),
            Column("reason", free_text=True, min_free=12),
        ],
        empty="no requests waiting",
    )
    for w in queue:
        sheet.add(
            f"{REQUEST_PREFIX}{w['request_id']}",
            w["owner"],
            w["project"],
            w["purpose"],
            _num(w["mib"]),
            f"{w['waiting_s']:.1f} s",
            " — ".join(x for x in (eta_words(w), w["reason"]) if x),
        )
    return sheet


def shares_table(shares: Sequence[ShareView]) -> Sheet:
    """Each project's share of the broker (`[shares]`) and its use now, as `broker.status`
    gives them (`shares`): weight, share of the projects holding or asking now, MiB granted,
    requests waiting."""
    sheet = Sheet(
        "Shares",
        [
            Column("project", free_text=True, min_free=7),
            Column("weight", "right"),
            Column("share", "right"),
            Column("granted MiB", "right"),
            Column("waiting", "right"),
        ],
        empty="no shares set",
    )
    for row in shares:
        sheet.add(
            "other projects" if row["project"] == "*" else row["project"],
            f"{row['weight']:g}",
            f"{100 * row['share']:.0f} %" if row["project"] != "*" else "—",
            _num(row["granted_mib"]),
            str(row["waiting"]),
        )
    return sheet


class Legend(Text):
    """A line that explains bars: shown in a terminal, left out of plain output."""


def legend() -> Text:
    """What the bar characters mean, in the GPU table's column names."""
    t = Legend()
    for ch, style, name in (
        ("█", "green", "leases use"),
        ("▒", "cyan", "granted"),
        ("▓", "magenta", "others use"),
        ("░", "yellow", "headroom"),
        ("·", "dim", "available"),
    ):
        t.append(ch, style=style)
        t.append(f" {name}  ")
    t.rstrip()
    return t


def broker_view(
    gpus: Sequence[GpuView],
    leases: LeasesListResult,
    header: str = "",
    jobs: Sequence[JobView] | None = None,
) -> View:
    """Everything in one renderable (`View.plain()` for pipes): `gpus`, `leases` and `jobs`
    as `gpus.list`, `leases.list` and `jobs.list` answer them."""
    parts: list[Sheet | Text] = []
    if header:
        parts.append(Text(header, style="bold"))
    parts.append(gpu_table(gpus))
    if gpus:
        parts.append(legend())
    parts += [lease_table(leases["leases"], gpus), queue_table(leases["queue"])]
    note = left_out_note(leases)
    if note:
        parts.append(Text(note, style="dim"))
    if jobs:
        parts.append(jobs_table(jobs))
    return View(*parts)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def progress_bar(job: JobView, width: int = 24) -> Text:
    """Completed █ (green) and failed █ (red) items out of total_items, then the percentage
    (`width` cells in all); counts only when there is no total."""
    total = job.get("total_items")
    done, failed = job["completed_items"], job["failed_items"]
    if not total:
        return Text(f"{fmt_mib(done)} done, {fmt_mib(failed)} failed")
    pct = f" {100 * (done + failed) / total:5.1f} %"
    cells = max(1, width - len(pct))
    ok_cells = min(cells, round(cells * done / total))
    bad_cells = min(cells - ok_cells, round(cells * failed / total))
    bar = Text()
    bar.append("█" * ok_cells, style="green")
    bar.append("█" * bad_cells, style="red")
    bar.append("·" * (cells - ok_cells - bad_cells), style="dim")
    bar.append(pct)
    return bar


def _no_total(width: int) -> Text:
    return Text("no total", style="dim")


def _progress_plain(job: JobView) -> str:
    total = job.get("total_items")
    if not total:
        return "no total"
    return f"{100 * (job['completed_items'] + job['failed_items']) / total:.1f} %"


def left_out_note(answer: LeasesListResult) -> str | None:
    """The line under the leases and the queue that says what `leases.list` left out of
    other users' (`leases_left_out`: the smallest leases; `queue_left_out`: the requests
    furthest back); None when nothing."""
    parts = []
    if answer.get("leases_left_out"):
        parts.append(f"{fmt_count(answer['leases_left_out'])} smaller leases")
    if answer.get("queue_left_out"):
        parts.append(f"{fmt_count(answer['queue_left_out'])} requests further back in the queue")
    return f"Not listed, of other users: {' and '.join(parts)}." if parts else None


def finished_note(answer: JobsListResult) -> str | None:
    """The line under the jobs that says what the list leaves out: other users' older jobs
    (`jobs.list`'s `others_left_out`) and finished jobs dropped (`finished_dropped`,
    `finished_kept_per_user`); None when nothing is."""
    parts = []
    left_out = answer.get("others_left_out") or 0
    if left_out:
        parts.append(f"{fmt_count(left_out)} older jobs of other users not listed")
    dropped = answer.get("finished_dropped") or 0
    if dropped:
        kept = answer.get("finished_kept_per_user")
        each = f"the newest {fmt_count(kept)} of each user are kept" if kept else "not all kept"
        parts.append(f"finished jobs: {each}; {fmt_count(dropped)} older ones dropped")
    return "; ".join(parts) or None


def jobs_table(jobs: Sequence[JobView], note: str | None = None) -> Sheet:
    """Jobs: id, owner (the OS user who declared it), purpose, state, progress (a bar with
    the percentage that takes the room left; "no total" for jobs that count without one),
    done and failed items, items/s, ETA; project, workers (leases held/allocated) and
    handler join when the width allows; `note` (what the list leaves out) under them."""
    sheet = Sheet(
        f"Jobs ({fmt_count(len(jobs))})",
        [
            Column("job"),
            Column("owner", free_text=True, min_free=5, optional=True),
            Column("purpose", free_text=True, min_free=8),
            Column("state"),
            bar_column("progress", bar_min=14, bar_max=32),
            Column("done", "right"),
            Column("failed", "right"),
            Column("items/s", "right"),
            Column("ETA", "right"),
            Column("project", free_text=True, optional=True),
            Column("workers", "right", optional=True),
            Column("handler", free_text=True, optional=True),
        ],
        empty="no jobs",
    )
    styles = {"running": "green", "stalled": "yellow", "failed": "red", "succeeded": "cyan"}
    short = unique_prefixes([j["job_id"] for j in jobs], strip="job-")
    for j in jobs:
        state = j["state"] + (f" ({j['reason']})" if j.get("reason") else "")
        rate = j.get("items_per_s")
        sheet.add(
            Cell(j["job_id"], short=short[j["job_id"]]),
            str(j.get("owner", "")),
            j["purpose"],
            Cell(Text(state, style=styles.get(j["state"], "")), plain=state),
            Cell(
                bar=partial(progress_bar, j) if j.get("total_items") else _no_total,
                plain=_progress_plain(j),
            ),
            _num(j["completed_items"]),
            _num(j["failed_items"], "red" if j["failed_items"] else ""),
            f"{rate:.1f}" if rate else "—",
            _duration(j.get("eta_s")),
            j["project"],
            f"{len(j.get('lease_ids', []))}/{j['workers']}",
            j["handler"],
        )
    if note:
        sheet.notes.append(Text(note, style="dim"))
    return sheet


_FRESH_STYLE = {"online": "green", "stale": "yellow", "offline": "red"}


def fleet_view(fleet: FleetView) -> View:
    """The fleet: computers with freshness, then their GPUs and leases."""
    computers = Sheet(
        f"Fleet of group {fleet.group}",
        [
            Column("computer", free_text=True),
            Column("freshness", free_text=True, min_free=9),
            Column("GPUs", "right"),
            Column("leases", "right"),
            Column("queue", "right"),
            Column("jobs", "right"),
            Column("telemetry", optional=True),
        ],
        empty=f"no computers in group {fleet.group} yet",
    )
    gpus = Sheet(
        "GPUs (MiB)",
        [
            Column("computer", free_text=True),
            Column("GPU"),
            Column("state"),
            Column("total", "right"),
            Column("available", "right"),
            Column("leases", "right"),
            Column("UUID", optional=True),
        ],
        empty="no GPUs reported",
    )
    leases = Sheet(
        "Leases",
        [
            Column("computer", free_text=True),
            Column("owner", free_text=True, min_free=5),
            Column("project", free_text=True, min_free=7),
            Column("session", free_text=True, min_free=7),
            Column("purpose", free_text=True, min_free=7),
            Column("MiB", "right"),
            Column("GPU"),
        ],
        empty="no leases",
    )
    for c in fleet.computers:
        fresh = c.freshness
        name = c.name
        text = fresh.text or fresh.state
        computers.add(
            name,
            Cell(Text(text, style=_FRESH_STYLE.get(fresh.state, "")), plain=text),
            _num(len(c.gpus)),
            _num(len(c.leases)),
            _num(len(c.queue)),
            _num(len(c.jobs)),
            c.telemetry_source or "?",
        )
        labels = _labels([(g.uuid, g.index) for g in c.gpus])
        for g in c.gpus:
            gpus.add(
                name,
                labels[g.uuid],
                g.state,
                _num(g.total_mib),
                _num(g.available_mib),
                _num(g.leases),
                Cell(short_uuid(g.uuid), plain=g.uuid),
            )
        for lease in c.leases:
            uuids = lease.gpu_uuids
            leases.add(
                name,
                lease.owner,
                lease.project,
                lease.session,
                lease.purpose,
                _num(lease.granted_mib),
                Cell(",".join(labels.get(u, short_uuid(u)) for u in uuids), plain=",".join(uuids)),
            )
    parts: list[Sheet | Text] = [computers]
    if computers.rows:
        parts += [gpus, leases]
    return View(*parts)


ROOM_NOTE = (
    "a view of the last reports: nothing is reserved, and the room may be gone when asked for"
)


def room_view(room: RoomView) -> View:
    """Where there is room (`GET /api/v1/fleet/room`'s answer): a row per GPU with room, the
    computers freshest first, each with its freshness and report age, the GPU's available
    MiB (less what its bookings hold now) and total MiB, until when (local time) before a
    booking takes the room ("—": no booking reported would), and the requests waiting on
    that computer; then `ROOM_NOTE`."""
    gpus = room.gpus
    mib = fmt_mib(room.mib)
    where = f"{gpus} GPUs of one computer" if gpus > 1 else "a GPU"
    sheet = Sheet(
        f"Room for {mib} MiB on {where} in group {room.group}",
        [
            Column("computer", free_text=True),
            Column("freshness", free_text=True, min_free=9),
            Column("report age", "right"),
            Column("GPU"),
            Column("available", "right"),
            Column("total", "right"),
            Column("until"),
            Column("waiting", "right", optional=True),
            Column("UUID", optional=True),
        ],
        empty=f"no computer has {mib} MiB available on {where} at its last report",
    )
    now_s = time.time()
    for c in room.computers:
        state = c.freshness.state
        age = c.freshness.age_s
        labels = _labels([(g.uuid, g.index) for g in c.gpus])
        for g in c.gpus:
            sheet.add(
                c.name,
                Cell(Text(state, style=_FRESH_STYLE.get(state, "")), plain=state),
                Cell(_duration(age), plain="—" if age is None else f"{age:.0f} s"),
                labels[g.uuid],
                _num(g.room_mib if g.room_mib or g.booked_mib else g.available_mib, "bold"),
                _num(g.total_mib),
                "—" if g.until_at is None else fmt_when(g.until_at.timestamp(), now_s),
                _num(c.waiting),
                Cell(short_uuid(g.uuid), plain=g.uuid),
            )
    parts: list[Sheet | Text] = [sheet]
    if sheet.rows:
        parts.append(Text(ROOM_NOTE, style="dim"))
    return View(*parts)
