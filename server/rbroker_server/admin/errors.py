"""The one error of the administrative operations (`rbroker_server.admin.operations`), kept
apart from them so that the command line can catch it without importing the database layer
(SQLAlchemy and SQLModel, about 0.8 s) on the paths that never reach it."""

from __future__ import annotations


class AdminError(Exception):
    """An administrative request that cannot be done (message says why)."""
