"""SQLModel tables of the coordinator. Every change here comes with an Alembic revision.

Tables: groups, viewer tokens, enrollment codes (hashed), computers (with their latest
state), runs seen per computer (so a retired run can never be replayed), downsampled
history points, daily usage per computer, project and user, used request nonces, the web
view's sign-in sessions, the write probe of `/healthz`, the attempts rate limits count,
each group's webhooks with their deliveries, and the audit trail.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

from rbroker_server.db.engine import UtcDateTime

JsonType = sa.JSON().with_variant(JSONB(), "postgresql")


class Group(SQLModel, table=True):
    """A set of computers and the people allowed to see them."""

    __tablename__ = "groups"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=64, unique=True)
    created_at: datetime = Field(sa_type=UtcDateTime)


class ViewerToken(SQLModel, table=True):
    """A bearer token that reads one group's fleet; only a SHA-256 of its secret is kept."""

    __tablename__ = "viewer_tokens"

    id: str = Field(primary_key=True, max_length=32)
    group_id: int = Field(
        sa_column=sa.Column(sa.ForeignKey("groups.id", ondelete="CASCADE"), nullable=False)
    )
    name: str = Field(default="", max_length=64)
    secret_hash: str = Field(max_length=64)
    created_at: datetime = Field(sa_type=UtcDateTime)
    revoked_at: datetime | None = Field(default=None, sa_type=UtcDateTime)


class EnrollCode(SQLModel, table=True):
    """A one-time, expiring code that enrolls one computer into a group (hashed at rest)."""

    __tablename__ = "enroll_codes"

    id: str = Field(primary_key=True, max_length=32)
    group_id: int = Field(
        sa_column=sa.Column(sa.ForeignKey("groups.id", ondelete="CASCADE"), nullable=False)
    )
    secret_hash: str = Field(max_length=64)
    created_at: datetime = Field(sa_type=UtcDateTime)
    expires_at: datetime = Field(sa_type=UtcDateTime)
    used_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    computer_id: str | None = Field(default=None, max_length=64)


class Computer(SQLModel, table=True):
    """An enrolled computer, its key, its report position and its latest (redacted) state."""

    __tablename__ = "computers"

    id: str = Field(primary_key=True, max_length=64)
    group_id: int = Field(
        sa_column=sa.Column(
            sa.ForeignKey("groups.id", ondelete="CASCADE"), nullable=False, index=True
        )
    )
    name: str = Field(max_length=128)
    public_key: str = Field(max_length=64, unique=True)
    enrolled_at: datetime = Field(sa_type=UtcDateTime)
    revoked_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    run_id: str | None = Field(default=None, max_length=64)
    run_counter: int | None = Field(default=None, sa_type=sa.BigInteger)
    """The current run's `run_counter` (None: its broker sends none)."""
    seq: int | None = Field(default=None, sa_type=sa.BigInteger)
    last_seen_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    """Server receive time of the latest applied report (the only freshness clock)."""
    generated_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    """The computer's own clock when it built that report (display and skew only)."""
    clock_skew_s: float | None = None
    reported_name: str | None = Field(default=None, max_length=128)
    broker_version: str | None = Field(default=None, max_length=64)
    telemetry_source: str | None = Field(default=None, max_length=32)
    state: dict[str, Any] | None = Field(default=None, sa_type=JsonType)
    reports_applied: int = Field(default=0, sa_type=sa.BigInteger)
    history_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    """Start of the newest history bucket written for this computer."""
    flagged: bool = False
    flagged_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    flags: list[dict[str, Any]] | None = Field(default=None, sa_type=JsonType)


class ComputerRun(SQLModel, table=True):
    """A broker run (`run_id`) seen from a computer; a run once replaced stays retired."""

    __tablename__ = "computer_runs"

    computer_id: str = Field(
        sa_column=sa.Column(
            sa.ForeignKey("computers.id", ondelete="CASCADE"), primary_key=True, nullable=False
        )
    )
    run_id: str = Field(primary_key=True, max_length=64)
    first_seen_at: datetime = Field(sa_type=UtcDateTime)


class HistoryPoint(SQLModel, table=True):
    """One downsampled point of a computer's GPU figures (one per `history_step_s`)."""

    __tablename__ = "history_points"

    computer_id: str = Field(
        sa_column=sa.Column(
            sa.ForeignKey("computers.id", ondelete="CASCADE"), primary_key=True, nullable=False
        )
    )
    at: datetime = Field(sa_column=sa.Column(UtcDateTime, primary_key=True, index=True))
    data: dict[str, Any] = Field(sa_type=JsonType)


class DailyUsage(SQLModel, table=True):
    """GPU memory granted and used on one computer on one day (UTC) by one project and
    user, in MiB-hours (`rbroker_protocol.usage`): each applied report adds its active
    leases over the time since the computer's previous report (`rbroker_server.usage.rollup`).
    Kept for `usage_window_days`."""

    __tablename__ = "daily_usage"

    computer_id: str = Field(
        sa_column=sa.Column(
            sa.ForeignKey("computers.id", ondelete="CASCADE"), primary_key=True, nullable=False
        )
    )
    day: date = Field(sa_column=sa.Column(sa.Date, primary_key=True, index=True))
    project: str = Field(primary_key=True, max_length=64)
    owner: str = Field(primary_key=True, max_length=64)
    granted_mib_hours: float = Field(sa_column=sa.Column(sa.Float, nullable=False))
    used_mib_hours: float = Field(sa_column=sa.Column(sa.Float, nullable=False))


class RequestNonce(SQLModel, table=True):
    """A nonce of a signed request, kept until its timestamp leaves the validity window."""

    __tablename__ = "request_nonces"

    computer_id: str = Field(primary_key=True, max_length=64)
    nonce: str = Field(primary_key=True, max_length=64)
    expires_at: datetime = Field(sa_column=sa.Column(UtcDateTime, nullable=False, index=True))


class WebSession(SQLModel, table=True):
    """A browser signed in with a viewer token; only a SHA-256 of the session id is kept.

    The session lives as long as its token: a revoked token ends every session made with it.
    """

    __tablename__ = "web_sessions"

    id_hash: str = Field(primary_key=True, max_length=64)
    token_id: str = Field(
        sa_column=sa.Column(
            sa.ForeignKey("viewer_tokens.id", ondelete="CASCADE"), nullable=False, index=True
        )
    )
    csrf_token: str = Field(max_length=64)
    created_at: datetime = Field(sa_type=UtcDateTime)
    expires_at: datetime = Field(sa_column=sa.Column(UtcDateTime, nullable=False, index=True))


class RateLimitHit(SQLModel, table=True):
    """One attempt that a rate limit counts (`rbroker_server.edge.ratelimit.DbHits`): its kind
    (`signin`, `enroll`, `credentials`: the client's network, `203.0.113.0/24`,
    `2001:db8:1:2::/64`; `credential`: a credential, `token <id>`; `served`: a network and a
    credential served to it) and when (Unix seconds). Shared by every coordinator process on
    the database; rows older than the window (`served`: an hour) are deleted as they are
    counted and pruned."""

    __tablename__ = "rate_limit_hits"
    __table_args__ = (sa.Index("ix_rate_limit_hits_kind_key_at", "kind", "key", "at"),)

    id: int | None = Field(default=None, primary_key=True)
    kind: str = Field(max_length=32)
    key: str = Field(max_length=64)
    at: float = Field(sa_column=sa.Column(sa.Float, nullable=False, index=True))


class Webhook(SQLModel, table=True):
    """A group's webhook (`rbroker_server.webhooks`): where its events are POSTed, which
    events (comma-separated names), the secret its deliveries are signed with (kept as is:
    signing needs it; `webhook add` shows it once) and its thresholds in seconds."""

    __tablename__ = "webhooks"

    id: int | None = Field(default=None, primary_key=True)
    group_id: int = Field(
        sa_column=sa.Column(
            sa.ForeignKey("groups.id", ondelete="CASCADE"), nullable=False, index=True
        )
    )
    url: str = Field(max_length=2048)
    events: str = Field(max_length=256)
    secret: str = Field(max_length=64)
    waiting_after_s: float = Field(sa_column=sa.Column(sa.Float, nullable=False))
    idle_after_s: float = Field(sa_column=sa.Column(sa.Float, nullable=False))
    created_at: datetime = Field(sa_type=UtcDateTime)


class WebhookDelivery(SQLModel, table=True):
    """One event for one webhook: its JSON body and how its delivery went (`state`: `queued`,
    `delivered`, `failed` after 24 h of attempts, or `skipped`: an event that was already
    there when the webhook was added, recorded so that it is never sent). `event_key` names
    the event (`computer_offline:<computer id>:<last seen, Unix s>`); unique per webhook, so
    coordinator processes that see the same event insert it once."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        sa.UniqueConstraint("webhook_id", "event_key", name="uq_webhook_deliveries_key"),
        sa.Index("ix_webhook_deliveries_state_next_at", "state", "next_at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    webhook_id: int = Field(
        sa_column=sa.Column(sa.ForeignKey("webhooks.id", ondelete="CASCADE"), nullable=False)
    )
    event_key: str = Field(max_length=255)
    event: str = Field(max_length=32)
    computer_id: str | None = Field(default=None, max_length=64)
    body: str = Field(sa_column=sa.Column(sa.Text, nullable=False))
    state: str = Field(max_length=16)
    attempts: int = 0
    created_at: datetime = Field(sa_column=sa.Column(UtcDateTime, nullable=False, index=True))
    next_at: datetime = Field(sa_type=UtcDateTime)
    first_attempt_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    last_attempt_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    last_error: str = Field(default="", max_length=512)


metadata = SQLModel.metadata
"""The metadata Alembic compares migrations against."""


class HealthCheck(SQLModel, table=True):
    """One row per coordinator host name: the last time `/healthz` proved a write (a
    committed UPDATE or INSERT), so a health check fails when the database cannot write."""

    __tablename__ = "health_checks"

    name: str = Field(primary_key=True, max_length=255)
    checked_at: datetime = Field(sa_type=UtcDateTime)


class AuditEntry(SQLModel, table=True):
    """One line of the coordinator's audit trail (`rbroker_server.admin.audit`): who
    (`actor`: `cli:<OS user>` or `token:<token id>`, never a secret) did what (`action`) to
    what (`target`) in which group (`group_name`, kept as text so an entry outlives its
    group). Written in the transaction of the change it records; never updated or deleted."""

    __tablename__ = "audit_entries"

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = Field(sa_column=sa.Column(UtcDateTime, nullable=False, index=True))
    actor: str = Field(max_length=128)
    action: str = Field(max_length=32)
    group_name: str | None = Field(default=None, max_length=64, index=True)
    target: str = Field(max_length=128)
    detail: str = Field(default="", max_length=512)
