"""The broker's audit trail: an append-only record of the actions that touch another user's
work or the whole computer (docs/architecture.md §3, "Audit trail"; issue 42).

What is recorded (`action`): an administrator ending another user's lease
(`lease_revoked`), cancelling another user's waiting request (`request_cancelled`) or
booking (`booking_cancelled`); new admissions paused or resumed (`admissions_paused`,
`admissions_resumed`); a request, job or booking refused by `[members]` (`member_refused`);
an idle lease reclaimed by the broker (`lease_reclaimed`, actor `broker`;
`rbroker.broker.reclaim`);
and `chain_broken`, written by the broker itself when it finds the record it continues
broken.

The file: `audit.jsonl` in the broker's data dir, created 0600 in the 0700 data dir like the
lease journal (`rbroker_protocol.files.private_append`, never through a symbolic link), one
JSON object per line, written by one `os.write` of `O_APPEND` per entry before the action's
answer goes out, no fsync (as the lease journal):

    {"seq": int (from 1, +1 per entry), "at": float (Unix s, wall clock),
     "actor": str (the OS user who acted; "broker" for the broker itself),
     "action": str (above), "target": {"owner": str, "project": str, "kind": str, "id": str}
     ("" where not known), "reason": str, "prev": str}

`prev` is the SHA-256 (hex) of the previous line's bytes without its newline ("0" * 64 for
the first entry ever): a hash chain. A line edited, a line removed or inserted, or the file
cut short in the middle makes a later `prev` (or `seq`) disagree, and `verify` names the
line; the last line is checked against what this broker wrote last. The chain shows damage;
it does not prevent it: the file's mode (0600, in a 0700 data dir of the broker's account)
keeps other users from writing, truncating or reading it, and someone with the broker's own
account or root could rewrite it whole.

Entries are never edited and a broken file is never rewritten: a broker that opens a record
whose chain does not verify logs a warning and appends a `chain_broken` entry naming where
(its `prev` chains to the last line found), and continues from it; `audit.list` reports the
break (`verified` false, `problem`) as long as the broken lines are kept.

Retention: two files. When an entry would take `audit.jsonl` past `max_bytes`
(`MAX_BYTES`, 16 MiB), the file is renamed `audit.1.jsonl` (the one there before is dropped)
and a new `audit.jsonl` starts, whose first entry chains to the last of the renamed one: at
most about 2 × `max_bytes` are kept, the newest entries always.

Refusals are throttled: at most one `member_refused` entry per user every `REFUSALS_EVERY_S`
(the next one says how many were left out), so that a user who is refused in a loop cannot
push the administrators' entries out of the two files kept.

A write that fails (a full disk, a removed or read-only data dir) is logged and never fails
or delays the action: refusing an administrator's or the broker's action because its record
cannot be written would be worse than a gap in the record. The entry is lost (the chain goes
on from the last line written); each later entry tries again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from rbroker_protocol.files import private_append
from rbroker_protocol.results import AuditEntry, AuditListResult

log = logging.getLogger(__name__)

FILE_NAME: Final = "audit.jsonl"
"""The audit file in the broker's data dir."""
OLD_NAME: Final = "audit.1.jsonl"
"""The file before it (retention: these two)."""
MAX_BYTES: Final = 16 * 1024 * 1024
"""Size past which the file is renamed `OLD_NAME` and a new one starts."""
GENESIS: Final = "0" * 64
"""`prev` of the first entry ever written."""
BROKER_ACTOR: Final = "broker"
"""The actor of entries the broker writes of itself (`chain_broken`)."""
REFUSALS_EVERY_S: Final = 60.0
"""At most one `member_refused` entry per OS user in this many seconds (`Audit.refused`)."""
MAX_FIELD_CHARS: Final = 1000
"""Longest actor, target field or reason kept (longer ones are cut, with "…")."""

_FIELDS: Final = ("seq", "at", "actor", "action", "target", "reason", "prev")
_TARGET: Final = ("owner", "project", "kind", "id")


def line_hash(line: bytes) -> str:
    """SHA-256 (hex) of one line's bytes, its newline excluded: the next entry's `prev`."""
    return hashlib.sha256(line).hexdigest()


@dataclass(frozen=True, slots=True)
class Target:
    """What an action touched: its owner (OS user), project, kind (`lease`, `request`,
    `booking`, `job`, `broker`, `audit`) and id ("" where not known)."""

    owner: str = ""
    project: str = ""
    kind: str = ""
    id: str = ""


@dataclass(slots=True)
class _Read:
    """What `_read` found: the entries parsed (with `seq`), the first problem and how many
    more, the last line's bytes and whether it ended without a newline."""

    entries: list[AuditEntry]
    problems: list[tuple[int, str]]  # (index among the lines read, words)
    last_line: bytes | None
    torn: bool
    last_seq: int
    last_break: int  # index of the last `chain_broken` entry, -1 if none


def _cut(text: str) -> str:
    return text if len(text) <= MAX_FIELD_CHARS else text[: MAX_FIELD_CHARS - 1] + "…"


def _entry(raw: bytes) -> AuditEntry | None:
    """One line as an entry, or None when it is not one (bad JSON, a field missing or of
    another type)."""
    try:
        value: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(value, dict) or set(value) != set(_FIELDS):
        return None
    target = value["target"]
    if not isinstance(target, dict) or set(target) != set(_TARGET):
        return None
    texts = [value[k] for k in ("actor", "action", "reason", "prev")] + list(target.values())
    if not all(isinstance(x, str) for x in texts):
        return None
    if type(value["seq"]) is not int or not isinstance(value["at"], int | float):
        return None
    entry: AuditEntry = value  # type: ignore[assignment]  # checked field by field above
    return entry


def _read(paths: list[Path]) -> _Read:
    """Read and verify the lines of `paths` (oldest file first) as one chain; a missing file
    is empty, one that cannot be read (not a file, no permission) is a problem."""
    found = _Read([], [], None, False, 0, -1)
    prev_line: bytes | None = None
    prev_seq: int | None = None
    index = 0
    for path in paths:
        found.torn = False  # of the last file only: the one written to
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        except OSError as exc:
            reason = exc.strerror or str(exc)
            found.problems.append((index, f"{path.name} cannot be read ({reason})"))
            prev_line, prev_seq = None, None
            continue
        if not data:
            continue
        lines = data.split(b"\n")
        found.torn = lines[-1] != b""
        if not found.torn:
            lines.pop()
        for number, raw in enumerate(lines, 1):
            where = f"{path.name} line {number}"
            entry = _entry(raw)
            if entry is None:
                words = "is not an entry (edited, or cut short by a failed write)"
                found.problems.append((index, f"{where} {words}"))
                prev_seq = None
            else:
                if prev_line is not None and entry["prev"] != line_hash(prev_line):
                    found.problems.append(
                        (
                            index,
                            f"{where} does not chain to the line before it (that line or this "
                            "one was edited, or lines between them were removed)",
                        )
                    )
                elif prev_seq is not None and entry["seq"] != prev_seq + 1:
                    found.problems.append(
                        (index, f"{where} has seq {entry['seq']} after {prev_seq}: lines missing")
                    )
                found.entries.append(entry)
                prev_seq = entry["seq"]
                found.last_seq = max(found.last_seq, entry["seq"])
                if entry["action"] == "chain_broken":
                    found.last_break = index
            prev_line = raw
            index += 1
    found.last_line = prev_line
    return found


class Audit:
    """The audit trail in `data_dir` (see the module docstring); `wall()` gives the entries'
    times (Unix s). With `data_dir` None nothing is written and the record is empty (a
    broker without a data dir: tests). Opening never raises: a file that cannot be read or
    opened is logged, and each entry tries again."""

    def __init__(
        self,
        data_dir: Path | None,
        wall: Callable[[], float],
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self.path = None if data_dir is None else Path(data_dir) / FILE_NAME
        self.wall = wall
        self.max_bytes = max_bytes
        self.unwritten = 0
        """Entries that could not be written since the start (logged each time)."""
        self._fd: int | None = None  # None: not open (yet, or after a failure)
        self._last_line: bytes | None = None  # the last line this broker wrote or read
        self._seq = 0
        self._torn = False  # the file ends without a newline: write one first
        self._refusals: dict[str, tuple[float, int]] = {}  # user → (last entry at, left out)
        self._open()

    @property
    def old_path(self) -> Path | None:
        """`audit.1.jsonl` beside the file (None without a data dir)."""
        return None if self.path is None else self.path.with_name(OLD_NAME)

    def _paths(self) -> list[Path]:
        assert self.path is not None and self.old_path is not None
        return [self.old_path, self.path]

    def _open(self) -> bool:
        """Open the file, continue its seq and chain, and mark a broken chain (see the module
        docstring). Returns whether it is open; failures are logged."""
        if self.path is None or self._fd is not None:
            return self._fd is not None
        found = _read(self._paths())
        try:
            self._fd = private_append(self.path)
        except OSError as exc:
            log.warning("audit: %s cannot be opened (%s); entries are not kept", self.path, exc)
            return False
        self._last_line, self._seq, self._torn = found.last_line, found.last_seq, found.torn
        fresh = [words for index, words in found.problems if index > found.last_break]
        if fresh:
            more = f" (and {len(fresh) - 1} more)" if len(fresh) > 1 else ""
            log.warning("audit: %s: %s%s; a new chain segment starts", self.path, fresh[0], more)
            self.record(
                BROKER_ACTOR,
                "chain_broken",
                Target(kind="audit", id=FILE_NAME),
                f"the record before this entry does not verify: {fresh[0]}{more}",
            )
        return True

    def record(self, actor: str, action: str, target: Target, reason: str) -> None:
        """Append one entry (see the module docstring), rotating first when it would take the
        file past `max_bytes`. Never raises: a failed write is logged and counted
        (`unwritten`)."""
        if self.path is None:
            return
        if self._fd is None and not self._open():
            self._lost(action, "the file cannot be opened")
            return
        entry = {
            "seq": self._seq + 1,
            "at": self.wall(),
            "actor": _cut(actor),
            "action": action,
            "target": {
                "owner": _cut(target.owner),
                "project": _cut(target.project),
                "kind": target.kind,
                "id": _cut(target.id),
            },
            "reason": _cut(reason),
            "prev": GENESIS if self._last_line is None else line_hash(self._last_line),
        }
        line = orjson.dumps(entry)
        try:
            assert self._fd is not None
            size = os.fstat(self._fd).st_size
            if size and size + len(line) + 2 > self.max_bytes:
                self._rotate()
            if self._fd is None:
                raise OSError(f"{self.path} cannot be opened again after its rotation")
            data = (b"\n" if self._torn else b"") + line + b"\n"
            written = os.write(self._fd, data)
        except OSError as exc:
            self._lost(action, str(exc))
            return
        if written != len(data):  # a full disk mid-line: the next entry starts a line
            self._torn = True
            self._lost(action, f"only {written} of {len(data)} bytes written")
            return
        self._torn = False
        self._seq += 1
        self._last_line = line

    def refused(self, user: str, target: Target, reason: str, now: float) -> None:
        """A `member_refused` entry for `user` (`record`), unless one was written for it less
        than `REFUSALS_EVERY_S` before `now` (monotonic s): then it is only counted, and the
        next entry written says how many were left out."""
        last, left_out = self._refusals.get(user, (-math.inf, 0))
        if now - last < REFUSALS_EVERY_S:
            self._refusals[user] = (last, left_out + 1)
            return
        if left_out:
            reason += (
                f" ({left_out} more refusals of {user} in the {REFUSALS_EVERY_S:g} s after the "
                "entry before were not recorded)"
            )
        self._refusals[user] = (now, 0)
        self.record(user, "member_refused", target, reason)

    def _rotate(self) -> None:
        """Rename the file `OLD_NAME` (dropping the one there) and open a new one (closed
        first: Windows renames no open file). A failed rename is logged and the current file
        goes on past its limit.

        Raises:
            OSError: the file cannot be opened again (`_fd` is then None: the next entry
                tries again).
        """
        assert self._fd is not None and self.path is not None and self.old_path is not None
        os.close(self._fd)
        self._fd = None
        try:
            os.replace(self.path, self.old_path)
        except OSError as exc:
            log.warning("audit: %s not rotated (%s); it grows past its limit", self.path, exc)
        else:
            self._torn = False
        self._fd = private_append(self.path)

    def _lost(self, action: str, why: str) -> None:
        self.unwritten += 1
        log.warning(
            "audit: a %s entry was not written to %s (%s); the action went ahead",
            action,
            self.path,
            why,
        )

    def listed(self, limit: int = 200, before_seq: int | None = None) -> AuditListResult:
        """`audit.list`: the newest `limit` entries (oldest first) with `seq` below
        `before_seq` when given, from both files, and whether the whole record kept verifies
        (`verified`; `problem`: the first break in words, naming the file and line, or why
        the files cannot be read). Reads and hashes both files (at most about 2 ×
        `max_bytes`)."""
        if self.path is None:
            return {"entries": [], "verified": True, "problem": None}
        found = _read(self._paths())
        problems = [words for _index, words in found.problems]
        if self._last_line is not None and found.last_line != self._last_line:
            problems.append(
                f"{FILE_NAME}'s last line is not entry {self._seq}, the last this broker "
                "wrote: the file was cut short or changed since"
            )
        entries = [e for e in found.entries if before_seq is None or e["seq"] < before_seq]
        problem = None
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            problem = problems[0] + more
        return {
            "entries": entries[-limit:] if limit > 0 else [],
            "verified": not problems,
            "problem": problem,
        }

    def close(self) -> None:
        """Close the file (entries after this try to open it again)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None
