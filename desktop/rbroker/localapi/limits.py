"""The limits of one OS user's connections to the local API, together, so that one user
cannot take the broker from the others (docs/architecture.md §5): how many connections a
user keeps open (`PerUserLimit`), the answer bytes they leave unsent (`UnsentBudget`) and
the serving they get in one turn of the event loop (`Turns`); and the broker process's own
limit of open files, raised so that connections do not run out of handles
(`raise_open_file_limit`). What one connection may do alone is in
`rbroker.localapi.connection`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from rbroker.transport.base import Peer
from rbroker_protocol import jsonrpc
from rbroker_protocol.errors import ErrorCode, RpcError

log = logging.getLogger(__name__)


class UserConnection(Protocol):
    """What these limits use of a connection (`rbroker.localapi.connection.Connection`)."""

    transport: asyncio.Transport
    peer: Peer
    closed: bool

    @property
    def user_key(self) -> int | str:
        """The peer's OS user: its uid, else its name."""

    def hold(self, why: str) -> None:
        """Stop serving its lines until `release(why)`."""

    def release(self, why: str) -> None:
        """End the hold `why`."""

    def unsent_bytes(self) -> int:
        """Bytes written to it that the peer has not taken yet."""

    def drop(self, why: str) -> None:
        """Close it at once, discarding unsent bytes."""


MAX_CONNECTIONS_PER_USER = 512
"""Open connections per OS user (by uid). One more is answered `too_many_connections` and
closed, so one user cannot take every file handle of a broker that others share."""


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


LINES_PER_TURN = 16
"""Request lines of one OS user served in one turn of the event loop (`Turns`)."""

SERVE_PER_TURN_S = 0.005
"""Seconds of serving one OS user's request lines may take in one turn of the event loop
(`Turns`): past it, that user's next line waits for the next turn. A line is measured from
its decoding to its answer written (a `jobs.list` of 2 000 jobs took about 30 ms, a lease
cycle's line about 0.05 ms), so a user asking for large answers gets one of them per turn,
not `LINES_PER_TURN`."""


class Turns:
    """Serves the OS users in turn, so one user's load bounds only that user's latency.

    Each user's connections get at most `per_turn` request lines, and at most `per_turn_s`
    seconds of serving (`clock`), in one turn of the event loop; the line that passes the
    time is finished, and the user's next one waits. A connection with a line past its
    user's share is held back (`hold`; its line stays in its buffer) and waits in its
    user's queue; at the start of the next turn the queues are served user by user, each up
    to its share again, before what the loop read meanwhile. So a user who keeps 500
    connections busy has 500 requests queued behind each other, while another user's
    request waits at most for one turn: for each busy user, `per_turn` lines or
    `per_turn_s` seconds of its lines and the one line that passed them.
    """

    def __init__(
        self,
        per_turn: int = LINES_PER_TURN,
        per_turn_s: float = SERVE_PER_TURN_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.per_turn = per_turn
        self.per_turn_s = per_turn_s
        self.clock = clock
        self._served: dict[int | str, int] = {}
        self._spent_s: dict[int | str, float] = {}
        self._waiting: dict[int | str, deque[UserConnection]] = {}
        self._next: asyncio.Handle | None = None

    def _has_share(self, key: int | str) -> bool:
        return (
            self._served.get(key, 0) < self.per_turn
            and self._spent_s.get(key, 0.0) < self.per_turn_s
        )

    def _turn_ends(self) -> None:
        if self._next is None:
            self._next = asyncio.get_running_loop().call_soon(self._new_turn)

    def take(self, conn: UserConnection) -> bool:
        """Whether `conn` may serve a line now; False: it was queued for a later turn (and
        is held back until then)."""
        key = conn.user_key
        self._turn_ends()
        if not self._has_share(key):
            conn.hold("turn")
            self._waiting.setdefault(key, deque()).append(conn)
            return False
        self._served[key] = self._served.get(key, 0) + 1
        return True

    def charge(self, conn: UserConnection, seconds: float) -> None:
        """Count `seconds` of serving against `conn`'s user in this turn (a line served
        after `take`, or an answer built later for that user)."""
        key = conn.user_key
        self._turn_ends()
        self._spent_s[key] = self._spent_s.get(key, 0.0) + seconds

    def _new_turn(self) -> None:
        self._next = None
        self._served.clear()
        self._spent_s.clear()
        for key, queue in list(self._waiting.items()):
            while queue and self._has_share(key):
                queue.popleft().release("turn")  # serves its lines (queued again past the share)
            if not queue and self._waiting.get(key) is queue:
                del self._waiting[key]

    def forget(self, conn: UserConnection) -> None:
        """`conn` closed: out of its user's queue."""
        queue = self._waiting.get(conn.user_key)
        if queue is not None and conn in queue:
            queue.remove(conn)
            if not queue:
                del self._waiting[conn.user_key]


def _abort(transport: asyncio.Transport) -> None:
    with contextlib.suppress(Exception):
        if not transport.is_closing() or transport.get_write_buffer_size():
            transport.abort()


class PerUserLimit:
    """Open connections per OS user (by uid, else by name), at most `limit` each."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._count: dict[int | str, int] = {}
        self._warned: set[str] = set()

    def over(self, conn: UserConnection) -> RpcError | None:
        """`too_many_connections` when `conn`'s user is at the limit, else None (nothing
        counted: a check by uid alone, made before any lookup in the OS's databases)."""
        count = self._count.get(conn.user_key, 0)
        if count < self.limit:
            return None
        return RpcError(
            ErrorCode.TOO_MANY_CONNECTIONS,
            f"user {conn.peer.user} already has {count} connections to this broker "
            f"({self.limit} at most); close some and try again",
            limit=self.limit,
        )

    def count_in(self, conn: UserConnection) -> None:
        """Count `conn` in (it was admitted)."""
        key = conn.user_key
        self._count[key] = self._count.get(key, 0) + 1
        self._warned.discard(conn.peer.user)

    def refuse(self, conn: UserConnection, refused: RpcError) -> None:
        """Answer `refused` and close `conn` (aborted if the answer is not taken within 1 s;
        no timer when the socket took it at once, as it nearly always does); the refusal is
        logged once per user until one of that user's connections is admitted again."""
        transport = conn.transport
        with contextlib.suppress(Exception):
            transport.write(jsonrpc.encode(jsonrpc.error(None, refused.to_wire())))
        if conn.peer.user not in self._warned:
            log.warning("refusing connections of %s: %s", conn.peer.user, refused.message)
            self._warned.add(conn.peer.user)
        with contextlib.suppress(Exception):
            transport.close()
        with contextlib.suppress(Exception):
            if not transport.get_write_buffer_size():
                return
        asyncio.get_running_loop().call_later(1.0, _abort, transport)

    def forget(self, conn: UserConnection) -> None:
        """Count a closed connection out."""
        key = conn.user_key
        left = self._count.get(key, 0) - 1
        if left > 0:
            self._count[key] = left
        else:
            self._count.pop(key, None)


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
        self._backed_up: dict[int | str, set[UserConnection]] = {}
        self.dropped = 0  # connections dropped for their user's unsent bytes

    def wrote(self, conn: UserConnection) -> None:
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

    def forget(self, conn: UserConnection) -> None:
        """`conn` closed."""
        backed_up = self._backed_up.get(conn.user_key)
        if backed_up is not None:
            backed_up.discard(conn)
            if not backed_up:
                del self._backed_up[conn.user_key]
