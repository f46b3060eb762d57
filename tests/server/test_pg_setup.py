"""The PostgreSQL test setup (`tests.pg`) creates the database `RBROKER_TEST_PG_URL` names
when it is missing and drops only what it created, also when the test body fails."""

from __future__ import annotations

import secrets

import pytest
import sqlalchemy as sa

from tests.pg import created_if_missing, pg_url, scratch_schema


def _databases(base: str) -> set[str]:
    engine = sa.create_engine(sa.engine.make_url(base).set(database="postgres"))
    try:
        with engine.connect() as conn:
            return {r[0] for r in conn.exec_driver_sql("SELECT datname FROM pg_database")}
    finally:
        engine.dispose()


def _schemas(base: str) -> set[str]:
    engine = sa.create_engine(base)
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT schema_name FROM information_schema.schemata")
            return {r[0] for r in rows}
    finally:
        engine.dispose()


@pytest.fixture
def server_url() -> str:
    base = pg_url()
    if base is None:
        pytest.skip("PostgreSQL variant: set RBROKER_TEST_PG_URL")
    return base


def test_a_missing_database_is_created_and_dropped_also_on_failure(server_url: str) -> None:
    name = f"rbt_missing_{secrets.token_hex(4)}"
    url = sa.engine.make_url(server_url).set(database=name).render_as_string(hide_password=False)
    assert name not in _databases(server_url)
    with pytest.raises(RuntimeError, match="a failing test"), created_if_missing(url) as got:
        assert got == url
        assert name in _databases(server_url)
        engine = sa.create_engine(url)  # a connection the failing test leaves open
        conn = engine.connect()
        assert conn.exec_driver_sql("SELECT current_database()").scalar() == name
        raise RuntimeError("a failing test")
    assert name not in _databases(server_url)
    conn.invalidate()
    engine.dispose()


def test_an_existing_database_is_left_alone(pg_base_url: str) -> None:
    name = sa.engine.make_url(pg_base_url).database
    with created_if_missing(pg_base_url):
        pass
    assert name in _databases(pg_base_url)


def test_a_scratch_schema_is_dropped_also_on_failure(pg_base_url: str) -> None:
    seen: list[str] = []
    with pytest.raises(RuntimeError), scratch_schema(pg_base_url, "rbt") as url:
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            schema = conn.exec_driver_sql("SELECT current_schema()").scalar()
            assert isinstance(schema, str) and schema.startswith("rbt_")
            seen.append(schema)
            conn.exec_driver_sql("CREATE TABLE t (x int)")
        engine.dispose()
        raise RuntimeError("a failing test")
    assert seen and seen[0] not in _schemas(pg_base_url)
