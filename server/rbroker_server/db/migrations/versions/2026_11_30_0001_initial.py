"""Initial schema: groups, viewer tokens, enrollment codes, computers, runs, history, nonces.

Revision ID: 2026_11_30_0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

from rbroker_server.db.engine import UtcDateTime

revision = "2026_11_30_0001"
down_revision = None
branch_labels = None
depends_on = None

JsonType = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "groups",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", UtcDateTime(), nullable=False),
    )
    op.create_table(
        "viewer_tokens",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column(
            "group_id", sa.Integer(), sa.ForeignKey("groups.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("revoked_at", UtcDateTime(), nullable=True),
    )
    op.create_table(
        "enroll_codes",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column(
            "group_id", sa.Integer(), sa.ForeignKey("groups.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
        sa.Column("used_at", UtcDateTime(), nullable=True),
        sa.Column("computer_id", sa.String(64), nullable=True),
    )
    op.create_table(
        "computers",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column(
            "group_id", sa.Integer(), sa.ForeignKey("groups.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("public_key", sa.String(64), nullable=False, unique=True),
        sa.Column("enrolled_at", UtcDateTime(), nullable=False),
        sa.Column("revoked_at", UtcDateTime(), nullable=True),
        sa.Column("run_id", sa.String(64), nullable=True),
        sa.Column("seq", sa.BigInteger(), nullable=True),
        sa.Column("last_seen_at", UtcDateTime(), nullable=True),
        sa.Column("generated_at", UtcDateTime(), nullable=True),
        sa.Column("clock_skew_s", sa.Float(), nullable=True),
        sa.Column("reported_name", sa.String(128), nullable=True),
        sa.Column("broker_version", sa.String(64), nullable=True),
        sa.Column("telemetry_source", sa.String(32), nullable=True),
        sa.Column("state", JsonType, nullable=True),
        sa.Column("reports_applied", sa.BigInteger(), nullable=False),
        sa.Column("history_at", UtcDateTime(), nullable=True),
        sa.Column("flagged", sa.Boolean(), nullable=False),
        sa.Column("flagged_at", UtcDateTime(), nullable=True),
        sa.Column("flags", JsonType, nullable=True),
    )
    op.create_index("ix_computers_group_id", "computers", ["group_id"])
    op.create_table(
        "computer_runs",
        sa.Column(
            "computer_id",
            sa.String(64),
            sa.ForeignKey("computers.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("first_seen_at", UtcDateTime(), nullable=False),
    )
    op.create_table(
        "history_points",
        sa.Column(
            "computer_id",
            sa.String(64),
            sa.ForeignKey("computers.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("at", UtcDateTime(), primary_key=True),
        sa.Column("data", JsonType, nullable=False),
    )
    op.create_index("ix_history_points_at", "history_points", ["at"])
    op.create_table(
        "request_nonces",
        sa.Column("computer_id", sa.String(64), primary_key=True),
        sa.Column("nonce", sa.String(64), primary_key=True),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
    )
    op.create_index("ix_request_nonces_expires_at", "request_nonces", ["expires_at"])


def downgrade() -> None:
    op.drop_table("request_nonces")
    op.drop_table("history_points")
    op.drop_table("computer_runs")
    op.drop_table("computers")
    op.drop_table("enroll_codes")
    op.drop_table("viewer_tokens")
    op.drop_table("groups")
