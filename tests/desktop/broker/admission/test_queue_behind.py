"""A request queued behind others on every GPU it may take gets its reason without an
admission pass over the whole queue (the cost of an acquire stays flat in the length of the
queue), and FIFO holds: it is granted only after the requests ahead of it.

An in-process broker with a manual clock: no sample or tick runs unless the test runs it.
"""

from __future__ import annotations

from rbroker.broker.leases import Lease
from rbroker_protocol.errors import RpcError
from tests.conftest import GPU0
from tests.desktop.inprocess import InProcessBroker, SleeperPool


def test_requests_behind_a_waiting_one_get_reasons_without_passes_and_keep_fifo(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    _, holder = pool.spawn()
    # another process holds the GPU: what fits only once the requester's own leases end is
    # refused at once (architecture.md §3), so this wait is behind someone else's lease
    full = h.acquire(pool.spawn()[1], mib=20000).result()
    passes = []
    run = h.broker.admission.run

    def counted(*args: object, **kwargs: object) -> None:
        passes.append(1)
        run(*args, **kwargs)  # type: ignore[arg-type]

    h.broker.admission.run = counted  # type: ignore[method-assign]
    first = h.acquire(holder, mib=8000, wait_s=60.0)  # does not fit: waits
    assert len(passes) == 1 and not first.done()
    behind = [h.acquire(holder, mib=1000, wait_s=60.0) for _ in range(10)]  # would fit
    refused = h.acquire(holder, mib=1000, wait_s=0.0)
    assert len(passes) == 1, "a request queued behind others ran a pass over the queue"
    assert not any(t.done() for t in behind), "granted past the request ahead (FIFO)"
    queue = h.broker.queue
    assert [w.reason_kind for w in queue] == ["capacity"] * 12
    assert queue[10].reason.endswith("1 000 requested; 10 requests ahead")
    assert queue[1].reason_data["available_mib"] == queue[0].reason_data["available_mib"]
    h.tick(0.1)  # the tick answers the wait_s=0 request on its reason's numbers
    err = refused.exception()
    assert isinstance(err, RpcError) and err.name == "capacity_unavailable", err
    assert "11 requests ahead" in err.message
    h.broker.release(full.lease_id, full.owner)
    h.sample()  # the release confirmed: first the request ahead, then the ones behind it
    assert first.done() and isinstance(first.result(), Lease)
    assert all(t.done() and t.result().gpu_uuid == GPU0 for t in behind)
    assert [lease.granted_mib for lease in h.broker.leases.values()] == [8000] + [1000] * 10


def test_every_waiter_reading_its_own_entry_costs_one_pass_over_the_queue(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    """Each waiter whose client asked to be told (`notify_waiting`) is told its queue entry
    when something changed (`Broker.watch_waiting`, pushed): one pass over the queue tells
    them all, not one pass per waiter (one pass each was O(queue²) a round: 2 048 waiters
    held the broker's loop for seconds), and nothing is worked out while nothing changed."""
    _, holder = pool.spawn()
    full = h.acquire(pool.spawn()[1], mib=20000).result()
    waiting = [
        h.acquire(holder, conn_id=10 + i, mib=4000, wait_s=60.0, request_key=f"k{i}")
        for i in range(300)
    ]
    passes = []
    ahead = h.broker.waiting.ahead

    def counted(*args: object, **kwargs: object) -> object:
        passes.append(1)
        return ahead(*args, **kwargs)  # type: ignore[arg-type]

    h.broker.waiting.ahead = counted  # type: ignore[method-assign]
    told: dict[str, list[dict[str, object]]] = {}
    queued = list(h.broker.queue)

    async def watch_all() -> None:
        for w in queued:
            h.broker.watch_waiting(w, lambda e, k=w.request_key: told.setdefault(k, []).append(e))

    h.run(watch_all())
    h.spin()
    assert len(passes) == 1, f"{len(passes)} passes over the queue to tell 300 waiters"
    assert [told[f"k{i}"][-1]["ahead"] for i in range(300)] == list(range(300))
    h.spin()
    assert len(passes) == 1  # nothing changed: nobody told again
    waiting[0].cancel()  # the first leaves: everyone behind moves up, told in one pass
    h.spin()
    assert len(passes) == 2
    assert told["k299"][-1]["ahead"] == 298 and len(told["k299"]) == 2
    h.broker.release(full.lease_id, full.owner)
    h.sample()  # 23 347 MiB free: the next five in the queue's order, no one behind them
    assert [t.done() for t in waiting[1:7]] == [True] * 5 + [False]
