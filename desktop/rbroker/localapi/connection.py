"""One connection of the local API (`Connection`, an `asyncio.Protocol`): how it cuts and
serves request lines, writes answers and events, and the limits of one connection that keep
a hostile or broken client from hurting the broker: bytes kept unsent, requests in flight,
half-sent lines, queued events. The limits of one OS user's connections together (how many,
their unsent bytes, their turns) are in `rbroker.localapi.limits`; who the peer process is,
which only `lease.acquire` asks, in `rbroker.localapi.identity`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, cast

from rbroker.broker.holders import Holder
from rbroker.localapi.identity import holder_of
from rbroker.localapi.limits import Turns, UnsentBudget
from rbroker.localapi.requests import request_id_of
from rbroker.transport import peer_hung_up
from rbroker.transport.base import Peer, PeerOf
from rbroker_protocol import jsonrpc
from rbroker_protocol.errors import ErrorCode, RpcError

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

MAX_EVENT_BACKLOG = 10_000
"""Events queued for one subscriber that is not reading them. Past this the connection is
dropped (as Redis drops pub/sub clients over their output buffer limit): without a bound, a
local client that subscribes and never reads grows the broker's memory without end."""


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
        """The peer process's identity (`rbroker.localapi.identity.holder_of`), read once per
        connection: the process on the other end of a socket never changes.

        Raises:
            RpcError: as `holder_of`.
        """
        if self._holder is None:
            self._holder = holder_of(self.peer)
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
