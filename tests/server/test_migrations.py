"""Alembic migrations: dated files, upgrade from empty, idempotent, matching the models."""

from __future__ import annotations

import re
import secrets

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from rbroker_server.db import engine as db
from rbroker_server.db.models import metadata


def test_revision_files_are_dated() -> None:
    files = sorted(p.name for p in (db.MIGRATIONS / "versions").glob("*.py"))
    assert files
    for name in files:
        assert re.fullmatch(r"\d{4}_\d{2}_\d{2}_\d{4}_[a-z0-9_]+\.py", name), name


def test_upgrade_from_empty_matches_the_models(database_url: str) -> None:
    engine = db.make_engine(database_url)
    try:
        assert db.current_revision(engine) is None
        head = db.upgrade(engine)
        assert head == db.head_revision() == db.current_revision(engine)
        assert db.upgrade(engine) == head  # idempotent
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(ctx, metadata) == []
    finally:
        engine.dispose()


def test_sqlite_pragmas(tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = db.make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 1000
    finally:
        engine.dispose()


def test_setup_creates_a_missing_postgresql_database(pg_base_url: str) -> None:
    base = pg_base_url
    name = f"rbt_db_{secrets.token_hex(4)}"
    url = sa.engine.make_url(base).set(database=name)
    admin = sa.create_engine(sa.engine.make_url(base), isolation_level="AUTOCOMMIT")
    try:
        assert db.ensure_database(url.render_as_string(hide_password=False)) is True
        assert db.ensure_database(url.render_as_string(hide_password=False)) is False
        engine = db.make_engine(url.render_as_string(hide_password=False))
        try:
            assert db.upgrade(engine) == db.head_revision()
        finally:
            engine.dispose()
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}"')
        admin.dispose()


def test_ensure_database_leaves_sqlite_alone(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert db.ensure_database(f"sqlite:///{tmp_path / 'x.db'}") is False
