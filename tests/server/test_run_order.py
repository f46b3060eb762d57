"""Run order: a report from a run the coordinator has never seen, generated before the
current run's reports, never replaces the current run (issue: run ids had no order).

Real signed reports over real HTTP to a real coordinator, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import base64
import time
from datetime import UTC, datetime

from tests.fakes.reports import payload
from tests.server.conftest import Coordinator


def test_a_late_report_of_an_older_run_does_not_replace_the_current_run(
    coordinator: Coordinator,
) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    # run 4 (before a restart) builds a report, which is delayed on its way
    t0 = time.time() - 60
    late = pc.envelope(
        payload(name="before-restart", run_id="run-4", run_counter=4, generated_at=t0),
        run_id="run-4",
        seq=9,
    )
    # run 5 (after the restart) reports first
    current = pc.envelope(
        payload(name="after-restart", run_id="run-5", run_counter=5), run_id="run-5", seq=1
    )
    r = pc.send(current)
    assert (r.json()["applied"], r.json()["code"]) == (True, "new_run")

    # before: applied as a "new_run", the fleet showed the old state, and run 5's next
    # report was answered run_retired (the live broker had to start yet another run)
    r = pc.send(late)
    assert r.status_code == 200
    ack = r.json()
    assert (ack["applied"], ack["code"], ack["current_run_counter"]) == (
        False,
        "run_outdated",
        5,
    )
    assert ack["reason"] == (
        "not applied: run counter 4 is older than the current run's 5; a live broker "
        "continues with a run counter above 5"
    )
    row = coordinator.row(pc.id)
    assert (row.run_id, row.run_counter, row.seq, row.reported_name) == (
        "run-5",
        5,
        1,
        "after-restart",
    )
    # the current run goes on undisturbed
    nxt = pc.envelope(
        payload(name="after-restart", run_id="run-5", run_counter=5), run_id="run-5", seq=2
    )
    assert pc.send(nxt).json()["code"] == "applied"
    # a newer run (the next restart) replaces it; an equal counter (a run restarted after
    # `run_retired` keeps its counter) is not older
    for run, counter in (("run-6", 6), ("run-6b", 6)):
        env = pc.envelope(payload(run_id=run, run_counter=counter), run_id=run, seq=1)
        r = pc.send(env)
        assert (r.json()["applied"], r.json()["code"]) == (True, "new_run"), r.json()
    assert (coordinator.row(pc.id).run_id, coordinator.row(pc.id).run_counter) == ("run-6b", 6)


def test_brokers_without_a_run_counter_are_ordered_by_arrival_as_before(
    coordinator: Coordinator,
) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    old_broker = pc.envelope(payload(run_id="run-a"), run_id="run-a", seq=1)
    assert b'"run_counter":null' in base64.b64decode(old_broker["payload"])
    assert pc.send(old_broker).json()["code"] == "new_run"
    assert coordinator.row(pc.id).run_counter is None
    # an upgraded broker (counter 1) after an old one: accepted
    env = pc.envelope(payload(run_id="run-b", run_counter=1), run_id="run-b", seq=1)
    assert pc.send(env).json()["code"] == "new_run"
    # an old broker's report after it: nothing to compare, ordered by arrival as before
    env = pc.envelope(payload(run_id="run-c"), run_id="run-c", seq=1)
    r = pc.send(env)
    assert (r.json()["code"], r.json()["current_run_counter"]) == ("new_run", None)
    assert coordinator.row(pc.id).run_counter is None


def _fleet_names(coordinator: Coordinator) -> list[str]:
    return [c["reported_name"] for c in coordinator.fleet("vision")["computers"]]


def test_a_late_first_report_of_an_older_run_with_the_same_counter_keeps_the_view(
    coordinator: Coordinator,
) -> None:
    """Runs that counters do not order (a run restarted after `run_retired` keeps its
    counter): the one whose report was generated 10 s earlier, delivered late, is refused
    and the fleet view keeps the newer run's state."""
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    now = time.time()
    late = pc.envelope(
        payload(name="older-run", run_id="run-6a", run_counter=6, generated_at=now - 10),
        run_id="run-6a",
        seq=1,
    )
    current = pc.envelope(
        payload(name="newer-run", run_id="run-6b", run_counter=6, generated_at=now),
        run_id="run-6b",
        seq=1,
    )
    assert pc.send(current).json()["code"] == "new_run"
    assert _fleet_names(coordinator) == ["newer-run"]
    ack = pc.send(late).json()
    assert (ack["applied"], ack["code"], ack["current_run_counter"]) == (
        False,
        "run_outdated",
        6,
    )
    assert ack["reason"] == (
        "not applied: run run-6a reported a state generated 10.000 s before the current "
        "run's latest report"
    )
    assert _fleet_names(coordinator) == ["newer-run"]
    row = coordinator.row(pc.id)
    assert (row.run_id, row.seq, row.reported_name) == ("run-6b", 1, "newer-run")
    # the newer run goes on; a run generated later (the next restart) still takes over
    nxt = pc.envelope(
        payload(name="newer-run", run_id="run-6b", run_counter=6), run_id="run-6b", seq=2
    )
    assert pc.send(nxt).json()["code"] == "applied"
    env = pc.envelope(payload(name="next", run_id="run-6c", run_counter=6), run_id="run-6c", seq=1)
    assert pc.send(env).json()["code"] == "new_run"
    assert _fleet_names(coordinator) == ["next"]


def test_a_newer_report_written_by_another_process_is_checked_by_the_write(
    coordinator: Coordinator,
) -> None:
    """The sender cache holds the current run's time as this process wrote it; when another
    process applied a newer report meanwhile, the conditional UPDATE refuses the late run
    and the fresh read answers `run_outdated`."""
    import sqlalchemy as sa

    from rbroker_server.db.engine import write_transaction
    from rbroker_server.db.models import Computer

    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    now = time.time()
    first = pc.envelope(
        payload(name="newer", run_id="run-b", run_counter=3, generated_at=now - 20),
        run_id="run-b",
    )
    assert pc.send(first).json()["code"] == "new_run"
    table = Computer.__table__  # type: ignore[attr-defined]
    generated = datetime.fromtimestamp(now, UTC)
    with write_transaction(coordinator.engine) as conn:  # "another process", seq 2 at `now`
        conn.execute(
            sa.update(table).where(table.c.id == pc.id).values(seq=2, generated_at=generated)
        )
    late = pc.envelope(
        payload(name="older", run_id="run-a", run_counter=3, generated_at=now - 10),
        run_id="run-a",
    )
    ack = pc.send(late).json()
    assert (ack["code"], ack["current_run_counter"]) == ("run_outdated", 3), ack
    assert _fleet_names(coordinator) == ["newer"]
