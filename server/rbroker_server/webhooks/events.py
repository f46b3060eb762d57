"""Webhook events found in the stored fleet (the computers' rows: freshness from the server
clock, the redacted state of their last report) and queued as `webhook_deliveries` rows.

A watcher pass (`watch`) runs in the coordinator's webhook task, apart from the report
path: reports are written as before, never slowed or failed by webhooks, and the events a
report shows are queued at the next pass (`Settings.webhook_interval_s` later at most).
Each event has a key (`event_key`); the delivery table is unique by (webhook, key), so a
pass that runs again, or in another coordinator process on the same database, inserts
nothing new (`ON CONFLICT DO NOTHING`).

Events (`EVENTS`):
- `computer_offline`: its last report is older than `offline_after_s` or said its broker
  was stopping; key `computer_offline:<computer id>:<last seen, Unix s>`.
- `computer_back`: a computer whose `computer_offline` was queued reported again; key
  `computer_back:<computer id>:<the offline one's last seen>`.
- `job_finished` / `job_failed`: a job of its last report is `succeeded` or `cancelled` /
  `failed`; key `job_<…>:<computer id>:<job id>`.
- `booking_starts`: a live booking of its last report whose start passed (the computer's
  clock) and whose end did not; key `booking_starts:<computer id>:<booking id>`.
- `request_waiting`: a queued request waiting longer than the webhook's
  `waiting_after_s`; requests carry no id, so the key is a digest of what the request shows
  (owner, project, purpose, session, MiB, GPUs) and the 10-minute span it started in.
- `lease_idle`: a lease of its last report that its broker measured `idle` (never
  `active` or `unknown`) for at least the webhook's `idle_after_s` (its report's `idle_s`);
  once per idle episode, key `lease_idle:<computer id>:<lease id>:<span>`, where span
  numbers the episode's start (the report's `generated_at`, the computer's clock, minus
  `idle_s`) in spans of `idle_span_s(idle_after_s)` seconds. A known key of the neighbouring
  span (`Event.near`) is the same episode, its start seen across a span's edge (clock and
  send jitter); a new episode after the lease was active again starts at least
  `idle_after_s` (3 spans) after the one before, so it is always sent.

`request_waiting` and `lease_idle` are per owner and computer: of one owner's requests (or
idle leases) on a computer past the threshold, only the longest waiting (idle) one is an
event, its text saying how many more of theirs there are (`more_waiting`, `more_idle`), so
that one user's hundred waiting requests or tiny idle leases are one message, not a flood of
the group's channel and its queue (`MAX_QUEUED_PER_GROUP`).

Bodies carry what the group's fleet view shows (names, owners, projects, purposes, MiB, GPUs,
counts, times), never a command line, an environment or a process id.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from rbroker_server.db.engine import utcnow, write_transaction
from rbroker_server.db.tables import COMPUTERS, DELIVERIES, GROUPS, WEBHOOKS
from rbroker_server.fleet.bookings import fmt_mib
from rbroker_server.fleet.service import age_text, freshness, idle_text
from rbroker_server.settings import Settings

log = logging.getLogger(__name__)

EVENTS: Final = (
    "computer_offline",
    "computer_back",
    "request_waiting",
    "job_finished",
    "job_failed",
    "lease_idle",
    "booking_starts",
)
"""The event names a webhook may ask for."""

MAX_QUEUED_PER_GROUP: Final = 1000
"""Deliveries queued (not yet delivered or given up) per group at most; further events
are dropped, counted and logged (once a minute)."""

_WAIT_SPAN_S: Final = 600
_IDLE_SPAN_S: Final = 600.0
_FINISHED = {"succeeded": "job_finished", "cancelled": "job_finished", "failed": "job_failed"}
_LIVE_BOOKINGS = ("booked", "held", "claimed")


@dataclass(frozen=True, slots=True)
class Event:
    """One event of one computer: its name, key, time and JSON body (a dict)."""

    name: str
    key: str
    computer_id: str
    body: dict[str, Any]
    near: tuple[str, ...] = ()
    """Other keys of the same event (a `lease_idle` episode's start in a neighbouring span):
    one of them already stored means it is not new."""


@dataclass(slots=True)
class Watched:
    """What one pass did: rows queued, rows recorded as skipped, events dropped per group
    name (over `MAX_QUEUED_PER_GROUP`)."""

    queued: int = 0
    skipped: int = 0
    dropped: dict[str, int] = field(default_factory=dict)


def slack_escape(text: str) -> str:
    """`text` with Slack's three control characters (`&`, `<`, `>`) escaped, so a name
    cannot make a link or a mention."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _iso(at: datetime | float | None) -> str | None:
    if at is None:
        return None
    if isinstance(at, float | int):
        at = datetime.fromtimestamp(at, UTC)
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _body(
    name: str, group: str, row: Any, at: datetime | float, text: str, **fields: Any
) -> dict[str, Any]:
    return {
        "event": name,
        "group": group,
        "computer": row.name,
        "computer_id": row.id,
        "at": _iso(at),
        "text": text,
        **fields,
    }


def _who(item: dict[str, Any]) -> str:
    owner = item.get("owner") or "someone"
    project = item.get("project")
    return f"{owner} ({project})" if project else owner


def idle_span_s(idle_after_s: float) -> float:
    """The span (seconds) a `lease_idle` episode's start is rounded to in its key: 10 min,
    or a third of the webhook's `idle_after_s` when that is shorter, so that two episodes
    of one lease (at least `idle_after_s` apart) never fall in neighbouring spans."""
    return min(_IDLE_SPAN_S, idle_after_s / 3)


def _lease_idle(
    row: Any, group: str, hook: Any, state: dict[str, Any], lease: dict[str, Any], others: int = 0
) -> Event | None:
    """The `lease_idle` event of `lease` (a lease of `row`'s stored report, as JSON) for
    `hook`, or None: not `idle`, or idle less than `hook.idle_after_s`; `others`: how many
    more leases of the same owner on that computer are idle past the threshold (said in
    the text and `more_idle`, not sent one by one)."""
    idle_s = lease.get("idle_s")
    if lease.get("idle_state") != "idle" or idle_s is None or idle_s < hook.idle_after_s:
        return None
    seen = row.last_seen_at
    made = row.generated_at or seen
    if seen is None or made is None:
        return None
    span_s = idle_span_s(hook.idle_after_s)
    n = int((made.timestamp() - idle_s) // span_s)
    cid, lid = row.id, lease["lease_id"]
    key = f"lease_idle:{cid}:{lid}:{n}"
    near = (f"lease_idle:{cid}:{lid}:{n - 1}", f"lease_idle:{cid}:{lid}:{n + 1}")
    index = {g["uuid"]: g["index"] for g in state.get("gpus", [])}
    uuids = list(lease.get("gpu_uuids", []))
    gpus = [index[u] for u in uuids if u in index]
    owner = slack_escape(lease.get("owner") or "someone")
    about = [f"project {slack_escape(lease['project'])}"] if lease.get("project") else []
    if lease.get("purpose"):
        about.append(f"'{slack_escape(lease['purpose'])}'")
    mib = lease["granted_mib"]
    on = f" on GPU{'s' if len(gpus) != 1 else ''} {', '.join(map(str, gpus))}" if gpus else ""
    text = (
        f":zzz: {owner}'s lease on {slack_escape(row.name)}"
        + (f" ({', '.join(about)})" if about else "")
        + f" {idle_text(idle_s)}, {fmt_mib(mib)} MiB{on}"
        + (f" (and {others} more of theirs idle)" if others else "")
    )
    fields = {k: lease.get(k) for k in ("lease_id", "owner", "project", "purpose")}
    fields.update(
        granted_mib=mib,
        gpus=gpus,
        gpu_uuids=uuids,
        idle_s=round(idle_s, 1),
        idle_since=_iso(seen.timestamp() - idle_s),
        more_idle=others,
    )
    body = _body("lease_idle", group, row, seen, text, lease=fields)
    return Event("lease_idle", key, cid, body, near)


def computer_events(
    row: Any,
    group: str,
    hook: Any,
    settings: Settings,
    now: datetime,
    offline_seen: float | None = None,
) -> list[Event]:
    """The events `row` (a `computers` row) shows now for `hook` (a `webhooks` row), all
    kinds, whatever `hook.events` asks for; `offline_seen`: the last seen time (Unix s) of
    this computer's latest queued `computer_offline` for the hook (None: none)."""
    state = row.state or {}
    cid, name = row.id, slack_escape(row.name)
    g = slack_escape(group)
    out: list[Event] = []
    fresh = freshness(row.last_seen_at, now, settings, bool(state.get("stopping")))
    seen = row.last_seen_at.timestamp() if row.last_seen_at is not None else None
    if fresh.state == "offline" and seen is not None:
        gone = seen if state.get("stopping") else seen + settings.offline_after_s
        text = f":red_circle: {name} ({g}) is offline: {fresh.text}"
        body = _body(
            "computer_offline",
            group,
            row,
            gone,
            text,
            last_seen_at=_iso(seen),
            freshness=fresh.text,
        )
        out.append(Event("computer_offline", f"computer_offline:{cid}:{seen:.6f}", cid, body))
    if (
        fresh.state != "offline"
        and seen is not None
        and offline_seen is not None
        and seen > offline_seen
    ):
        away = age_text(seen - offline_seen)
        text = f":large_green_circle: {name} ({g}) is back after {away} without reports"
        body = _body(
            "computer_back",
            group,
            row,
            seen,
            text,
            last_seen_at=_iso(seen),
            offline_since=_iso(offline_seen),
        )
        out.append(Event("computer_back", f"computer_back:{cid}:{offline_seen:.6f}", cid, body))
    if fresh.state == "offline":
        return out  # what an offline computer last said is not news
    at = row.last_seen_at or now
    for job in state.get("jobs", []):
        kind = _FINISHED.get(job.get("state", ""))
        if kind is None:
            continue
        label = slack_escape(job.get("purpose") or job["job_id"])
        done, failed, total = (
            job.get("completed_items", 0),
            job.get("failed_items", 0),
            job.get("total_items"),
        )
        counts = f"{done} done, {failed} failed" + (f" of {total}" if total is not None else "")
        icon = ":x:" if kind == "job_failed" else ":white_check_mark:"
        text = f"{icon} job {label} on {name} ({g}) {job['state']}: {counts}"
        fields = {
            k: job.get(k)
            for k in (
                "job_id",
                "project",
                "purpose",
                "state",
                "total_items",
                "completed_items",
                "failed_items",
            )
        }
        body = _body(kind, group, row, at, text, job=fields)
        out.append(Event(kind, f"{kind}:{cid}:{job['job_id']}", cid, body))
    now_s = now.timestamp()
    for b in state.get("bookings", []):
        if b.get("state") not in _LIVE_BOOKINGS or not b["start_at"] <= now_s < b["end_at"]:
            continue
        gpus = len(b.get("gpu_uuids", []))
        text = (
            f":calendar: booking of {slack_escape(_who(b))} starts on {name} ({g}): "
            f"{b['mib']} MiB on {gpus} GPU{'s' if gpus != 1 else ''} until {_iso(b['end_at'])}"
        )
        fields = {
            k: b.get(k) for k in ("booking_id", "owner", "project", "purpose", "mib", "state")
        }
        fields.update(gpus=gpus, start_at=_iso(b["start_at"]), end_at=_iso(b["end_at"]))
        body = _body("booking_starts", group, row, b["start_at"], text, booking=fields)
        out.append(Event("booking_starts", f"booking_starts:{cid}:{b['booking_id']}", cid, body))
    since_report = max(0.0, (now - at).total_seconds())
    longest: dict[str, tuple[float, dict[str, Any]]] = {}  # owner → their longest wait
    more: dict[str, int] = {}  # owner → how many more of theirs waited past the threshold
    for q in state.get("queue", []):
        waited = q.get("waiting_s", 0.0) + since_report
        if waited < hook.waiting_after_s:
            continue
        owner = str(q.get("owner", ""))
        if owner in longest:
            more[owner] = more.get(owner, 0) + 1
            if waited <= longest[owner][0]:
                continue
        longest[owner] = (waited, q)
    for owner, (waited, q) in longest.items():
        others = more.get(owner, 0)
        started = now_s - waited
        shown = [
            str(q.get(k, "")) for k in ("owner", "project", "purpose", "session", "mib", "gpus")
        ]
        digest = hashlib.sha256("\x1f".join(shown).encode()).hexdigest()[:16]
        key = f"request_waiting:{cid}:{digest}:{int(started // _WAIT_SPAN_S)}"
        gpus = q.get("gpus", 1)
        text = (
            f":hourglass: {slack_escape(_who(q))} has waited {age_text(waited)} on {name} "
            f"({g}) for {q['mib']} MiB on {gpus} GPU{'s' if gpus != 1 else ''}"
        )
        if q.get("reason"):
            text += f": {slack_escape(q['reason'])}"
        if others:
            text += f" (and {others} more of theirs waiting)"
        fields = {k: q.get(k) for k in ("owner", "project", "purpose", "mib", "gpus", "reason")}
        fields.update(waiting_s=round(waited, 1), more_waiting=others)
        body = _body("request_waiting", group, row, now, text, request=fields)
        out.append(Event("request_waiting", key, cid, body))
    idlest: dict[str, tuple[float, dict[str, Any]]] = {}  # owner → their longest idle lease
    more_idle: dict[str, int] = {}
    for lease in state.get("leases", []):
        idle_s = lease.get("idle_s")
        if lease.get("idle_state") != "idle" or idle_s is None or idle_s < hook.idle_after_s:
            continue
        owner = str(lease.get("owner", ""))
        if owner in idlest:
            more_idle[owner] = more_idle.get(owner, 0) + 1
            if idle_s <= idlest[owner][0]:
                continue
        idlest[owner] = (idle_s, lease)
    for owner, (_, lease) in idlest.items():
        idle = _lease_idle(row, group, hook, state, lease, more_idle.get(owner, 0))
        if idle is not None:
            out.append(idle)
    return out


def _insert(dialect: str) -> Any:
    ins = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return ins(DELIVERIES).on_conflict_do_nothing(index_elements=["webhook_id", "event_key"])


def _rows(hook: Any, events: Iterable[Event], state: str, now: datetime) -> list[dict[str, Any]]:
    return [
        {
            "webhook_id": hook.id,
            "event_key": e.key,
            "event": e.name,
            "computer_id": e.computer_id,
            "body": json.dumps(e.body, separators=(",", ":"), ensure_ascii=False),
            "state": state,
            "attempts": 0,
            "created_at": now,
            "next_at": now,
            "last_error": "",
        }
        for e in events
    ]


def _latest_offline(conn: Connection, hook_ids: list[int]) -> dict[tuple[int, str], float]:
    """(webhook id, computer id) → last seen (Unix s) of its latest sent-or-queued
    `computer_offline`."""
    rows = conn.execute(
        sa.select(DELIVERIES.c.webhook_id, DELIVERIES.c.computer_id, DELIVERIES.c.event_key).where(
            DELIVERIES.c.webhook_id.in_(hook_ids),
            DELIVERIES.c.event == "computer_offline",
            DELIVERIES.c.state != "skipped",
        )
    ).all()
    latest: dict[tuple[int, str], float] = {}
    for r in rows:
        seen = float(r.event_key.rsplit(":", 1)[1])
        k = (r.webhook_id, r.computer_id)
        latest[k] = max(seen, latest.get(k, seen))
    return latest


def candidates(conn: Connection, hook: Any, settings: Settings, now: datetime) -> list[Event]:
    """Every event `hook` asks for that its group's live computers show now."""
    wanted = set(hook.events.split(","))
    group = conn.execute(sa.select(GROUPS.c.name).where(GROUPS.c.id == hook.group_id)).scalar_one()
    offline = _latest_offline(conn, [hook.id])
    rows = conn.execute(
        sa.select(COMPUTERS).where(
            COMPUTERS.c.group_id == hook.group_id, COMPUTERS.c.revoked_at.is_(None)
        )
    ).all()
    found: list[Event] = []
    for row in rows:
        events = computer_events(row, group, hook, settings, now, offline.get((hook.id, row.id)))
        found.extend(e for e in events if e.name in wanted)
    return found


def record_skipped(conn: Connection, hook: Any, settings: Settings, now: datetime) -> int:
    """Record what `hook`'s group shows now as `skipped` (never sent): a new webhook
    announces what happens from then on, not what was already there. Rows recorded."""
    events = candidates(conn, hook, settings, now)
    if events:
        conn.execute(_insert(conn.dialect.name), _rows(hook, events, "skipped", now))
    return len(events)


def _known(conn: Connection, hook_id: int, keys: list[str]) -> set[str]:
    """Those of `keys` stored for webhook `hook_id` (any state), asked 1 000 at a time."""
    known: set[str] = set()
    for i in range(0, len(keys), 1000):
        known.update(
            conn.execute(
                sa.select(DELIVERIES.c.event_key).where(
                    DELIVERIES.c.webhook_id == hook_id,
                    DELIVERIES.c.event_key.in_(keys[i : i + 1000]),
                )
            ).scalars()
        )
    return known


def watch(
    engine: Engine,
    settings: Settings,
    now: datetime | None = None,
    max_queued: int = MAX_QUEUED_PER_GROUP,
) -> Watched:
    """One pass: queue the new events of every webhook (at most `max_queued` queued per
    group; the rest dropped and counted in the result).

    Raises:
        sqlalchemy.exc.SQLAlchemyError: a database fault (nothing of the pass is kept).
    """
    now = now or utcnow()
    done = Watched()
    found: list[tuple[Any, list[Event]]] = []
    with engine.connect() as conn:  # read outside the write lock: report writes go on
        for hook in conn.execute(sa.select(WEBHOOKS).order_by(WEBHOOKS.c.id)).all():
            events = candidates(conn, hook, settings, now)
            if not events:
                continue
            known = _known(conn, hook.id, [k for e in events for k in (e.key, *e.near)])
            new = [e for e in events if e.key not in known and known.isdisjoint(e.near)]
            if new:
                found.append((hook, new))
    if not found:
        return done
    with write_transaction(engine) as conn:
        for hook, new in found:
            room = max(0, max_queued - queued_in_group(conn, hook.group_id))
            if len(new) > room:
                group = conn.execute(
                    sa.select(GROUPS.c.name).where(GROUPS.c.id == hook.group_id)
                ).scalar_one()
                done.dropped[group] = done.dropped.get(group, 0) + len(new) - room
                new = new[:room]
            if new:
                rows = _rows(hook, new, "queued", now)
                insert = _insert(conn.dialect.name).returning(DELIVERIES.c.id)
                done.queued += len(conn.execute(insert, rows).all())
    return done


def queued_in_group(conn: Connection, group_id: int) -> int:
    """Deliveries still queued for the webhooks of group `group_id`."""
    return int(
        conn.execute(
            sa.select(sa.func.count())
            .select_from(DELIVERIES.join(WEBHOOKS, WEBHOOKS.c.id == DELIVERIES.c.webhook_id))
            .where(WEBHOOKS.c.group_id == group_id, DELIVERIES.c.state == "queued")
        ).scalar_one()
    )


class DropLog:
    """Logs dropped events at most once per `every_s`, with the counts since the last line."""

    def __init__(self, every_s: float = 60.0, cap: int = MAX_QUEUED_PER_GROUP) -> None:
        self.every_s = every_s
        self.cap = cap
        self.pending: dict[str, int] = {}
        self.total: dict[str, int] = {}
        self._last = float("-inf")

    def add(self, dropped: dict[str, int]) -> None:
        for group, n in dropped.items():
            self.pending[group] = self.pending.get(group, 0) + n
            self.total[group] = self.total.get(group, 0) + n
        now = time.monotonic()
        if self.pending and now - self._last >= self.every_s:
            self._last = now
            log.warning(
                "webhook events dropped (a group's queue is full, %d deliveries): %s",
                self.cap,
                ", ".join(f"{g}: {n}" for g, n in sorted(self.pending.items())),
            )
            self.pending = {}


def prune(conn: Connection, now: datetime, keep_s: float) -> int:
    """Delete delivered, failed and skipped rows created more than `keep_s` ago."""
    return conn.execute(
        sa.delete(DELIVERIES).where(
            DELIVERIES.c.state != "queued",
            DELIVERIES.c.created_at < now - timedelta(seconds=keep_s),
        )
    ).rowcount
