"""What the report path knows of each sender, kept between its reports: the public key
with its loaded verify key, the current run, its counter, the last applied seq, when that
report was received and the newest history bucket.

A cached view only saves the read; it never decides. The conditional UPDATE of a report
(`statements.update_computer`) repeats every condition the view was used for (same run and
an older seq, or the old run; not revoked; the same public key), so a view made stale by
another coordinator process on the same database, a revocation or a new key only costs a
0-row update, after which the ingest path reads the row again and decides on that.
Revoked computers are never cached.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

import anyio.to_thread
import nacl.signing
from sqlalchemy.engine import Engine

from rbroker_protocol.signing import EnvelopeError, load_verify_key
from rbroker_server.reports import statements as st

MAX_COMPUTERS: Final = 100_000
"""Views kept at most (≈ 1 KiB each); past it the oldest are dropped first."""


@dataclass(frozen=True, slots=True)
class ComputerView:
    """One computer's row as the report path needs it (`statements.SELECT_COMPUTER`).

    `verify_key` is None when the stored key is not 32 bytes of Ed25519 key material
    (its reports are then refused as unauthenticated).
    """

    public_key: str
    verify_key: nacl.signing.VerifyKey | None
    revoked: bool
    run_id: str | None
    run_counter: int | None
    seq: int | None
    history_at: datetime | None
    generated_at: datetime | None = None
    """When the current run's latest applied report was generated (the computer's clock)."""
    last_seen_at: datetime | None = None
    """When the latest applied report was received (the coordinator's clock)."""

    @classmethod
    def from_row(cls, row: Any) -> ComputerView:
        """A view of a `SELECT_COMPUTER` row."""
        try:
            key: nacl.signing.VerifyKey | None = load_verify_key(row.public_key)
        except EnvelopeError:
            key = None
        return cls(
            public_key=row.public_key,
            verify_key=key,
            revoked=row.revoked_at is not None,
            run_id=row.run_id,
            run_counter=row.run_counter,
            seq=row.seq,
            history_at=row.history_at,
            generated_at=row.generated_at,
            last_seen_at=row.last_seen_at,
        )

    def after(
        self,
        run_id: str,
        seq: int,
        run_counter: int | None,
        history_at: datetime | None,
        generated_at: datetime | None = None,
        last_seen_at: datetime | None = None,
    ) -> ComputerView:
        """This view once a report of (`run_id`, `seq`), generated at `generated_at` and
        received at `last_seen_at`, is applied; `history_at` is the bucket it wrote (None:
        it wrote none)."""
        return replace(
            self,
            run_id=run_id,
            seq=seq,
            run_counter=run_counter,
            history_at=history_at or self.history_at,
            generated_at=generated_at,
            last_seen_at=last_seen_at,
        )


def load_view(engine: Engine, computer_id: str) -> ComputerView | None:
    """Read `computer_id`'s row (None: no such computer).

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database could not be read.
    """
    with engine.connect() as conn:
        row = conn.execute(st.SELECT_COMPUTER, {"w_id": computer_id}).first()
    return None if row is None else ComputerView.from_row(row)


LOAD_CHUNK: Final = 500
"""Computers read by one statement at most (`load_views`; SQLite's bound-parameter limit is
999 on old builds)."""


def load_views(engine: Engine, computer_ids: list[str]) -> dict[str, ComputerView]:
    """Read the rows of `computer_ids` in one connection, `LOAD_CHUNK` ids a statement:
    computer id → view; ids of no computer are left out.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database could not be read.
    """
    views: dict[str, ComputerView] = {}
    with engine.connect() as conn:
        for i in range(0, len(computer_ids), LOAD_CHUNK):
            chunk = computer_ids[i : i + LOAD_CHUNK]
            for row in conn.execute(st.SELECT_COMPUTERS, {"w_ids": chunk}):
                views[row.id] = ComputerView.from_row(row)
    return views


class ViewLoader:
    """Reads computers' rows for the requests of one event loop, several senders in one
    thread hop and one statement: a request that needs a row (`load`) waits for the next
    read, which takes every id asked for since the previous read started, so each answer
    is read after it was asked for. Without it a coordinator that has just started, whose
    senders all miss the cache at once, spent a worker thread, a pooled connection and a
    SELECT on each of them.

    Args:
        engine: where the rows are read.
        cache: where each view read is put (`ComputerCache.put`).
    """

    def __init__(self, engine: Engine, cache: ComputerCache) -> None:
        self.engine = engine
        self.cache = cache
        self._asked: dict[asyncio.AbstractEventLoop, dict[str, list[asyncio.Future[Any]]]] = {}
        self._readers: set[asyncio.Task[None]] = set()  # the loop keeps only weak references

    async def load(self, computer_id: str) -> ComputerView | None:
        """The computer's row, read after this call (None: no such computer).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database could not be read.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        asked = self._asked.get(loop)
        if asked is None:  # no read running on this loop: start one
            asked = self._asked[loop] = {}
            reader = loop.create_task(self._read(loop))
            self._readers.add(reader)
            reader.add_done_callback(self._readers.discard)
        asked.setdefault(computer_id, []).append(future)
        view: ComputerView | None = await future
        return view

    async def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read what was asked, batch after batch, until nothing more is (on `loop`)."""
        batch: dict[str, list[asyncio.Future[Any]]] = {}
        try:
            while batch := self._asked.get(loop) or {}:
                self._asked[loop] = {}
                try:
                    views = await anyio.to_thread.run_sync(load_views, self.engine, list(batch))
                except Exception as exc:
                    _settle(batch, error=exc)
                    continue
                for cid, futures in batch.items():
                    view = views.get(cid)
                    self.cache.put(cid, view)
                    _settle({cid: futures}, view=view)
                batch = {}
        except BaseException as exc:  # cancelled (the loop is closing): nobody left hanging
            _settle(batch, error=exc)
            _settle(self._asked.get(loop) or {}, error=exc)
            raise
        finally:
            self._asked.pop(loop, None)


def _settle(
    asked: dict[str, list[asyncio.Future[Any]]],
    *,
    view: ComputerView | None = None,
    error: BaseException | None = None,
) -> None:
    for futures in asked.values():
        for future in futures:
            if future.done():  # its request was cancelled
                continue
            if isinstance(error, Exception):
                future.set_exception(error)
            elif error is not None:
                future.cancel()
            else:
                future.set_result(view)


class ComputerCache:
    """computer id → `ComputerView`, at most `max_computers` of them (thread-safe: the
    event loop reads while writes settle)."""

    def __init__(self, max_computers: int = MAX_COMPUTERS) -> None:
        self._views: dict[str, ComputerView] = {}
        self._max = max_computers
        self._lock = threading.Lock()

    def get(self, computer_id: str) -> ComputerView | None:
        """The cached view, or None."""
        return self._views.get(computer_id)

    def put(self, computer_id: str, view: ComputerView | None) -> None:
        """Remember `view` (None, or a revoked computer's: forget the computer)."""
        with self._lock:
            self._views.pop(computer_id, None)
            if view is None or view.revoked:
                return
            self._views[computer_id] = view
            while len(self._views) > self._max:  # dicts keep insertion order: oldest first
                del self._views[next(iter(self._views))]

    def __len__(self) -> int:
        return len(self._views)
