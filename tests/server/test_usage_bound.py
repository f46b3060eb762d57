"""What one computer can add to the usage history, and what one usage read answers: at most
`usage_names_per_day` pairs of project and owner per computer and UTC day (the rest of its
usage summed under `(other)`, nothing lost), known again by a coordinator that restarts,
and reads that show the `top` names with the rest summed (over HTTP, on SQLite and
PostgreSQL)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import date
from typing import Any

import pytest
import sqlalchemy as sa

from rbroker_protocol.reports import LeaseReport
from rbroker_protocol.usage import OTHER_NAME, UsageView
from rbroker_server.db import engine as db
from rbroker_server.usage.bound import UsageNames
from tests.fakes.reports import GPU_A, payload
from tests.server.conftest import Coordinator, EnrolledComputer

HOUR = 3600.0


def _leases(projects: list[str], mib: int = 1024) -> list[LeaseReport]:
    """One lease of `mib` MiB per project, all owned by alice."""
    return [
        LeaseReport(
            lease_id=f"lease-{i}", gpu_uuids=[GPU_A], granted_mib=mib, owner="alice", project=p
        )
        for i, p in enumerate(projects)
    ]


def _report(pc: EnrolledComputer, projects: list[str], **kw: Any) -> None:
    r = pc.report(payload(leases=_leases(projects), run_id=pc.run_id), **kw)
    assert r.status_code == 200 and r.json()["applied"], r.text


def _rows(c: Coordinator, computer_id: str) -> dict[str, float]:
    """project → granted MiB-hours of the computer's rows (every day)."""
    with c.engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT project, sum(granted_mib_hours) FROM daily_usage "
                "WHERE computer_id = :c GROUP BY project"
            ),
            {"c": computer_id},
        ).all()
    return {r[0]: float(r[1]) for r in rows}


def test_a_computer_adds_at_most_its_pairs_a_day_and_the_rest_counts_as_other(
    coordinator_factory: Callable[..., Coordinator],
) -> None:
    c = coordinator_factory(usage_names_per_day=3)
    c.group("alpha")
    pc = c.enroll("alpha")
    other_pc = c.enroll("alpha", "lab-2")
    _report(pc, [f"p{i}" for i in range(5)])  # a run's first report adds nothing
    _report(other_pc, ["q0"])
    time.sleep(0.1)
    _report(pc, [f"p{i}" for i in range(5)])
    rows = _rows(c, pc.id)
    assert set(rows) == {"p0", "p1", "p2", OTHER_NAME}  # three pairs, then (other)
    assert rows[OTHER_NAME] == pytest.approx(2 * rows["p0"])  # p3 and p4: nothing lost
    # renaming at every report adds no row: new pairs go to (other), known ones to theirs
    for n in range(3):
        time.sleep(0.05)
        _report(pc, ["p0", *[f"r{n}-{i}" for i in range(40)]])
    rows = _rows(c, pc.id)
    assert set(rows) == {"p0", "p1", "p2", OTHER_NAME}
    # another computer has a bound of its own
    time.sleep(0.05)
    _report(other_pc, ["q0", "q1", "q2", "q3"])
    assert set(_rows(c, other_pc.id)) == {"q0", "q1", "q2", OTHER_NAME}

    # a restarted coordinator (a new sender cache and writer) reads the pairs again
    c2 = coordinator_factory(usage_names_per_day=3)
    _report(pc, ["n0"])  # the run's next report, to the new coordinator
    time.sleep(0.05)
    before = _rows(c2, pc.id)[OTHER_NAME]
    _report(pc, ["n1"])
    after = _rows(c2, pc.id)
    assert set(after) == {"p0", "p1", "p2", OTHER_NAME} and after[OTHER_NAME] > before

    # the read sums every row of the group: (other) is a name like any other
    r = c.http.get("/api/v1/usage?days=1", headers=c.viewer("alpha"))
    totals = {t["name"]: t["granted_mib_hours"] for t in r.json()["totals"]}
    assert totals[OTHER_NAME] == pytest.approx(
        after[OTHER_NAME] + _rows(c, other_pc.id)[OTHER_NAME], abs=0.002
    )


def test_usage_names_read_the_table_and_forget_the_oldest(
    coordinator: Coordinator,
) -> None:
    """The bound on its own: pairs known from the table on a miss, a computer forgotten
    past `max_pairs_kept` read again (never exceeded), rows of one pair merged, days and
    computers apart."""
    coordinator.group("alpha")
    a, b = coordinator.enroll("alpha").id, coordinator.enroll("alpha", "lab-2").id
    today, tomorrow = date(2026, 12, 6), date(2026, 12, 7)

    def row(cid: str, day: date, project: str, mib_hours: float = 1.0) -> dict[str, Any]:
        return {
            "computer_id": cid,
            "day": day,
            "project": project,
            "owner": "alice",
            "granted_mib_hours": mib_hours,
            "used_mib_hours": 0.0,
        }

    with db.write_transaction(coordinator.engine) as conn:
        conn.execute(
            sa.text(
                "INSERT INTO daily_usage VALUES (:c, :d, 'old', 'alice', 5.0, 0.0)"
                if coordinator.engine.dialect.name == "sqlite"
                else "INSERT INTO daily_usage (computer_id, day, project, owner, "
                "granted_mib_hours, used_mib_hours) VALUES (:c, :d, 'old', 'alice', 5.0, 0.0)"
            ),
            {"c": a, "d": today},
        )
    names = UsageNames(per_day=2, max_pairs_kept=3)
    with coordinator.engine.connect() as conn:
        out = names.bounded(
            conn,
            [
                row(a, today, "new"),
                row(a, today, "x"),
                row(a, today, "y", 2.0),
                row(a, tomorrow, "x"),
                row(b, today, "x"),
                row(a, today, "old"),
            ],
        )
        assert [
            (r["computer_id"], r["day"], r["project"], r["granted_mib_hours"]) for r in out
        ] == [
            (a, today, "new", 1.0),  # "old" (in the table) and "new": the two pairs
            (a, today, OTHER_NAME, 3.0),  # x and y, merged into one row
            (a, tomorrow, "x", 1.0),
            (b, today, "x", 1.0),
            (a, today, "old", 1.0),
        ]
        assert out[1]["owner"] == OTHER_NAME
        assert len(names) == 3  # the computers written least recently forgotten
        assert names.bounded(conn, [row(a, today, "z")])[0]["project"] == OTHER_NAME
        # one pair kept: a computer forgotten is read again from the table (where only
        # "old" is: nothing above was written)
        small = UsageNames(per_day=2, max_pairs_kept=1)
        assert small.bounded(conn, [row(a, today, "z")])[0]["project"] == "z"
        assert small.bounded(conn, [row(b, today, "q")])[0]["project"] == "q"
        assert len(small) == 1
        assert small.bounded(conn, [row(a, today, "w")])[0]["project"] == "w"


def _report_at(pc: EnrolledComputer, projects: list[str], mib: list[int]) -> None:
    leases = [
        LeaseReport(
            lease_id=f"lease-{i}", gpu_uuids=[GPU_A], granted_mib=m, owner="alice", project=p
        )
        for i, (p, m) in enumerate(zip(projects, mib, strict=True))
    ]
    r = pc.report(payload(leases=leases, run_id=pc.run_id))
    assert r.status_code == 200 and r.json()["applied"], r.text


def test_a_read_shows_the_top_names_and_sums_the_rest(coordinator: Coordinator) -> None:
    c = coordinator
    c.group("alpha")
    pc = c.enroll("alpha")
    projects = [f"p{i}" for i in range(6)]
    mib = [6000, 5000, 4000, 3000, 2000, 1000]  # p0 the most granted
    _report_at(pc, projects, mib)
    time.sleep(0.1)
    _report_at(pc, projects, mib)

    def read(query: str) -> dict[str, Any]:
        r = c.http.get(f"/api/v1/usage{query}", headers=c.viewer("alpha"))
        assert r.status_code == 200, r.text
        UsageView.model_validate(r.json())
        return dict(r.json())

    whole = read("?days=1")
    assert whole["names_left_out"] == 0 and len(whole["totals"]) == 6
    everything = sum(t["granted_mib_hours"] for t in whole["totals"])
    top = read("?days=1&top=2")
    assert top["names_left_out"] == 4
    names = [t["name"] for t in top["totals"]]
    assert names == ["p0", "p1", OTHER_NAME]  # p0 and p1, the rest summed
    granted = {t["name"]: t["granted_mib_hours"] for t in top["totals"]}
    assert granted[OTHER_NAME] == pytest.approx(granted["p0"] * 10 / 6, abs=0.002)
    assert sum(granted.values()) == pytest.approx(everything, abs=0.003)
    assert {d["name"] for d in top["usage"]} == {"p0", "p1", OTHER_NAME}
    csv_text = c.http.get("/api/v1/usage?days=1&top=1&format=csv", headers=c.viewer("alpha")).text
    assert {line.split(",")[1] for line in csv_text.splitlines()[1:]} == {"p0", OTHER_NAME}


def test_the_usage_page_says_how_many_names_it_summed(coordinator: Coordinator) -> None:
    from tests.server.test_web import sign_in

    c = coordinator
    c.group("alpha")
    pc = c.enroll("alpha")
    projects = [f"p{i}" for i in range(3)]
    _report_at(pc, projects, [3000, 2000, 1000])
    time.sleep(0.05)
    _report_at(pc, projects, [3000, 2000, 1000])
    client, _ = sign_in(c, c.tokens["alpha"])
    try:
        page = client.get("/usage?days=7&top=1")
        assert page.status_code == 200, page.text
        assert "2 more projects with less usage are summed as (other)" in page.text
        assert "usage-left-out" not in client.get("/usage?days=7").text
    finally:
        client.close()
