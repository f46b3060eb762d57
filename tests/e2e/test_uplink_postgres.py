"""Two coordinator processes on one PostgreSQL database (several instances behind a load
balancer, architecture.md §7): brokers reporting to either instance appear in both fleets; when one
instance stops, the computers reporting to it go stale while the others stay online.

Runs where `RBROKER_TEST_PG_URL` names a PostgreSQL server and database (see `tests.pg`: a
fresh schema is made and dropped, the database created when missing); skipped otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.conftest import wait_until
from tests.e2e.conftest import CoordinatorProcess, UplinkBroker, by_name
from tests.pg import pg_base_url, scratch_schema

__all__ = ["pg_base_url"]  # a fixture for this module

STALE_AFTER_S = 8.0


@pytest.fixture
def pg_database_url(pg_base_url: str) -> Iterator[str]:
    """A fresh PostgreSQL schema as a database URL; dropped afterwards, also on failure."""
    with scratch_schema(pg_base_url, "rbe") as url:
        yield url


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
