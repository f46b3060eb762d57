"""The SQLAlchemy Core table of each SQLModel table (`models`), named once here: the
statements of the hot path, the reads and the housekeeping import them from this module
(`COMPUTERS`, not `Computer.__table__`, so that no module makes its own alias)."""

from __future__ import annotations

import sqlalchemy as sa

from rbroker_server.db.models import (
    AuditEntry,
    Computer,
    ComputerRun,
    DailyUsage,
    EnrollCode,
    Group,
    HealthCheck,
    HistoryPoint,
    RateLimitHit,
    RequestNonce,
    ViewerToken,
    Webhook,
    WebhookDelivery,
    WebSession,
)

GROUPS: sa.Table = Group.__table__  # type: ignore[attr-defined]
TOKENS: sa.Table = ViewerToken.__table__  # type: ignore[attr-defined]
CODES: sa.Table = EnrollCode.__table__  # type: ignore[attr-defined]
COMPUTERS: sa.Table = Computer.__table__  # type: ignore[attr-defined]
RUNS: sa.Table = ComputerRun.__table__  # type: ignore[attr-defined]
HISTORY: sa.Table = HistoryPoint.__table__  # type: ignore[attr-defined]
USAGE: sa.Table = DailyUsage.__table__  # type: ignore[attr-defined]
NONCES: sa.Table = RequestNonce.__table__  # type: ignore[attr-defined]
SESSIONS: sa.Table = WebSession.__table__  # type: ignore[attr-defined]
RATE_LIMIT_HITS: sa.Table = RateLimitHit.__table__  # type: ignore[attr-defined]
HEALTH: sa.Table = HealthCheck.__table__  # type: ignore[attr-defined]
WEBHOOKS: sa.Table = Webhook.__table__  # type: ignore[attr-defined]
DELIVERIES: sa.Table = WebhookDelivery.__table__  # type: ignore[attr-defined]
AUDIT: sa.Table = AuditEntry.__table__  # type: ignore[attr-defined]
