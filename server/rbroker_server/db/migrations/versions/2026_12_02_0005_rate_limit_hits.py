"""Rate limits shared by every coordinator process: `rate_limit_hits`, one row per counted
attempt (kind, client network, Unix time).

Revision ID: 2026_12_02_0005
Revises: 2026_12_01_0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "2026_12_02_0005"
down_revision = "2026_12_01_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rate_limit_hits",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
    )
    op.create_index("ix_rate_limit_hits_kind_key_at", "rate_limit_hits", ["kind", "key", "at"])
    op.create_index("ix_rate_limit_hits_at", "rate_limit_hits", ["at"])


def downgrade() -> None:
    op.drop_index("ix_rate_limit_hits_at", table_name="rate_limit_hits")
    op.drop_index("ix_rate_limit_hits_kind_key_at", table_name="rate_limit_hits")
    op.drop_table("rate_limit_hits")
