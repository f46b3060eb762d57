"""The lease journal (`rbroker.broker.store.LeaseStore`): a grant, re-attach, resize or end
is one appended line before the call returns, folded into SQLite within `END_FLUSH_S`, before
any read and at close, then truncated. A store opened after a crash (its predecessor never
closed, its timer never ran) folds what the journal holds first: every lease answered is
there, ended ones ended; a torn last line or an unreadable one is logged and skipped."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from rbroker.broker.store import LeaseStore, token_hash

TOKEN = "secret-token-never-written"


def _record(lease_id: str, mib: int = 512) -> dict[str, object]:
    return {"lease_id": lease_id, "granted_mib": mib, "holder_pid": 4242, "ttl_s": 30.0}


def _in_a_loop(changes: Callable[[], None]) -> None:
    """Run `changes` as a broker does, on a running event loop (the fold is put on a
    timer), and stop the loop before the timer fires: nothing folds, as in a crash."""
    loop = asyncio.new_event_loop()

    async def main() -> None:
        changes()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def _rows(path: Path) -> dict[str, str]:
    """lease_id → state, as another reader of the database sees it."""
    db = sqlite3.connect(path)
    try:
        return dict(db.execute("SELECT lease_id, state FROM leases").fetchall())
    finally:
        db.close()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "data" / "broker.sqlite3"


def test_answered_changes_are_in_the_journal_only_and_a_reopen_after_a_crash_has_them(
    path: Path,
) -> None:
    crashed = LeaseStore(path)  # never closed: the broker was killed

    def changes() -> None:
        crashed.put_lease("lease-a", TOKEN, _record("lease-a"))
        crashed.put_lease("lease-b", "token-b", _record("lease-b"))
        crashed.put_lease("lease-b", "token-b2", _record("lease-b", mib=1024))  # re-attach
        crashed.end_lease_soon("lease-a", "released", 1765000000.5, _record("lease-a"))
        crashed.flush_soon()

    _in_a_loop(changes)
    journal = crashed.journal_path.read_bytes()
    assert journal.count(b"\n") == 4
    assert TOKEN.encode() not in journal  # the token's hash only
    assert _rows(path) == {}  # no commit on the answer's path

    store = LeaseStore(path)
    try:
        assert store.journal_path.read_bytes() == b""  # folded, then truncated
        assert _rows(path) == {"lease-a": "released", "lease-b": "active"}
        [active] = store.active_leases()
        assert (active.lease_id, active.token_sha256) == ("lease-b", token_hash("token-b2"))
        assert active.record["granted_mib"] == 1024
    finally:
        store.close()


def test_a_lease_granted_and_ended_in_one_window_ends_up_ended(path: Path) -> None:
    store = LeaseStore(path)
    try:

        def changes() -> None:
            for n in range(3):
                lease_id = f"lease-{n}"
                store.put_lease(lease_id, TOKEN, _record(lease_id))
                store.end_lease_soon(lease_id, "released", 1765000000.0 + n, _record(lease_id))
                store.flush_soon()
            store.put_lease("lease-kept", TOKEN, _record("lease-kept"))

        _in_a_loop(changes)
        assert [x.lease_id for x in store.active_leases()] == ["lease-kept"]  # a read folds
        assert _rows(path) == {
            "lease-0": "released",
            "lease-1": "released",
            "lease-2": "released",
            "lease-kept": "active",
        }
    finally:
        store.close()


def test_the_journal_is_truncated_after_each_fold_and_the_timer_folds(path: Path) -> None:
    store = LeaseStore(path)
    try:
        seen: list[tuple[int, dict[str, str]]] = []

        async def main() -> None:
            store.put_lease("lease-a", TOKEN, _record("lease-a"))
            seen.append((store.journal_path.stat().st_size, _rows(path)))
            await asyncio.sleep(0.3)  # the broker's timer: END_FLUSH_S
            seen.append((store.journal_path.stat().st_size, _rows(path)))
            store.end_lease_soon("lease-a", "expired", 1765000001.0, _record("lease-a"))
            store.flush()
            seen.append((store.journal_path.stat().st_size, _rows(path)))

        asyncio.run(main())
        assert seen[0][0] > 0 and seen[0][1] == {}
        assert seen[1] == (0, {"lease-a": "active"})
        assert seen[2] == (0, {"lease-a": "expired"})
    finally:
        store.close()


def test_a_torn_last_line_is_skipped_with_one_log_line(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    crashed = LeaseStore(path)
    _in_a_loop(lambda: crashed.put_lease("lease-a", TOKEN, _record("lease-a")))
    whole = crashed.journal_path.read_bytes()
    with crashed.journal_path.open("ab") as f:  # a write cut short by the crash
        f.write(whole[: len(whole) // 2])
    with caplog.at_level(logging.INFO, logger="rbroker.broker.store"):
        store = LeaseStore(path)
    try:
        assert [x.lease_id for x in store.active_leases()] == ["lease-a"]
        torn = [r for r in caplog.records if "torn last line" in r.getMessage()]
        assert len(torn) == 1 and torn[0].levelno == logging.WARNING
        # a torn last line is the crash's own, not damage: never reported as unreadable
        assert not [r for r in caplog.records if "unreadable" in r.getMessage()]
        assert store.journal_path.read_bytes() == b""
    finally:
        store.close()


def test_an_unreadable_line_is_logged_and_skipped(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    crashed = LeaseStore(path)
    _in_a_loop(lambda: crashed.put_lease("lease-a", TOKEN, _record("lease-a")))
    with crashed.journal_path.open("ab") as f:
        f.write(b'{"not": "a change"}\n\xff\xfe garbage\n["e", "released"]\n')
        f.write(b'["g", "lease-x", "0f0f", "{not a record"]\n')
    _in_a_loop(lambda: crashed.put_lease("lease-b", TOKEN, _record("lease-b")))
    with caplog.at_level(logging.INFO, logger="rbroker.broker.store"):
        store = LeaseStore(path)
    try:
        assert [x.lease_id for x in store.active_leases()] == ["lease-a", "lease-b"]
        lines = [
            r.getMessage()
            for r in caplog.records
            if "unreadable" in r.getMessage() and r.levelno == logging.ERROR
        ]
        assert [m.split("line ")[1].split(" ")[0] for m in lines] == ["2", "3", "4", "5"]
        # whole lines in the middle are damage, not a torn end: no "torn" warning for them
        assert not [r for r in caplog.records if "torn" in r.getMessage()]
    finally:
        store.close()


def test_a_failed_fold_keeps_the_journal_for_the_next_open(path: Path) -> None:
    store = LeaseStore(path)
    _in_a_loop(lambda: store.put_lease("lease-a", TOKEN, _record("lease-a")))
    blocker = sqlite3.connect(path, timeout=0)
    blocker.execute("BEGIN EXCLUSIVE")  # another writer holds the database
    store._db.execute("PRAGMA busy_timeout=0")
    try:
        with pytest.raises(sqlite3.OperationalError):
            store.flush()
        assert store.journal_path.read_bytes().count(b"\n") == 1
    finally:
        blocker.rollback()
        blocker.close()
    store.flush()  # the retry folds it
    assert _rows(path) == {"lease-a": "active"}
    assert store.journal_path.read_bytes() == b""
    store.close()


@pytest.mark.skipif(os.name != "posix", reason="POSIX symbolic links")
def test_a_link_where_the_journal_belongs_is_refused(path: Path, tmp_path: Path) -> None:
    """A broker run as root must not append its journal to whatever file a link names."""
    target = tmp_path / "elsewhere"
    target.write_bytes(b"keep\n")
    path.parent.mkdir(parents=True)
    (path.parent / "broker.leases.jsonl").symlink_to(target)
    with pytest.raises(OSError) as caught:
        LeaseStore(path)
    assert caught.value.errno == errno.ELOOP
    assert caught.value.filename == str(path.parent / "broker.leases.jsonl")
    assert target.read_bytes() == b"keep\n"


def _ended(store: LeaseStore, first: int, count: int) -> None:
    """`count` leases granted and ended, lease-`first`…, each ending a second after the last."""
    for n in range(first, first + count):
        lease_id = f"lease-{n}"
        store.put_lease(lease_id, TOKEN, _record(lease_id))
        store.end_lease_soon(lease_id, "released", 1765000000.0 + n, _record(lease_id))


def test_the_prune_of_ended_leases_is_a_statement_of_the_next_fold_not_a_commit_of_its_own(
    path: Path,
) -> None:
    store = LeaseStore(path)
    try:
        _ended(store, 0, 8)  # no loop runs: each change folds at once
        store.put_lease("lease-active", TOKEN, _record("lease-active"))
        before = _rows(path)
        assert len(before) == 9
        statements: list[str] = []
        store._db.set_trace_callback(statements.append)

        def changes() -> None:
            _ended(store, 8, 2)
            store.prune_ended_soon(3)  # on the answer's path: nothing is folded or deleted

        _in_a_loop(changes)
        assert statements == [] and _rows(path) == before
        store.flush()
        kinds = [s.split()[0] for s in statements]
        assert kinds[0] == "BEGIN" and kinds[-1] == "COMMIT" and kinds.count("COMMIT") == 1
        assert any(s.startswith("DELETE FROM leases") for s in statements)
        assert _rows(path) == {
            "lease-7": "released",
            "lease-8": "released",
            "lease-9": "released",
            "lease-active": "active",
        }
        statements.clear()
        store.flush()  # done: the next fold has nothing to do
        assert statements == []
    finally:
        store.close()


def test_a_prune_that_fails_is_undone_alone_and_done_at_a_later_fold(
    path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = LeaseStore(path)
    try:
        _ended(store, 0, 5)
        monkeypatch.setattr("rbroker.broker.store._PRUNE_SQL", "DELETE FROM no_such_table")
        store.prune_ended_soon(2)
        with caplog.at_level(logging.WARNING, logger="rbroker.broker.store"):
            store.flush()  # the ends are folded; the prune is logged and stays due
        assert "ended leases not pruned (at a later fold)" in caplog.text
        assert len(_rows(path)) == 5 and store.journal_path.read_bytes() == b""
        monkeypatch.undo()
        store.flush()
        assert _rows(path) == {"lease-3": "released", "lease-4": "released"}
    finally:
        store.close()
