"""Housekeeping: prune history older than the window, daily usage older than its window,
nonces past their validity and rate limit hits older than their window."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from rbroker_server.db.engine import utcnow, write_lock
from rbroker_server.db.tables import HISTORY, NONCES, USAGE
from rbroker_server.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Pruned:
    history_points: int
    nonces: int
    rate_limit_hits: int = 0
    usage_rows: int = 0


def prune(engine: Engine, settings: Settings, now: datetime | None = None) -> Pruned:
    """Delete history points older than `history_window_s`, daily usage of days before the
    last `usage_window_days` (UTC, today included) and expired request nonces."""
    now = now or utcnow()
    cutoff = now - timedelta(seconds=settings.history_window_s)
    first_day = now.astimezone(UTC).date() - timedelta(days=settings.usage_window_days - 1)
    with write_lock(engine), engine.begin() as conn:
        history = conn.execute(sa.delete(HISTORY).where(HISTORY.c.at < cutoff)).rowcount
        usage = conn.execute(sa.delete(USAGE).where(USAGE.c.day < first_day)).rowcount
        nonces = conn.execute(sa.delete(NONCES).where(NONCES.c.expires_at < now)).rowcount
    from rbroker_server.edge.ratelimit import WINDOW_S, prune_hits

    with write_lock(engine):
        hits = prune_hits(engine, older_than_s=WINDOW_S, now=now.timestamp())
    if history or nonces or usage:
        log.info(
            "pruned %d history points, %d daily usage rows and %d nonces", history, usage, nonces
        )
    return Pruned(history, nonces, hits, usage)
