"""Write probe of `/healthz`: `health_checks`, one row per coordinator host name.

Revision ID: 2026_12_01_0004
Revises: 2026_11_30_0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from rbroker_server.db.engine import UtcDateTime

revision = "2026_12_01_0004"
down_revision = "2026_11_30_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "health_checks",
        sa.Column("name", sa.String(length=255), primary_key=True),
        sa.Column("checked_at", UtcDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("health_checks")
