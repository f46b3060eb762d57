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
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, cast

from rbroker.broker.eta import retell
from rbroker.broker.holders import Holder
from rbroker.broker.launchers import interpreter_of, snapshot_around
from rbroker.broker.leases import Waiter
from rbroker.broker.service import Broker
from rbroker.localapi.requests import request_id_of
from rbroker.transport import peer_hung_up
from rbroker.transport.base import Peer, PeerOf
from rbroker_protocol import jsonrpc
from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.results import QueuedRequest

log = logging.getLogger(__name__)

_conn_ids = itertools.count(1)


MAX_IN_FLIGHT = 1024
"""Requests of one connection served at once (those that wait: a queued `lease.acquire`, a
job write). Each further line is answered at once `too_many_in_flight` (`data.limit`) until
one finishes, and reading goes on: so the broker's memory stays bounded, and a peer that
closes is always seen, its waiting requests cancelled. (Reading used to pause at the cap: a
client that closed its socket there kept its 1 024 requests queued for as long as its
process lived.) The lines that keep or end what the connection holds (`LineServer.
serves_past_cap`: renew, release, cancel) are served past the cap: they are answered as they
are read and never wait, so they add no request that lasts. (They used to be refused too,
and a connection with 1 024 waiting requests lost its granted lease for want of a renewal.)"""

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


class LineServer(Protocol):
    """What a `Connection` serves its lines with (the local API's server)."""

    def admit(self, conn: Connection) -> bool:
        """Whether `conn` (its `peer` read) may stay; False: it was refused and is closing."""

    def serve_line(self, conn: Connection, line: bytes) -> Coroutine[Any, Any, None] | None:
        """Serve one request line: answered inline (None), or the coroutine that serves it
        (run as a task of the connection)."""

    def serves_past_cap(self, line: bytes) -> bool:
        """Whether `line` is served although its connection has `MAX_IN_FLIGHT` requests in
        flight: a line answered as it is read that keeps or ends what the connection holds."""

    def forget(self, conn: Connection) -> None:
        """`conn` closed: count it out everywhere (its tasks are already cancelled)."""


class Connection(asyncio.Protocol):
    """One client connection, an `asyncio.Protocol`: its peer, its transport and its in-flight
    request tasks. Request lines are cut in `data_received` and served at once by the
    `LineServer`, or refused `too_many_in_flight` while `MAX_IN_FLIGHT` requests are served;
    reading pauses while answers wait unsent past `max_unsent` (bytes; the transport's
    `pause_writing`: a peer that closes meanwhile fails the pending write) and while the
    server holds it back (`hold`), e.g. until its user's next turn (`turns`). `budget` counts
    its user's unsent bytes; `limit` is the longest request line (bytes)."""

    transport: asyncio.Transport
    peer: Peer

    def __init__(
        self,
        server: LineServer,
        peer_of: PeerOf,
        limit: int = jsonrpc.MAX_LINE_BYTES,
        max_unsent: int = MAX_UNSENT_BYTES,
        budget: UnsentBudget | None = None,
        turns: Turns | None = None,
    ) -> None:
        self.id = next(_conn_ids)
        self.server = server
        self.turns = turns
        self.limit = limit
        self.tasks: set[asyncio.Task[None]] = set()
        self.requests: set[asyncio.Task[None]] = set()
        self.lock = asyncio.Lock()
        self.unsubscribe: Callable[[], None] | None = None
        self.closed = False
        self.bound = False  # it sent a request that may leave a lease, request or job on it
        self.event_backlog = 0
        self._holder: Holder | None = None
        self.max_unsent = max_unsent
        self.budget = budget
        self._peer_of = peer_of
        self._admitted = False
        self._buf = bytearray()
        self._skipping = False  # inside a line over `limit`, discarded up to its newline
        self._eof = False
        self._held: set[str] = set()  # why lines are not served now
        self._reading_paused = False
        self._serving = False
        self._line_timer: asyncio.TimerHandle | None = None
        self._write_paused = False
        self._unsent_timer: asyncio.TimerHandle | None = None
        self._drained: asyncio.Future[None] | None = None

    @property
    def user_key(self) -> int | str:
        """The peer's OS user: its uid, else its name."""
        return self.peer.uid if self.peer.uid is not None else self.peer.user

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's: no subclass of it
        try:
            self.peer = self._peer_of(transport)
        except OSError:
            self.closed = True
            self.transport.close()
            return
        # answers are written at once; reading pauses only past the bound
        self.transport.set_write_buffer_limits(high=self.max_unsent)
        self._admitted = self.server.admit(self)
        if not self._admitted:
            self.closed = True

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if self._skipping:
            end = data.find(b"\n")
            if end < 0:
                return
            data = data[end + 1 :]
            self._skipping = False
            self._cancel_line_timer()
            self._too_long()
        self._buf += data
        if not self._held:
            self._serve_lines()
        elif len(self._buf) > self.limit:
            self._pause_reading()

    def eof_received(self) -> bool:
        self._eof = True
        if not self._held:
            self._serve_lines()
        return True  # `_serve_lines` closes once the lines already read are served

    def connection_lost(self, exc: Exception | None) -> None:
        self._clean_up()

    def pause_writing(self) -> None:
        self._write_paused = True
        self.hold("unsent")
        loop = asyncio.get_running_loop()
        self._unsent_timer = loop.call_later(UNSENT_DROP_AFTER_S, self._unsent_timed_out)

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._unsent_timer is not None:
            self._unsent_timer.cancel()
            self._unsent_timer = None
        self._wake_senders()
        self.release("unsent")

    # -- reading ---------------------------------------------------------------------------
    def hold(self, why: str) -> None:
        """Stop serving lines until `release(why)`, and stop reading: at once, or for a
        `turn` (a wait of one turn of the loop, `Turns`) once more than `limit` bytes wait."""
        self._cancel_line_timer()
        self._held.add(why)
        if why != "turn":
            self._pause_reading()

    def release(self, why: str) -> None:
        """End the hold `why`; with no hold left, serve the lines already read and read on."""
        if why not in self._held:
            return
        self._held.discard(why)
        if self._held or self.closed:
            return
        self._serve_lines()  # reads on once the lines already read are served

    def _pause_reading(self) -> None:
        if not self._reading_paused and not self.closed:
            self._reading_paused = True
            self.transport.pause_reading()

    def _serve_lines(self) -> None:
        """Serve the complete lines read, while nothing holds the connection back; time the
        unfinished one (`LINE_TIMEOUT_S`), skip one over the limit, close at end of stream."""
        if self._serving:
            return
        self._serving = True
        try:
            buf = self._buf
            start = 0
            while not self._held and not self.closed:
                end = buf.find(b"\n", start)
                if end < 0:
                    break
                begin, start = start, end + 1
                line = bytes(buf[begin:start])
                if len(line) - 1 > self.limit:
                    self._too_long()
                elif not line.strip():
                    pass
                elif self.turns is None:
                    self._serve(line)
                elif self.turns.take(self):
                    started_s = self.turns.clock()
                    self._serve(line)
                    self.turns.charge(self, self.turns.clock() - started_s)
                else:  # its user's share of this turn is spent: served in a later turn
                    start = begin
                    break
            if start:
                del buf[:start]
                self._cancel_line_timer()
            if self.closed or self._held:
                return
            if self._reading_paused:  # what was read is served: read on
                self._reading_paused = False
                self.transport.resume_reading()
            if self._eof:
                self._end_of_stream()
            elif len(buf) > self.limit:  # no newline within the limit: skip to the next one
                self._skipping = True
                buf.clear()
                self._start_line_timer()
            elif buf:
                self._start_line_timer()
        finally:
            self._serving = False

    def _serve(self, line: bytes) -> None:
        if len(self.requests) >= MAX_IN_FLIGHT and not self.server.serves_past_cap(line):
            self._too_many_in_flight(line)
            return
        coro = self.server.serve_line(self, line)
        if coro is None:
            return
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        self.requests.add(task)
        task.add_done_callback(self._request_done)

    def _request_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self.requests.discard(task)

    def _too_many_in_flight(self, line: bytes) -> None:
        """Refuse `line` unread: `MAX_IN_FLIGHT` requests of this connection are in flight."""
        err = RpcError(
            ErrorCode.TOO_MANY_IN_FLIGHT,
            f"this connection already has {len(self.requests)} requests in flight "
            f"({MAX_IN_FLIGHT} at most); wait for their answers or use another connection",
            limit=MAX_IN_FLIGHT,
        )
        self.answer(jsonrpc.error(request_id_of(line), err.to_wire()))

    def _end_of_stream(self) -> None:
        """The client sent its last byte: serve an unfinished last line (within the limit),
        then close (a request still waiting is cancelled)."""
        rest, self._buf = bytes(self._buf), bytearray()
        if not self._skipping and rest.strip() and len(rest) <= self.limit:
            self._serve(rest)
        self._clean_up()
        self.transport.close()

    def _too_long(self) -> None:
        err = RpcError(
            ErrorCode.REQUEST_TOO_LARGE,
            f"request line longer than {self.limit} bytes",
            limit_bytes=self.limit,
        )
        self.answer(jsonrpc.error(None, err.to_wire()))

    def _start_line_timer(self) -> None:
        if self._line_timer is None:
            loop = asyncio.get_running_loop()
            self._line_timer = loop.call_later(LINE_TIMEOUT_S, self._line_timed_out)

    def _cancel_line_timer(self) -> None:
        if self._line_timer is not None:
            self._line_timer.cancel()
            self._line_timer = None

    def _line_timed_out(self) -> None:
        self._line_timer = None
        if self.closed:
            return
        err = RpcError(
            ErrorCode.INVALID_REQUEST,
            f"incomplete request line: no newline within {LINE_TIMEOUT_S:g} s; closing",
            timeout_s=LINE_TIMEOUT_S,
        )
        with contextlib.suppress(Exception):
            self.transport.write(jsonrpc.encode(jsonrpc.error(None, err.to_wire())))
        self.drop(f"incomplete request line for {LINE_TIMEOUT_S:g} s")

    def _unsent_timed_out(self) -> None:
        self._unsent_timer = None
        self.drop(
            f"{ErrorCode.UNSENT_OVER_LIMIT.value}: {self.unsent_bytes()} answer bytes unsent "
            f"for {UNSENT_DROP_AFTER_S:g} s (the client does not read; at most "
            f"{self.max_unsent} are kept)"
        )

    def _clean_up(self) -> None:
        self.closed = True
        self._cancel_line_timer()
        if self._unsent_timer is not None:
            self._unsent_timer.cancel()
            self._unsent_timer = None
        self._wake_senders()
        if not self._admitted:
            return
        self._admitted = False
        for task in list(self.tasks):
            task.cancel()
        if self.turns is not None:
            self.turns.forget(self)
        self.server.forget(self)

    # -- the peer and writing ----------------------------------------------------------------
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

    async def _drain(self) -> None:
        """Wait while more than `max_unsent` bytes wait unsent (until the transport's
        `resume_writing`, or the connection closes)."""
        while self._write_paused and not self.closed:
            if self._drained is None:
                self._drained = asyncio.get_running_loop().create_future()
            await self._drained

    def _wake_senders(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    async def send(
        self, message: dict[str, Any] | Callable[[], Awaitable[dict[str, Any] | None]]
    ) -> None:
        """Write one message, or build it with `message()` and write it (nothing when it
        builds None), once fewer than `MAX_UNSENT_BYTES` wait unsent on this connection (so
        a client that does not read holds up only its own answers, and no answer is built
        before it can be written)."""
        async with self.lock:
            if self.closed:
                return
            await self._drain()
            if self.closed:
                return
            if callable(message):
                built = await message()
                if built is None:
                    return
                message = built
            self.write_now(message)

    def answer(self, message: dict[str, Any]) -> None:
        """Write `message` now when `can_write_now()`, else behind the answers waiting to be
        written (`send`, in a task of this connection)."""
        if self.can_write_now():
            self.write_now(message)
        elif not self.closed:
            task = asyncio.get_running_loop().create_task(self.send(message))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def can_write_now(self) -> bool:
        """True when an answer may be written at once, bypassing `send`: no send holds the
        lock (so answers keep their order) and fewer than `max_unsent` bytes wait unsent."""
        return not self.closed and not self.lock.locked() and not self._write_paused

    def write_now(self, message: dict[str, Any]) -> None:
        """Write one message at once (only when `can_write_now()`)."""
        try:
            self.transport.write(jsonrpc.encode(message))
        except (ConnectionError, RuntimeError):
            self.closed = True
            return
        if self.budget is not None:
            self.budget.wrote(self)

    def peer_gone(self) -> bool:
        """Whether nobody can read an answer on this connection any more: it is closed or
        closing here, or the peer closed its end (`rbroker.transport.peer_hung_up`; a peer
        that only shut down its sending side still reads, and is not gone)."""
        return self.closed or self.transport.is_closing() or peer_hung_up(self.transport)

    def unsent_bytes(self) -> int:
        """Bytes written to this connection that the peer has not taken yet."""
        return self.transport.get_write_buffer_size()

    def drop(self, why: str) -> None:
        """Close at once, discarding unsent bytes; `connection_lost` then cleans up."""
        if not self.closed:
            log.warning("dropping connection %d of %s: %s", self.id, self.peer.user, why)
        self.closed = True
        self.transport.abort()


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
        self._waiting: dict[int | str, deque[Connection]] = {}
        self._next: asyncio.Handle | None = None

    def _has_share(self, key: int | str) -> bool:
        return (
            self._served.get(key, 0) < self.per_turn
            and self._spent_s.get(key, 0.0) < self.per_turn_s
        )

    def _turn_ends(self) -> None:
        if self._next is None:
            self._next = asyncio.get_running_loop().call_soon(self._new_turn)

    def take(self, conn: Connection) -> bool:
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

    def charge(self, conn: Connection, seconds: float) -> None:
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

    def forget(self, conn: Connection) -> None:
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

    def over(self, conn: Connection) -> RpcError | None:
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

    def count_in(self, conn: Connection) -> None:
        """Count `conn` in (it was admitted)."""
        key = conn.user_key
        self._count[key] = self._count.get(key, 0) + 1
        self._warned.discard(conn.peer.user)

    def refuse(self, conn: Connection, refused: RpcError) -> None:
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

    def forget(self, conn: Connection) -> None:
        """Count a closed connection out."""
        key = conn.user_key
        left = self._count.get(key, 0) - 1
        if left > 0:
            self._count[key] = left
        else:
            self._count.pop(key, None)


async def tell_waiting(conn: Connection, broker: Broker, waiter: Waiter) -> None:
    """Send `conn` an `event` notification of kind `waiting` (the queue entry: request_id,
    reason, reason_kind, reason_data, ahead, waiting_s, eta_s, eta_reason) each time the
    broker tells a new entry of its queued request `waiter` (`Broker.watch_waiting`: pushed
    on each change) and its reason changed or its estimate moved (`retell`); runs until
    cancelled (when the `lease.acquire` ends) or the connection closes."""
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
            news.clear()
            data = latest[0]
            if retell(told, data):
                told = data
                event = {"kind": "waiting", "data": data}
                await conn.send({"jsonrpc": "2.0", "method": "event", "params": event})
    finally:
        stop()


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
