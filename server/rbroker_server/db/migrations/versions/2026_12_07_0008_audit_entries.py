"""The audit trail: `audit_entries` (when, who, what, which group, to what), append-only.

Revision ID: 2026_12_07_0008
Revises: 2026_12_06_0007
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from rbroker_server.db.engine import UtcDateTime

revision = "2026_12_07_0008"
down_revision = "2026_12_06_0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_entries",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", UtcDateTime(), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("group_name", sa.String(length=64), nullable=True),
        sa.Column("target", sa.String(length=128), nullable=False),
        sa.Column("detail", sa.String(length=512), nullable=False),
    )
    op.create_index("ix_audit_entries_at", "audit_entries", ["at"])
    op.create_index("ix_audit_entries_group_name", "audit_entries", ["group_name"])


def downgrade() -> None:
    op.drop_index("ix_audit_entries_group_name", table_name="audit_entries")
    op.drop_index("ix_audit_entries_at", table_name="audit_entries")
    op.drop_table("audit_entries")
