"""Parallel jobs (architecture.md §4): declared purpose, handler, workers and chunk-driven progress.

rbroker never runs a job's code and never sees its inputs or results: a job is a record
that moves only when its chunks report counts.

State machine::

    queued ──▶ running ──▶ succeeded | failed(reason) | cancelled(reason)
       │          ▲  │
       │          │  ▼
       └──────▶ stalled ──▶ cancelled("abandoned: …")   (after `abandon_s` unattended)

A job is attached to the connections that declared it, updated it or reported a chunk
to it, and to the leases its workers took with its `job_id`; when the last of these is
gone before the job finished, it becomes `stalled` (visible), never silently done. A job
stalled with nothing attached and no report for `abandon_s` (`BrokerConfig.job_abandon_s`,
default 24 h) was abandoned: it ends `cancelled` with the reason `abandoned: no worker,
connection or report for 24 h` and is kept with the finished jobs (`check_abandoned`), so
it no longer shows as stalled in everyone's view for ever nor counts against its user's
`too_many_jobs`. The unattended time is counted on the monotonic clock, and across a broker
restart on the boot clock: a stalled job's record keeps when it stalled (`STALL_MARK`), so a
restart within the same boot goes on counting (it used to count again from every restart,
so a broker restarted daily never ended one); after a reboot, or where no boot id is read
(`Clock.boot_id`), it counts from the broker's start. A job running or queued when the broker
stopped counts from the start too: its workers may have been there until then.

Chunk reports are idempotent by `chunk_id`: the same chunk reported again with the same
counts is acknowledged and not counted; with different counts it is refused. Counts are
cumulative and persisted with each chunk in one transaction.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any

from rbroker.base.display import fmt_count
from rbroker.broker import listing
from rbroker.broker.clock import Clock
from rbroker.broker.fairness import cap
from rbroker.broker.store import LeaseStore
from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.results import JobRecord, JobView

log = logging.getLogger(__name__)

FINISHED = frozenset({"succeeded", "failed", "cancelled"})
MAX_LISTED_OTHERS = listing.MAX_LISTED_OTHERS
"""Jobs of other users in one `jobs.list` answer, the newest (a job is about 600 bytes on the
wire: about 1.2 MB, well within the 4 MiB one connection may leave unsent); the asker's own
are all listed."""
MIN_RATE_WINDOW_S = 1.0
"""A job observed for less than this has no items/s (nor ETA) yet."""


@dataclass(slots=True)
class Job:
    """One declared job. Times are Unix seconds (wall clock, for display and rates)."""

    job_id: str
    owner: str
    project: str
    purpose: str
    handler: str
    total_items: int | None
    workers: int
    state: str = "queued"
    reason: str = ""
    completed_items: int = 0
    failed_items: int = 0
    chunks: dict[str, tuple[int, int]] = field(default_factory=dict)
    declared_at: float = 0.0
    first_report_at: float | None = None
    last_report_at: float | None = None
    finished_at: float | None = None
    conn_ids: set[int] = field(default_factory=set)
    lease_ids: set[str] = field(default_factory=set)
    account: str = ""
    """The OS account that declared it beyond its name (`uid 1001`, `sid S-1-5-…`; "" where
    not known): kept in the store, never shown."""

    def to_record(self) -> JobRecord:
        """The persisted and wire form (no connection, no chunk list)."""
        return {
            "job_id": self.job_id,
            "owner": self.owner,
            "project": self.project,
            "purpose": self.purpose,
            "handler": self.handler,
            "total_items": self.total_items,
            "workers": self.workers,
            "state": self.state,
            "reason": self.reason,
            "completed_items": self.completed_items,
            "failed_items": self.failed_items,
            "chunks_reported": len(self.chunks),
            "declared_at": self.declared_at,
            "first_report_at": self.first_report_at,
            "last_report_at": self.last_report_at,
            "finished_at": self.finished_at,
        }

    def to_wire(self, active_leases: list[str], now: float | None = None) -> JobView:
        """`to_record()` plus the live links, the observed rate (items/s) and the ETA (s).

        The rate is items reported since the declaration over the time since then, up to
        `now` (wall clock) while the job runs, so a job that stops reporting slows down
        and its ETA grows instead of freezing; up to the last report otherwise. Under
        `MIN_RATE_WINDOW_S` there is no rate yet.
        """
        done = self.completed_items + self.failed_items
        rate = None
        if self.first_report_at is not None and self.last_report_at is not None:
            end = self.last_report_at
            if self.state == "running":
                end = max(end, time.time() if now is None else now)
            span = end - self.declared_at
            rate = done / span if span >= MIN_RATE_WINDOW_S else None
        eta = (
            round((self.total_items - done) / rate, 1)
            if rate and self.total_items is not None and self.state == "running"
            else None
        )
        return {
            **self.to_record(),
            "lease_ids": sorted(active_leases),
            "items_per_s": round(rate, 3) if rate else None,
            "eta_s": eta,
        }


STALL_MARK = "unattended_since"
"""The key of a stalled job's stored record (never in its wire form) that holds when it
stalled on the boot clock: `{"clock": Clock.boot_id(), "boot_s": Clock.boottime()}`."""


class JobTable:
    """The broker's jobs. All methods run on the broker's event loop.

    Raises `RpcError` with `job_not_found`, `job_finished`, `not_job_owner` or
    `invalid_params` (with the numbers) on bad requests; nothing is changed then.
    """

    def __init__(
        self,
        clock: Clock,
        store: LeaseStore | None,
        max_open_per_user: int = 1024,
        abandon_s: float = 24 * 3600.0,
        max_finished_per_user: int = 100,
        max_chunks_per_user: int = 1_000_000,
    ) -> None:
        self.clock = clock
        self.max_open_per_user = max_open_per_user
        self.max_finished_per_user = max_finished_per_user
        self.max_chunks_per_user = max_chunks_per_user
        # per OS user: finished jobs kept, oldest first, and chunk ids kept over all its jobs
        self._finished: dict[str, dict[str, None]] = {}
        self._chunks: dict[str, int] = {}
        self.dropped: dict[str, int] = {}  # finished jobs dropped per user since the start
        self.abandon_s = abandon_s
        self.store = store
        self.jobs: dict[str, Job] = {}
        # jobs that may have lost their last connection or lease since `check_stalled`
        self._recheck: set[str] = set()
        # stalled jobs → since when (monotonic clock) nothing has been attached to them: a
        # job's end for want of workers is an expiry, never decided on the wall clock
        self._stalled: dict[str, float] = {}
        # the same moments on the boot clock, written with the stalled job (STALL_MARK)
        self._stalled_boot: dict[str, float] = {}
        boot_id, boot_now = clock.boot_id(), clock.boottime()
        mono_now = clock.monotonic()
        self._open: dict[str, int] = {}  # jobs not finished, per OS user
        if store is not None:
            for rec, chunks in store.jobs():
                job = Job(
                    job_id=rec["job_id"],
                    owner=rec["owner"],
                    project=rec["project"],
                    purpose=rec["purpose"],
                    handler=rec["handler"],
                    total_items=rec["total_items"],
                    workers=rec["workers"],
                    state=rec["state"],
                    reason=rec["reason"],
                    completed_items=rec["completed_items"],
                    failed_items=rec["failed_items"],
                    chunks=chunks,
                    declared_at=rec["declared_at"],
                    first_report_at=rec["first_report_at"],
                    last_report_at=rec["last_report_at"],
                    finished_at=rec["finished_at"],
                    account=rec["account"] if isinstance(rec.get("account"), str) else "",
                )
                unsaved = job.state in ("queued", "running")
                if unsaved:
                    job.state = "stalled"  # nobody is attached after a restart until they report
                if job.state == "stalled":
                    since_boot = _stalled_at(rec.get(STALL_MARK), boot_id, boot_now)
                    if since_boot is None:  # unattended from now, as far as this broker knows
                        since_boot, unsaved = boot_now, True
                    self._stalled[job.job_id] = mono_now - (boot_now - since_boot)
                    self._stalled_boot[job.job_id] = since_boot
                self.jobs[job.job_id] = job
                self._chunks[job.owner] = self._chunks.get(job.owner, 0) + len(job.chunks)
                if unsaved:  # so that a second restart counts from this one
                    with contextlib.suppress(Exception):  # not written: counted again later
                        self._save(job)
                if job.state not in FINISHED:
                    self._open[job.owner] = self._open.get(job.owner, 0) + 1
            finished = sorted(
                (j for j in self.jobs.values() if j.state in FINISHED),
                key=lambda j: j.finished_at or 0.0,  # the order they finished in, for display
            )
            for job in finished:
                self._finished.setdefault(job.owner, {})[job.job_id] = None
            for owner in list(self._finished):
                with contextlib.suppress(Exception):  # not written: dropped at its next end
                    self._drop_finished(owner, self.max_finished_per_user)

    def _ended(self, job: Job) -> None:
        """`job` has just finished (written): it is kept among its user's finished jobs, and
        the oldest beyond `max_finished_per_user` are dropped (a store that fails keeps
        them until the next end)."""
        self._open[job.owner] -= 1
        self._finished.setdefault(job.owner, {})[job.job_id] = None
        with contextlib.suppress(Exception):
            self._drop_finished(job.owner, self.max_finished_per_user)

    def _drop_finished(self, owner: str, keep: int, chunks_over: int = 0) -> None:
        """Drop `owner`'s oldest finished jobs until `keep` are left, or, with
        `chunks_over`, until that many chunk ids are freed (whichever drops more); from the
        store first (an error raised there drops nothing)."""
        finished = self._finished.get(owner, {})
        drop: list[str] = []
        freed = 0
        for job_id in finished:
            if len(finished) - len(drop) <= keep and freed >= chunks_over:
                break
            drop.append(job_id)
            freed += len(self.jobs[job_id].chunks)
        if not drop:
            return
        if self.store is not None:
            self.store.delete_jobs(drop)
        for job_id in drop:
            del finished[job_id]
            job = self.jobs.pop(job_id)
            self._chunks[owner] = self._chunks.get(owner, 0) - len(job.chunks)
        self.dropped[owner] = self.dropped.get(owner, 0) + len(drop)

    def _save(self, job: Job) -> None:
        if self.store is not None:
            self.store.put_job(job.job_id, self._stored(job))

    def _stored(self, job: Job) -> dict[str, Any]:
        """The record the store keeps: `to_record()`, and a stalled job's `STALL_MARK`."""
        record: dict[str, Any] = dict(job.to_record())
        if job.account:
            record["account"] = job.account
        since_boot = self._stalled_boot.get(job.job_id)
        if job.state == "stalled" and since_boot is not None:
            boot_id = self.clock.boot_id()
            if boot_id:
                record[STALL_MARK] = {"clock": boot_id, "boot_s": since_boot}
        return record

    def _mark_stalled(self, job_id: str) -> None:
        """`job_id` unattended from now (monotonic and boot clocks)."""
        self._stalled[job_id] = self.clock.monotonic()
        self._stalled_boot[job_id] = self.clock.boottime()

    def get(self, job_id: str, owner: str, account: str = "") -> Job:
        """The job, checked to belong to `owner`, and to its account when both the job and
        the caller know theirs (`Job.account`): an account removed and made again under the
        same name is another user, and does not take over the old one's jobs."""
        job = self.jobs.get(job_id)
        if job is None:
            raise RpcError(ErrorCode.JOB_NOT_FOUND, f"no job {job_id}", job_id=job_id)
        if job.owner != owner:
            raise RpcError(
                ErrorCode.NOT_JOB_OWNER, f"job {job_id} belongs to another user", job_id=job_id
            )
        if job.account and account and job.account != account:
            raise RpcError(
                ErrorCode.NOT_JOB_OWNER,
                f"job {job_id} belongs to another account named {owner} (the account that "
                "declared it was removed or made again since)",
                job_id=job_id,
            )
        return job

    def get_open(self, job_id: str, owner: str, account: str = "") -> Job:
        """The job, checked to belong to `owner` (and `account`, as `get`) and not to be
        finished (a worker may still lease for it)."""
        job = self.get(job_id, owner, account)
        if job.state in FINISHED:
            raise RpcError(
                ErrorCode.JOB_FINISHED,
                f"job {job_id} is {job.state}; no new worker leases for it",
                job_id=job_id,
                state=job.state,
            )
        return job

    def open_of(self, owner: str) -> int:
        """How many of OS user `owner`'s jobs are not finished (queued, running, stalled)."""
        return self._open.get(owner, 0)

    def declare(
        self,
        owner: str,
        project: str,
        purpose: str,
        handler: str,
        total_items: int | None,
        workers: int,
        conn_id: int | None,
        account: str = "",
    ) -> Job:
        """Create a job in state `queued`, bound to the declaring connection, owned by
        `owner` (and its `account`, when known: `Job.account`).

        Raises:
            RpcError: `too_many_jobs` when `owner` already has `max_open_per_user` jobs not
                finished (queued, running or stalled), with `limit` and `count`.
            sqlite3.Error: the store cannot write it (nothing is kept).
        """
        cap(
            ErrorCode.TOO_MANY_JOBS,
            owner,
            self.open_of(owner),
            self.max_open_per_user,
            "jobs not finished (queued, running or stalled)",
            "finish or cancel some (job.update) and try again",
        )
        job = Job(
            job_id="job-" + secrets.token_hex(6),
            owner=owner,
            project=project,
            purpose=purpose,
            handler=handler,
            total_items=total_items,
            workers=workers,
            declared_at=self.clock.wall(),
            conn_ids=set() if conn_id is None else {conn_id},
            account=account,
        )
        self._save(job)  # first: a job the store cannot keep is not declared
        self.jobs[job.job_id] = job
        self._open[owner] = self._open.get(owner, 0) + 1
        self._recheck.add(job.job_id)
        return job

    def update(
        self,
        job_id: str,
        owner: str,
        state: str | None,
        reason: str | None,
        workers: int | None,
        conn_id: int | None,
        account: str = "",
    ) -> Job:
        """Change state and/or workers. Finished jobs cannot change; failed and cancelled
        need a reason."""
        job = self.get(job_id, owner, account)
        if job.state in FINISHED:
            raise RpcError(
                ErrorCode.JOB_FINISHED,
                f"job {job_id} already {job.state}",
                job_id=job_id,
                state=job.state,
            )
        if state in ("failed", "cancelled") and not reason:
            raise RpcError(
                ErrorCode.INVALID_PARAMS, f"state {state} needs a reason", field="reason"
            )
        before = (job.workers, job.state, job.reason, job.finished_at)
        if workers is not None:
            job.workers = workers
        if state is not None:
            job.state = state
            job.reason = reason or ""
            if state in FINISHED:
                job.finished_at = self.clock.wall()
        try:
            self._save(job)
        except BaseException:  # not written: not changed
            job.workers, job.state, job.reason, job.finished_at = before
            raise
        if job.state in FINISHED:
            self._ended(job)
        if conn_id is not None:
            job.conn_ids.add(conn_id)  # e.g. the declarer came back (SDK reconnect)
        self._recheck.add(job.job_id)
        return job

    def report(
        self,
        job_id: str,
        owner: str,
        chunk_id: str,
        completed: int,
        failed: int,
        conn_id: int | None = None,
        account: str = "",
    ) -> tuple[Job, bool]:
        """Count one chunk from connection `conn_id` (which then keeps the job attached).
        Returns `(job, duplicate)`; a duplicate changes no count and no state."""
        job = self.get(job_id, owner, account)
        seen = job.chunks.get(chunk_id)
        if seen is not None:
            if seen == (completed, failed):
                if conn_id is not None and job.state not in FINISHED:
                    job.conn_ids.add(conn_id)
                return job, True
            raise RpcError(
                ErrorCode.INVALID_PARAMS,
                f"chunk {chunk_id} was already reported with completed={seen[0]}, "
                f"failed={seen[1]}; now completed={completed}, failed={failed}",
                field="chunk_id",
            )
        if job.state in FINISHED:
            raise RpcError(
                ErrorCode.JOB_FINISHED,
                f"job {job_id} is {job.state}; chunk {chunk_id} not counted",
                job_id=job_id,
                state=job.state,
            )
        if completed + failed == 0:
            raise RpcError(
                ErrorCode.INVALID_PARAMS,
                "a chunk report needs completed + failed > 0",
                field="completed",
            )
        if job.total_items is not None:
            after = job.completed_items + job.failed_items + completed + failed
            if after > job.total_items:
                raise RpcError(
                    ErrorCode.INVALID_PARAMS,
                    f"chunk {chunk_id} would bring the job to {fmt_count(after)} items "
                    f"({fmt_count(job.completed_items)} completed + "
                    f"{fmt_count(job.failed_items)} failed + {fmt_count(completed + failed)} "
                    f"now) but total_items is {fmt_count(job.total_items)}",
                    field="completed",
                    total_items=job.total_items,
                    would_be=after,
                )
        self._room_for_a_chunk(owner)
        now = self.clock.wall()
        before = (job.completed_items, job.failed_items, job.first_report_at, job.last_report_at)
        state_before = job.state
        job.chunks[chunk_id] = (completed, failed)
        job.completed_items += completed
        job.failed_items += failed
        job.first_report_at = job.first_report_at or now
        job.last_report_at = now
        if job.state in ("queued", "stalled"):
            job.state = "running"
        if self.store is not None:
            try:
                self.store.add_chunk(job.job_id, chunk_id, completed, failed, self._stored(job))
            except BaseException:  # not written: not counted (a retry counts it once)
                del job.chunks[chunk_id]
                job.completed_items, job.failed_items = before[0], before[1]
                job.first_report_at, job.last_report_at = before[2], before[3]
                job.state = state_before
                raise
        self._chunks[owner] = self._chunks.get(owner, 0) + 1
        if conn_id is not None:
            job.conn_ids.add(conn_id)
        self._recheck.add(job.job_id)
        return job, False

    def _room_for_a_chunk(self, owner: str) -> None:
        """Make room for one more of `owner`'s chunk ids: its oldest finished jobs are
        dropped while it holds `max_chunks_per_user`.

        Raises:
            RpcError: `too_many_chunks` (with `limit` and `count`) when its open jobs alone
                hold that many, or the store could not drop the finished ones.
        """
        count = self._chunks.get(owner, 0)
        if count < self.max_chunks_per_user:
            return
        with contextlib.suppress(Exception):  # not dropped: refused below
            self._drop_finished(owner, 0, count - self.max_chunks_per_user + 1)
        cap(
            ErrorCode.TOO_MANY_CHUNKS,
            owner,
            self._chunks.get(owner, 0),
            self.max_chunks_per_user,
            "chunk ids kept for its jobs' reports",
            "report larger chunks, or finish jobs (their chunk ids go with them)",
        )

    def link_lease(self, job_id: str, owner: str, lease_id: str) -> None:
        """A worker's lease belongs to the job; the job is running while it has one."""
        job = self.get(job_id, owner)
        job.lease_ids.add(lease_id)
        if job.state in ("queued", "stalled"):
            before = job.state
            job.state = "running"
            try:
                self._save(job)
            except Exception as exc:  # a full disk: as it was, running from its next report
                job.state = before
                log.warning("job %s not marked running: %s", job_id, exc)
        self._recheck.add(job_id)

    def restore_link(self, job_id: str, lease_id: str) -> None:
        """A lease restored after a broker restart still belongs to its job. The state does
        not change: the job stays `stalled` until one of its workers reports again."""
        job = self.jobs.get(job_id)
        if job is not None and job.state not in FINISHED:
            job.lease_ids.add(lease_id)

    def lease_ended(self, lease_id: str, job_id: str | None) -> None:
        """Lease `lease_id` of job `job_id` (None: of no job) ended: it no longer keeps the
        job running."""
        job = self.jobs.get(job_id) if job_id is not None else None
        if job is not None and lease_id in job.lease_ids:
            job.lease_ids.discard(lease_id)
            self._recheck.add(job.job_id)

    def check_stalled(self) -> list[Job]:
        """Queued or running jobs with no attached connection and no live linked lease
        become `stalled`; returns the jobs that changed. Only the jobs that lost a
        connection or a lease, or changed, since the last check are looked at, so the cost
        is flat in the number of leases and jobs."""
        changed = []
        retry: set[str] = set()
        for job_id in self._recheck:
            job = self.jobs.get(job_id)
            if job is None:
                continue
            if job.state in ("queued", "running") and not job.conn_ids and not job.lease_ids:
                before = job.state
                job.state = "stalled"
                self._mark_stalled(job_id)
                try:
                    self._save(job)
                except Exception as exc:  # a full disk: as it was, checked again later
                    job.state = before
                    self._stalled.pop(job_id, None)
                    self._stalled_boot.pop(job_id, None)
                    retry.add(job_id)
                    log.warning("job %s not marked stalled: %s", job_id, exc)
                    continue
                changed.append(job)
        self._recheck = retry
        return changed

    def check_abandoned(self) -> list[Job]:
        """Stalled jobs with no connection attached, no live linked lease and no chunk
        reported for `abandon_s` seconds end `cancelled` with the reason `abandoned: …` and
        `finished_at` now; returns the jobs that ended. The seconds are counted on the
        monotonic clock from the stall (a report makes a job running again, so the last
        report comes before it; after a restart, from the broker's start), so a wall clock
        that steps ends nothing early. Only stalled jobs are looked at.
        A job not written to the store stays as it was and is tried again at the next call.
        """
        now = self.clock.monotonic()
        ended = []
        for job_id, since in list(self._stalled.items()):
            job = self.jobs.get(job_id)
            if job is None or job.state != "stalled":
                del self._stalled[job_id]  # running again, or finished by its owner
                self._stalled_boot.pop(job_id, None)
                continue
            if job.conn_ids or job.lease_ids:  # attached again, though not yet running
                self._mark_stalled(job_id)
                with contextlib.suppress(Exception):  # not written: an older mark stays
                    self._save(job)
                continue
            if now - since < self.abandon_s:
                continue
            before = (job.state, job.reason, job.finished_at)
            job.state = "cancelled"
            job.reason = (
                f"abandoned: no worker, connection or report for {_duration(self.abandon_s)}"
            )
            job.finished_at = self.clock.wall()
            try:
                self._save(job)
            except Exception:  # not written: not ended (tried again at the next tick)
                job.state, job.reason, job.finished_at = before
                continue
            del self._stalled[job_id]
            self._stalled_boot.pop(job_id, None)
            self._ended(job)
            ended.append(job)
        return ended

    def connection_closed(self, conn_id: int) -> None:
        """A connection is gone (finished or crashed): it no longer keeps jobs attached."""
        for job in self.jobs.values():
            if conn_id in job.conn_ids:
                job.conn_ids.discard(conn_id)
                self._recheck.add(job.job_id)

    def view(self, include_finished: bool, live_lease_ids: Container[str]) -> list[JobView]:
        """Jobs for `jobs.list`, newest last."""
        now = self.clock.wall()
        return [
            job.to_wire([lid for lid in job.lease_ids if lid in live_lease_ids], now)
            for job in self.jobs.values()
            if include_finished or job.state not in FINISHED
        ]

    def listed(
        self,
        include_finished: bool,
        live_lease_ids: Container[str],
        asker: str,
        max_others: int = MAX_LISTED_OTHERS,
    ) -> tuple[list[JobView], int]:
        """`jobs.list` for OS user `asker`: every job of its own and the newest `max_others`
        of other users, newest last, and how many others were left out. So an answer stays
        within what one asker may be sent however many users keep jobs (each user's jobs
        are bounded; their sum over users is not)."""
        now = self.clock.wall()
        chosen = [
            job for job in self.jobs.values() if include_finished or job.state not in FINISHED
        ]
        shown, left_out = listing.for_asker(
            chosen, asker, lambda job: job.owner, max_others=max_others, newest=True
        )
        live = live_lease_ids
        return [
            job.to_wire([x for x in job.lease_ids if x in live], now) for job in shown
        ], left_out


def _duration(seconds: float) -> str:
    """`86400` → `24 h`, `5400` → `90 min`, `90` → `90 s`: a setting's length in words."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{fmt_count(int(seconds // 3600))} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{fmt_count(int(seconds // 60))} min"
    return f"{seconds:g} s"


def _stalled_at(mark: Any, boot_id: str, boot_now: float) -> float | None:
    """When a stored job stalled, on this boot's clock (`STALL_MARK`): None when the mark is
    missing or malformed, from another boot or a clock without an id, or in the future."""
    if not boot_id or not isinstance(mark, dict) or mark.get("clock") != boot_id:
        return None
    at = mark.get("boot_s")
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not 0 <= at <= boot_now:
        return None
    return float(at)
