"""Connections of the local API and the limits that keep hostile or broken clients from
hurting the broker: bytes kept unsent (per connection, and per user: `UnsentBudget`),
requests in flight, half-sent lines, connections per user, queued events, open file handles.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from rbroker.broker.holders import Holder
from rbroker.broker.launchers import interpreter_of, snapshot_around
from rbroker.broker.service import Broker
from rbroker.transport.base import Peer
from rbroker_protocol import jsonrpc
from rbroker_protocol.errors import ErrorCode, RpcError

log = logging.getLogger(__name__)

TOO_LONG = object()
"""`read_line`'s answer for a line over `jsonrpc.MAX_LINE_BYTES` (skipped to its end)."""
_conn_ids = itertools.count(1)


MAX_IN_FLIGHT = 1024
"""Requests of one connection served at once. Past this the connection is not read until
one finishes: a client that sends without reading its answers meets backpressure (its own
writes block) instead of growing the broker's memory without end."""

MAX_UNSENT_BYTES = 4 * 1024 * 1024
"""Answer and event bytes of one connection that the broker keeps unsent, by default
(`BrokerConfig.max_unsent_bytes`; `UnsentBudget` caps a user's total). Answers are built
only while less than this waits in the connection's write buffer, and the connection is not
read meanwhile: a client that sends without reading costs the broker at most about this much
(one client sending `leases.list` without reading grew the broker by about 1 GiB before)."""

UNSENT_DROP_AFTER_S = 10.0
"""A connection whose unsent bytes stay past `MAX_UNSENT_BYTES` this long is dropped."""

LINE_TIMEOUT_S = 10.0
"""Time a started request line may take to end with its newline. A connection that sends
half a line and stalls is answered `invalid_request` and closed (1 030 such connections
used to exhaust the broker's file handles). An idle connection between lines is fine."""

MAX_CONNECTIONS_PER_USER = 512
"""Open connections per OS user (by uid). One more is answered `too_many_connections` and
closed, so one user cannot take every file handle of a broker that others share."""

MAX_EVENT_BACKLOG = 10_000
"""Events queued for one subscriber that is not reading them. Past this the connection is
dropped (as Redis drops pub/sub clients over their output buffer limit): without a bound, a
local client that subscribes and never reads grows the broker's memory without end."""

WAITING_POLL_S = 0.25
"""How often a waiting `lease.acquire` with `notify_waiting` looks for a changed reason."""


def raise_open_file_limit() -> tuple[int, int] | None:
    """Raise this process's soft limit of open files to its hard limit (Unix).

    Each connection takes one file handle; the usual soft limit of 1 024 would let a few
    hundred idle clients of several users starve everyone else. Returns the (soft, hard)
    limits now in force, or None where the OS has no such limit (Windows).
    """
    if sys.platform == "win32":
        return None
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft, hard


class Connection:
    """One client connection: its peer, its writer and its in-flight request tasks.
    `max_unsent` (bytes) holds its answers back; `budget` counts its user's unsent bytes."""

    def __init__(
        self,
        writer: asyncio.StreamWriter,
        peer: Peer,
        max_unsent: int = MAX_UNSENT_BYTES,
        budget: UnsentBudget | None = None,
    ) -> None:
        self.id = next(_conn_ids)
        self.writer = writer
        self.peer = peer
        self.tasks: set[asyncio.Task[None]] = set()
        self.requests: set[asyncio.Task[None]] = set()
        self.lock = asyncio.Lock()
        self.unsubscribe: Callable[[], None] | None = None
        self.closed = False
        self.event_backlog = 0
        self._holder: Holder | None = None
        self.max_unsent = max_unsent
        self.budget = budget
        # drain() waits only past the bound: answers are written without a round of waiting
        writer.transport.set_write_buffer_limits(high=max_unsent)

    @property
    def user_key(self) -> int | str:
        """The peer's OS user: its uid, else its name."""
        return self.peer.uid if self.peer.uid is not None else self.peer.user

    def holder(self) -> Holder:
        """The peer process's identity (pid + start time), read once per connection: the
        process on the other end of a socket never changes. On Windows a launcher on the
        pipe (a venv's `python.exe`, `py.exe`, a console-script shim) stands for the
        interpreter it started (`rbroker.broker.launchers`): that is the process the
        driver lists.

        Raises:
            RpcError: `not_allowed` when the OS gives pid 0 (the peer is in a pid namespace
                the broker cannot see); `cancelled` when the peer has exited.
        """
        if self._holder is None:
            if self.peer.pid == 0:
                raise RpcError(
                    ErrorCode.NOT_ALLOWED,
                    "cannot identify the calling process (another pid namespace): run the "
                    "client in the broker's pid namespace, or the broker in the client's",
                    reason="peer_pid_unknown",
                )
            pid = self.peer.pid
            if sys.platform == "win32":
                pid = interpreter_of(snapshot_around(pid), pid)
            try:
                self._holder = Holder.of(pid)
            except ProcessLookupError:
                raise RpcError(ErrorCode.CANCELLED, "the requesting process has exited") from None
        return self._holder

    async def send(self, message: dict[str, Any] | Callable[[], Awaitable[dict[str, Any]]]) -> None:
        """Write one message, or build it with `message()` and write it, once fewer than
        `MAX_UNSENT_BYTES` wait unsent on this connection (so a client that does not read
        holds up only its own answers, and no answer is built before it can be written)."""
        async with self.lock:
            if self.closed:
                return
            try:
                await self.writer.drain()
                if self.closed:
                    return
                if callable(message):
                    message = await message()
                self.writer.write(jsonrpc.encode(message))
            except (ConnectionError, RuntimeError):
                self.closed = True
                return
            if self.budget is not None:
                self.budget.wrote(self)

    def can_write_now(self) -> bool:
        """True when an answer may be written at once, bypassing `send`: no send holds the
        lock (so answers keep their order) and fewer than `max_unsent` bytes wait unsent."""
        return not self.closed and not self.lock.locked() and self.unsent_bytes() < self.max_unsent

    def write_now(self, message: dict[str, Any]) -> None:
        """Write one message at once (only when `can_write_now()`)."""
        try:
            self.writer.write(jsonrpc.encode(message))
        except (ConnectionError, RuntimeError):
            self.closed = True
            return
        if self.budget is not None:
            self.budget.wrote(self)

    def unsent_bytes(self) -> int:
        """Bytes written to this connection that the peer has not taken yet."""
        return self.writer.transport.get_write_buffer_size()

    def drop(self, why: str) -> None:
        """Close at once, discarding unsent bytes; the reader loop then cleans up."""
        if not self.closed:
            log.warning("dropping connection %d of %s: %s", self.id, self.peer.user, why)
        self.closed = True
        self.writer.transport.abort()


async def read_line(conn: Connection, reader: asyncio.StreamReader) -> bytes | object | None:
    """The next request line, `TOO_LONG`, or None at the end of the stream.

    Waiting for a line to start has no limit (an idle client is fine); once it has
    started, it must end within `LINE_TIMEOUT_S` or the connection is closed.
    """
    try:
        first = await reader.readexactly(1)
    except asyncio.IncompleteReadError:
        return None
    if first == b"\n":
        return first
    loop = asyncio.get_running_loop()
    timer = loop.call_later(LINE_TIMEOUT_S, _line_timed_out, conn)
    try:
        too_long = False
        while True:
            try:
                line = first + await reader.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:
                if too_long or not (first + exc.partial).strip():
                    return None
                rest = first + exc.partial
                return rest if len(rest) <= jsonrpc.MAX_LINE_BYTES else None
            except asyncio.LimitOverrunError as exc:
                too_long = True
                await reader.readexactly(max(1, exc.consumed))
                continue
            if too_long or len(line) - 1 > jsonrpc.MAX_LINE_BYTES:
                return TOO_LONG
            return line
    finally:
        timer.cancel()


def _line_timed_out(conn: Connection) -> None:
    if conn.closed:
        return
    err = RpcError(
        ErrorCode.INVALID_REQUEST,
        f"incomplete request line: no newline within {LINE_TIMEOUT_S:g} s; closing",
        timeout_s=LINE_TIMEOUT_S,
    )
    with contextlib.suppress(Exception):
        conn.writer.write(jsonrpc.encode(jsonrpc.error(None, err.to_wire())))
    conn.drop(f"incomplete request line for {LINE_TIMEOUT_S:g} s")


async def wait_until_written(conn: Connection) -> bool:
    """Stop reading while answers pile up unsent; False when the connection was dropped
    because they stayed past `conn.max_unsent` for `UNSENT_DROP_AFTER_S`."""
    if conn.unsent_bytes() <= conn.max_unsent:
        return True
    try:
        await asyncio.wait_for(conn.writer.drain(), UNSENT_DROP_AFTER_S)
    except TimeoutError:
        conn.drop(
            f"{ErrorCode.UNSENT_OVER_LIMIT.value}: {conn.unsent_bytes()} answer bytes unsent "
            f"for {UNSENT_DROP_AFTER_S:g} s (the client does not read; at most "
            f"{conn.max_unsent} are kept)"
        )
        return False
    except (ConnectionError, RuntimeError):
        return False
    return not conn.closed


class PerUserLimit:
    """Open connections per OS user (by uid, else by name), at most `limit` each."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._count: dict[int | str, int] = {}
        self._warned: set[str] = set()

    def admit(self, conn: Connection) -> RpcError | None:
        """Count `conn` in; `too_many_connections` (not counted) when its user is at the
        limit."""
        key = conn.user_key
        count = self._count.get(key, 0)
        if count >= self.limit:
            return RpcError(
                ErrorCode.TOO_MANY_CONNECTIONS,
                f"user {conn.peer.user} already has {count} connections to this broker "
                f"({self.limit} at most); close some and try again",
                limit=self.limit,
            )
        self._count[key] = count + 1
        self._warned.discard(conn.peer.user)
        return None

    async def refuse(self, conn: Connection, refused: RpcError) -> None:
        """Answer `refused` (for at most 1 s) and close `conn`; the refusal is logged once per
        user until one of that user's connections is admitted again."""
        with contextlib.suppress(Exception):
            conn.writer.write(jsonrpc.encode(jsonrpc.error(None, refused.to_wire())))
            await asyncio.wait_for(conn.writer.drain(), 1.0)
        if conn.peer.user not in self._warned:
            log.warning("refusing connections of %s: %s", conn.peer.user, refused.message)
            self._warned.add(conn.peer.user)
        with contextlib.suppress(Exception):
            conn.writer.close()

    def forget(self, conn: Connection) -> None:
        """Count a closed connection out."""
        key = conn.user_key
        left = self._count.get(key, 0) - 1
        if left > 0:
            self._count[key] = left
        else:
            self._count.pop(key, None)


async def tell_waiting(conn: Connection, broker: Broker, request_key: str) -> None:
    """Send `conn` an `event` notification of kind `waiting` (the queue entry: request_id,
    reason, reason_kind, reason_data, ahead, waiting_s) each time the reason of its queued
    request `request_key` changes, checked every `WAITING_POLL_S`; runs until cancelled
    (when the `lease.acquire` ends) or the connection closes."""
    last = None
    while not conn.closed:
        data = broker.waiting_entry(request_key, conn.id)
        if data is not None and data["reason"] != last:
            last = data["reason"]
            event = {"kind": "waiting", "data": data}
            await conn.send({"jsonrpc": "2.0", "method": "event", "params": event})
        await asyncio.sleep(WAITING_POLL_S)


# -- answer bytes a user's connections leave unsent, together ---------------------------------
COUNTED_FROM_BYTES = 16 * 1024
"""A connection with less than this unsent (bytes) is not counted against its user."""


class UnsentBudget:
    """The per-user cap on unsent answer bytes, `per_user_bytes`, over all connections
    (docs/architecture.md §5).

    One connection that does not read holds its own answers back at `max_unsent_bytes`, but
    a user with many such connections would multiply that (500 connections × 4 MiB grew a
    broker by 2 GiB). So after every write the connection's user is checked: when the
    connections of one OS user together hold more than `max_unsent_bytes_per_user` unsent,
    the one holding the most is dropped at once, with the reason `unsent_over_limit` in the
    broker's log, until the user is under the cap again.

    Only connections with at least `COUNTED_FROM_BYTES` unsent are counted (so a write costs
    a look at that user's backed-up connections only, not at all of them): a user's
    connections below it add at most 512 × 16 KiB = 8 MiB to the cap.
    """

    def __init__(self, per_user_bytes: int) -> None:
        self.per_user_bytes = per_user_bytes
        self._backed_up: dict[int | str, set[Connection]] = {}
        self.dropped = 0  # connections dropped for their user's unsent bytes

    def wrote(self, conn: Connection) -> None:
        """`conn` was just written to: count it, and drop its user's connections holding the
        most while the user's total is over the cap."""
        key = conn.user_key
        if conn.unsent_bytes() < COUNTED_FROM_BYTES:
            backed_up = self._backed_up.get(key)
            if backed_up is not None:
                backed_up.discard(conn)
            return
        backed_up = self._backed_up.setdefault(key, set())
        backed_up.add(conn)
        sizes = {}
        for c in list(backed_up):
            n = c.unsent_bytes()
            if c.closed or n < COUNTED_FROM_BYTES:
                backed_up.discard(c)
            else:
                sizes[c] = n
        total = sum(sizes.values())
        while total > self.per_user_bytes and sizes:
            worst = max(sizes, key=sizes.__getitem__)
            worst.drop(
                f"{ErrorCode.UNSENT_OVER_LIMIT.value}: the connections of {conn.peer.user} "
                f"hold {total} answer bytes unsent ({self.per_user_bytes} at most per user); "
                f"closing the one holding the most ({sizes[worst]})"
            )
            self.dropped += 1
            total -= sizes.pop(worst)
            backed_up.discard(worst)
        if not backed_up:
            self._backed_up.pop(key, None)

    def forget(self, conn: Connection) -> None:
        """`conn` closed."""
        backed_up = self._backed_up.get(conn.user_key)
        if backed_up is not None:
            backed_up.discard(conn)
            if not backed_up:
                del self._backed_up[conn.user_key]
