"""The report path over real HTTP with its sender cache and writer: what another process
changes in the database (a revocation, a new key) takes effect on the next report of a
computer this coordinator has cached; concurrent reports share commits; concurrent reports
of a fresh computer's first run are all of that run; the writer thread ends with the
app."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import nacl.signing
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from rbroker_protocol import signing
from rbroker_server.admin import operations as admin
from rbroker_server.db import engine as db
from rbroker_server.db.tables import COMPUTERS
from tests.server.conftest import Coordinator

JSON = {"content-type": "application/json"}


@contextlib.contextmanager
def _other_process(c: Coordinator) -> Iterator[Engine]:
    """An engine of its own on the coordinator's database, as another process has."""
    engine = db.make_engine(c.settings.db_url)
    try:
        yield engine
    finally:
        engine.dispose()


def test_a_revocation_by_another_process_refuses_the_next_report(
    coordinator: Coordinator,
) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    assert pc.report().json()["applied"] is True  # cached from here on
    with _other_process(coordinator) as other:
        assert admin.revoke_computer(other, pc.id)
    r = pc.report()
    assert r.status_code == 403, r.text
    assert r.json()["detail"] == "computer revoked"
    row = coordinator.row(pc.id)
    assert (row.seq, row.reports_applied) == (1, 1)
    assert pc.report().status_code == 403


def test_a_new_key_written_by_another_process_takes_effect_at_once(
    coordinator: Coordinator,
) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    assert pc.report().json()["applied"] is True  # the old key is cached
    new_key = nacl.signing.SigningKey.generate()
    with _other_process(coordinator) as other, other.begin() as conn:
        conn.execute(
            sa.update(COMPUTERS)
            .where(COMPUTERS.c.id == pc.id)
            .values(public_key=signing.public_key_b64(new_key))
        )
    old = pc.report()
    assert old.status_code == 401, old.text
    assert coordinator.row(pc.id).seq == 1
    pc.key = new_key
    new = pc.report()
    assert new.status_code == 200, new.text
    assert new.json()["code"] == "applied"
    # the computer enrolled again (a new identity) reports beside the old one
    again = coordinator.enroll("vision", "lab-1")
    assert again.id != pc.id
    assert again.report().json()["code"] == "new_run"
    assert pc.report().json()["code"] == "applied"


def _post(c: Coordinator, env: dict[str, Any]) -> dict[str, Any]:
    r = c.http.post("/api/v1/reports", content=signing.encode_envelope(env), headers=JSON)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def test_another_process_changing_the_run_is_decided_on_the_fresh_row(
    coordinator_factory: Callable[..., Coordinator],
) -> None:
    one = coordinator_factory()
    two = coordinator_factory()
    one.group("vision")
    pc = one.enroll("vision")
    assert _post(one, pc.envelope())["code"] == "new_run"
    # the broker restarts; its new run reaches the other coordinator first
    pc.run_id, pc.seq = "run-2", 0
    assert _post(two, pc.envelope())["code"] == "new_run"
    # `one` still has run-1 cached: run-2's next report is applied there as the same run
    assert _post(one, pc.envelope())["code"] == "applied"
    # and a late report of run-1 is told its run is retired, not that it is newer
    assert _post(one, pc.envelope(run_id="run-1", seq=5))["code"] == "run_retired"
    assert (one.row(pc.id).run_id, one.row(pc.id).seq) == ("run-2", 2)


@contextlib.contextmanager
def _writes_held(c: Coordinator, ids: list[str]) -> Iterator[None]:
    """Another connection holds what the writer needs: SQLite's write lock, or the rows of
    `ids` on PostgreSQL."""
    with _other_process(c) as other, other.connect() as conn:
        if c.backend == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.execute(sa.select(COMPUTERS.c.id).where(COMPUTERS.c.id.in_(ids)).with_for_update())
        try:
            yield
        finally:
            conn.rollback()


def test_concurrent_reports_share_commits(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    computers = [coordinator.enroll("vision", f"pc-{i}") for i in range(24)]
    for pc in computers:
        assert pc.report().status_code == 200  # enrolled and cached
    commits = [0]

    def on_commit(_conn: Any) -> None:
        commits[0] += 1

    answers: list[httpx.Response] = []

    def send(body: bytes) -> None:
        with httpx.Client(base_url=coordinator.url, timeout=30) as http:
            answers.append(http.post("/api/v1/reports", content=body, headers=JSON))

    bodies = [signing.encode_envelope(pc.envelope()) for pc in computers]
    sa.event.listen(coordinator.engine, "commit", on_commit)
    with _writes_held(coordinator, [pc.id for pc in computers]):
        threads = [threading.Thread(target=send, args=(b,)) for b in bodies]
        for t in threads:
            t.start()
        threading.Event().wait(1.5)  # all of them arrive and queue behind the held lock
    for t in threads:
        t.join(30)
    sa.event.remove(coordinator.engine, "commit", on_commit)
    assert [r.status_code for r in answers] == [200] * len(bodies)
    assert all(r.json()["applied"] for r in answers)
    assert commits[0] < len(bodies) // 2, commits  # typically 2: the first report, the rest
    for pc in computers:
        assert coordinator.row(pc.id).seq == 2


@pytest.mark.parametrize("processes", [1, 2])
def test_concurrent_reports_of_a_new_run_are_never_told_it_is_retired(
    coordinator_factory: Callable[..., Coordinator], processes: int
) -> None:
    # a fresh computer sends its first run's reports over 16 connections at once (on two
    # coordinator processes: alternately to each); all of them are of its only run
    coordinators = [coordinator_factory() for _ in range(processes)]
    coordinators[0].group("vision")
    pc = coordinators[0].enroll("vision")
    pc.run_id = "run-f3"
    bodies = [signing.encode_envelope(pc.envelope(seq=seq)) for seq in range(1, 17)]
    start = threading.Barrier(len(bodies))
    answers: dict[int, httpx.Response] = {}

    def send(seq: int, body: bytes) -> None:
        c = coordinators[seq % processes]
        with httpx.Client(base_url=c.url, timeout=30) as http:
            http.get("/healthz")  # connected before the barrier
            start.wait(10)
            answers[seq] = http.post("/api/v1/reports", content=body, headers=JSON)

    threads = [threading.Thread(target=send, args=(i + 1, b)) for i, b in enumerate(bodies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(answers) == list(range(1, 17))
    assert all(r.status_code == 200 for r in answers.values()), [r.text for r in answers.values()]
    codes = [answers[seq].json()["code"] for seq in sorted(answers)]
    assert codes.count("new_run") == 1, codes
    assert set(codes) <= {"new_run", "applied", "not_newer", "superseded"}, codes
    assert answers[16].json()["applied"] is True
    row = coordinators[0].row(pc.id)
    assert (row.run_id, row.seq) == ("run-f3", 16)
    assert row.reports_applied == sum(r.json()["applied"] for r in answers.values())


def test_the_writer_thread_ends_with_the_app(
    coordinator_factory: Callable[..., Coordinator],
) -> None:
    before = {t for t in threading.enumerate() if t.name == "report-writer"}
    c = coordinator_factory()
    c.group("vision")
    assert c.enroll("vision").report().status_code == 200
    started = {t for t in threading.enumerate() if t.name == "report-writer"} - before
    assert len(started) == 1
    c.stop()
    assert not [t for t in started if t.is_alive()]
