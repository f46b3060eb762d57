"""The report writer on a real database (SQLite file, or PostgreSQL with
RBROKER_TEST_PG_URL): queued writes commit together, a failing one fails alone, two reports
of one computer in one batch keep their order, and closing answers what is queued."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

import nacl.signing
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from rbroker_protocol import signing
from rbroker_protocol.enroll import EnrollRequest
from rbroker_protocol.reports import LeaseReport
from rbroker_server.admin import operations as admin
from rbroker_server.db import engine as db
from rbroker_server.db.tables import COMPUTERS, HEALTH
from rbroker_server.enroll import service as enroll_service
from rbroker_server.reports import service
from rbroker_server.reports.cache import load_view
from rbroker_server.reports.ingest import ReportIngest
from rbroker_server.reports.writer import GroupCommitWriter, WriterClosed
from rbroker_server.settings import Settings
from tests.fakes.reports import GPU_A, payload, signed_body


def _count_commits(engine: Engine) -> list[int]:
    commits = [0]

    def on_commit(_conn: Any) -> None:
        commits[0] += 1

    sa.event.listen(engine, "commit", on_commit)
    return commits


def _insert(name: str) -> Callable[[Connection], str]:
    def work(conn: Connection) -> str:
        conn.execute(sa.insert(HEALTH).values(name=name, checked_at=db.utcnow()))
        return name

    return work


class _Gate:
    """A job that holds the writer inside its transaction until `open()`."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self._open = threading.Event()

    def __call__(self, conn: Connection) -> str:
        self.started.set()
        assert self._open.wait(20)
        return _insert("gate")(conn)

    def open(self) -> None:
        self._open.set()


async def _held(writer: GroupCommitWriter, gate: _Gate) -> asyncio.Future[Any]:
    """Submit `gate` and wait until the writer runs it (later jobs then queue)."""
    held = asyncio.ensure_future(writer.submit(gate))
    assert await asyncio.to_thread(gate.started.wait, 10)
    return held


async def _queued(*aws: Any) -> list[asyncio.Future[Any]]:
    futures = [asyncio.ensure_future(a) for a in aws]
    for _ in range(3):  # each task runs up to its wait for the writer
        await asyncio.sleep(0)
    return futures


def _names(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(sa.select(HEALTH.c.name)).scalars())


def test_queued_writes_commit_in_one_transaction(engine: Engine) -> None:
    writer = GroupCommitWriter(engine)
    writer.start()
    commits = _count_commits(engine)
    gate = _Gate()

    async def main() -> list[Any]:
        held = await _held(writer, gate)
        rest = await _queued(*(writer.submit(_insert(f"job-{i}")) for i in range(20)))
        gate.open()
        return await asyncio.gather(held, *rest)

    try:
        results = asyncio.run(main())
    finally:
        writer.close()
    assert results == ["gate", *(f"job-{i}" for i in range(20))]
    assert commits[0] == 2  # the gate's batch, then all 20 queued meanwhile
    assert _names(engine) == set(results)


def test_a_failing_write_fails_alone(engine: Engine) -> None:
    writer = GroupCommitWriter(engine)
    writer.start()
    gate = _Gate()

    def fault(conn: Connection) -> None:
        _insert("fault")(conn)
        raise sa.exc.OperationalError("UPDATE computers", {}, OSError("disk I/O error"))

    async def main() -> list[Any]:
        held = await _held(writer, gate)
        rest = await _queued(
            writer.submit(_insert("good-1")),
            writer.submit(_insert("gate")),  # violates the unique name: IntegrityError
            writer.submit(_insert("good-2")),
            writer.submit(fault),
            writer.submit(_insert("good-3")),
        )
        gate.open()
        return await asyncio.gather(held, *rest, return_exceptions=True)

    try:
        results = asyncio.run(main())
    finally:
        writer.close()
    assert results[:2] == ["gate", "good-1"]
    assert isinstance(results[2], sa.exc.IntegrityError)
    assert results[3] == "good-2"
    assert isinstance(results[4], sa.exc.OperationalError)
    assert results[5] == "good-3"
    assert _names(engine) == {"gate", "good-1", "good-2", "good-3"}  # nothing of the failures


def test_close_answers_what_is_queued_and_stops_the_thread(engine: Engine) -> None:
    writer = GroupCommitWriter(engine, name="report-writer-close-test")
    writer.start()
    gate = _Gate()

    async def main() -> tuple[list[Any], BaseException | None]:
        held = await _held(writer, gate)
        rest = await _queued(*(writer.submit(_insert(f"job-{i}")) for i in range(5)))
        closing = asyncio.ensure_future(asyncio.to_thread(writer.close))
        await asyncio.sleep(0.05)
        refused: BaseException | None = None
        try:
            await writer.submit(_insert("late"))
        except WriterClosed as exc:
            refused = exc
        gate.open()
        answers = await asyncio.gather(held, *rest)
        await closing
        return answers, refused

    answers, refused = asyncio.run(main())
    assert answers == ["gate", *(f"job-{i}" for i in range(5))]
    assert isinstance(refused, WriterClosed)
    assert "late" not in _names(engine)
    assert not [t for t in threading.enumerate() if t.name == "report-writer-close-test"]


def _enrolled(engine: Engine) -> tuple[str, nacl.signing.SigningKey]:
    admin.create_group(engine, "vision")
    key = nacl.signing.SigningKey.generate()
    code = admin.create_enroll_code(engine, "vision", 600).text
    req = EnrollRequest(code=code, name="lab-1", public_key=signing.public_key_b64(key))
    return enroll_service.enroll(engine, req).computer_id, key


def test_two_reports_of_one_computer_in_one_batch_keep_seq_order(
    engine: Engine, database_url: str, tmp_path: Any
) -> None:
    computer_id, key = _enrolled(engine)
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url)
    ingest = ReportIngest(engine, settings)
    ingest.start()
    commits = _count_commits(engine)

    def body(seq: int) -> bytes:
        return signed_body(key, computer_id, "run-1", seq, payload())

    async def main() -> list[Any]:
        first = await ingest.handle(body(1), db.utcnow())  # the sender is cached from here on
        gate = _Gate()
        held = await _held(ingest.writer, gate)
        before = commits[0]
        batch = await _queued(*(ingest.handle(body(s), db.utcnow()) for s in (3, 2, 4)))
        gate.open()
        answers = await asyncio.gather(*batch)
        await held
        assert commits[0] - before == 2  # the gate's batch and the three reports' batch
        return [first, *answers]

    try:
        answers = [json.loads(a) for a in asyncio.run(main())]
    finally:
        ingest.close()
    assert [a["code"] for a in answers] == ["new_run", "applied", "not_newer", "applied"]
    assert answers[2]["reason"] == "not applied: seq 2 is not newer than 4"
    with engine.connect() as conn:
        row = conn.execute(sa.select(COMPUTERS).where(COMPUTERS.c.id == computer_id)).one()
    assert (row.seq, row.reports_applied) == (4, 3)


def test_a_shared_statement_that_misses_a_row_is_written_one_by_one(
    engine: Engine, database_url: str, tmp_path: Any
) -> None:
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url)
    admin.create_group(engine, "vision")
    senders = []
    for name in ("lab-1", "lab-2", "lab-3"):
        key = nacl.signing.SigningKey.generate()
        code = admin.create_enroll_code(engine, "vision", 600).text
        req = EnrollRequest(code=code, name=name, public_key=signing.public_key_b64(key))
        senders.append((enroll_service.enroll(engine, req).computer_id, key))

    def write_of(
        cid: str, key: nacl.signing.SigningKey, seq: int, stale_key: bool, now: datetime
    ) -> Any:
        env = service.parse(signed_body(key, cid, "run-1", seq, payload()), settings)
        view = load_view(engine, cid)
        assert view is not None
        checked = service.decode(env, service.verify(env, view), now)
        if stale_key:  # as a cached view from before the key changed
            view = dataclasses.replace(view, public_key="stale")
        return service.plan(checked, view, now, settings)

    for cid, key in senders:
        with db.write_transaction(engine) as conn:
            assert service.write(conn, write_of(cid, key, 1, False, db.utcnow())) == "applied"
    now = db.utcnow()  # one time for the three: one variant of the statement
    writes = [write_of(cid, key, 2, i == 1, now) for i, (cid, key) in enumerate(senders)]
    assert len({id(w.statement) for w in writes}) == 1  # one executemany for the three
    with db.write_transaction(engine) as conn:
        assert service.write_many(conn, writes) == ["applied", "not_updated", "applied"]
    with engine.connect() as conn:
        seqs = dict(conn.execute(sa.select(COMPUTERS.c.id, COMPUTERS.c.seq)).all())
    assert [seqs[cid] for cid, _ in senders] == [2, 1, 2]


def test_reports_of_one_new_run_in_one_batch_are_decided_as_that_run(
    engine: Engine, database_url: str, tmp_path: Any
) -> None:
    # a fresh computer's first run: every report is planned as "new run" from the same
    # fresh row; only the first applies as one, the others are of the run it made current
    computer_id, key = _enrolled(engine)
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url)
    ingest = ReportIngest(engine, settings)
    ingest.start()
    seqs = (3, 1, 5, 4, 2)
    submitted = [0]
    submit = ingest.writer.submit

    async def counted(work: Any, key: str = "") -> Any:
        submitted[0] += 1
        return await submit(work, key)

    ingest.writer.submit = counted  # type: ignore[method-assign]

    def body(seq: int) -> bytes:
        return signed_body(key, computer_id, "run-f3", seq, payload(run_id="run-f3"))

    async def main() -> list[Any]:
        gate = _Gate()
        held = await _held(ingest.writer, gate)
        tasks = [asyncio.ensure_future(ingest.handle(body(s), db.utcnow())) for s in seqs]
        for _ in range(1000):  # each reads the row (no view is cached) and queues its write
            if submitted[0] == 1 + len(seqs):
                break
            await asyncio.sleep(0.01)
        assert submitted[0] == 1 + len(seqs)
        gate.open()
        answers = await asyncio.gather(*tasks)
        await held
        return list(answers)

    try:
        answers = [json.loads(a) for a in asyncio.run(main())]
    finally:
        ingest.close()
    codes = [a["code"] for a in answers]
    assert codes.count("new_run") == 1, codes
    assert set(codes) <= {"new_run", "applied", "not_newer"}, codes
    assert answers[seqs.index(5)]["applied"] is True
    with engine.connect() as conn:
        row = conn.execute(sa.select(COMPUTERS).where(COMPUTERS.c.id == computer_id)).one()
    assert (row.run_id, row.seq) == ("run-f3", 5)
    assert row.reports_applied == sum(a["applied"] for a in answers)


def test_a_new_run_written_earlier_in_the_transaction_is_current_not_retired(
    engine: Engine, database_url: str, tmp_path: Any
) -> None:
    computer_id, key = _enrolled(engine)
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url)

    def write_of(run_id: str, seq: int) -> Any:
        env = service.parse(
            signed_body(key, computer_id, run_id, seq, payload(run_id=run_id)), settings
        )
        view = load_view(engine, computer_id)
        assert view is not None
        now = db.utcnow()
        checked = service.decode(env, service.verify(env, view), now)
        return service.plan(checked, view, now, settings)

    writes = [write_of("run-f3", seq) for seq in (1, 2, 3)]
    assert all(w.new_run for w in writes)  # all planned from the row before the run
    with db.write_transaction(engine) as conn:
        assert service.write_many(conn, writes) == ["applied", "run_current", "run_current"]
    # a run really replaced by another is retired
    old = write_of("run-f3", 9)  # planned while run-f3 is current: a same-run write
    assert not old.new_run
    with db.write_transaction(engine) as conn:
        assert service.write(conn, write_of("run-g4", 1)) == "applied"
    late = write_of("run-f3", 10)
    assert late.new_run
    with db.write_transaction(engine) as conn:
        assert service.write(conn, late) == "run_exists"
        assert service.write(conn, old) == "not_updated"
    with engine.connect() as conn:
        row = conn.execute(sa.select(COMPUTERS).where(COMPUTERS.c.id == computer_id)).one()
    assert (row.run_id, row.seq, row.reports_applied) == ("run-g4", 1, 2)


def test_the_writer_keeps_the_pairs_it_wrote_instead_of_reading_them_per_batch(
    engine: Engine, database_url: str, tmp_path: Any
) -> None:
    """The ingest's `UsageNames` is the one the writes use, also while it is empty (an
    empty one is falsy: a new one had been made, and the table read, for every batch)."""
    computer_id, key = _enrolled(engine)
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url)
    ingest = ReportIngest(engine, settings)
    ingest.start()
    lease = LeaseReport(lease_id="lease-1", gpu_uuids=[GPU_A], granted_mib=1024, project="p")
    reads: list[str] = []

    def on_execute(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "daily_usage" in statement and statement.lstrip().upper().startswith("SELECT"):
            reads.append(statement)

    sa.event.listen(engine, "before_cursor_execute", on_execute)

    async def main() -> list[Any]:
        answers = []
        for seq in range(1, 5):  # each alone in its batch
            body = signed_body(key, computer_id, "run-1", seq, payload(leases=[lease]))
            answers.append(await ingest.handle(body, db.utcnow()))
        return answers

    try:
        answers = [json.loads(a) for a in asyncio.run(main())]
    finally:
        ingest.close()
        sa.event.remove(engine, "before_cursor_execute", on_execute)
    assert [a["applied"] for a in answers] == [True] * 4
    assert len(ingest.usage_names) == 1  # (p, "") of today
    assert len(reads) == 1  # the computer's pairs read once, at the first usage row
