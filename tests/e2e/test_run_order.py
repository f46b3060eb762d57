"""Run order end to end: each broker start takes the next run counter of its data dir; a
late report of an older run never replaces the current run; a broker whose data dir went
back in time (restored from a backup) is refused once and continues above the current run.

Real broker processes with their reporters, a real coordinator process on SQLite and on
PostgreSQL (with `RBROKER_TEST_PG_URL`), real signed reports.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import sqlalchemy as sa

from rbroker.uplink.keys import FileKeyStore
from tests.conftest import SINGLE_24G, start_broker, wait_until
from tests.e2e.conftest import CoordinatorProcess, UplinkBroker
from tests.fakes.reports import payload, signed_body

PG_ENV = "RBROKER_TEST_PG_URL"


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """'' (SQLite in the coordinator's data dir) or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        yield ""
        return
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"PostgreSQL variant: set {PG_ENV} (e.g. postgresql+psycopg://…/test)")
    schema = f"rbo_{os.getpid()}_{secrets.token_hex(4)}"
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


def _row(c: CoordinatorProcess, computer_id: str) -> Any:
    engine = sa.create_engine(c.database_url or f"sqlite:///{c.db_path}")
    try:
        with engine.connect() as conn:
            return conn.execute(
                sa.text("SELECT run_id, run_counter, seq FROM computers WHERE id = :id"),
                {"id": computer_id},
            ).one()
    finally:
        engine.dispose()


def _restart(ub: UplinkBroker, counter: int | None = None) -> None:
    """Stop the broker, optionally set its data dir's run counter, start it again (the
    fixture only stops the first process: the last one is stopped by the test)."""
    assert ub.broker.stop(signal.SIGTERM) == 0
    if counter is not None:
        (ub.broker.data_dir / "run_counter").write_text(f"{counter}\n")
    ub.broker = start_broker(SINGLE_24G, root=ub.broker.scenario.parent)


def test_run_counter_orders_runs(
    database_url: str,
    coordinator_factory: Callable[..., CoordinatorProcess],
    uplink_broker: Callable[..., UplinkBroker],
) -> None:
    c = coordinator_factory(database_url=database_url)
    # a report every 1 s (default 5 s): the checks below wait for the next report
    ub = uplink_broker(c, "lab-1", report_interval_s=1.0)
    try:
        _check_run_order(c, ub)
    finally:
        ub.broker.stop(signal.SIGKILL)


def _check_run_order(c: CoordinatorProcess, ub: UplinkBroker) -> None:
    counter_file = ub.broker.data_dir / "run_counter"
    wait_until(lambda: _row(c, ub.computer_id).run_counter == 1, timeout_s=30)
    assert counter_file.read_text() == "1\n"

    # each broker start is a new run with the next counter
    _restart(ub)
    wait_until(lambda: _row(c, ub.computer_id).run_counter == 2, timeout_s=30)
    assert counter_file.read_text() == "2\n"
    live = _row(c, ub.computer_id)

    # a report of run 1 that was never delivered arrives now, signed by this computer
    key = FileKeyStore(ub.broker.data_dir / "computer.key").load()
    assert key is not None
    late = payload(
        "lab-1 before the restart",
        "never-seen-run-1",
        run_counter=1,
        generated_at=time.time() - 30,
        gpus=[],
    )
    r = httpx.post(
        f"{c.url}/api/v1/reports",
        content=signed_body(key, ub.computer_id, "never-seen-run-1", 7, late),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 200
    ack = r.json()
    # before: {"applied": true, "code": "new_run"}, the fleet showed run 1's state, and the
    # live run was answered run_retired at its next report
    assert (ack["applied"], ack["code"], ack["current_run_counter"]) == (
        False,
        "run_outdated",
        2,
    )
    seq_then = live.seq
    wait_until(lambda: _row(c, ub.computer_id).seq > seq_then, timeout_s=30)
    now = _row(c, ub.computer_id)
    assert (now.run_id, now.run_counter) == (live.run_id, 2)  # the live run goes on
    assert c.computer(ub.computer_id)["name"] == "lab-1"
    assert "retired this run" not in ub.broker.log()

    # the data dir goes back in time (restored from a backup): the new run takes counter 1,
    # is refused once, and continues with 3 (above the coordinator's 2): no loop
    _restart(ub, counter=0)
    wait_until(lambda: _row(c, ub.computer_id).run_counter == 3, timeout_s=30)
    assert counter_file.read_text() == "3\n"
    seq_then = _row(c, ub.computer_id).seq
    wait_until(lambda: _row(c, ub.computer_id).seq > seq_then, timeout_s=30)
    assert _row(c, ub.computer_id).run_counter == 3
    assert ub.broker.log().count("coordinator's current run has run counter 2") == 1
    assert ub.link()["link"] == "ok"
