"""Run order: a report from a run the coordinator has never seen, generated before the
current run's reports, never replaces the current run (issue: run ids had no order).

Real signed reports over real HTTP to a real coordinator, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import base64
import time

from tests.server.conftest import Coordinator, payload


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
