"""What one user's jobs may keep on a broker others share (docs/architecture.md §4, §5):
the newest `max_finished_jobs_per_user` finished jobs (older ones dropped, oldest first, and
said in `jobs.list`), and `max_chunks_per_user` chunk ids for idempotent reports (past it the
user's oldest finished jobs go first, then `too_many_chunks`). One user declaring and
cancelling a hundred thousand jobs used to grow `jobs.list` past what any asker may be sent.
On the in-process harness with the manual clock, with small bounds."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rbroker.broker.config import BrokerConfig
from rbroker_protocol.errors import RpcError
from tests.conftest import SINGLE_24G
from tests.desktop.inprocess import InProcessBroker

Make = Callable[..., InProcessBroker]


def _declare(h: InProcessBroker, owner: str, total: int | None = None) -> str:
    job = h.broker.declare_job(owner, "p", f"{owner}'s job", "tests.embed", total, 1, None)
    return str(job["job_id"])


def _cancel(h: InProcessBroker, owner: str, job_id: str) -> None:
    h.broker.update_job(job_id, owner, "cancelled", "done with it", None, None)


def _ids(h: InProcessBroker, owner: str) -> list[str]:
    return [j["job_id"] for j in h.broker.jobs_view(True) if j["owner"] == owner]


def test_the_defaults_are_stated() -> None:
    config = BrokerConfig("s", "d")  # type: ignore[arg-type]
    assert (config.max_finished_jobs_per_user, config.max_chunks_per_user) == (100, 1_000_000)


def test_the_newest_finished_jobs_of_each_user_are_kept_across_a_restart(make: Make) -> None:
    h = make(SINGLE_24G, max_finished_jobs_per_user=3)
    alice = [_declare(h, "alice") for _ in range(5)]
    bob = [_declare(h, "bob") for _ in range(2)]
    for job_id in alice:
        _cancel(h, "alice", job_id)
    for job_id in bob:
        _cancel(h, "bob", job_id)
    assert _ids(h, "alice") == alice[2:]  # the oldest two dropped
    assert _ids(h, "bob") == bob  # another user's churn drops none of bob's
    listed = h.broker.jobs_list(True, "alice")
    assert (listed["finished_kept_per_user"], listed["finished_dropped"]) == (3, 2)
    open_job = _declare(h, "alice")  # open jobs are not finished ones: never dropped
    h.restart()
    assert _ids(h, "alice") == [*alice[2:], open_job]
    assert _ids(h, "bob") == bob
    _cancel(h, "alice", open_job)
    assert _ids(h, "alice") == [*alice[3:], open_job]


def test_chunk_ids_past_the_bound_drop_finished_jobs_first_then_are_refused(make: Make) -> None:
    h = make(SINGLE_24G, max_chunks_per_user=5)
    old = _declare(h, "alice")
    for n in range(3):
        h.broker.report_job(old, "alice", f"old-{n}", 1, 0, None)
    _cancel(h, "alice", old)
    live = _declare(h, "alice")
    for n in range(2):
        h.broker.report_job(live, "alice", f"c-{n}", 1, 0, None)  # 5 kept now
    h.broker.report_job(live, "alice", "c-2", 1, 0, None)  # the finished job makes room
    assert _ids(h, "alice") == [live]
    h.broker.report_job(live, "alice", "c-3", 1, 0, None)
    h.broker.report_job(live, "alice", "c-4", 1, 0, None)
    with pytest.raises(RpcError) as refused:
        h.broker.report_job(live, "alice", "c-5", 1, 0, None)
    assert refused.value.name == "too_many_chunks"
    assert refused.value.data == {"limit": 5, "count": 5}
    assert "alice" in refused.value.message and "\n" not in refused.value.message
    # a chunk reported again is acknowledged, not counted, at the bound too
    job, duplicate = h.broker.report_job(live, "alice", "c-4", 1, 0, None)
    assert duplicate and job["completed_items"] == 5
    # another user is not held back by alice's chunks
    other = _declare(h, "bob")
    h.broker.report_job(other, "bob", "c-0", 1, 0, None)
    h.restart()  # the count is the store's: still at the bound
    with pytest.raises(RpcError) as again:
        h.broker.report_job(live, "alice", "c-5", 1, 0, None)
    assert again.value.name == "too_many_chunks"


@pytest.fixture
def make(make_inprocess: Make) -> Make:
    return make_inprocess


def test_a_new_account_with_an_old_name_does_not_take_over_its_jobs(make: Make) -> None:
    """Jobs belong to the account, not only its name: an account removed and made again as
    `alice` (another uid) is refused the old alice's job (`not_job_owner`, one line), also
    after a restart; the account that declared it goes on."""
    h = make(SINGLE_24G)
    job = h.broker.declare_job("alice", "p", "embed", "h", None, 1, None, account="uid 1001")
    job_id = str(job["job_id"])
    h.restart()
    for call in (
        lambda a: h.broker.report_job(job_id, "alice", "c-1", 1, 0, None, a),
        lambda a: h.broker.update_job(job_id, "alice", "cancelled", "done", None, None, a),
    ):
        with pytest.raises(RpcError) as refused:
            call("uid 1002")
        assert refused.value.name == "not_job_owner"
        assert "another account named alice" in refused.value.message
        assert "\n" not in refused.value.message
    assert h.broker.report_job(job_id, "alice", "c-1", 1, 0, None, "uid 1001")[0]["state"] == (
        "running"
    )
    assert "account" not in h.broker.jobs_view(True)[0]  # kept, never shown


def test_the_account_is_the_uid_or_the_sid() -> None:
    from rbroker.transport.base import Peer, account_of

    assert account_of(Peer(pid=1, user="alice", uid=1001)) == "uid 1001"
    assert account_of(Peer(pid=1, user="LAB\\alice", sid="S-1-5-21-1-2-3-1001")) == (
        "sid S-1-5-21-1-2-3-1001"
    )
    assert account_of(Peer(pid=1, user="alice")) == ""


def test_a_list_has_all_of_the_askers_jobs_and_the_newest_of_others(make: Make) -> None:
    """However many users keep jobs, one answer holds the asker's own and the newest
    `max_others` of the others, and says how many it left out."""
    h = make(SINGLE_24G, persist=False)
    mine_first = _declare(h, "alice")
    others = [_declare(h, f"user{n % 5}") for n in range(8)]
    mine_last = _declare(h, "alice")
    jobs, left_out = h.broker.jobs.listed(True, h.broker.leases, "alice", max_others=3)
    assert [j["job_id"] for j in jobs] == [*[mine_first], *others[-3:], mine_last]
    assert left_out == 5
    listed = h.broker.jobs_list(True, "alice")
    assert len(listed["jobs"]) == 10 and listed["others_left_out"] == 0
