"""Events to connections: the broker's events to subscribed connections (`events.subscribe`),
and the events meant for a lease's own holder, sent to the connection the lease is bound to
as an `event` notification `{kind, data}` whether or not that connection subscribed:
`over_grant` (the SDK turns it into a Python warning) and `lease_ended` (`{lease_id, state,
ended_reason}`: the lease was ended by someone other than its holder, e.g. "released by
admin <user>"; the SDK marks the lease lost) and `booking_notice` with a `lease_id` (a
booking that the lease may be in the way of, or that the lease claims, starts or ends soon:
docs/architecture.md §2a; the SDK logs its `message`) and `idle_notice` (`{lease_id, owner,
project, notice: idle | reclaim_soon | reclaimed, idle_s, message}`: once per idle episode,
`rbroker.broker.reclaim`; the SDK logs its `message` and calls `on_idle`). A subscribed
connection already gets them with every other event, not twice. And to the connection of a
`lease.acquire` that waits, its place in the queue as it changes (`tell_waiting`: the
`waiting` event).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import Any

from rbroker.broker.eta import retell
from rbroker.broker.leases import Waiter
from rbroker.broker.service import Broker
from rbroker.localapi.connection import MAX_EVENT_BACKLOG, Connection
from rbroker_protocol.results import QueuedRequest

log = logging.getLogger(__name__)

HOLDER_KINDS = frozenset({"over_grant", "lease_ended", "booking_notice", "idle_notice"})
"""Event kinds sent to the lease's holder connection."""


def _send(conn: Connection, kind: str, data: dict[str, Any]) -> asyncio.Task[None]:
    msg = {"jsonrpc": "2.0", "method": "event", "params": {"kind": kind, "data": data}}
    task = asyncio.get_running_loop().create_task(conn.send(msg))
    conn.tasks.add(task)
    task.add_done_callback(conn.tasks.discard)
    return task


def route(broker: Broker, connections: Collection[Connection]) -> Callable[[], None]:
    """Send each `HOLDER_KINDS` event to the connection of the lease it names (among the
    live `connections`; a lease that just ended is found among the ended ones); returns the
    unsubscribe function."""

    def on_event(kind: str, data: dict[str, Any]) -> None:
        if kind not in HOLDER_KINDS:
            return
        if data.get("lease_id") is None:
            return
        conn_id = broker.holder_connection(str(data.get("lease_id")), kind == "lease_ended")
        if conn_id is None:
            return
        for conn in connections:
            if conn.id == conn_id and not conn.closed and conn.unsubscribe is None:
                _send(conn, kind, data)

    return broker.subscribe(on_event)


def subscribe(broker: Broker, conn: Connection) -> None:
    """Push every broker event to `conn` (`events.subscribe`); a subscriber that stops
    reading is dropped once `MAX_EVENT_BACKLOG` events are queued for it."""
    if conn.unsubscribe is not None:
        return

    def push(kind: str, data: dict[str, Any]) -> None:
        if conn.closed:
            return
        if conn.event_backlog >= MAX_EVENT_BACKLOG:
            log.warning(
                "connection %d does not read its events (%d queued): dropping it",
                conn.id,
                conn.event_backlog,
            )
            conn.closed = True
            conn.transport.abort()  # connection_lost then cleans up
            return
        conn.event_backlog += 1
        _send(conn, kind, data).add_done_callback(_event_sent)

    def _event_sent(_task: asyncio.Task[None]) -> None:
        conn.event_backlog -= 1

    conn.unsubscribe = broker.subscribe(push)


WAITING_SETTLE_S = 0.25
"""How long a waiting request's news settles before it is told: the entry told is the last
one after it (a sample asked for by a change of memory turns "waiting for a fresh GPU
sample" into the new figures within it, and the caller hears the figures, not both)."""


async def tell_waiting(conn: Connection, broker: Broker, waiter: Waiter) -> None:
    """Send `conn` an `event` notification of kind `waiting` (the queue entry: request_id,
    reason, reason_kind, reason_data, ahead, waiting_s, eta_s, eta_reason) when the broker
    tells a new entry of its queued request `waiter` (`Broker.watch_waiting`: pushed on each
    change; the last one after `WAITING_SETTLE_S`) and its reason changed or its estimate
    moved (`retell`); runs until cancelled (when the `lease.acquire` ends) or the connection
    closes."""
    latest: list[QueuedRequest] = []
    news = asyncio.Event()

    def tell(entry: QueuedRequest) -> None:
        latest[:] = [entry]
        news.set()

    told: QueuedRequest | None = None  # the entry last sent
    stop = broker.watch_waiting(waiter, tell)
    try:
        while not conn.closed:
            await news.wait()
            await asyncio.sleep(WAITING_SETTLE_S)
            news.clear()
            data = latest[0]
            if retell(told, data):
                told = data
                event = {"kind": "waiting", "data": data}
                await conn.send({"jsonrpc": "2.0", "method": "event", "params": event})
    finally:
        stop()
