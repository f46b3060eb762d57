"""Group commit: one writer thread per coordinator app applies the report writes of all
its requests, as many as have queued up in one transaction.

A request hands its write (a function of a connection) to `GroupCommitWriter.submit` and
awaits the outcome. The thread takes what the queue holds (at most `max_batch` jobs),
runs the jobs in one transaction (`db.write_transaction`) and answers each once it has
committed: an answer never precedes durability. Under load it first lingers `LINGER_S`,
so that more jobs share a commit. Jobs of a batch run in order of their key (a computer
id) and, for one key, in the order they came, so two reports of one computer in a batch
are ordered by the second's conditional UPDATE seeing the first's effect, and writers of
several processes take row locks in one order (no deadlocks between batches).

When a batch fails, each of its jobs is tried again alone, so only a job that fails by
itself fails (with its own exception: a database fault becomes the usual 503). Retries
alone stop `retry_budget_s` after the batch failed (a database that is down would
otherwise be waited for once per job); the jobs left get the batch's exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from sqlalchemy.engine import Connection, Engine

from rbroker_server.db.engine import write_transaction
from rbroker_server.metrics import health

log = logging.getLogger(__name__)

MAX_BATCH: Final = 256
"""Jobs in one transaction at most (≈ 25 ms of SQLite writes)."""
LINGER_S: Final = 0.001
"""Under load (the last batch held more than one job), how long the thread waits for more
jobs before it writes (seconds): a few more reports per commit halve the writer's CPU per
report (measured on 2 cores: 217 → 131 µs), which the event loop, sharing the GIL, gets
back. An idle coordinator writes a lone report at once."""
RETRY_BUDGET_S: Final = 2.0
"""How long after a failed batch its jobs are still retried alone (seconds)."""

Work = Callable[[Connection], Any]
"""A job: writes through the connection, returns the outcome; it must not commit and must
have no effect outside the transaction (it may run twice: in a batch, then alone)."""

ApplyBatch = Callable[[Connection, list[Any]], list[Any]]
"""Runs the works of one batch in one transaction, in order; their outcomes."""


def run_each(conn: Connection, works: list[Work]) -> list[Any]:
    """The default `ApplyBatch`: each work called in turn."""
    return [work(conn) for work in works]


class WriterClosed(Exception):
    """The writer is not running (not started yet, or the coordinator is shutting down)."""


@dataclass(slots=True)
class _Job:
    work: Work
    key: str
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    result: Any = None
    error: BaseException | None = field(default=None)


class GroupCommitWriter:
    """The writer thread of one app (one engine).

    Args:
        engine: where the jobs write.
        max_batch: jobs per transaction at most.
        retry_budget_s: see the module's docstring.
        linger_s: see `LINGER_S` (0: never wait).
        apply: how a batch's works run (`run_each`; e.g. `service.write_many`, which
            shares statements between them).
        name: the thread's name.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_batch: int = MAX_BATCH,
        retry_budget_s: float = RETRY_BUDGET_S,
        linger_s: float = LINGER_S,
        apply: ApplyBatch = run_each,
        name: str = "report-writer",
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.engine = engine
        self.max_batch = max_batch
        self.retry_budget_s = retry_budget_s
        self.linger_s = linger_s
        self._apply_batch = apply
        self._name = name
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def running(self) -> bool:
        """True from `start` until `close`."""
        return self._thread is not None and not self._closed

    def start(self) -> None:
        """Start the thread (once).

        Raises:
            WriterClosed: it was closed before.
        """
        with self._lock:
            if self._closed:
                raise WriterClosed("the report writer was closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    async def submit(self, work: Work, key: str = "") -> Any:
        """Run `work` in the next batch; its outcome once that batch has committed.

        Raises:
            WriterClosed: the writer is not running.
            Exception: what `work` raised when run alone (or its batch's failure, past the
                retry budget), e.g. `sqlalchemy.exc.OperationalError`.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._lock:
            if self._thread is None or self._closed:
                raise WriterClosed("the coordinator is not taking reports (shutting down)")
            self._queue.put(_Job(work, key, loop, future))
            health.WRITER_QUEUED.inc()
        return await future

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop taking jobs, apply those already queued, answer them and stop the thread
        (waiting up to `timeout_s`). Idempotent. Blocks: call it off the event loop."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            self._queue.put(None)
        if thread is None:
            return
        thread.join(timeout_s)
        if thread.is_alive():
            log.error("the report writer did not stop within %.0f s", timeout_s)

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        stop = False
        loaded = False
        while not stop:
            first = self._queue.get()
            if first is None:
                break
            health.WRITER_QUEUED.dec()
            if loaded and self.linger_s > 0:
                time.sleep(self.linger_s)
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    stop = True
                    break
                health.WRITER_QUEUED.dec()
                batch.append(job)
            loaded = len(batch) > 1
            batch.sort(key=_key)  # stable: one key's jobs keep their order
            self._apply(batch)
            _answer(batch)

    def _apply(self, batch: list[_Job]) -> None:
        try:
            with write_transaction(self.engine) as conn:
                results = self._apply_batch(conn, [job.work for job in batch])
        except Exception as exc:
            if len(batch) == 1:
                batch[0].error = exc
                return
            log.info(
                "a batch of %d report writes failed (%s); retrying each alone",
                len(batch),
                exc,
            )
            self._retry_alone(batch, exc)
            return
        for job, result in zip(batch, results, strict=True):
            job.result = result

    def _retry_alone(self, batch: list[_Job], failure: Exception) -> None:
        deadline = time.monotonic() + self.retry_budget_s
        for job in batch:
            if time.monotonic() > deadline:
                job.error = failure
                continue
            try:
                with write_transaction(self.engine) as conn:
                    (job.result,) = self._apply_batch(conn, [job.work])
            except Exception as exc:
                job.error = failure = exc


def _key(job: _Job) -> str:
    return job.key


def _answer(batch: list[_Job]) -> None:
    """Settle the futures, one loop callback per event loop (not one wake-up per job)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Job]] = {}
    for job in batch:
        by_loop.setdefault(job.loop, []).append(job)
    for loop, jobs in by_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for these
            loop.call_soon_threadsafe(_settle, jobs)


def _settle(jobs: list[_Job]) -> None:
    for job in jobs:
        if job.future.done():  # the request was cancelled (its client went away)
            continue
        if job.error is not None:
            job.future.set_exception(job.error)
        else:
            job.future.set_result(job.result)
