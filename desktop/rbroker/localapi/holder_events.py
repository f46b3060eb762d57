"""Events to connections: the broker's events to subscribed connections (`events.subscribe`),
and the events meant for a lease's own holder, sent to the connection the lease is bound to
as an `event` notification `{kind, data}` whether or not that connection subscribed:
`over_grant` (the SDK turns it into a Python warning) and `lease_ended` (`{lease_id, state,
ended_reason}`: the lease was ended by someone other than its holder, e.g. "released by
admin <user>"; the SDK marks the lease lost). A subscribed connection already gets them with
every other event, not twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import Any

from rbroker.broker.service import Broker
from rbroker.localapi.connection import MAX_EVENT_BACKLOG, Connection

log = logging.getLogger(__name__)

HOLDER_KINDS = frozenset({"over_grant", "lease_ended"})
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
