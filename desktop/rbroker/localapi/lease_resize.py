"""The local API's `lease.resize {lease_id, mib, wait_s}` → `{lease}` (architecture.md §3):
the broker's resize for the caller's OS user, on the caller's connection (closing it cancels
a growth that still waits)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from rbroker.broker.service import Broker
from rbroker.localapi.connection import Connection
from rbroker_protocol.localapi import ResizeParams


def entry(
    broker: Callable[[], Broker],
) -> tuple[type[ResizeParams], Callable[[Connection, Any], Awaitable[Any]]]:
    """The `(params model, handler)` pair of `lease.resize` for `LocalApi.methods`;
    `broker()` gives the served broker when a request comes."""

    async def resize(conn: Connection, p: ResizeParams) -> dict[str, Any]:
        lease = await broker().resize(p.lease_id, conn.peer.user, p.mib, p.wait_s, conn.id)
        return {"lease": lease.to_wire()}

    return ResizeParams, resize
