"""Two coordinator processes on one PostgreSQL database (several instances behind a load
balancer, DESIGN §7): brokers reporting to either instance appear in both fleets; when one
instance stops, the computers reporting to it go stale while the others stay online.

Runs where `RBROKER_TEST_PG_URL` names a PostgreSQL database (a fresh schema is made and
dropped); skipped otherwise.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from urllib.parse import quote

import pytest
import sqlalchemy as sa

from tests.conftest import wait_until
from tests.e2e.conftest import CoordinatorProcess, UplinkBroker, by_name

PG_ENV = "RBROKER_TEST_PG_URL"
STALE_AFTER_S = 8.0


@pytest.fixture
def pg_database_url() -> Iterator[str]:
    """A fresh PostgreSQL schema as a database URL; dropped afterwards."""
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"PostgreSQL variant: set {PG_ENV} (e.g. postgresql+psycopg://…/test)")
    schema = f"rbe_{os.getpid()}_{secrets.token_hex(4)}"
    engine = sa.create_engine(base)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        sep = "&" if "?" in base else "?"
        yield f"{base}{sep}options={quote(f'-csearch_path={schema}')}"
        with engine.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    finally:
        engine.dispose()


def test_two_coordinator_instances_on_one_postgresql_database(
    pg_database_url: str,
    coordinator_factory: Callable[..., CoordinatorProcess],
    uplink_broker: Callable[..., UplinkBroker],
) -> None:
    first = coordinator_factory(database_url=pg_database_url, stale_after_s=STALE_AFTER_S)
    second = first.second()
    try:
        uplink_broker(first, "lab-1")
        uplink_broker(second, "lab-2")

        def states(c: CoordinatorProcess) -> dict[str, str]:
            return {n: x["freshness"]["state"] for n, x in by_name(c.fleet()).items()}

        both_online = {"lab-1": "online", "lab-2": "online"}
        wait_until(lambda: states(first) == states(second) == both_online, timeout_s=30)

        first.stop()
        wait_until(
            lambda: states(second) == {"lab-1": "stale", "lab-2": "online"},
            timeout_s=STALE_AFTER_S + 15,
            interval_s=0.3,
        )
        lab1 = by_name(second.fleet())["lab-1"]
        assert lab1["gpus"][0]["total_mib"] == 24576  # last known values kept
        assert lab1["freshness"]["text"].startswith("last known, ")
    finally:
        second.stop()
