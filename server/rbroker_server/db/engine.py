"""Database engine (SQLite pragmas or PostgreSQL), the UTC time column, and schema upgrades."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import weakref
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Dialect, Engine

from rbroker_protocol import files

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).parent / "migrations"
_PG_MIGRATION_LOCK = 0x72_62_72_6B  # "rbrk": serialises upgrades of coordinators sharing one DB


def utcnow() -> datetime:
    """The server's clock, timezone-aware UTC (the only clock freshness uses)."""
    return datetime.now(UTC)


class UtcDateTime(sa.types.TypeDecorator[datetime]):
    """A timestamp stored in UTC and always read back timezone-aware (UTC).

    Naive datetimes are refused on the way in: every time the server stores is explicit.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: store timezone-aware UTC times only")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


_WRITE_LOCKS: weakref.WeakKeyDictionary[Engine, threading.Lock] = weakref.WeakKeyDictionary()
_WRITE_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def write_lock(engine: Engine) -> Iterator[None]:
    """Serialise this process's write transactions on SQLite (one writer at a time anyway);
    threads then queue on a lock instead of sleeping in SQLite's busy handler. A no-op on
    PostgreSQL, where row locks order concurrent writers."""
    if engine.dialect.name != "sqlite":
        yield
        return
    with _WRITE_LOCKS_GUARD:
        lock = _WRITE_LOCKS.setdefault(engine, threading.Lock())
    with lock:
        yield


@contextlib.contextmanager
def write_transaction(engine: Engine) -> Iterator[sa.Connection]:
    """One write transaction under `write_lock`, committed when the block ends (rolled back
    when it raises).

    On SQLite it starts with `BEGIN IMMEDIATE`: the driver itself begins a transaction only
    before the first INSERT/UPDATE/DELETE, so a SAVEPOINT as the first statement would
    start one of its own and its RELEASE would commit; after `BEGIN IMMEDIATE` savepoints
    nest inside the transaction and the database's write lock is taken at once.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database refused or could not commit.
    """
    with write_lock(engine), engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        yield conn


def dumps_json(value: Any) -> str:
    """JSON text of `value` for the JSON columns: orjson (compact; about a tenth of the
    standard library's time for a report's state, which the report writer encodes once per
    applied report), or `json.dumps` for what orjson refuses (e.g. integers past 64 bits).

    Raises:
        TypeError, ValueError: `value` is not JSON.
    """
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # orjson.JSONEncodeError is one
        return json.dumps(value)


def make_engine(url: str, **kw: Any) -> Engine:
    """An engine for `url`, its JSON columns written by `dumps_json`. SQLite gets WAL, a
    busy timeout and foreign keys on every connection; its directory and file are created
    private (`files.private_sqlite`: 0700, 0600). PostgreSQL gets pre-ping."""
    kw.setdefault("json_serializer", dumps_json)
    if url.startswith("sqlite"):
        db_path = sa.engine.make_url(url).database
        if db_path and db_path != ":memory:":
            files.private_sqlite(Path(db_path))
        engine = sa.create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, **kw
        )

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine
    return sa.create_engine(url, pool_pre_ping=True, **kw)


def ensure_database(url: str) -> bool:
    """Create the PostgreSQL database named in `url` when it does not exist yet (through
    the server's `postgres` database, which needs CREATEDB). SQLite files are created on
    first use. Returns True when a database was created."""
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "postgresql" or not parsed.database:
        return False
    probe = sa.create_engine(url)
    try:
        with probe.connect():
            return False
    except sa.exc.OperationalError as exc:
        if "does not exist" not in str(exc):
            raise
    finally:
        probe.dispose()
    maintenance = sa.create_engine(parsed.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with maintenance.connect() as conn:
            quoted = conn.dialect.identifier_preparer.quote(parsed.database)
            conn.exec_driver_sql(f"CREATE DATABASE {quoted}")
    finally:
        maintenance.dispose()
    log.info("created database %s", parsed.database)
    return True


def _alembic_config(connection: sa.Connection) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def current_revision(engine: Engine) -> str | None:
    """The schema revision the database is at (None: empty database)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str:
    """The newest revision this build knows."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    return head


def upgrade(engine: Engine) -> str:
    """Bring the schema to the newest revision (idempotent; safe with several coordinators
    on one PostgreSQL database: an advisory lock serialises them). Returns the revision."""
    from alembic import command

    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
        command.upgrade(_alembic_config(conn), "head")
    head = head_revision()
    log.info("database schema at revision %s", head)
    return head
