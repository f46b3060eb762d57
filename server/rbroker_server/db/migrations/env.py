"""Alembic environment: runs on the connection `rbroker_server.db.engine.upgrade` hands in.

`rbroker-server db upgrade` (and the app at start) call `db.upgrade`; there is no
alembic.ini. New revisions are dated: `versions/YYYY_MM_DD_NNNN_<slug>.py`.
"""

from __future__ import annotations

from alembic import context

from rbroker_server.db.models import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only reached when run without db.upgrade
    raise RuntimeError("run migrations through `rbroker-server db upgrade`")

context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
