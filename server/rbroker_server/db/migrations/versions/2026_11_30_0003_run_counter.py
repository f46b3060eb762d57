"""Order of a computer's runs: `computers.run_counter`, the current run's counter.

A report of a run the coordinator has not applied yet is refused (`run_outdated`) when its
run counter is lower than the current run's. Existing rows keep NULL (their current run
came from a broker that sends no counter), which orders nothing until the next new run.

Revision ID: 2026_11_30_0003
Revises: 2026_11_30_0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "2026_11_30_0003"
down_revision = "2026_11_30_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("computers") as batch:
        batch.add_column(sa.Column("run_counter", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("computers") as batch:
        batch.drop_column("run_counter")
