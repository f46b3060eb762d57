"""A request that leaves the queue without a grant is told as a `queue` event: its
connection closed, its holder exited, its caller's wait cancelled. Subscribers (the tray,
`rbroker watch`, the uplink) re-read the queue on it; without it, once `capacity` events
came only on a change (issue 44), the tray under Wine kept showing a request that had left
(tests/desktop/tray/test_window.py)."""

from __future__ import annotations

from typing import Any

from tests.desktop.inprocess import InProcessBroker, SleeperPool


def _told(h: InProcessBroker) -> list[dict[str, Any]]:
    told: list[dict[str, Any]] = []
    h.broker.subscribe(lambda kind, data: told.append(data) if kind == "queue" else None)
    return told


def _waiting(h: InProcessBroker, pool: SleeperPool, conn_id: int) -> tuple[Any, int]:
    """A holder of most of the GPU, and a request from another process behind it."""
    h.acquire(pool.spawn()[1], conn_id=1, mib=20000).result()
    proc, holder = pool.spawn()
    task = h.acquire(holder, conn_id=conn_id, mib=20000, wait_s=3600)
    (entry,) = h.broker.leases_view()["queue"]
    return (proc, task), entry["request_id"]


def test_a_closed_connections_request_is_told_leaving(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    _, request_id = _waiting(h, pool, conn_id=7)
    told = _told(h)
    h.broker.connection_closed(7)
    h.spin()
    assert {"request_id": request_id} in told
    assert h.broker.leases_view()["queue"] == []


def test_an_exited_holders_request_is_told_leaving(h: InProcessBroker, pool: SleeperPool) -> None:
    (proc, _), request_id = _waiting(h, pool, conn_id=7)
    told = _told(h)
    proc.kill()
    proc.wait()
    h.tick(0.5)
    assert {"request_id": request_id} in told
    assert h.broker.leases_view()["queue"] == []


def test_a_cancelled_wait_is_told_leaving(h: InProcessBroker, pool: SleeperPool) -> None:
    (_, task), request_id = _waiting(h, pool, conn_id=7)
    told = _told(h)
    task.cancel()  # the local API cancels the call when its connection breaks
    h.spin()
    assert {"request_id": request_id} in told
    assert h.broker.leases_view()["queue"] == []
