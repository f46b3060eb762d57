"""Webhook delivery: sign, claim, POST, retry, give up; and the serve process's webhook task.

Each delivery is a POST of its JSON body (`events`) with
- `X-Rbroker-Timestamp`: Unix seconds (whole) when it was sent;
- `X-Rbroker-Signature`: `sha256=<hex HMAC-SHA256(secret, timestamp + "." + body)>`;
- `X-Rbroker-Event` and `X-Rbroker-Delivery` (the event name and the row id).

A 2xx answer marks it `delivered`; anything else (another status, a refused connection, no
answer within `timeout_s`) counts an attempt and sets the next one after an exponential
backoff with jitter (`backoff_s`), until `give_up_after_s` (24 h) after its first attempt:
then it is `failed`. A claimed row's `next_at` moves `CLAIM_S` ahead while it is sent, so
another process does not take it meanwhile; a process that dies while sending leaves it to
be sent again after that (at least once; once per event otherwise).

Claims run in one transaction, on PostgreSQL under a transaction-scoped advisory lock and
`FOR UPDATE SKIP LOCKED`, so that two coordinator processes never claim the same row and
a group's rate (`per_minute` attempts per group per minute) holds across them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

import anyio.to_thread
import httpx
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from rbroker_server import __version__
from rbroker_server.db.engine import utcnow, write_transaction
from rbroker_server.db.tables import DELIVERIES, WEBHOOKS
from rbroker_server.metrics import health
from rbroker_server.settings import Settings
from rbroker_server.webhooks import events

log = logging.getLogger(__name__)

HEADER_TIMESTAMP: Final = "X-Rbroker-Timestamp"
HEADER_SIGNATURE: Final = "X-Rbroker-Signature"
TIMEOUT_S: Final = 10.0
"""How long one POST may take (seconds)."""
GIVE_UP_AFTER_S: Final = 24 * 3600.0
"""A delivery not answered with a 2xx this long after its first attempt is `failed`."""
BACKOFF_BASE_S: Final = 30.0
BACKOFF_MAX_S: Final = 3600.0
PER_MINUTE: Final = 60
"""Attempts per group per minute at most."""
CLAIM_S: Final = 60.0
"""How far a claimed row's `next_at` moves while it is being sent (> `TIMEOUT_S`)."""
BATCH: Final = 50
"""Rows claimed per claim at most."""
KEEP_S: Final = 30 * 86400.0
"""Delivered, failed and skipped rows are deleted this long after they were queued; an
event still shown after that (a finished job a broker keeps listing) would be sent again."""
_PG_CLAIM_LOCK: Final = 0x72_62_77_68  # "rbwh"


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """`sha256=<hex>` of HMAC-SHA256 keyed by `secret` over `timestamp + "." + body`."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def backoff_s(attempts: int, base_s: float = BACKOFF_BASE_S, max_s: float = BACKOFF_MAX_S) -> float:
    """Seconds before the next attempt after `attempts` failed ones: `base_s · 2^(n-1)`,
    at most `max_s`, times a random factor from 0.5 to 1.5 (jitter)."""
    return min(max_s, base_s * 2 ** max(0, attempts - 1)) * random.uniform(0.5, 1.5)


@dataclass(frozen=True, slots=True)
class Claimed:
    """A delivery taken for sending: its row id, event, body, URL and secret."""

    id: int
    event: str
    body: bytes
    url: str
    secret: str
    attempts: int
    first_attempt_at: datetime


def claim(
    engine: Engine, now: datetime, per_minute: int = PER_MINUTE, batch: int = BATCH
) -> list[Claimed]:
    """Take the due queued deliveries (oldest `next_at` first, at most `batch`), at most
    `per_minute` attempts per group in the last minute, counting the attempt.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: a database fault (nothing claimed).
    """
    with write_transaction(engine) as conn:
        pg = conn.dialect.name == "postgresql"
        if pg:
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_CLAIM_LOCK})
        due = (
            sa.select(
                DELIVERIES.c.id,
                DELIVERIES.c.event,
                DELIVERIES.c.body,
                DELIVERIES.c.attempts,
                DELIVERIES.c.first_attempt_at,
                WEBHOOKS.c.url,
                WEBHOOKS.c.secret,
                WEBHOOKS.c.group_id,
            )
            .join(WEBHOOKS, WEBHOOKS.c.id == DELIVERIES.c.webhook_id)
            .where(DELIVERIES.c.state == "queued", DELIVERIES.c.next_at <= now)
            .order_by(DELIVERIES.c.next_at, DELIVERIES.c.id)
            .limit(batch)
        )
        if pg:
            due = due.with_for_update(skip_locked=True, of=DELIVERIES)
        rows = conn.execute(due).all()
        if not rows:
            return []
        groups = {r.group_id for r in rows}
        recent: dict[int, int] = {
            group_id: n
            for group_id, n in conn.execute(
                sa.select(WEBHOOKS.c.group_id, sa.func.count())
                .select_from(DELIVERIES.join(WEBHOOKS, WEBHOOKS.c.id == DELIVERIES.c.webhook_id))
                .where(
                    WEBHOOKS.c.group_id.in_(groups),
                    DELIVERIES.c.last_attempt_at > now - timedelta(seconds=60),
                )
                .group_by(WEBHOOKS.c.group_id)
            ).all()
        }
        taken: list[Claimed] = []
        for r in rows:
            if recent.get(r.group_id, 0) >= per_minute:
                continue
            recent[r.group_id] = recent.get(r.group_id, 0) + 1
            first = r.first_attempt_at or now
            conn.execute(
                sa.update(DELIVERIES)
                .where(DELIVERIES.c.id == r.id)
                .values(
                    attempts=r.attempts + 1,
                    next_at=now + timedelta(seconds=CLAIM_S),
                    first_attempt_at=first,
                    last_attempt_at=now,
                )
            )
            taken.append(
                Claimed(r.id, r.event, r.body.encode(), r.url, r.secret, r.attempts + 1, first)
            )
    return taken


async def send(client: httpx.AsyncClient, item: Claimed, timeout_s: float = TIMEOUT_S) -> str:
    """POST `item`; "" when answered with a 2xx, else one line saying what went wrong."""
    stamp = str(int(time.time()))
    headers = {
        "content-type": "application/json",
        "user-agent": f"rbroker-coordinator/{__version__}",
        HEADER_TIMESTAMP: stamp,
        HEADER_SIGNATURE: signature(item.secret, stamp, item.body),
        "X-Rbroker-Event": item.event,
        "X-Rbroker-Delivery": str(item.id),
    }
    try:
        r = await client.post(item.url, content=item.body, headers=headers, timeout=timeout_s)
    except httpx.TimeoutException:
        return f"no answer within {timeout_s:g} s"
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"[:500] or type(exc).__name__
    if 200 <= r.status_code < 300:
        return ""
    return f"HTTP {r.status_code}"


def record(
    engine: Engine,
    item: Claimed,
    error: str,
    now: datetime,
    *,
    give_up_after_s: float = GIVE_UP_AFTER_S,
    base_s: float = BACKOFF_BASE_S,
    max_s: float = BACKOFF_MAX_S,
) -> str:
    """Store how sending `item` went (`error`: "" for delivered); its new state.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: a database fault.
    """
    if not error:
        values: dict[str, object] = {"state": "delivered", "last_error": ""}
    elif (now - item.first_attempt_at).total_seconds() >= give_up_after_s:
        values = {"state": "failed", "last_error": error[:512]}
    else:
        delay = backoff_s(item.attempts, base_s, max_s)
        values = {"next_at": now + timedelta(seconds=delay), "last_error": error[:512]}
    with write_transaction(engine) as conn:
        conn.execute(sa.update(DELIVERIES).where(DELIVERIES.c.id == item.id).values(**values))
    state = str(values.get("state", "queued"))
    health.webhook_attempted(state)
    return state


class Webhooks:
    """The webhook task of one coordinator process: every `interval_s`, a watcher pass
    (`events.watch`), then the due deliveries sent until none is left (or the rate stops
    them). Attributes are the bounds and timings (module constants by default)."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings
        self.interval_s = settings.webhook_interval_s
        self.timeout_s = TIMEOUT_S
        self.give_up_after_s = GIVE_UP_AFTER_S
        self.backoff_base_s = BACKOFF_BASE_S
        self.backoff_max_s = BACKOFF_MAX_S
        self.per_minute = PER_MINUTE
        self.max_queued = events.MAX_QUEUED_PER_GROUP
        self.drops = events.DropLog()
        self._pruned_at = float("-inf")

    async def step(self, client: httpx.AsyncClient) -> int:
        """One pass: watch, then send what is due; the deliveries attempted.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: a database fault.
        """
        watched = await anyio.to_thread.run_sync(
            lambda: events.watch(self.engine, self.settings, max_queued=self.max_queued)
        )
        self.drops.cap = self.max_queued
        self.drops.add(watched.dropped)
        if time.monotonic() - self._pruned_at > 3600:
            self._pruned_at = time.monotonic()
            await anyio.to_thread.run_sync(self._prune)
        sent = 0
        while True:
            batch = await anyio.to_thread.run_sync(
                lambda: claim(self.engine, utcnow(), self.per_minute)
            )
            if not batch:
                return sent
            errors = await asyncio.gather(*(send(client, i, self.timeout_s) for i in batch))
            for item, error in zip(batch, errors, strict=True):
                await anyio.to_thread.run_sync(self._record, item, error)
            sent += len(batch)

    def _record(self, item: Claimed, error: str) -> None:
        record(
            self.engine,
            item,
            error,
            utcnow(),
            give_up_after_s=self.give_up_after_s,
            base_s=self.backoff_base_s,
            max_s=self.backoff_max_s,
        )

    def _prune(self) -> None:
        with write_transaction(self.engine) as conn:
            events.prune(conn, utcnow(), KEEP_S)

    async def run_forever(self) -> None:
        """Pass after pass until cancelled; a database fault is logged and the next pass
        tries again."""
        async with httpx.AsyncClient(follow_redirects=False) as client:
            while True:
                try:
                    await self.step(client)
                except sa.exc.SQLAlchemyError as exc:
                    log.warning("webhooks: database fault (%s); trying again", exc)
                except Exception:
                    log.exception("webhooks: pass failed; trying again")
                await asyncio.sleep(self.interval_s)


@contextlib.asynccontextmanager
async def running(hooks: Webhooks) -> AsyncIterator[asyncio.Task[None]]:
    """Run `hooks.run_forever` for the block's duration."""
    task = asyncio.create_task(hooks.run_forever())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
