"""One interface over the OS transports of the local API (architecture.md §5).

A transport accepts connections and hands each to a handler as a pair of asyncio streams
plus the `Peer` read from the OS (never from the request). `unix.py` and
`pipe_windows.py` implement it; `serve()` picks the one for this OS.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Peer:
    """Who is on the other end: `pid` of the connecting process and its OS user name;
    `uid` on Unix; on Windows the account's `sid` and `elevated_admin` (the token's
    Administrators group is enabled: an elevated administrator)."""

    pid: int
    user: str
    uid: int | None = None
    sid: str | None = None
    elevated_admin: bool = False


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, Peer], Awaitable[None]]


class BrokerAlreadyRunning(RuntimeError):
    """Another broker answers at this address; it is left alone."""


class ListeningServer(Protocol):
    """What `serve()` returns."""

    address: str

    async def close(self) -> None:
        """Stop accepting, close the listening endpoint, remove its file if any."""


async def serve(
    address: str, handler: Handler, limit: int, *, shared: bool = False, group: str | None = None
) -> ListeningServer:
    """Listen at `address` (socket path or pipe name) with this OS's transport.

    `shared` and `group` (Unix sockets): a socket for other local users too — every user
    (`shared`, mode 0666) or the members of `group` (mode 0660, owned by that group); else
    the broker's own user's (0660 in a 0700 directory).

    Raises:
        BrokerAlreadyRunning: a live broker already listens there.
        OSError: the address cannot be bound.
    """
    if sys.platform == "win32":
        from rbroker.localapi.pipe_windows import serve_pipe

        return await serve_pipe(address, handler, limit)
    else:
        from rbroker.localapi.unix import serve_unix

        return await serve_unix(address, handler, limit, shared=shared, group=group)
