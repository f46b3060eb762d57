"""The broker's audit trail (`rbroker.broker.audit`, architecture.md §3 "Audit trail"): an
entry for each action that touches another user's work or the whole computer, with its
actor, target and reason; a hash chain that names an edited or removed line and is never
rewritten; two files kept; a write that fails never fails the action. On the in-process
broker through the `Broker` façade; the file as read back from the data dir."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rbroker.broker.audit import REFUSALS_EVERY_S
from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.localapi import AcquireParams, BookParams
from tests.conftest import SINGLE_24G
from tests.desktop.inprocess import InProcessBroker, SleeperPool


def _acquire(h: InProcessBroker, pool: SleeperPool, owner: str, mib: int, **kw: Any) -> Any:
    """A `lease.acquire` by `owner` as the local API makes it: the lease, the RpcError it was
    refused with, or the task still waiting."""
    p = AcquireParams.model_validate(
        {"mib": mib, "project": "vision", "session": "s", "purpose": "p", **kw}
    )
    task = h.loop.create_task(h.broker.acquire(p, owner, pool.spawn()[1], 1))
    h.spin()
    if not task.done():
        return task
    return task.exception() or task.result()


def _book(h: InProcessBroker, owner: str, project: str = "nlp") -> Any:
    params = BookParams.model_validate(
        {
            "mib": 1000,
            "start_at": h.clock.wall() + 3600,
            "end_at": h.clock.wall() + 7200,
            "project": project,
            "session": "s",
            "purpose": "p",
        }
    )
    try:
        return h.broker.book(params, owner)
    except RpcError as exc:
        return exc


def _file(h: InProcessBroker, name: str = "audit.jsonl") -> Path:
    return h.data_dir / name


def _lines(h: InProcessBroker, name: str = "audit.jsonl") -> list[dict[str, Any]]:
    return [json.loads(x) for x in _file(h, name).read_bytes().splitlines()]


def _pauses(h: InProcessBroker, n: int) -> None:
    for i in range(n):
        h.broker.set_paused(i % 2 == 0, "root")


def test_each_action_on_others_work_or_the_computer_is_an_entry(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h = make_inprocess(SINGLE_24G, members={"vision": ("alice", "bob")})
    mine = _acquire(h, pool, "alice", 1000)
    h.broker.release(mine.lease_id, "alice")  # its owner's own: not audited
    lease = _acquire(h, pool, "alice", 20000)
    waiting = _acquire(h, pool, "bob", 20000, wait_s=600)
    assert not isinstance(waiting, RpcError) and not isinstance(waiting, Exception)
    (request,) = h.broker.queue
    h.broker.cancel_request(request.request_id, "root", admin=True)
    h.broker.release(lease.lease_id, "root", admin=True)
    booking = _book(h, "bob")
    h.broker.cancel_booking(booking["booking_id"], "root", admin=True)
    own = _book(h, "bob")
    h.broker.cancel_booking(own["booking_id"], "bob")  # its owner's own: not audited
    h.broker.set_paused(True, "root")
    h.broker.set_paused(False, "root")
    refused = _acquire(h, pool, "carol", 1000)
    assert isinstance(refused, RpcError) and refused.name is ErrorCode.NOT_A_MEMBER
    h.clock.advance(REFUSALS_EVERY_S)
    with pytest.raises(RpcError):
        h.broker.declare_job("carol", "vision", "p", "h", None, 1, 1)
    h.clock.advance(REFUSALS_EVERY_S)
    assert isinstance(_book(h, "carol", "vision"), RpcError)

    listed = h.broker.audit_list()
    assert listed["verified"] is True and listed["problem"] is None
    entries = listed["entries"]
    assert entries == _lines(h)  # what the file holds, oldest first
    assert [e["seq"] for e in entries] == list(range(1, 9))
    got = [(e["actor"], e["action"], tuple(e["target"].values())) for e in entries]
    assert got == [
        ("root", "request_cancelled", ("bob", "vision", "request", f"req-{request.request_id}")),
        ("root", "lease_revoked", ("alice", "vision", "lease", lease.lease_id)),
        ("root", "booking_cancelled", ("bob", "nlp", "booking", booking["booking_id"])),
        ("root", "admissions_paused", ("", "", "broker", "")),
        ("root", "admissions_resumed", ("", "", "broker", "")),
        ("carol", "member_refused", ("carol", "vision", "request", "")),
        ("carol", "member_refused", ("carol", "vision", "job", "")),
        ("carol", "member_refused", ("carol", "vision", "booking", "")),
    ]
    reasons = [e["reason"] for e in entries]
    assert reasons[0] == "request cancelled by admin root"
    assert reasons[1] == "released by admin root"
    assert "root" in reasons[2] and reasons[3] == "new admissions paused by root"
    assert "user carol is not one" in reasons[5]
    assert entries[0]["at"] == h.clock.wall() - 2 * REFUSALS_EVERY_S
    assert entries[-1]["at"] == h.clock.wall()
    # the chain: each `prev` is the SHA-256 of the line before it
    raw = _file(h).read_bytes().splitlines()
    assert entries[0]["prev"] == "0" * 64
    for before, entry in zip(raw, entries[1:], strict=False):
        assert entry["prev"] == hashlib.sha256(before).hexdigest()
    assert h.broker.audit_list(limit=3, before_seq=5)["entries"] == entries[1:4]


def test_the_record_goes_on_after_a_restart(
    make_inprocess: Callable[..., InProcessBroker],
) -> None:
    h = make_inprocess(SINGLE_24G)
    _pauses(h, 3)
    h.restart()
    _pauses(h, 2)
    listed = h.broker.audit_list()
    assert listed["verified"] and [e["seq"] for e in listed["entries"]] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("damage", ["edited", "removed"])
def test_a_line_edited_or_removed_is_named_and_the_file_not_rewritten(
    make_inprocess: Callable[..., InProcessBroker], damage: str
) -> None:
    h = make_inprocess(SINGLE_24G)
    _pauses(h, 5)
    lines = _file(h).read_bytes().splitlines(keepends=True)
    if damage == "edited":
        lines[2] = lines[2].replace(b"paused by root", b"paused by anna")
    else:
        del lines[2]
    damaged = b"".join(lines)
    _file(h).write_bytes(damaged)
    listed = h.broker.audit_list()
    assert listed["verified"] is False
    assert listed["problem"] is not None
    # the first line whose `prev` disagrees: the one after the edit, or after the gap
    where = "audit.jsonl line 4" if damage == "edited" else "audit.jsonl line 3"
    assert listed["problem"].startswith(f"{where} does not chain to the line before it")
    assert _file(h).read_bytes() == damaged  # reported, not rewritten

    h.restart()  # a broker opening it marks the break and goes on from the last line
    assert _file(h).read_bytes().startswith(damaged)
    (mark,) = _lines(h)[len(lines) :]
    assert mark["action"] == "chain_broken" and mark["actor"] == "broker"
    assert where in mark["reason"]
    assert mark["prev"] == hashlib.sha256(damaged.splitlines()[-1]).hexdigest()
    h.broker.set_paused(True, "root")
    h.restart()  # a break already marked is not marked again
    assert [e["action"] for e in _lines(h)].count("chain_broken") == 1
    listed = h.broker.audit_list()
    assert listed["verified"] is False and where in (listed["problem"] or "")


def test_a_file_cut_short_under_the_running_broker_is_reported(
    make_inprocess: Callable[..., InProcessBroker],
) -> None:
    h = make_inprocess(SINGLE_24G)
    _pauses(h, 4)
    lines = _file(h).read_bytes().splitlines(keepends=True)
    _file(h).write_bytes(b"".join(lines[:2]))
    listed = h.broker.audit_list()
    assert listed["verified"] is False
    assert "last line is not entry 4" in (listed["problem"] or "")
    h.broker.set_paused(True, "root")  # the next entry chains to entry 4: the gap shows
    assert "audit.jsonl line 3 does not chain" in (h.broker.audit_list()["problem"] or "")


def test_two_files_are_kept_and_the_chain_runs_across_them(
    make_inprocess: Callable[..., InProcessBroker],
) -> None:
    h = make_inprocess(SINGLE_24G)
    h.broker.audit.max_bytes = 2000
    _pauses(h, 12)  # about 300 bytes an entry: one rotation
    old, new = _lines(h, "audit.1.jsonl"), _lines(h)
    assert old[0]["seq"] == 1 and new[0]["seq"] == old[-1]["seq"] + 1
    last_old = _file(h, "audit.1.jsonl").read_bytes().splitlines()[-1]
    assert new[0]["prev"] == hashlib.sha256(last_old).hexdigest()
    assert _file(h, "audit.1.jsonl").stat().st_size <= 2000
    listed = h.broker.audit_list(limit=100)
    assert listed["verified"] and [e["seq"] for e in listed["entries"]] == list(range(1, 13))
    _pauses(h, 20)  # more rotations: the oldest file is dropped
    listed = h.broker.audit_list(limit=100)
    seqs = [e["seq"] for e in listed["entries"]]
    assert listed["verified"] and seqs[0] > 1 and seqs == list(range(seqs[0], 33))
    assert sorted(p.name for p in h.data_dir.glob("audit*")) == ["audit.1.jsonl", "audit.jsonl"]
    for path in h.data_dir.glob("audit*"):
        assert path.stat().st_size <= 2000


def test_a_write_that_fails_never_fails_the_action(
    make_inprocess: Callable[..., InProcessBroker],
    pool: SleeperPool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = make_inprocess(SINGLE_24G)
    lease = _acquire(h, pool, "alice", 1000)
    h.broker.audit.close()
    _file(h).unlink()
    _file(h).mkdir()  # where the file belongs, something that takes no line
    with caplog.at_level(logging.WARNING):
        ended = h.broker.release(lease.lease_id, "root", admin=True)
        assert h.broker.set_paused(True, "root") is True
    assert ended.state.value == "revoked"
    assert h.broker.audit.unwritten == 2
    assert "a lease_revoked entry was not written" in caplog.text
    assert "the action went ahead" in caplog.text
    listed = h.broker.audit_list()
    assert listed["verified"] is False and listed["entries"] == []


def test_no_data_dir_no_record(make_inprocess: Callable[..., InProcessBroker]) -> None:
    h = make_inprocess(SINGLE_24G, persist=False)
    h.broker.set_paused(True, "root")
    assert h.broker.audit_list() == {"entries": [], "verified": True, "problem": None}
    assert not list(h.data_dir.glob("audit*"))


def test_a_user_refused_in_a_loop_cannot_flood_the_record(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h = make_inprocess(SINGLE_24G, members={"vision": ("alice",)})
    for _ in range(50):
        assert isinstance(_acquire(h, pool, "carol", 1000), RpcError)
    assert isinstance(_acquire(h, pool, "dave", 1000), RpcError)  # another user: its own
    h.clock.advance(REFUSALS_EVERY_S)
    assert isinstance(_acquire(h, pool, "carol", 1000), RpcError)
    entries = h.broker.audit_list()["entries"]
    assert [e["actor"] for e in entries] == ["carol", "dave", "carol"]
    assert entries[2]["reason"].endswith(
        "(49 more refusals of carol in the 60 s after the entry before were not recorded)"
    )


def test_a_line_cut_short_by_a_crash_is_named_and_the_next_entry_starts_a_line(
    make_inprocess: Callable[..., InProcessBroker],
) -> None:
    h = make_inprocess(SINGLE_24G)
    _pauses(h, 2)
    whole = _file(h).read_bytes()
    _file(h).write_bytes(whole + b'{"seq": 3, "at"')  # a write the crash cut
    h.restart()
    lines = _file(h).read_bytes().split(b"\n")
    assert lines[2] == b'{"seq": 3, "at"'
    mark = json.loads(lines[3])
    assert mark["action"] == "chain_broken" and mark["seq"] == 3
    assert "audit.jsonl line 3 is not an entry" in mark["reason"]
    assert mark["prev"] == hashlib.sha256(lines[2]).hexdigest()


def test_a_rotation_that_fails_lets_the_file_grow(
    make_inprocess: Callable[..., InProcessBroker], caplog: pytest.LogCaptureFixture
) -> None:
    h = make_inprocess(SINGLE_24G)
    h.broker.audit.max_bytes = 1000
    (h.data_dir / "audit.1.jsonl" / "in-the-way").mkdir(parents=True)
    with caplog.at_level(logging.WARNING):
        _pauses(h, 8)
    assert "not rotated" in caplog.text
    assert h.broker.audit.unwritten == 0 and len(_lines(h)) == 8
    listed = h.broker.audit_list()
    assert [e["seq"] for e in listed["entries"]] == list(range(1, 9))
    assert listed["problem"] is not None
    assert listed["problem"].startswith("audit.1.jsonl cannot be read (")
