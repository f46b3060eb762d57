"""Usage history: `daily_usage`, GPU memory granted and used per computer, day (UTC),
project and user, in MiB-hours; rolled up by the report writes, pruned after
`usage_window_days`.

Revision ID: 2026_12_05_0006
Revises: 2026_12_02_0005
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "2026_12_05_0006"
down_revision = "2026_12_02_0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "daily_usage",
        sa.Column(
            "computer_id",
            sa.String(64),
            sa.ForeignKey("computers.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("day", sa.Date(), primary_key=True),
        sa.Column("project", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(64), primary_key=True),
        sa.Column("granted_mib_hours", sa.Float(), nullable=False),
        sa.Column("used_mib_hours", sa.Float(), nullable=False),
    )
    op.create_index("ix_daily_usage_day", "daily_usage", ["day"])


def downgrade() -> None:
    op.drop_index("ix_daily_usage_day", table_name="daily_usage")
    op.drop_table("daily_usage")
