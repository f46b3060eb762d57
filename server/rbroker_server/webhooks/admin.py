"""Administrative operations on webhooks (`rbroker-server webhook add|list|remove`); an
add or a remove writes its audit entry in its transaction."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Final
from urllib.parse import urlsplit

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from rbroker_server.admin import audit
from rbroker_server.admin.errors import AdminError
from rbroker_server.db.engine import utcnow, write_transaction
from rbroker_server.db.tables import DELIVERIES, GROUPS, WEBHOOKS
from rbroker_server.settings import Settings
from rbroker_server.webhooks import events as ev

SECRET_PREFIX: Final = "rbw_"
WAITING_AFTER_S: Final = 600.0
"""`--waiting-after`'s default: a request waiting 10 min is news."""
IDLE_AFTER_S: Final = 1800.0
"""`--idle-after`'s default: a lease its broker measured idle for 30 min is news
(`lease_idle`; the broker's own `idle_after_s` is the least that can be told)."""
THRESHOLD_MAX_S: Final = 30 * 86400.0
URL_MAX: Final = 2048


@dataclass(frozen=True, slots=True)
class NewWebhook:
    """A webhook added just now; `secret` is shown once (it stays stored to sign with)."""

    id: int
    group: str
    url: str
    events: tuple[str, ...]
    secret: str


@dataclass(frozen=True, slots=True)
class WebhookInfo:
    """A webhook as `webhook list` shows it (never its secret), with its deliveries'
    counts by state."""

    id: int
    group: str
    url: str
    events: tuple[str, ...]
    waiting_after_s: float
    idle_after_s: float
    created_at: datetime
    queued: int
    delivered: int
    failed: int


def check_url(url: str) -> str:
    """`url` if it is an http(s) URL with a host, at most `URL_MAX` characters.

    Raises:
        AdminError: it is not.
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port past 65535 or not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise AdminError(
            f"a webhook URL is http:// or https:// with a host (and a port up to 65535), "
            f"not {url!r}"
        )
    if len(url) > URL_MAX or not url.isprintable() or " " in url:
        raise AdminError(f"a webhook URL is at most {URL_MAX} printable characters, no spaces")
    return url


def check_events(text: str) -> tuple[str, ...]:
    """The event names of a comma-separated list, in `events.EVENTS` order.

    Raises:
        AdminError: empty, or a name not in `events.EVENTS`.
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = sorted(set(names) - set(ev.EVENTS))
    if unknown or not names:
        raise AdminError(
            f"unknown event {', '.join(unknown)!s}; events are {','.join(ev.EVENTS)}"
            if unknown
            else f"name at least one event: {','.join(ev.EVENTS)}"
        )
    return tuple(n for n in ev.EVENTS if n in names)


def _check_threshold(name: str, seconds: float) -> float:
    if not 0 < seconds <= THRESHOLD_MAX_S:
        raise AdminError(f"{name} is from 1 second to 30 days, not {seconds:g} s")
    return seconds


def add_webhook(
    engine: Engine,
    settings: Settings,
    group: str,
    url: str,
    events: str,
    waiting_after_s: float = WAITING_AFTER_S,
    idle_after_s: float = IDLE_AFTER_S,
    actor: str | None = None,
) -> NewWebhook:
    """Add a webhook to `group`. What the group shows already (computers offline, jobs
    finished, bookings started, requests waiting, leases idle) is recorded as skipped: only what
    happens from now on is sent.

    Raises:
        AdminError: no such group, a URL that is not http(s), an unknown event, a
            threshold out of 1 s to 30 days.
    """
    url = check_url(url)
    names = check_events(events)
    _check_threshold("--waiting-after", waiting_after_s)
    _check_threshold("--idle-after", idle_after_s)
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    now = utcnow()
    with write_transaction(engine) as conn:
        gid = conn.execute(sa.select(GROUPS.c.id).where(GROUPS.c.name == group)).scalar()
        if gid is None:
            raise AdminError(f"no group named {group!r}")
        hid = conn.execute(
            sa.insert(WEBHOOKS)
            .values(
                group_id=gid,
                url=url,
                events=",".join(names),
                secret=secret,
                waiting_after_s=waiting_after_s,
                idle_after_s=idle_after_s,
                created_at=now,
            )
            .returning(WEBHOOKS.c.id)
        ).scalar_one()
        hook = conn.execute(sa.select(WEBHOOKS).where(WEBHOOKS.c.id == hid)).one()
        ev.record_skipped(conn, hook, settings, now)
        audit.record(
            conn,
            actor=actor or audit.cli_actor(),
            action=audit.WEBHOOK_ADDED,
            group=group,
            target=f"webhook {hid}",
            detail=f"{audit.url_origin(url)} {','.join(names)}",
            at=now,
        )
    return NewWebhook(int(hid), group, url, names, secret)


def list_webhooks(engine: Engine, group: str | None = None) -> list[WebhookInfo]:
    """The webhooks (of `group`, else all), by group and id.

    Raises:
        AdminError: no such group.
    """
    with engine.connect() as conn:
        q = sa.select(WEBHOOKS, GROUPS.c.name.label("group_name")).join(
            GROUPS, GROUPS.c.id == WEBHOOKS.c.group_id
        )
        if group is not None:
            if conn.execute(sa.select(GROUPS.c.id).where(GROUPS.c.name == group)).first() is None:
                raise AdminError(f"no group named {group!r}")
            q = q.where(GROUPS.c.name == group)
        hooks = conn.execute(q.order_by(GROUPS.c.name, WEBHOOKS.c.id)).all()
        counts: dict[tuple[int, str], int] = {
            (r.webhook_id, r.state): r.n
            for r in conn.execute(
                sa.select(
                    DELIVERIES.c.webhook_id, DELIVERIES.c.state, sa.func.count().label("n")
                ).group_by(DELIVERIES.c.webhook_id, DELIVERIES.c.state)
            )
        }
    return [
        WebhookInfo(
            h.id,
            h.group_name,
            h.url,
            tuple(h.events.split(",")),
            h.waiting_after_s,
            h.idle_after_s,
            h.created_at,
            counts.get((h.id, "queued"), 0),
            counts.get((h.id, "delivered"), 0),
            counts.get((h.id, "failed"), 0),
        )
        for h in hooks
    ]


def remove_webhook(engine: Engine, webhook_id: int, actor: str | None = None) -> bool:
    """Remove a webhook and its deliveries (queued ones are never sent). False: none."""
    if not 0 < webhook_id < 2**63:  # no row has it, and the database takes no such number
        return False
    with write_transaction(engine) as conn:
        hook = conn.execute(
            sa.select(WEBHOOKS.c.url, WEBHOOKS.c.events, GROUPS.c.name)
            .join(GROUPS, GROUPS.c.id == WEBHOOKS.c.group_id)
            .where(WEBHOOKS.c.id == webhook_id)
        ).first()
        if hook is None:
            return False
        conn.execute(sa.delete(DELIVERIES).where(DELIVERIES.c.webhook_id == webhook_id))
        conn.execute(sa.delete(WEBHOOKS).where(WEBHOOKS.c.id == webhook_id))
        audit.record(
            conn,
            actor=actor or audit.cli_actor(),
            action=audit.WEBHOOK_REMOVED,
            group=hook.name,
            target=f"webhook {webhook_id}",
            detail=f"{audit.url_origin(hook.url)} {hook.events}",
        )
        return True
