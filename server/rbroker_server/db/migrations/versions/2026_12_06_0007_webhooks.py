"""Webhooks: `webhooks` (a group's URL, events, secret and thresholds) and
`webhook_deliveries` (one row per event and webhook, unique by its event key, with how its
delivery went).

Revision ID: 2026_12_06_0007
Revises: 2026_12_05_0006
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from rbroker_server.db.engine import UtcDateTime

revision = "2026_12_06_0007"
down_revision = "2026_12_05_0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "webhooks",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "group_id",
            sa.Integer(),
            sa.ForeignKey("groups.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("events", sa.String(length=256), nullable=False),
        sa.Column("secret", sa.String(length=64), nullable=False),
        sa.Column("waiting_after_s", sa.Float(), nullable=False),
        sa.Column("idle_after_s", sa.Float(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
    )
    op.create_index("ix_webhooks_group_id", "webhooks", ["group_id"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column(
            "webhook_id",
            sa.Integer(),
            sa.ForeignKey("webhooks.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("event_key", sa.String(length=255), nullable=False),
        sa.Column("event", sa.String(length=32), nullable=False),
        sa.Column("computer_id", sa.String(length=64), nullable=True),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("next_at", UtcDateTime(), nullable=False),
        sa.Column("first_attempt_at", UtcDateTime(), nullable=True),
        sa.Column("last_attempt_at", UtcDateTime(), nullable=True),
        sa.Column("last_error", sa.String(length=512), nullable=False),
        sa.UniqueConstraint("webhook_id", "event_key", name="uq_webhook_deliveries_key"),
    )
    op.create_index(
        "ix_webhook_deliveries_state_next_at", "webhook_deliveries", ["state", "next_at"]
    )
    op.create_index("ix_webhook_deliveries_created_at", "webhook_deliveries", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_created_at", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_state_next_at", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_index("ix_webhooks_group_id", table_name="webhooks")
    op.drop_table("webhooks")
