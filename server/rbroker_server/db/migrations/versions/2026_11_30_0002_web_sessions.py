"""Sign-in sessions of the web view.

Revision ID: 2026_11_30_0002
Revises: 2026_11_30_0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from rbroker_server.db.engine import UtcDateTime

revision = "2026_11_30_0002"
down_revision = "2026_11_30_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "web_sessions",
        sa.Column("id_hash", sa.String(64), primary_key=True),
        sa.Column(
            "token_id",
            sa.String(32),
            sa.ForeignKey("viewer_tokens.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("csrf_token", sa.String(64), nullable=False),
        sa.Column("created_at", UtcDateTime(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=False),
    )
    op.create_index("ix_web_sessions_token_id", "web_sessions", ["token_id"])
    op.create_index("ix_web_sessions_expires_at", "web_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_web_sessions_expires_at", "web_sessions")
    op.drop_index("ix_web_sessions_token_id", "web_sessions")
    op.drop_table("web_sessions")
