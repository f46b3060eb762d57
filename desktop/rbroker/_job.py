"""`rbroker.job()`: declare a parallel job and report its chunks (architecture.md §4).

    with rbroker.job(project="search", purpose="embed corpus", handler="embed.encode_batch",
                     total_items=100_000, workers=4) as job:
        job.report("chunk-17", completed=1000, failed=3)

For pools, `job.task(fn, mib=...)` wraps a module-level function `fn(items) -> None |
(completed, failed)` into a picklable callable `task(chunk_id, items)` for
`concurrent.futures` or `multiprocessing`: each worker process connects once, holds its own
lease linked to the job (when `mib` is given) until it exits, runs `fn` and reports the
chunk. Run in the declaring process itself (directly or from a thread pool), the task's
connection and lease last until the job's `with` block ends. rbroker never sees the items
or the results: only the counts.

When the connection breaks (a broker restart), a report or update connects again (for up
to `RECONNECT_WINDOW_S`) and is sent once more: reports are idempotent by chunk id, so a
report whose answer was lost is acknowledged as a duplicate, never counted twice.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Sized
from dataclasses import dataclass
from typing import Any, TypeVar

from rbroker._lease import RECONNECT_WINDOW_S, _acquire, _Holder, _reconnect
from rbroker.base.exceptions import BrokerUnavailable, JobFinished, JobNotFound, RBrokerError
from rbroker.client.local import Client

_T = TypeVar("_T")


def _call_again(
    client: Client, socket: str | None, call: Callable[[Client], _T]
) -> tuple[Client, _T]:
    """`call(client)` (one typed client call); if the connection broke, once more on a new
    connection. Returns the client to use from now on and the result.

    Raises:
        BrokerUnavailable: the broker did not come back within `RECONNECT_WINDOW_S`.
    """
    try:
        return client, call(client)
    except BrokerUnavailable:
        client.close()
    fresh = _reconnect(socket, time.monotonic() + RECONNECT_WINDOW_S, None)
    return fresh, call(fresh)


class Job:
    """A declared job, as its declarer sees it. `info` is the broker's latest record."""

    def __init__(self, client: Client, info: dict[str, Any], socket: str | None) -> None:
        self._client = client
        self._socket = socket
        self.info = info
        self.job_id: str = info["job_id"]

    def report(self, chunk_id: str, completed: int = 0, failed: int = 0) -> dict[str, Any]:
        """Count one chunk (idempotent by `chunk_id`); returns the job's new record.

        Raises:
            InvalidParams: negative counts, beyond total_items, a chunk id re-used with
                other counts. JobFinished: the job already ended.
        """
        result = self._call(lambda c: c.job_report(self.job_id, chunk_id, completed, failed))
        self.info = dict(result["job"])
        return dict(self.info)

    def refresh(self) -> dict[str, Any]:
        """The job's latest record (counts reported by every worker), also kept in `info`.

        Raises:
            JobNotFound: the broker no longer knows the job.
        """
        listed = self._call(lambda c: c.jobs_list(include_finished=True))
        for info in listed["jobs"]:
            if info["job_id"] == self.job_id:
                self.info = dict(info)
                return dict(info)
        raise JobNotFound(f"no job {self.job_id}", "job_not_found", job_id=self.job_id)

    def _call(self, call: Callable[[Client], _T]) -> _T:
        self._client, result = _call_again(self._client, self._socket, call)
        return result

    def update(
        self, state: str | None = None, reason: str | None = None, workers: int | None = None
    ) -> dict[str, Any]:
        """Change the state (`running`, `succeeded`, `failed`, `cancelled`) or workers."""
        result = self._call(lambda c: c.job_update(self.job_id, state, reason, workers))
        self.info = dict(result["job"])
        return dict(self.info)

    def task(
        self, fn: Callable[[Any], Any], mib: int | None = None, wait_s: float = 600.0
    ) -> ChunkTask:
        """A picklable `task(chunk_id, items)` for pool workers (see the module doc)."""
        return ChunkTask(
            JobRef(
                self.job_id, self._socket, self.info["project"], self.info["purpose"], mib, wait_s
            ),
            fn,
        )


@dataclass(frozen=True)
class JobRef:
    """What a worker process needs to report to a job and lease for it (picklable)."""

    job_id: str
    socket: str | None
    project: str
    purpose: str
    mib: int | None = None
    wait_s: float = 600.0


_worker_lock = threading.Lock()
_workers: dict[str, tuple[Client, _Holder | None]] = {}
_inherited: list[tuple[Client, _Holder | None]] = []


def _forget_parent_workers() -> None:
    """In a forked child: the parent's connections and leases stay the parent's. The child
    makes its own on first use; the inherited ones are kept (never closed: closing would
    shut the parent's connection down) and never used."""
    global _worker_lock
    _worker_lock = threading.Lock()
    _inherited.extend(_workers.values())
    _workers.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_workers)


def _end_worker(job_id: str) -> None:
    """This process's connection and lease for job `job_id` (`_worker`), if it made them, go:
    the lease is released and the connection closed. The job's block ends here in its
    declaring process; a task run there (directly, or from a thread pool) would otherwise
    keep its lease, heartbeats and connection for as long as the process lives."""
    with _worker_lock:
        entry = _workers.pop(job_id, None)
    if entry is None:
        return
    client, holder = entry
    try:
        if holder is not None:
            holder.release()
    finally:
        client.close()


def _worker_report(ref: JobRef, chunk_id: str, completed: int, failed: int) -> None:
    """Report a chunk on this process's connection for `ref` (connecting again if the
    broker restarted)."""
    client, _ = _call_again(
        _worker(ref),
        ref.socket,
        lambda c: c.job_report(ref.job_id, chunk_id, completed, failed),
    )
    with _worker_lock:
        entry = _workers.get(ref.job_id)
        if entry is not None and entry[0] is not client:
            _workers[ref.job_id] = (client, entry[1])


def _worker(ref: JobRef) -> Client:
    """This process's connection (and lease) for `ref`, made on first use."""
    with _worker_lock:
        entry = _workers.get(ref.job_id)
        if entry is None:
            # the report connection first: once the lease is granted, nothing else can fail
            # here and leave the lease held with no entry (a broker restart right after the
            # grant is then handled by the reports' reconnect)
            client = Client(ref.socket)
            holder = None
            if ref.mib:
                try:
                    holder = _acquire(
                        ref.mib,
                        ref.project,
                        f"{ref.job_id} worker",
                        ref.purpose,
                        ref.wait_s,
                        1,
                        None,
                        30.0,
                        False,
                        ref.socket,
                        job_id=ref.job_id,
                    )
                except BaseException:
                    client.close()
                    raise
            entry = (client, holder)
            _workers[ref.job_id] = entry
        return entry[0]


class ChunkTask:
    """`task(chunk_id, items)`: run `fn(items)` in a worker and report the chunk.

    `fn` returns None (all items completed), or `(completed, failed)`. If it raises, the
    chunk is reported with every item failed (len(items) when sized, else 1) and the
    exception propagates (if that report is refused, e.g. the job ended, the exception
    still propagates, with a note saying so).
    """

    def __init__(self, ref: JobRef, fn: Callable[[Any], Any]) -> None:
        self.ref = ref
        self.fn = fn

    def __call__(self, chunk_id: str, items: Any) -> Any:
        _worker(self.ref)  # the lease (if any) is held before the work starts
        size = len(items) if isinstance(items, Sized) else 1
        try:
            outcome = self.fn(items)
        except Exception as exc:
            try:
                _worker_report(self.ref, chunk_id, 0, max(1, size))
            except RBrokerError as report_error:  # the caller's exception matters more
                exc.add_note(f"rbroker: chunk {chunk_id} not reported: {report_error}")
            raise
        if outcome is None:
            completed, failed = size, 0
        else:
            completed, failed = outcome
        _worker_report(self.ref, chunk_id, completed, failed)
        return outcome


@contextlib.contextmanager
def job(
    *,
    project: str,
    purpose: str,
    handler: str,
    total_items: int | None = None,
    workers: int = 1,
    socket: str | None = None,
) -> Iterator[Job]:
    """Declare a job for the `with` block; it ends `succeeded` on a normal exit, `failed`
    (the reason is the exception's type name, never its message) on an exception, and
    `cancelled` on KeyboardInterrupt. Then the lease and connection that `Job.task` tasks
    run in this process made for the job are released and closed (those of other processes
    end with them).

    Raises:
        DescriptionRejected: a description broke a rule. BrokerUnavailable: no broker.
    """
    client = Client(socket)
    handle: Job | None = None
    try:
        # the job lives on the broker found: its workers report there, to no other
        declared = client.job_declare(
            project=project,
            purpose=purpose,
            handler=handler,
            workers=workers,
            total_items=total_items,
        )
        handle = Job(client, dict(declared["job"]), client.address)
        try:
            yield handle
        except KeyboardInterrupt:
            with contextlib.suppress(RBrokerError):
                handle.update("cancelled", reason="interrupted")
            raise
        except BaseException as exc:
            with contextlib.suppress(RBrokerError):
                handle.update("failed", reason=f"raised {type(exc).__name__}")
            raise
        else:
            if handle.info.get("state") not in ("succeeded", "failed", "cancelled"):
                with contextlib.suppress(JobFinished):  # ended from elsewhere: keep that end
                    handle.update("succeeded")
    finally:
        try:
            if handle is not None:
                _end_worker(handle.job_id)
        finally:
            (handle._client if handle is not None else client).close()
