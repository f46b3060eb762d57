"""Reading senders' rows for the report path on a real database (SQLite file, or PostgreSQL
with RBROKER_TEST_PG_URL): the reads asked for meanwhile share one statement, each answer
is read after it was asked for, and a database fault reaches every request waiting."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import nacl.signing
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from rbroker_protocol import signing
from rbroker_protocol.enroll import EnrollRequest
from rbroker_server.admin import operations as admin
from rbroker_server.db import engine as db
from rbroker_server.db.tables import COMPUTERS
from rbroker_server.enroll import service as enroll_service
from rbroker_server.reports.cache import ComputerCache, ViewLoader
from rbroker_server.reports.ingest import ReportIngest
from rbroker_server.settings import Settings
from tests.fakes.reports import payload, signed_body


def _enrolled(engine: Engine, n: int) -> list[tuple[str, nacl.signing.SigningKey]]:
    admin.create_group(engine, "vision")
    out = []
    for i in range(n):
        key = nacl.signing.SigningKey.generate()
        code = admin.create_enroll_code(engine, "vision", 600).text
        req = EnrollRequest(code=code, name=f"lab-{i}", public_key=signing.public_key_b64(key))
        out.append((enroll_service.enroll(engine, req).computer_id, key))
    return out


def _computer_reads(engine: Engine) -> list[str]:
    """The SELECTs of the computers table run from now on (their SQL)."""
    reads: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM computers" in statement:
            reads.append(statement)

    sa.event.listen(engine, "before_cursor_execute", seen)
    return reads


def test_first_reports_of_many_senders_share_one_read(
    engine: Engine, database_url: str, tmp_path: Any
) -> None:
    senders = _enrolled(engine, 20)
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url)
    ingest = ReportIngest(engine, settings)
    ingest.start()
    reads = _computer_reads(engine)

    async def main() -> list[bytes]:
        bodies = [signed_body(key, cid, "run-1", 1, payload()) for cid, key in senders]
        return await asyncio.gather(*(ingest.handle(b, db.utcnow()) for b in bodies))

    try:
        answers = [json.loads(a) for a in asyncio.run(main())]
    finally:
        ingest.close()
    assert [a["code"] for a in answers] == ["new_run"] * len(senders)
    # none was cached: one read for the twenty (a second only if some asked after it began)
    assert 1 <= len(reads) <= 2, reads
    assert len(ingest.cache) == len(senders)


def test_a_load_asked_during_a_read_is_read_again_after_it(engine: Engine) -> None:
    (first, _), (second, _) = _enrolled(engine, 2)
    loader = ViewLoader(engine, ComputerCache())
    reading, go_on = threading.Event(), threading.Event()
    held = [True]

    def hold(*_: Any) -> None:  # the first read waits here, in its worker thread
        if held[0]:
            held[0] = False
            reading.set()
            assert go_on.wait(10)

    sa.event.listen(engine, "before_cursor_execute", hold)

    async def main() -> tuple[Any, Any, Any]:
        early = asyncio.ensure_future(loader.load(first))
        await asyncio.to_thread(reading.wait, 10)
        late = asyncio.ensure_future(loader.load(second))
        await asyncio.sleep(0)  # asked while the first read is under way
        with engine.begin() as conn:  # written after the first read began
            conn.execute(sa.update(COMPUTERS).where(COMPUTERS.c.id == second).values(seq=41))
        go_on.set()
        return await early, await late, await loader.load("c_nobody")

    early, late, nobody = asyncio.run(main())
    assert early is not None and early.seq is None
    assert late is not None and late.seq == 41  # not the answer of the read under way
    assert nobody is None
    assert loader.cache.get(second) == late


def test_a_database_fault_reaches_every_request_waiting(tmp_path: Any) -> None:
    engine = db.make_engine(f"sqlite:///{(tmp_path / 'empty.db').as_posix()}")  # no tables
    loader = ViewLoader(engine, ComputerCache())

    async def main() -> list[Any]:
        return await asyncio.gather(
            *(loader.load(f"c_{i}") for i in range(3)), return_exceptions=True
        )

    try:
        outcomes = asyncio.run(main())
    finally:
        engine.dispose()
    assert all(isinstance(o, sa.exc.OperationalError) for o in outcomes), outcomes
    assert len(loader.cache) == 0
