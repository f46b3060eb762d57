"""PostgreSQL for the coordinator tests, set up and cleaned up by the tests themselves.

`RBROKER_TEST_PG_URL` (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test) names a
server and a database. When that database does not exist, the `pg_base_url` fixture creates
it (through the server's `postgres` maintenance database) and drops it at the end of the
session; a database that existed is left alone. Each test then works in a fresh schema of
its own (`scratch_schema`), dropped when the test ends, also when it fails. Without the
variable the PostgreSQL variants skip.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from urllib.parse import quote

import pytest
import sqlalchemy as sa

PG_ENV = "RBROKER_TEST_PG_URL"


def pg_url() -> str | None:
    """The URL from `RBROKER_TEST_PG_URL`, or None when it is not set."""
    return os.environ.get(PG_ENV) or None


def _maintenance_engine(url: sa.engine.URL) -> sa.engine.Engine:
    """An AUTOCOMMIT engine on the server's `postgres` database (CREATE/DROP DATABASE
    cannot run inside a transaction, nor on the database they act on)."""
    return sa.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@contextlib.contextmanager
def created_if_missing(url_text: str) -> Iterator[str]:
    """Yield `url_text`, creating its database first when it does not exist and dropping
    it afterwards, also when the body raises. An existing database is never dropped."""
    url = sa.engine.make_url(url_text)
    name = url.database
    assert name, f"{PG_ENV} must name a database"
    engine = _maintenance_engine(url)
    try:
        with engine.connect() as conn:
            exists = conn.execute(
                sa.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}
            ).first()
            if exists is None:
                conn.exec_driver_sql(f"CREATE DATABASE {_quoted(name)}")
        try:
            yield url_text
        finally:
            if exists is None:
                with engine.connect() as conn:
                    # FORCE (PostgreSQL 13+) ends connections a failed test left open
                    conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {_quoted(name)} WITH (FORCE)")
    finally:
        engine.dispose()


@contextlib.contextmanager
def scratch_schema(base: str, prefix: str) -> Iterator[str]:
    """A fresh schema in `base`'s database, as a URL whose connections use it; the schema
    is dropped afterwards, also when the body raises."""
    schema = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    engine = sa.create_engine(base)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"CREATE SCHEMA {_quoted(schema)}"))
        try:
            sep = "&" if "?" in base else "?"
            yield f"{base}{sep}options={quote(f'-csearch_path={schema}')}"
        finally:
            with engine.begin() as conn:
                conn.execute(sa.text(f"DROP SCHEMA IF EXISTS {_quoted(schema)} CASCADE"))
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def pg_base_url() -> Iterator[str]:
    """The test database's URL (created for this session when missing); skips without
    `RBROKER_TEST_PG_URL`."""
    base = pg_url()
    if base is None:
        pytest.skip(f"PostgreSQL variant: set {PG_ENV} (e.g. postgresql+psycopg://…/test)")
    with created_if_missing(base) as url:
        yield url
