"""Persistence of the leases and the queue in SQLite (WAL) in the data dir.

What is written, and when (each a committed transaction before the answer goes out, but
for a lease's end):
- a lease at its grant (with a hash of its re-attach token, never the token);
- a lease's end within `END_FLUSH_S` of it, in the same transaction as the next grant when
  one comes sooner (so a lease cycle commits once). A broker killed in that window restores
  the ended lease at its restart; its holder does not re-attach it, so it expires after the
  re-attach grace: its memory stays booked a few seconds longer, nothing is granted twice.
  Every read of the store sees the ends not yet written, and `close()` writes them;
- a holder's baseline on a GPU (memory outside its leases) at every change, one row per
  holder and GPU while it is above 0 (`rbroker.broker.baselines`): lease records are not
  rewritten then, and a baseline that stays at 0 (a holder using no memory outside its
  leases, the usual case) writes nothing;
- a waiting request when it first has to wait, and its removal;
- a job at its declaration and every change, and each chunk report together with the
  job's new cumulative counts (one transaction, so counts and chunks never disagree).
Renewals are not written: after a restart every restored lease gets one TTL from the
restart, and its holder re-attaches within it. This keeps the heartbeat path free of disk
writes while a broker crash (even `kill -9`) loses no grant."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import sqlite3
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from rbroker_protocol.files import private_sqlite

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

END_FLUSH_S = 0.05
"""Longest time a lease's end waits unwritten (the broker flushes it; see the docstring)."""

_END_SQL = "UPDATE leases SET state = ?, ended_at = ?, record = ? WHERE lease_id = ?"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS leases (
    lease_id      TEXT PRIMARY KEY,
    token_sha256  TEXT NOT NULL,
    record        TEXT NOT NULL,      -- JSON: every field of the lease but the token
    state         TEXT NOT NULL,      -- active | released | expired | holder_exited | revoked
    ended_at      REAL
);
CREATE INDEX IF NOT EXISTS leases_state ON leases(state);
CREATE TABLE IF NOT EXISTS jobs (
    job_id        TEXT PRIMARY KEY,
    record        TEXT NOT NULL       -- JSON: the job with its cumulative counts
);
CREATE TABLE IF NOT EXISTS job_chunks (
    job_id        TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE,
    chunk_id      TEXT NOT NULL,
    completed     INTEGER NOT NULL,
    failed        INTEGER NOT NULL,
    PRIMARY KEY (job_id, chunk_id)
);
CREATE TABLE IF NOT EXISTS baselines (
    holder_pid    INTEGER NOT NULL,
    holder_start  REAL NOT NULL,
    gpu_uuid      TEXT NOT NULL,
    mib           INTEGER NOT NULL,   -- held outside its leases (rbroker.broker.baselines)
    PRIMARY KEY (holder_pid, holder_start, gpu_uuid)
);
CREATE TABLE IF NOT EXISTS waiters (
    request_key   TEXT PRIMARY KEY,
    seq           INTEGER NOT NULL,
    record        TEXT NOT NULL
);
"""


def record_json(record: Mapping[str, Any]) -> str:
    """`record` as the JSON text stored in a `record` column (compact; read back with
    `json.loads`). orjson writes it; what orjson refuses (a key that is not a string, an
    integer past 64 bits) goes through `json`. Records hold no NaN or infinity (clock
    readings and validated params), which orjson would write as null."""
    try:
        return orjson.dumps(record).decode()
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(record)


def token_hash(token: str) -> str:
    """SHA-256 hex of a re-attach token (what is stored)."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class StoredLease:
    """A lease row as read back: its JSON record and token hash."""

    lease_id: str
    token_sha256: str
    record: dict[str, Any]


class LeaseStore:
    """The broker's SQLite file (`<data dir>/broker.sqlite3`).

    Raises:
        sqlite3.Error: the file cannot be opened or is not an rbroker database.
    """

    def __init__(self, path: Path) -> None:
        private_sqlite(path)  # 0600 in a 0700 dir, whatever the umask
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()
        self._ends: list[tuple[str, float, str, str]] = []  # queued by `end_lease_soon`
        self._baseline_rows: dict[tuple[int, float, str], int] = {}  # the baselines table
        self._flush_handle: asyncio.TimerHandle | None = None
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)
        self._db.execute(
            "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)",
            (str(SCHEMA_VERSION),),
        )
        for pid, start, uuid, mib in self._db.execute(
            "SELECT holder_pid, holder_start, gpu_uuid, mib FROM baselines"
        ):
            self._baseline_rows[(int(pid), float(start), str(uuid))] = int(mib)

    def meta(self, key: str) -> str | None:
        """A value of the `meta` table (None when not set)."""
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        """Set a value of the `meta` table (done on return)."""
        with self._lock:
            self._db.execute(
                "INSERT INTO meta(key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    def close(self) -> None:
        """Write the queued lease ends, close the database."""
        with self._lock:
            try:
                self._flush_locked()
            finally:
                self._db.close()

    def put_lease(self, lease_id: str, token: str, record: dict[str, Any]) -> None:
        """Write a granted lease, with the queued lease ends (one commit, done on return)."""
        row = (lease_id, token_hash(token), record_json(record))
        sql = (
            "INSERT OR REPLACE INTO leases(lease_id, token_sha256, record, state, ended_at)"
            " VALUES (?, ?, ?, 'active', NULL)"
        )
        with self._lock:
            if not self._ends:
                self._db.execute(sql, row)
                return
            ends, self._ends = self._ends, []
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(_END_SQL, ends)
                self._db.execute(sql, row)
            except BaseException:
                self._db.execute("ROLLBACK")
                self._ends = ends + self._ends
                raise
            self._db.execute("COMMIT")

    def put_baseline(self, holder_pid: int, holder_start: float, gpu_uuid: str, mib: int) -> None:
        """Write a holder's baseline on a GPU (MiB; 0 or less deletes it), committed on return.
        A figure the table already holds (or a deletion of a row it does not hold) writes
        nothing: this store is the table's only writer (one broker per data dir), so the
        rows it keeps in memory are the table's."""
        key = (holder_pid, holder_start, gpu_uuid)
        with self._lock:
            if mib > 0:
                if self._baseline_rows.get(key) == mib:
                    return
                self._db.execute(
                    "INSERT OR REPLACE INTO baselines(holder_pid, holder_start, gpu_uuid, mib)"
                    " VALUES (?, ?, ?, ?)",
                    (*key, mib),
                )
                self._baseline_rows[key] = mib
            elif key in self._baseline_rows:
                self._db.execute(
                    "DELETE FROM baselines WHERE holder_pid = ? AND holder_start = ?"
                    " AND gpu_uuid = ?",
                    key,
                )
                del self._baseline_rows[key]

    def baselines(self) -> list[tuple[int, float, str, int]]:
        """Every stored baseline: (holder pid, holder start time, GPU UUID, MiB)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT holder_pid, holder_start, gpu_uuid, mib FROM baselines"
            ).fetchall()
        return [(int(p), float(s), str(u), int(m)) for p, s, u, m in rows]

    def end_lease(self, lease_id: str, state: str, ended_at: float, record: dict[str, Any]) -> None:
        """Mark a lease ended (committed on return)."""
        with self._lock:
            self._db.execute(_END_SQL, (state, ended_at, record_json(record), lease_id))

    def end_lease_soon(
        self, lease_id: str, state: str, ended_at: float, record: dict[str, Any]
    ) -> None:
        """Queue a lease's end: written by `flush()`, the next `put_lease`, or before any
        read (the caller flushes within `END_FLUSH_S`; see the module docstring)."""
        with self._lock:
            self._ends.append((state, ended_at, record_json(record), lease_id))

    def flush(self) -> None:
        """Write the queued lease ends (one commit; nothing when none are queued).

        Raises:
            sqlite3.Error: the write failed (the ends stay queued).
        """
        with self._lock:
            self._flush_locked()

    def flush_soon(self) -> None:
        """Write the queued lease ends within `END_FLUSH_S` (at once when no event loop runs:
        a broker driven step by step); a failed timed write is logged and retried with the
        next write."""
        if self._flush_handle is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._flush_handle = loop.call_later(END_FLUSH_S, self._flush_timed)

    def _flush_timed(self) -> None:
        self._flush_handle = None
        try:
            self.flush()
        except sqlite3.Error:
            log.exception("writing lease ends failed (they are written with the next write)")

    def _flush_locked(self) -> None:
        if not self._ends:
            return
        ends, self._ends = self._ends, []
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.executemany(_END_SQL, ends)
        except BaseException:
            self._db.execute("ROLLBACK")
            self._ends = ends + self._ends
            raise
        self._db.execute("COMMIT")

    def active_leases(self) -> list[StoredLease]:
        """Leases not yet ended, in grant order."""
        with self._lock:
            self._flush_locked()
            rows = self._db.execute(
                "SELECT lease_id, token_sha256, record FROM leases WHERE state = 'active' "
                "ORDER BY rowid"
            ).fetchall()
        return [StoredLease(r[0], r[1], json.loads(r[2])) for r in rows]

    def put_waiter(self, request_key: str, seq: int, record: dict[str, Any]) -> None:
        """Write a waiting request (committed on return)."""
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO waiters(request_key, seq, record) VALUES (?, ?, ?)",
                (request_key, seq, json.dumps(record)),
            )

    def delete_waiter(self, request_key: str) -> None:
        """Forget a request that was granted, refused, timed out or cancelled."""
        with self._lock:
            self._db.execute("DELETE FROM waiters WHERE request_key = ?", (request_key,))

    def waiters(self) -> list[dict[str, Any]]:
        """Waiting requests in FIFO order (their records, with `request_key`)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT request_key, record FROM waiters ORDER BY seq"
            ).fetchall()
        return [{**json.loads(r[1]), "request_key": r[0]} for r in rows]

    def prune_ended(self, keep: int) -> None:
        """Keep only the `keep` most recently ended leases."""
        with self._lock:
            self._flush_locked()
            self._db.execute(
                "DELETE FROM leases WHERE state != 'active' AND lease_id NOT IN ("
                "SELECT lease_id FROM leases WHERE state != 'active' "
                "ORDER BY ended_at DESC LIMIT ?)",
                (keep,),
            )

    def put_job(self, job_id: str, record: Mapping[str, Any]) -> None:
        """Write a job's record (committed on return)."""
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO jobs(job_id, record) VALUES (?, ?)",
                (job_id, json.dumps(record)),
            )

    def add_chunk(
        self, job_id: str, chunk_id: str, completed: int, failed: int, record: Mapping[str, Any]
    ) -> None:
        """Record one chunk and the job's new counts in one transaction."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT INTO job_chunks(job_id, chunk_id, completed, failed) "
                    "VALUES (?, ?, ?, ?)",
                    (job_id, chunk_id, completed, failed),
                )
                self._db.execute(
                    "UPDATE jobs SET record = ? WHERE job_id = ?", (json.dumps(record), job_id)
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def jobs(self) -> list[tuple[dict[str, Any], dict[str, tuple[int, int]]]]:
        """Every job's record with its chunks `{chunk_id: (completed, failed)}`."""
        with self._lock:
            jobs = self._db.execute("SELECT job_id, record FROM jobs ORDER BY rowid").fetchall()
            chunks = self._db.execute(
                "SELECT job_id, chunk_id, completed, failed FROM job_chunks"
            ).fetchall()
        by_job: dict[str, dict[str, tuple[int, int]]] = {}
        for job_id, chunk_id, completed, failed in chunks:
            by_job.setdefault(job_id, {})[chunk_id] = (int(completed), int(failed))
        return [(json.loads(rec), by_job.get(job_id, {})) for job_id, rec in jobs]
