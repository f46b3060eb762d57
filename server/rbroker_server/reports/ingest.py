"""The report path put together (architecture.md §7, §10).

`steps` is the one decision procedure, written as a generator apart from its input and
output: it yields `LOAD` when it needs the computer's row (the driver sends back a fresh
`ComputerView`, or None) and a `service.Write` when it has something to write (the driver
sends back the `service.Outcome`), and returns the answer (`schema.Ack`, a `ReportAck`).

`ReportIngest.handle` drives it for the HTTP route (and for the benchmark, which calls what
the route calls): the view comes from a `ComputerCache`, the row is read only on a miss or
when a write did not apply (through a `ViewLoader`: the reads asked for meanwhile share one
statement), and writes go through the app's `GroupCommitWriter`; parsing,
the signature check and decoding run on the event loop.

Whatever a cached view decides is checked again by the write's conditional UPDATE; an
outcome other than "applied", or a refusal on a cached view, is decided again on a fresh
row, so the answers are those a fresh read would give. A report is answered `run_retired`
only when its write found the run recorded and the computer's current run another; a new
run made current after the view was read (by an earlier report of the same batch, or by
another process) is decided again as the current run.
"""

from __future__ import annotations

import functools
from collections.abc import Generator
from datetime import datetime
from typing import Any, Final

from sqlalchemy.engine import Engine

from rbroker_protocol.signing import Envelope
from rbroker_server.metrics import health
from rbroker_server.reports import service
from rbroker_server.reports.cache import ComputerCache, ComputerView, ViewLoader
from rbroker_server.reports.schema import Ack, encode_ack
from rbroker_server.reports.service import (
    Checked,
    ComputerRevoked,
    Outcome,
    ReportInvalid,
    ReportUnauthenticated,
    Write,
)
from rbroker_server.reports.writer import GroupCommitWriter
from rbroker_server.settings import Settings
from rbroker_server.usage.bound import UsageNames

LOAD: Final = "load"
"""What `steps` yields for the computer's row."""

_ATTEMPTS: Final = 4
"""Decisions at most per report (a cached view, then fresh rows); past it `superseded`."""

Steps = Generator[str | Write, Any, Ack]


def steps(settings: Settings, env: Envelope, cached: ComputerView | None, now: datetime) -> Steps:
    """Decide one report (see the module's docstring); `cached`: a view to start from.

    Raises (out of the generator):
        ReportUnauthenticated, ComputerRevoked, ReportInvalid, PayloadNestedTooDeeply.
    """
    view = cached
    fresh = reload = view is None
    verified_key: str | None = None
    payload = b""
    checked: Checked | None = None
    for _ in range(_ATTEMPTS):
        if reload:
            view = yield LOAD
            fresh, reload = True, False
        if view is None:
            raise ReportUnauthenticated("unknown computer")
        if verified_key != view.public_key:
            try:
                payload = service.verify(env, view)
            except ReportUnauthenticated:
                if fresh:
                    raise
                reload = True  # the key may have changed since the view was cached
                continue
            verified_key = view.public_key
        if view.revoked:
            raise ComputerRevoked
        if checked is None:
            try:
                checked = service.decode(env, payload, now)
            except ReportInvalid:
                if fresh:
                    raise
                reload = True  # a computer revoked meanwhile gets its 403 first
                continue
        decision = service.plan(checked, view, now, settings)
        if isinstance(decision, Ack):
            if fresh:
                return decision
        else:
            outcome: Outcome = yield decision
            if outcome == "applied":
                return decision.answer()
            # "run_exists": the run's row exists and the computer's current run is another
            # (read in the write's transaction); "run_current": the run became current
            # after the view was read (an earlier report of the batch, another process),
            # so the report is decided again as one of the current run (seq order)
            if outcome == "run_exists" and fresh:
                return service.not_applied(
                    env, "run_retired", f"not applied: run {env.run_id} was replaced by another run"
                )
        reload = True
    reason = "not applied: a newer report was applied meanwhile"
    return service.not_applied(env, "superseded", reason)


class ReportIngest:
    """The report path of one app: its settings, engine, sender cache and writer.

    `start` and `close` follow the app's lifespan.
    """

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings
        self.cache = ComputerCache()
        self.loader = ViewLoader(engine, self.cache)
        self.usage_names = UsageNames(settings.usage_names_per_day)
        self.writer = GroupCommitWriter(
            engine, apply=functools.partial(service.write_many, names=self.usage_names)
        )

    def start(self) -> None:
        """Start the writer thread."""
        self.writer.start()

    def close(self) -> None:
        """Apply and answer what is queued, then stop the writer thread (blocks)."""
        self.writer.close()

    async def handle(self, body: bytes, received_at: datetime) -> bytes:
        """Verify and apply one report envelope; the JSON bytes of its `ReportAck`.

        Raises:
            ReportTooLarge, ReportUnauthenticated, ComputerRevoked, ReportInvalid,
            PayloadNestedTooDeeply; writer.WriterClosed; sqlalchemy.exc.SQLAlchemyError
            (a database fault).
        """
        env = service.parse(body, self.settings)
        cid = env.computer_id
        run = steps(self.settings, env, self.cache.get(cid), received_at)
        reply: Any = None
        try:
            while True:
                step = run.send(reply)
                if isinstance(step, Write):
                    reply = await self.writer.submit(step, cid)
                    if reply == "applied":
                        self.cache.put(cid, step.applied_view())
                else:
                    reply = await self.loader.load(cid)  # and cached
        except StopIteration as done:
            answer: Ack = done.value
            health.report_answered(answer.applied, answer.code)
            return encode_ack(answer)
