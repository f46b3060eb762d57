"""Fleet reads: rows to wire views, freshness from the server clock, GPU states."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from rbroker_protocol.fleet import (
    ComputerView,
    Flag,
    FleetGpuView,
    FleetView,
    Freshness,
    GpuState,
    HistoryPointView,
    HistoryView,
    RoomComputerView,
    RoomGpuView,
    RoomView,
)
from rbroker_server.api.query import QueryInvalid, QueryRules
from rbroker_server.auth.caller import Scope
from rbroker_server.db.engine import utcnow
from rbroker_server.db.tables import COMPUTERS, GROUPS, HISTORY
from rbroker_server.fleet import bookings as booked
from rbroker_server.settings import Settings

ROOM_MIB_MAX = 2**40
"""The largest `mib` a room query takes: a report's largest MiB figure (`GpuReport`)."""
ROOM_GPUS_MAX = 64
"""The most GPUs a room query takes: a request's most (`QueueEntry.gpus`)."""
ROOM_QUERY_NAMES = ("mib", "gpus")
FLEET_LIMIT_MAX = 1000
"""The most computers one page of `GET /api/v1/fleet` takes (`limit`)."""
FLEET_QUERY_NAMES = ("limit", "after")
_FRESHEST = {"online": 0, "stale": 1, "offline": 2}


class ComputerNotFound(Exception):
    """No such computer in the caller's group (other groups' computers look the same)."""


class RoomQueryInvalid(QueryInvalid):
    """A room query the coordinator does not take; the message says why in one line."""


_ROOM_RULES = QueryRules(ROOM_QUERY_NAMES, RoomQueryInvalid)


class FleetQueryInvalid(QueryInvalid):
    """A fleet query the coordinator does not take; the message says why in one line."""


_FLEET_RULES = QueryRules(FLEET_QUERY_NAMES, FleetQueryInvalid)


@dataclass(frozen=True)
class FleetPage:
    """At most `limit` computers (None: all) after computer `after` (None: from the first)
    in the fleet's order (name, then id)."""

    limit: int | None = None
    after: str | None = None


def parse_fleet_query(params: Mapping[str, list[str]]) -> FleetPage:
    """Check a fleet query given as name → the values sent.

    Raises:
        FleetQueryInvalid: an unknown or repeated parameter, `limit` not a whole number from
            1 to `FLEET_LIMIT_MAX`, an empty `after` or one longer than 64 characters.
    """
    _FLEET_RULES.check_names(params)
    limit = _FLEET_RULES.whole(params, "limit", FLEET_LIMIT_MAX, "computers in one answer")
    after = params.get("after", [None])[0]
    if after is not None and not 0 < len(after) <= 64:
        raise FleetQueryInvalid(
            "after must be a computer id (the previous answer's next_after), "
            f"not {_FLEET_RULES.shown(after)}"
        )
    return FleetPage(limit=limit, after=after)


@dataclass(frozen=True)
class RoomQuery:
    """`mib` MiB available on each of `gpus` GPUs of one computer."""

    mib: int
    gpus: int = 1


def parse_room_query(params: Mapping[str, list[str]]) -> RoomQuery:
    """Check a room query given as name → the values sent (a name sent twice has two).

    Raises:
        RoomQueryInvalid: `mib` missing, an unknown or repeated parameter, `mib` not a whole
            number from 1 to `ROOM_MIB_MAX`, `gpus` not one from 1 to `ROOM_GPUS_MAX`.
    """
    _ROOM_RULES.check_names(params)
    mib = _ROOM_RULES.whole(params, "mib", ROOM_MIB_MAX, "MiB on each GPU")
    if mib is None:
        raise RoomQueryInvalid("mib is missing: the MiB to find room for, e.g. ?mib=20480")
    gpus = _ROOM_RULES.whole(params, "gpus", ROOM_GPUS_MAX, "GPUs of one computer")
    return RoomQuery(mib=mib, gpus=gpus or 1)


def age_text(seconds: float) -> str:
    """`42 s`, `3 min`, `5 h`, `2 d`."""
    if seconds < 60:
        return f"{int(seconds)} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h"
    return f"{int(seconds // 86400)} d"


def idle_text(seconds: float) -> str:
    """How long a lease has been idle: `idle 40 s`, `idle 25 min`, `idle 2 h 10 min`,
    `idle 3 d 4 h`."""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"idle {s} s"
    if s < 3600:
        return f"idle {s // 60} min"
    if s < 86400:
        return f"idle {s // 3600} h {s % 3600 // 60} min"
    return f"idle {s // 86400} d {s % 86400 // 3600} h"


def freshness(
    last_seen_at: datetime | None, now: datetime, settings: Settings, stopped: bool = False
) -> Freshness:
    """Freshness of a computer from the server receive time of its last applied report;
    `offline` at once when that report said its broker was stopping (`stopped`)."""
    if last_seen_at is None:
        return Freshness(state="offline", last_seen_at=None, age_s=None, text="never reported")
    age = max(0.0, (now - last_seen_at).total_seconds())
    if stopped:
        text = f"offline (broker stopped); last known, {age_text(age)} ago"
        return Freshness(state="offline", last_seen_at=last_seen_at, age_s=age, text=text)
    if age <= settings.stale_after_s:
        return Freshness(state="online", last_seen_at=last_seen_at, age_s=age, text="online")
    if age <= settings.offline_after_s:
        text = f"last known, {age_text(age)} ago"
        return Freshness(state="stale", last_seen_at=last_seen_at, age_s=age, text=text)
    text = f"offline; last known, {age_text(age)} ago"
    return Freshness(state="offline", last_seen_at=last_seen_at, age_s=age, text=text)


def gpu_state(gpu: dict[str, Any], leases_on_gpu: int) -> GpuState:
    """`lost`, `telemetry_unavailable`, `full` (nothing available), `busy` (leases or
    outstanding grants), else `free`. Independent of the computer's freshness."""
    telemetry = gpu.get("telemetry")
    if telemetry == "lost":
        return "lost"
    available = gpu.get("available_mib")
    if telemetry in ("unavailable", "unknown_capacity") or available is None:
        return "telemetry_unavailable"
    if available <= 0:
        return "full"
    if leases_on_gpu or (gpu.get("outstanding_mib") or 0) or (gpu.get("leased_in_use_mib") or 0):
        return "busy"
    return "free"


def _computer_view(row: Any, now: datetime, settings: Settings, lists: bool = True) -> ComputerView:
    """The wire view of a computer's row; without `lists`, its `leases`, `queue`, `jobs` and
    `bookings` are left empty (not parsed: a summary counts them in the row's state itself).
    Each GPU's `booked_mib` is what the stored bookings protect on it at `now`."""
    state = row.state or {}
    leases = state.get("leases", [])
    per_gpu: dict[str, int] = {}
    for lease in leases:
        for uuid in lease.get("gpu_uuids", []):
            per_gpu[uuid] = per_gpu.get(uuid, 0) + 1
    bookings = state.get("bookings", [])
    on_gpu = booked.on_gpus(bookings)
    now_s = now.timestamp()
    gpus = [
        FleetGpuView(
            **g,
            state=gpu_state(g, per_gpu.get(g["uuid"], 0)),
            leases=per_gpu.get(g["uuid"], 0),
            booked_mib=booked.booked_at(on_gpu.get(g["uuid"], ()), now_s),
        )
        for g in state.get("gpus", [])
    ]
    skew = row.clock_skew_s
    warning = None
    if skew is not None and abs(skew) > settings.clock_skew_warn_s:
        side = "ahead of" if skew > 0 else "behind"
        warning = f"computer clock is {age_text(abs(skew))} {side} the server's"
    return ComputerView(
        id=row.id,
        name=row.name,
        reported_name=row.reported_name,
        freshness=freshness(row.last_seen_at, now, settings, bool(state.get("stopping"))),
        clock_skew_s=skew,
        clock_warning=warning,
        broker_version=row.broker_version,
        telemetry_source=row.telemetry_source,
        enrolled_at=row.enrolled_at,
        revoked=row.revoked_at is not None,
        flagged=row.flagged,
        flagged_at=row.flagged_at,
        flags=[Flag(**f) for f in row.flags or []],
        run_id=row.run_id,
        seq=row.seq,
        reports_applied=row.reports_applied,
        gpus=gpus,
        leases=leases if lists else [],
        queue=state.get("queue", []) if lists else [],
        jobs=state.get("jobs", []) if lists else [],
        left_out=state.get("left_out", {}),
        bookings=bookings if lists else [],
        bookings_left_out=state.get("bookings_left_out", 0),
    )


def fleet(
    engine: Engine, settings: Settings, scope: Scope, page: FleetPage | None = None
) -> FleetView:
    """The caller's group and its live computers, by name (then id); with `page`, at most
    `page.limit` of them after computer `page.after`, and `next_after` the id to ask the
    next page after (None on the last).

    Raises:
        FleetQueryInvalid: `page.after` is no computer of the caller's group (revoked ones
            and other groups' alike).
    """
    now = utcnow()
    page = page or FleetPage()
    group, rows = _group_rows(engine, scope, page)
    more = page.limit is not None and len(rows) > page.limit
    if more:
        rows = rows[: page.limit]
    return FleetView(
        group=group,
        generated_at=now,
        stale_after_s=settings.stale_after_s,
        offline_after_s=settings.offline_after_s,
        computers=[_computer_view(r, now, settings) for r in rows],
        next_after=str(rows[-1].id) if more else None,
    )


def room(engine: Engine, settings: Settings, scope: Scope, query: RoomQuery) -> RoomView:
    """The caller's group's computers where `query.mib` MiB were free on each of
    `query.gpus` of their GPUs at their last report (a GPU counts only with telemetry `ok`:
    the only state its broker admits on), freshest first: online, stale, then offline, by
    report age within each, then by name. A GPU's room is its `available_mib` less what
    its computer's live bookings protect on it now (`booked_mib`); `until_at` is the start
    of the first booking to come that would leave less than `query.mib` (the coordinator's
    clock; None: none reported would). A view, never a placement or a reservation."""
    now = utcnow()
    now_s = now.timestamp()
    group, rows = _group_rows(engine, scope)
    found = []
    for row in rows:
        state = row.state or {}
        on_gpu = booked.on_gpus(state.get("bookings", []))
        fits = []
        for g in state.get("gpus", []):
            available = g.get("available_mib")
            if g.get("telemetry", "ok") != "ok" or available is None:
                continue
            mine = on_gpu.get(g["uuid"], [])
            booked_mib = booked.booked_at(mine, now_s)
            room_mib = max(0, available - booked_mib)
            if room_mib < query.mib:
                continue
            until = booked.to_datetime(booked.room_until(mine, available, query.mib, now_s))
            fits.append(
                RoomGpuView(
                    uuid=g["uuid"],
                    index=g.get("index", 0),
                    name=g.get("name", ""),
                    available_mib=available,
                    total_mib=g.get("total_mib"),
                    booked_mib=booked_mib,
                    room_mib=room_mib,
                    until_at=until,
                    text=booked.room_text(query.mib, until, now),
                )
            )
        if len(fits) < query.gpus:
            continue
        fits.sort(key=lambda g: (-g.room_mib, g.index, g.uuid))
        found.append(
            RoomComputerView(
                id=row.id,
                name=row.name,
                freshness=freshness(row.last_seen_at, now, settings, bool(state.get("stopping"))),
                gpus=fits,
                waiting=len(state.get("queue", []))
                + int(state.get("left_out", {}).get("queue", 0)),
                until_at=_until_on(fits, query.gpus),
            )
        )
    found.sort(
        key=lambda c: (
            _FRESHEST[c.freshness.state],
            c.freshness.age_s if c.freshness.age_s is not None else float("inf"),
            c.name,
        )
    )
    return RoomView(group=group, generated_at=now, mib=query.mib, gpus=query.gpus, computers=found)


def _until_on(fits: list[RoomGpuView], gpus: int) -> datetime | None:
    """Until when `gpus` of `fits` keep room: the `gpus`-th latest `until_at` (None, no
    booking takes it, counts as the latest)."""
    latest = sorted(
        fits, key=lambda g: (0.0, 0.0) if g.until_at is None else (1.0, -g.until_at.timestamp())
    )
    return latest[gpus - 1].until_at


def fleet_summary(
    engine: Engine, settings: Settings, scope: Scope
) -> tuple[FleetView, list[dict[str, Any]]]:
    """The caller's group as `fleet` gives it but without the computers' lists (their
    `leases`, `queue` and `jobs` empty), and each computer's stored state (the report's
    fields as JSON: `leases`, `queue`, `jobs`, `left_out`…) in the same order, to count."""
    now = utcnow()
    group, rows = _group_rows(engine, scope)
    view = FleetView(
        group=group,
        generated_at=now,
        stale_after_s=settings.stale_after_s,
        offline_after_s=settings.offline_after_s,
        computers=[_computer_view(r, now, settings, lists=False) for r in rows],
    )
    return view, [r.state or {} for r in rows]


def _group_rows(
    engine: Engine, scope: Scope, page: FleetPage | None = None
) -> tuple[str, list[Any]]:
    """The group's name and its live computers' rows by (name, id); with `page`, those after
    `page.after` and at most `page.limit` + 1 (one more tells whether a next page exists).

    Raises:
        FleetQueryInvalid: `page.after` is no live computer of the group.
    """
    live = (COMPUTERS.c.group_id == scope.group_id, COMPUTERS.c.revoked_at.is_(None))
    query = sa.select(COMPUTERS).where(*live).order_by(COMPUTERS.c.name, COMPUTERS.c.id)
    with engine.connect() as conn:
        group = conn.execute(sa.select(GROUPS.c.name).where(GROUPS.c.id == scope.group_id)).one()
        if page is not None and page.after is not None:
            last = conn.execute(
                sa.select(COMPUTERS.c.name, COMPUTERS.c.id).where(
                    *live, COMPUTERS.c.id == page.after
                )
            ).first()
            if last is None:
                raise FleetQueryInvalid(
                    f"after: no computer {_FLEET_RULES.shown(page.after)} in this group"
                )
            query = query.where(
                sa.or_(
                    COMPUTERS.c.name > last.name,
                    sa.and_(COMPUTERS.c.name == last.name, COMPUTERS.c.id > last.id),
                )
            )
        if page is not None and page.limit is not None:
            query = query.limit(page.limit + 1)
        rows = conn.execute(query).all()
    return str(group.name), list(rows)


def _row(conn: sa.Connection, scope: Scope, computer_id: str) -> Any:
    row = conn.execute(
        sa.select(COMPUTERS).where(
            COMPUTERS.c.id == computer_id, COMPUTERS.c.group_id == scope.group_id
        )
    ).first()
    if row is None:
        raise ComputerNotFound(computer_id)
    return row


def computer(engine: Engine, settings: Settings, scope: Scope, computer_id: str) -> ComputerView:
    """One computer of the caller's group.

    Raises:
        ComputerNotFound: unknown, or in another group.
    """
    with engine.connect() as conn:
        row = _row(conn, scope, computer_id)
    return _computer_view(row, utcnow(), settings)


def history(engine: Engine, settings: Settings, scope: Scope, computer_id: str) -> HistoryView:
    """The computer's history points inside the window, oldest first.

    Raises:
        ComputerNotFound: unknown, or in another group.
    """
    since = utcnow() - timedelta(seconds=settings.history_window_s)
    with engine.connect() as conn:
        _row(conn, scope, computer_id)
        points = conn.execute(
            sa.select(HISTORY.c.at, HISTORY.c.data)
            .where(HISTORY.c.computer_id == computer_id, HISTORY.c.at >= since)
            .order_by(HISTORY.c.at)
        ).all()
    return HistoryView(
        computer_id=computer_id,
        window_s=settings.history_window_s,
        step_s=settings.history_step_s,
        points=[
            HistoryPointView(
                at=p.at,
                gpus=p.data.get("gpus", []),
                leases=p.data.get("leases", 0),
                queue=p.data.get("queue", 0),
                jobs=p.data.get("jobs", []),
            )
            for p in points
        ],
    )
