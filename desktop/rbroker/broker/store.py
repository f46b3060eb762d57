"""Persistence of the leases and the queue in SQLite (WAL, synchronous=NORMAL) in the data dir.

What is written, and when (each done before the answer goes out):
- a lease at its grant, re-attach (a fresh token) and resize, and its end: one line each
  appended to the lease journal beside the database (`<name>.leases.jsonl`, 0600, with a
  hash of the re-attach token, never the token) by one `os.write` before the call returns,
  no fsync. The journal is folded into the database in one transaction within `END_FLUSH_S`
  (the broker's timer, `flush_soon`), before any read of the store and at `close()`, in the
  order written (a lease granted and ended in one window ends up ended), then truncated. A
  store opened on a journal left by a crash folds it first (replaying is idempotent: whole
  rows, in order); a torn last line (a crash mid-write) or an unreadable line is logged and
  skipped. The guarantee is WAL's with synchronous=NORMAL: a broker killed (even `kill -9`)
  right after answering loses no grant and no end; a power loss may lose the last ones.
  Ended leases beyond the broker's `ended_history` are deleted in a fold's transaction too
  (`prune_ended_soon`, every 200 ends);
- a holder's baseline on a GPU (memory outside its leases) at every change, one row per
  holder and GPU while it is above 0 (`rbroker.broker.baselines`): lease records are not
  rewritten then, and a baseline that stays at 0 (a holder using no memory outside its
  leases, the usual case) writes nothing;
- a waiting request when it first has to wait (committed on return), and its removal (in
  the journal, as a lease's end);
- a booking at its acceptance and every change of its state (committed on return);
- a job at its declaration and every change, and each chunk report together with the
  job's new cumulative counts (one transaction, so counts and chunks never disagree).
All but the first and the waiting requests' removal are SQLite transactions, committed on
return. Renewals are not written:
after a restart every restored lease gets one TTL from the restart, and its holder
re-attaches within it. This keeps the heartbeat path free of disk writes, and the lease
cycle free of SQLite commits.

A full or failing disk (docs/architecture.md §3, "Storage faults"): a grant, re-attach or
resize that the journal cannot take raises `OSError` and is not kept (its caller refuses the
request). An end, or a waiting request's removal, is never refused: what the journal cannot
take is written to the reserve beside it (`<name>.owed`, `OWED_RESERVE_BYTES` allocated when
the store opens, so that writing into it needs no new room on a file system that overwrites
in place), and kept in memory until a fold puts it into the database; a store opened on a
reserve that holds changes folds them after the journal's. A baseline that SQLite cannot
take is kept in memory the same way. While anything is owed, every later change waits
behind it (`retry`, the broker's tick, tries again at most every `OWED_RETRY_S`), and a
write that must be done before its answer (a waiting request, a job) folds what is owed
first, or raises."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.files import private_append, private_sqlite

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

END_FLUSH_S = 0.05
"""Longest time a journaled lease change waits to be folded into the database (the broker's
timer; see the docstring)."""

JOURNAL_SUFFIX = ".leases.jsonl"
"""The lease journal's name beside the database: `broker.sqlite3` → `broker.leases.jsonl`."""

OWED_SUFFIX = ".owed"
"""The reserve beside the database: `broker.sqlite3` → `broker.owed`."""

OWED_RESERVE_BYTES = 256 * 1024
"""The reserve's size: room for the ends of a few hundred leases that a full disk could not
journal (a line is about a kilobyte)."""

OWED_RETRY_S = 1.0
"""How often `retry` tries again to write what is owed (a full disk)."""

_GRANT = "g"  # journal line ["g", lease_id, token_sha256, record JSON text]
_END = "e"  # journal line ["e", state, ended_at, record JSON text, lease_id]
_FORGET = "d"  # journal line ["d", request_key]: a waiting request's row deleted
_BASELINE = "b"  # in memory only: (holder_pid, holder_start, gpu_uuid, mib), mib > 0
_NO_BASELINE = "x"  # in memory only: (holder_pid, holder_start, gpu_uuid)
_GRANT_SQL = (
    "INSERT OR REPLACE INTO leases(lease_id, token_sha256, record, state, ended_at)"
    " VALUES (?, ?, ?, 'active', NULL)"
)
_END_SQL = "UPDATE leases SET state = ?, ended_at = ?, record = ? WHERE lease_id = ?"
_SQL = {
    _GRANT: _GRANT_SQL,
    _END: _END_SQL,
    _FORGET: "DELETE FROM waiters WHERE request_key = ?",
    _BASELINE: "INSERT OR REPLACE INTO baselines(holder_pid, holder_start, gpu_uuid, mib)"
    " VALUES (?, ?, ?, ?)",
    _NO_BASELINE: "DELETE FROM baselines WHERE holder_pid = ? AND holder_start = ?"
    " AND gpu_uuid = ?",
}

_PRUNE_SQL = (
    "DELETE FROM leases WHERE state != 'active' AND lease_id NOT IN ("
    "SELECT lease_id FROM leases WHERE state != 'active' ORDER BY ended_at DESC LIMIT ?)"
)

#: A journaled change: its kind (`_GRANT`, `_END`) and its statement's parameters.
_Change = tuple[str, tuple[Any, ...]]

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
CREATE TABLE IF NOT EXISTS bookings (
    booking_id    TEXT PRIMARY KEY,
    record        TEXT NOT NULL,      -- JSON: rbroker.broker.bookings.Booking.to_record
    live          INTEGER NOT NULL    -- 1: booked, held or claimed
);
"""


STORAGE_ERRORS = (OSError, sqlite3.Error)
"""What the store raises when its data directory cannot be written (a full disk, EIO, a
read-only file system): the journal's `OSError`, SQLite's "database or disk is full"."""


def storage_unavailable(
    exc: Exception, what: str = "not granted", kept: str = "nothing was booked"
) -> RpcError:
    """The refusal of a request whose change the store could not write (`exc`: ENOSPC, EIO,
    EROFS…), in one line with the reason the OS or SQLite gave: `what` was not done, and
    `kept` says what is as it was."""
    reason = (exc.strerror if isinstance(exc, OSError) else None) or str(exc).splitlines()[0]
    return RpcError(
        ErrorCode.STORAGE_UNAVAILABLE,
        f"{what}: the broker cannot write its data directory ({reason}); {kept}, try again "
        "once there is room",
        reason=reason,
    )


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


_KIND_NAMES = {_END: "lease's end", _FORGET: "waiting request's removal"}


def _write_at(fd: int, data: bytes, offset: int) -> None:
    """Write all of `data` at `offset` of `fd` (not opened for appending).

    Raises:
        OSError: the write failed.
    """
    if hasattr(os, "pwrite"):
        done = 0
        while done < len(data):
            done += os.pwrite(fd, data[done:], offset + done)
        return
    os.lseek(fd, offset, os.SEEK_SET)
    done = 0
    while done < len(data):
        done += os.write(fd, data[done:])


def _journal_change(line: bytes) -> _Change | None:
    """The change a complete journal line holds (without its newline), or None when it is
    not one."""
    try:
        item = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(item, list) or not item:
        return None
    kind, args = item[0], tuple(item[1:])
    if kind == _FORGET:
        return (kind, args) if len(args) == 1 and isinstance(args[0], str) else None
    grant = kind == _GRANT and len(args) == 3 and all(isinstance(a, str) for a in args)
    end = (
        kind == _END
        and len(args) == 4
        and isinstance(args[1], (int, float))
        and all(isinstance(a, str) for a in (args[0], args[2], args[3]))
    )
    if not (grant or end):
        return None
    try:  # the database holds only records that read back (`active_leases`)
        return (kind, args) if isinstance(json.loads(args[2]), dict) else None
    except ValueError:
        return None


class LeaseStore:
    """The broker's SQLite file (`<data dir>/broker.sqlite3`) and its lease journal
    (`<data dir>/broker.leases.jsonl`), folded into it at once when a crash left one.

    Raises:
        sqlite3.Error: the file cannot be opened or is not an rbroker database, or the journal
            cannot be folded into it.
        OSError: the journal cannot be opened or read (ELOOP: it is a symbolic link).
    """

    def __init__(self, path: Path) -> None:
        private_sqlite(path)  # 0600 in a 0700 dir, whatever the umask
        self.path = path
        self.journal_path = path.with_name(path.stem + JOURNAL_SUFFIX)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()
        self._pending: list[_Change] = []  # journaled, not yet in the database, in order
        self._journal_bytes = 0  # the journal's length after its last whole line
        self._journal = -1  # its descriptor (below)
        self._baseline_rows: dict[tuple[int, float, str], int] = {}  # the baselines table
        self._flush_handle: asyncio.TimerHandle | None = None
        self.owed_path = path.with_name(path.stem + OWED_SUFFIX)
        self._owed = -1  # the reserve's descriptor (-1: none)
        self._owed_room = 0  # its allocated bytes
        self._owed_bytes = 0  # its bytes in use: whole lines, then NUL bytes
        self._owing = False  # a change is pending that the journal does not hold
        self._retry_at = 0.0  # monotonic: `retry` tries no earlier
        self._tail: list[_Change] = []  # read from the reserve at the open
        self._prune_keep: int | None = None  # ended leases kept by the next fold's prune
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
        try:
            self._journal = private_append(self.journal_path)
            self._open_reserve()
            self._replay_journal()
        except BaseException:
            for fd in (self._journal, self._owed):
                if fd >= 0:
                    os.close(fd)
            self._db.close()
            raise

    def _open_reserve(self) -> None:
        """Open the reserve, read what a stop on a full disk left there (folded after the
        journal's lines), allocate its room (a failure leaves it as large as it is)."""
        self._owed = private_append(self.owed_path, append=False)
        data = b""
        while chunk := os.read(self._owed, 1 << 20):
            data += chunk
        end = data.find(b"\0")
        lines = (data if end < 0 else data[:end]).split(b"\n")
        lines.pop()  # b"" after a whole last line, else a torn one: never acknowledged
        owed = [c for c in map(_journal_change, lines) if c is not None]
        if owed:
            log.warning(
                "%s: %d changes a full disk kept out of the journal folded into the database",
                self.owed_path,
                len(owed),
            )
            self._owed_bytes = len(data) if end < 0 else end
        size = len(data)
        if size < OWED_RESERVE_BYTES:
            try:
                if hasattr(os, "posix_fallocate"):
                    os.posix_fallocate(self._owed, 0, OWED_RESERVE_BYTES)
                else:
                    os.lseek(self._owed, size, os.SEEK_SET)
                    os.write(self._owed, b"\0" * (OWED_RESERVE_BYTES - size))
                size = OWED_RESERVE_BYTES
            except OSError as exc:
                log.warning("%s: no room reserved for ends (%s)", self.owed_path, exc)
                size = os.fstat(self._owed).st_size
        self._owed_room = size
        self._tail = owed  # folded after the journal's lines (`_replay_journal`)

    def _replay_journal(self) -> None:
        """Fold what a crash left in the journal into the database, truncate it."""
        os.lseek(self._journal, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(self._journal, 1 << 20):
            chunks.append(chunk)
        if not chunks and not self._tail:  # the usual case: the last broker closed its store
            return
        lines = b"".join(chunks).split(b"\n")
        torn = lines.pop()  # b"" after a whole last line
        if torn:
            log.warning(
                "lease journal %s: a torn last line (%d bytes, a write cut by a crash) skipped",
                self.journal_path,
                len(torn),
            )
        for number, line in enumerate(lines, 1):
            change = _journal_change(line)
            if change is None:
                log.error(
                    "lease journal %s: line %d unreadable (%d bytes), skipped",
                    self.journal_path,
                    number,
                    len(line),
                )
                continue
            self._pending.append(change)
        self._pending += self._tail
        self._tail = []
        if self._pending:
            log.info(
                "lease journal %s: %d lease changes left by a crash folded into the database",
                self.journal_path,
                len(self._pending),
            )
        self._journal_bytes = -1  # unknown until truncated
        self._fold_locked()
        if self._journal_bytes != 0:  # nothing was pending, only skipped lines
            self._truncate_journal()

    def meta(self, key: str) -> str | None:
        """A value of the `meta` table (None when not set)."""
        with self._lock:
            self._fold_locked()
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
        """Fold the journal into the database, close both (a journal that cannot be folded
        stays, for the next open)."""
        with self._lock:
            try:
                self._fold_locked()
            finally:
                self._db.close()
                for fd in (self._journal, self._owed):
                    if fd >= 0:
                        os.close(fd)
                self._journal = self._owed = -1

    def _append_locked(self, change: _Change) -> None:
        """Journal `change` (one `os.write`, done on return), queue it for the fold.

        Raises:
            OSError: the write failed (the journal is cut back to its last whole line).
        """
        line = orjson.dumps([change[0], *change[1]]) + b"\n"
        try:
            written = os.write(self._journal, line)
            while written < len(line):  # a short write (a full disk): the rest, or an error
                written += os.write(self._journal, line[written:])
        except OSError:
            if self._journal_bytes >= 0:
                try:
                    os.ftruncate(self._journal, self._journal_bytes)
                except OSError:
                    log.exception("lease journal %s: cutting a failed write", self.journal_path)
            raise
        if self._journal_bytes >= 0:
            self._journal_bytes += len(line)
        self._pending.append(change)

    def _keep_locked(self, change: _Change) -> None:
        """Journal `change`, which may not be refused (an end, a waiting request's removal):
        what the journal cannot take goes to the reserve, or, when that is full too, stays
        in memory only (logged); either way it is pending for the next fold, in order."""
        try:
            self._append_locked(change)
            return
        except OSError as exc:
            reason = exc
        self._pending.append(change)
        self._owing = True
        line = orjson.dumps([change[0], *change[1]]) + b"\n"
        where = self._owed_bytes
        if self._owed >= 0 and where + len(line) < self._owed_room:  # a NUL byte stays last
            try:
                _write_at(self._owed, line, where)
                self._owed_bytes += len(line)
                log.warning(
                    "the lease journal cannot be written (%s): a %s kept in %s",
                    reason,
                    _KIND_NAMES.get(change[0], "change"),
                    self.owed_path,
                )
                return
            except OSError as exc:
                reason = exc
        log.error(
            "the lease journal cannot be written (%s) and its reserve is full: a %s is kept in "
            "memory only until there is room (a stop before then loses it)",
            reason,
            _KIND_NAMES.get(change[0], "change"),
        )

    def _clear_reserve(self) -> None:
        """The reserve's changes are in the database: its lines become NUL bytes again."""
        if not self._owed_bytes:
            return
        try:
            _write_at(self._owed, b"\0" * self._owed_bytes, 0)
        except OSError:
            log.exception(
                "%s: clearing it after the fold (replaying is idempotent)", self.owed_path
            )
            return
        self._owed_bytes = 0

    def retry(self, now: float) -> None:
        """Try again to write what a full disk kept in memory or in the reserve (the broker's
        tick: at most every `OWED_RETRY_S` of monotonic time `now`)."""
        if not self._owing or now < self._retry_at:
            return
        self._retry_at = now + OWED_RETRY_S
        try:
            self.flush()
        except sqlite3.Error as exc:
            log.debug("what is owed is still not written: %s", exc)
            return
        log.warning("the data directory takes writes again: what was owed is written")

    @property
    def owing(self) -> bool:
        """True while a change that a full disk could not write waits for room."""
        return self._owing

    def put_lease(self, lease_id: str, token: str, record: dict[str, Any]) -> None:
        """Write a granted (re-attached, resized) lease to the journal: done on return, in
        the database within `END_FLUSH_S` (see the module docstring).

        Raises:
            OSError: the journal cannot be written (the store keeps nothing of it).
        """
        with self._lock:
            self._append_locked((_GRANT, (lease_id, token_hash(token), record_json(record))))
        self.flush_soon()

    def put_baseline(self, holder_pid: int, holder_start: float, gpu_uuid: str, mib: int) -> None:
        """Write a holder's baseline on a GPU (MiB; 0 or less deletes it), committed on return
        (never raises: one SQLite cannot take waits in memory for room, see the docstring).
        A figure the table already holds (or a deletion of a row it does not hold) writes
        nothing: this store is the table's only writer (one broker per data dir), so the
        rows it keeps in memory are the table's."""
        key = (holder_pid, holder_start, gpu_uuid)
        with self._lock:
            if mib > 0:
                if self._baseline_rows.get(key) == mib:
                    return
                change: _Change = (_BASELINE, (*key, mib))
                self._baseline_rows[key] = mib
            elif key in self._baseline_rows:
                change = (_NO_BASELINE, key)
                del self._baseline_rows[key]
            else:
                return
            if not self._owing:
                try:
                    self._db.execute(_SQL[change[0]], change[1])
                    return
                except sqlite3.Error as exc:
                    log.warning("a baseline is kept in memory until there is room: %s", exc)
            self._pending.append(change)  # after what is owed, in order
            self._owing = True

    def baselines(self) -> list[tuple[int, float, str, int]]:
        """Every stored baseline: (holder pid, holder start time, GPU UUID, MiB)."""
        with self._lock:
            self._fold_locked()
            rows = self._db.execute(
                "SELECT holder_pid, holder_start, gpu_uuid, mib FROM baselines"
            ).fetchall()
        return [(int(p), float(s), str(u), int(m)) for p, s, u, m in rows]

    def end_lease_soon(
        self, lease_id: str, state: str, ended_at: float, record: dict[str, Any]
    ) -> None:
        """Write a lease's end to the journal (done on return; in the database with the next
        fold: the caller calls `flush_soon`; see the module docstring). Never raises: an end
        the journal cannot take goes to the reserve (see the module docstring)."""
        with self._lock:
            self._keep_locked((_END, (state, ended_at, record_json(record), lease_id)))

    def flush(self) -> None:
        """Fold the journal's changes into the database (one commit; nothing when none are
        pending), then truncate it.

        Raises:
            sqlite3.Error: the write failed (the changes stay pending, the journal whole).
        """
        with self._lock:
            self._fold_locked()

    def flush_soon(self) -> None:
        """Fold the journal into the database within `END_FLUSH_S` (at once when no event
        loop runs: a broker driven step by step); a failed timed fold is logged and retried
        with the next one."""
        if self._flush_handle is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._flush_timed()
            return
        self._flush_handle = loop.call_later(END_FLUSH_S, self._flush_timed)

    def _flush_timed(self) -> None:
        self._flush_handle = None
        owing = self._owing
        try:
            self.flush()
        except sqlite3.Error as exc:
            if not owing:  # once per episode, not at every retry
                log.warning("folding the lease journal failed (retried): %s", exc)

    def _fold_locked(self) -> None:
        """The pending changes into the database in one transaction, in order; then the
        journal truncated (a failed truncation is logged: replaying is idempotent)."""
        keep = self._prune_keep
        if not self._pending and keep is None:
            return
        pending, self._pending = self._pending, []
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for kind, run in itertools.groupby(pending, key=lambda c: c[0]):
                    self._db.executemany(_SQL[kind], [args for _, args in run])
                pruned = keep is not None and self._prune_locked(keep)
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
        except BaseException:
            self._pending = pending + self._pending
            self._owing = True  # retried by `retry`
            raise
        if pruned:
            self._prune_keep = None
        self._truncate_journal()
        self._clear_reserve()
        self._owing = False

    def _prune_locked(self, keep: int) -> bool:
        """Within the fold's transaction, delete all but the `keep` most recently ended
        leases (in a savepoint: a failure is logged and undone alone); True when done."""
        try:
            self._db.execute("SAVEPOINT prune")
        except sqlite3.Error as exc:
            log.warning("ended leases not pruned (at a later fold): %s", exc)
            return False
        try:
            self._db.execute(_PRUNE_SQL, (keep,))
        except sqlite3.Error as exc:
            log.warning("ended leases not pruned (at a later fold): %s", exc)
            self._db.execute("ROLLBACK TO prune")  # raises when SQLite ended the transaction
            self._db.execute("RELEASE prune")
            return False
        self._db.execute("RELEASE prune")
        return True

    def _truncate_journal(self) -> None:
        try:
            os.ftruncate(self._journal, 0)
        except OSError:
            log.exception("lease journal %s: truncating after the fold", self.journal_path)
            try:
                self._journal_bytes = os.fstat(self._journal).st_size
            except OSError:
                self._journal_bytes = -1  # unknown: a failed write is not cut back
        else:
            self._journal_bytes = 0

    def active_leases(self) -> list[StoredLease]:
        """Leases not yet ended, in grant order."""
        with self._lock:
            self._fold_locked()
            rows = self._db.execute(
                "SELECT lease_id, token_sha256, record FROM leases WHERE state = 'active' "
                "ORDER BY rowid"
            ).fetchall()
        return [StoredLease(r[0], r[1], json.loads(r[2])) for r in rows]

    def put_waiter(self, request_key: str, seq: int, record: dict[str, Any]) -> None:
        """Write a waiting request (committed on return, after every pending change: a
        removal of the same key waiting in the journal must not delete it).

        Raises:
            sqlite3.Error: it cannot be written (nothing of it is kept).
        """
        with self._lock:
            self._fold_locked()
            self._db.execute(
                "INSERT OR REPLACE INTO waiters(request_key, seq, record) VALUES (?, ?, ?)",
                (request_key, seq, json.dumps(record)),
            )

    def delete_waiter(self, request_key: str) -> None:
        """Forget a request that was granted, refused, timed out or cancelled: in the
        journal, as an end (never raises; see the module docstring)."""
        with self._lock:
            self._keep_locked((_FORGET, (request_key,)))
        self.flush_soon()

    def waiters(self) -> list[dict[str, Any]]:
        """Waiting requests in FIFO order (their records, with `request_key`)."""
        with self._lock:
            self._fold_locked()
            rows = self._db.execute(
                "SELECT request_key, record FROM waiters ORDER BY seq"
            ).fetchall()
        return [{**json.loads(r[1]), "request_key": r[0]} for r in rows]

    def prune_ended_soon(self, keep: int) -> None:
        """Keep only the `keep` most recently ended leases, from the next fold on (within
        `END_FLUSH_S`): the prune is one more statement of the fold's transaction, not a
        fold and a commit of its own on the caller's path (a release that pruned waited
        for both, about 0.7 ms, every 200 ends: issue 44). Never raises: a prune SQLite
        cannot do is logged and done at a later fold, and takes nothing else of the fold
        with it."""
        with self._lock:
            self._prune_keep = keep
        self.flush_soon()

    def put_booking(self, record: Mapping[str, Any], live: bool, keep_ended: int) -> None:
        """Write a booking's record (committed on return), keeping at most `keep_ended`
        bookings that are no longer live. What a full disk owes is written first.

        Raises:
            sqlite3.Error: it cannot be written (nothing of it is kept).
        """
        with self._lock:
            if self._owing:
                self._fold_locked()
            self._db.execute(
                "INSERT OR REPLACE INTO bookings(booking_id, record, live) VALUES (?, ?, ?)",
                (record["booking_id"], json.dumps(record), int(live)),
            )
            if not live:
                self._db.execute(
                    "DELETE FROM bookings WHERE live = 0 AND booking_id NOT IN ("
                    "SELECT booking_id FROM bookings WHERE live = 0 ORDER BY rowid DESC "
                    "LIMIT ?)",
                    (keep_ended,),
                )

    def bookings(self) -> list[dict[str, Any]]:
        """Every booking's record kept, oldest write first."""
        with self._lock:
            self._fold_locked()
            rows = self._db.execute("SELECT record FROM bookings ORDER BY rowid").fetchall()
        return [json.loads(r[0]) for r in rows]

    def put_job(self, job_id: str, record: Mapping[str, Any]) -> None:
        """Write a job's record (committed on return). What a full disk
        owes is written first.

        Raises:
            sqlite3.Error: it cannot be written (nothing of it is kept).
        """
        with self._lock:
            if self._owing:
                self._fold_locked()
            self._db.execute(
                "INSERT OR REPLACE INTO jobs(job_id, record) VALUES (?, ?)",
                (job_id, json.dumps(record)),
            )

    def add_chunk(
        self, job_id: str, chunk_id: str, completed: int, failed: int, record: Mapping[str, Any]
    ) -> None:
        """Record one chunk and the job's new counts in one transaction. What a full disk
        owes is written first.

        Raises:
            sqlite3.Error: it cannot be written (nothing of it is kept).
        """
        with self._lock:
            if self._owing:
                self._fold_locked()
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

    def delete_jobs(self, job_ids: list[str]) -> None:
        """Forget finished jobs and their chunks, in one transaction (committed on return).
        What a full disk owes is written first.

        Raises:
            sqlite3.Error: it cannot be written (nothing of it is kept).
        """
        with self._lock:
            if self._owing:
                self._fold_locked()
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for job_id in job_ids:
                    self._db.execute("DELETE FROM job_chunks WHERE job_id = ?", (job_id,))
                    self._db.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def jobs(self) -> list[tuple[dict[str, Any], dict[str, tuple[int, int]]]]:
        """Every job's record with its chunks `{chunk_id: (completed, failed)}`."""
        with self._lock:
            self._fold_locked()
            jobs = self._db.execute("SELECT job_id, record FROM jobs ORDER BY rowid").fetchall()
            chunks = self._db.execute(
                "SELECT job_id, chunk_id, completed, failed FROM job_chunks"
            ).fetchall()
        by_job: dict[str, dict[str, tuple[int, int]]] = {}
        for job_id, chunk_id, completed, failed in chunks:
            by_job.setdefault(job_id, {})[chunk_id] = (int(completed), int(failed))
        return [(json.loads(rec), by_job.get(job_id, {})) for job_id, rec in jobs]
