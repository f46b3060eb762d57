"""What one `leases.list` answer holds however many users share the broker (docs/
architecture.md §5): the asker's own leases and waiting requests, and at most
`MAX_LISTED_OTHERS` of other users' in each list (the largest leases, the head of the
queue), the rest counted; the uplink's report still sees everything. On the in-process
harness, with a cap of 2."""

from __future__ import annotations

from typing import Any

import pytest

from rbroker.broker import listing
from rbroker.cli.views import left_out_note
from rbroker_protocol.localapi import AcquireParams
from tests.desktop.inprocess import DESCRIPTION, InProcessBroker, SleeperPool


def _begin(h: InProcessBroker, mib: int, owner: str, holder: Any, wait_s: float = 0) -> None:
    p = AcquireParams(mib=mib, wait_s=wait_s, **DESCRIPTION)

    async def begin() -> Any:
        return h.broker.begin_acquire(p, owner, holder, 1)

    h.run(begin())
    h.spin()


def test_an_answer_holds_the_askers_own_and_the_largest_or_first_of_others(
    h: InProcessBroker, pool: SleeperPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listing, "MAX_LISTED_OTHERS", 2)
    h.sample()
    _, holder = pool.spawn()
    for n, mib in enumerate([1000, 3000, 2000, 500]):
        _begin(h, mib, f"user{n}", holder)
    _begin(h, 100, "alice", holder)
    for n in range(4):  # 20 000 MiB never fits beside the 6 600 granted: they wait
        _begin(h, 20000, f"waiter{n}", holder, wait_s=600)
    _begin(h, 20000, "alice", holder, wait_s=600)

    everything = h.broker.leases_view()  # the uplink's: all of it, no counts
    assert len(everything["leases"]) == 5 and len(everything["queue"]) == 5
    assert "leases_left_out" not in everything and "queue_left_out" not in everything

    view = h.broker.leases_view(False, "alice")
    assert [x["owner"] for x in view["leases"]] == ["user1", "user2", "alice"]  # the largest
    assert [x["owner"] for x in view["queue"]] == ["waiter0", "waiter1", "alice"]  # the head
    assert (view["leases_left_out"], view["queue_left_out"]) == (2, 2)
    assert [x["ahead"] for x in view["queue"]] == [0, 1, 4]  # as many ahead as there are
    assert left_out_note(view) == (
        "Not listed, of other users: 2 smaller leases and 2 requests further back in the queue."
    )
    # an asker with nothing of its own sees the same others; under the cap, no counts
    assert len(h.broker.leases_view(False, "nobody")["leases"]) == 2
    monkeypatch.setattr(listing, "MAX_LISTED_OTHERS", 2000)
    full = h.broker.leases_view(True, "alice")
    assert len(full["leases"]) == 5 and "leases_left_out" not in full
    assert left_out_note(full) is None


def test_the_cap_is_stated() -> None:
    assert listing.MAX_LISTED_OTHERS == 2000
