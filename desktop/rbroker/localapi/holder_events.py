"""Events meant for a lease's own holder: the broker's `over_grant` event goes to the
connection the lease is bound to, as an `event` notification `{kind: "over_grant", data}`,
whether or not that connection subscribed to events (the SDK turns it into a Python
warning). A subscribed connection already gets it with every other event, not twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from typing import Any

from rbroker.broker.service import Broker
from rbroker.localapi.connection import Connection

HOLDER_KINDS = frozenset({"over_grant"})
"""Event kinds sent to the lease's holder connection."""


def route(broker: Broker, connections: Collection[Connection]) -> Callable[[], None]:
    """Send each `HOLDER_KINDS` event to the connection of the lease it names (among the
    live `connections`); returns the unsubscribe function."""

    def on_event(kind: str, data: dict[str, Any]) -> None:
        if kind not in HOLDER_KINDS:
            return
        lease = broker.leases.get(str(data.get("lease_id")))
        if lease is None or lease.conn_id is None:
            return
        for conn in connections:
            if conn.id == lease.conn_id and not conn.closed and conn.unsubscribe is None:
                msg = {"jsonrpc": "2.0", "method": "event", "params": {"kind": kind, "data": data}}
                task = asyncio.get_running_loop().create_task(conn.send(msg))
                conn.tasks.add(task)
                task.add_done_callback(conn.tasks.discard)

    return broker.subscribe(on_event)
