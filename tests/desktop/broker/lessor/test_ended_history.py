"""The ended leases the broker keeps: the last `ended_history` in memory (`Lessor.ended`) and
the same ones in its database, where every 200th end has the next fold of the journal delete
the older ones (`LeaseStore.prune_ended_soon`), not the release that made it.

An in-process broker with a store and a manual clock; the holder is a sleeping process."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from tests.conftest import SINGLE_24G
from tests.desktop.inprocess import InProcessBroker, SleeperPool


def test_every_200_ends_the_next_fold_keeps_the_ended_history_and_no_release_waits_for_it(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h = make_inprocess(SINGLE_24G, ended_history=5)
    store = h.broker.store
    assert store is not None
    _, holder = pool.spawn()

    def rows() -> dict[str, str]:
        store.flush()
        db = sqlite3.connect(store.path)
        try:
            return dict(db.execute("SELECT lease_id, state FROM leases").fetchall())
        finally:
            db.close()

    statements: list[str] = []
    for n in range(200):
        lease = h.acquire(holder, mib=100).result()
        h.clock.advance(0.001)  # each end later than the last
        h.loop.run_until_complete(_release(h, lease.lease_id, statements))
        if n == 198:
            assert len(rows()) == 199  # nothing pruned yet
    assert statements == [], "a release ran SQL on its own path"
    kept = rows()
    assert set(kept.values()) == {"released"}
    assert set(kept) == {x.lease_id for x in h.broker.ended}  # the 5 latest, as in memory


async def _release(h: InProcessBroker, lease_id: str, statements: list[str]) -> None:
    """Release on the running loop, as the local API serves it (the fold on its timer),
    noting the SQL statements the release itself runs."""
    store = h.broker.store
    assert store is not None
    store._db.set_trace_callback(statements.append)
    try:
        h.broker.release(lease_id, "tester")
    finally:
        store._db.set_trace_callback(None)
