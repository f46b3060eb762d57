"""Slow and greedy clients at the connection level, below the ASGI app (architecture.md §7,
"Slow clients").

uvicorn has no deadline for a request's head or body and its `limit_concurrency` refuses
everyone alike, so a few hundred connections that send one header byte every 10 s used to
hold every file descriptor and starve all other clients. `guarded_protocol(base, guard)`
subclasses uvicorn's HTTP protocol class (httptools or h11; passed as `http=` to
`uvicorn.Config`) so that each connection

- must complete a request head within `head_timeout_s` (from the connection's opening for
  its first request; for a later request on a kept-alive connection from that request's
  first byte; between requests uvicorn's keep-alive timeout applies);
- must complete the body within `body_timeout_s` of the end of its head;
- is refused (a 503 with `Retry-After`, then closed) when its client address already has
  `max_per_address` connections open (IPv4 per address, IPv6 per /64; trusted proxies are
  exempt) or the server has `max_total` open;
- is refused as well when the server has all but its last eighth of `max_total` open
  (`RESERVED_SHARE`) and its address already has `LIGHT_CONNECTIONS` open: that last eighth
  is kept for clients with few connections, so a health check, a sign-in or a computer's
  report still gets in while a few greedy addresses hold the rest (17 addresses at the
  per-address cap used to fill the whole server, and `/healthz` answered 503 to everyone).
  An IPv6 client is light only while its /48 (`site_key`: one site's allocation, 65 536
  /64s) has fewer than `LIGHT_SITE_CONNECTIONS` open too: a /48 opening three connections
  from each of its /64s used to take the whole reserve.

A connection past a deadline gets a 408 when it had sent a byte, and is closed. Cuts and
refusals are counted and logged by `EdgeLog`: one WARNING line at once, then at most one
line per interval with the counts since the last line and the address that caused most.

Both protocol classes are driven the same way: after each `data_received` the connection's
`cycle` (the request-response cycle uvicorn makes when a head is complete) and its
`more_body` say where the request is, so nothing here depends on a parser's callbacks.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rbroker_server.edge.net import Network, in_networks, peer_ip
from rbroker_server.metrics import health

log = logging.getLogger(__name__)

LOG_INTERVAL_S = 60.0
"""At most one line of counts per this many seconds (the first event is logged at once)."""
REFUSED_RETRY_AFTER_S = 5
"""The `Retry-After` of a refused connection's 503."""
RESERVED_SHARE = 8
"""The last `max_total // RESERVED_SHARE` connections are kept for light clients."""
LIGHT_CONNECTIONS = 4
"""An address with fewer connections open than this is a light client (a health check, a
browser, a computer's uplink)."""
LIGHT_SITE_CONNECTIONS = 16
"""An IPv6 address is a light client only while its /48 has fewer connections open than
this as well."""

_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"retry-after: %d\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
)
_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)


def address_key(host: str) -> str:
    """The key connections are counted under: an IPv4 address itself, an IPv6 address's
    /64 (one host can take any address of its /64); IPv4-mapped IPv6 as IPv4. Anything
    else (a Unix socket's name) as given."""
    addr = peer_ip(host)
    if addr is None:
        return host
    if isinstance(addr, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


def site_key(host: str) -> str | None:
    """The /48 of an IPv6 address (a site: RFC 6177 allocations are /48 to /56, so one
    holder can use every /64 of it), None for anything else (IPv4, IPv4-mapped IPv6)."""
    addr = peer_ip(host)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is None:
        return str(ipaddress.IPv6Network((addr, 48), strict=False))
    return None


class EdgeLog:
    """Counts of cut and refused connections, logged at most once per `interval_s`.

    `count(what, key)` adds one event; the first event after a quiet interval is logged at
    once, later ones are summed into one line at the end of the interval ("in the last 60 s:
    812 closed past the 10 s head deadline, 300 refused over 256 connections per address;
    most from 10.0.0.5 (1100)").
    """

    def __init__(
        self, interval_s: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._counts: Counter[str] = Counter()
        self._by_key: Counter[str] = Counter()
        self._last: float | None = None
        self._flush: asyncio.TimerHandle | None = None
        self.totals: Counter[str] = Counter()
        """Every event since start, by what (for tests and diagnostics)."""

    def count(self, what: str, key: str) -> None:
        self._counts[what] += 1
        self._by_key[key] += 1
        self.totals[what] += 1
        now = self._clock()
        if self._last is None or now - self._last >= self.interval_s:
            self.flush()
        elif self._flush is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._flush = loop.call_later(self._last + self.interval_s - now, self.flush)

    def flush(self) -> None:
        """Log the counts since the last line (nothing when there are none)."""
        self._flush = None
        if not self._counts:
            return
        parts = ", ".join(f"{n} {what}" for what, n in self._counts.items())
        key, n = self._by_key.most_common(1)[0]
        since = "" if self._last is None else f"in the last {self._clock() - self._last:.0f} s: "
        log.warning("slow or greedy clients: %s%s; most from %s (%d)", since, parts, key, n)
        self._counts.clear()
        self._by_key.clear()
        self._last = self._clock()


@dataclass
class ConnectionGuard:
    """The limits and the open connections every guarded connection of a server shares.

    Attributes:
        head_timeout_s: a request head must be complete within this (the first from the
            connection's opening, later ones from their first byte).
        body_timeout_s: a request body must be complete within this of its head's end.
        max_total: open connections at most; more are refused with a 503, and its last
            eighth is kept for addresses with fewer than `LIGHT_CONNECTIONS` open.
        max_per_address: open connections per client address (IPv6: per /64) at most.
        exempt: networks whose connections the per-address cap does not limit (the
            trusted reverse proxies, from which every client comes).
    """

    head_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_total: int = 4096
    max_per_address: int = 256
    exempt: Sequence[Network] = ()
    events: EdgeLog = field(default_factory=EdgeLog)
    open_total: int = 0
    open_by_key: Counter[str] = field(default_factory=Counter)
    open_by_site: Counter[str] = field(default_factory=Counter)

    def exempted(self, host: str) -> bool:
        addr = peer_ip(host)
        return addr is not None and in_networks(addr, self.exempt)

    def admit(self, key: str | None, exempt: bool, site: str | None = None) -> str | None:
        """Count one new connection of `key` (None: no address) in `site` (an IPv6 /48,
        `site_key`) and return None, or say why it is refused (nothing counted then)."""
        if self.open_total >= self.max_total:
            return f"refused over {self.max_total} open connections in all"
        if key is not None and not exempt and self.open_by_key[key] >= self.max_per_address:
            return f"refused over {self.max_per_address} open connections per address"
        reserved = self.max_total // RESERVED_SHARE
        if (
            self.open_total >= self.max_total - reserved
            and not exempt
            and (
                key is None
                or self.open_by_key[key] >= LIGHT_CONNECTIONS
                or (site is not None and self.open_by_site[site] >= LIGHT_SITE_CONNECTIONS)
            )
        ):
            return f"refused into the last {reserved} connections, kept for light clients"
        self.open_total += 1
        if key is not None:
            self.open_by_key[key] += 1
        if site is not None:
            self.open_by_site[site] += 1
        return None

    def release(self, key: str | None, site: str | None = None) -> None:
        self.open_total -= 1
        if key is not None:
            self.open_by_key[key] -= 1
            if self.open_by_key[key] <= 0:
                del self.open_by_key[key]
        if site is not None:
            self.open_by_site[site] -= 1
            if self.open_by_site[site] <= 0:
                del self.open_by_site[site]


class _Guarded:
    """Mixed in before uvicorn's protocol class (`guarded_protocol`)."""

    guard: ConnectionGuard
    # set by uvicorn's protocol classes
    transport: asyncio.Transport
    cycle: Any
    loop: asyncio.AbstractEventLoop

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[misc]
        self._key: str | None = None
        self._site: str | None = None
        self._counted = False
        self._seen_cycle: Any = None
        self._bytes = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        peer = transport.get_extra_info("peername")
        host = peer[0] if isinstance(peer, tuple | list) and peer else None
        self._key = address_key(str(host)) if host else None
        self._site = site_key(str(host)) if host else None
        exempt = bool(host) and self.guard.exempted(str(host))
        refusal = self.guard.admit(self._key, exempt, self._site)
        if refusal is not None:
            self.guard.events.count(refusal, self._key or "?")
            health.connection_refused(refusal)
            text = b"too many connections from your address or in all; try again later\n"
            transport.write(_REFUSED % (REFUSED_RETRY_AFTER_S, len(text), text))
            transport.close()
            return
        self._counted = True
        health.OPEN_CONNECTIONS.inc()
        self._head_timer = self.loop.call_later(self.guard.head_timeout_s, self._deadline, "head")

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        # httptools' protocol: each answer's head goes out with its body (`HeadWithBody`)
        HeadWithBody(self.transport, cycle)
        super()._start_asgi_task(cycle, app)  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        if self._counted:
            self._counted = False
            self.guard.release(self._key, self._site)
            health.OPEN_CONNECTIONS.dec()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if not self._counted:  # refused: its bytes are not read
            return
        if data:
            self._bytes = True
        idle = self._between_requests()
        super().data_received(data)  # type: ignore[misc]
        if self._examine() or not data or self.transport.is_closing():
            return
        if idle and self._head_timer is None and self._between_requests():
            # the first bytes of a later request's head (a kept-alive connection)
            self._head_timer = self.loop.call_later(
                self.guard.head_timeout_s, self._deadline, "head"
            )

    def _between_requests(self) -> bool:
        cycle = self.cycle
        return cycle is None or (cycle.response_complete and not cycle.more_body)

    def _examine(self) -> bool:
        """Move the deadlines on with the request; True when a new head was completed."""
        cycle = self.cycle
        new = cycle is not None and cycle is not self._seen_cycle
        if new:
            self._seen_cycle = cycle
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None
            if cycle.more_body:
                self._body_timer = self.loop.call_later(
                    self.guard.body_timeout_s, self._deadline, "body"
                )
        if self._body_timer is not None and cycle is not None and not cycle.more_body:
            self._body_timer.cancel()
            self._body_timer = None
        return new

    def _cancel_timers(self) -> None:
        for timer in (getattr(self, "_head_timer", None), getattr(self, "_body_timer", None)):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None

    def _deadline(self, phase: str) -> None:
        if phase == "head":
            self._head_timer = None
        else:
            self._body_timer = None
        if self.transport.is_closing() or self.transport.get_protocol() is not self:
            return  # closed meanwhile, or upgraded to another protocol
        self._examine()  # a pipelined head may have been completed since
        cycle = self.cycle
        if (
            phase == "head"
            and cycle is not None
            and cycle is self._seen_cycle
            and not self._between_requests()
        ):
            return  # its head completed: the request runs
        if phase == "body" and (cycle is None or not cycle.more_body):
            return
        timeout = self.guard.head_timeout_s if phase == "head" else self.guard.body_timeout_s
        self.guard.events.count(f"closed past the {timeout:g} s {phase} deadline", self._key or "?")
        health.CONNECTIONS_CUT.labels(phase).inc()
        if phase == "head" and self._bytes:
            text = b"request head not complete in time\n"
            self.transport.write(_TIMEOUT % (len(text), text))
        if phase == "body" and cycle is not None:
            cycle.disconnected = True  # the app's next receive() is http.disconnect
        self.transport.close()


class HeadWithBody:
    """The transport of one request-response cycle of uvicorn's httptools protocol, which
    writes an answer's head (status line and headers) and then its body, one
    `transport.write` each: here the head is held and goes out in one write with the first
    body chunk, so that a small answer costs one send (uvloop sends at once, holding the
    GIL, and each send wakes the client; the head's send was 16 % of the event loop's
    GIL time under load, bench/RESULTS.md). A head with no body write after it (`HEAD`, an
    empty body) goes out when the answer is complete, and before a `close`.

    Args:
        transport: the connection's transport.
        cycle: uvicorn's `RequestResponseCycle`; its `transport` and `on_response` become
            this object's.
    """

    BIG_BYTES = 64 * 1024
    """A body chunk of this size or more is written on its own after the head (not copied)."""

    __slots__ = ("_cycle", "_head", "_on_response", "_started", "transport")

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self.transport = transport
        self._cycle = cycle
        self._head: bytes | None = None
        self._started = False
        self._on_response = cycle.on_response
        cycle.transport = self
        cycle.on_response = self._response_complete

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            if len(data) < self.BIG_BYTES:
                self.transport.write(head + data)
                return
            self.transport.write(head)
        elif not self._started and self._cycle.response_started:
            self._started = True  # the answer's head (a `100 Continue` comes before it)
            self._head = data
            return
        self.transport.write(data)

    def flush(self) -> None:
        """Write a held head."""
        head = self._head
        if head is not None:
            self._head = None
            self.transport.write(head)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)

    def _response_complete(self) -> None:
        self.flush()
        self._on_response()


def guarded_protocol(
    base: type[asyncio.Protocol], guard: ConnectionGuard
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class `base` (`HttpToolsProtocol`, `H11Protocol`) with the
    deadlines and caps of `guard`; pass it as `http=` to `uvicorn.Config`."""
    return type(f"Guarded{base.__name__}", (_Guarded, base), {"guard": guard})


def default_protocol() -> type[asyncio.Protocol]:
    """The protocol class uvicorn's `http="auto"` picks (httptools when installed)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return AutoHTTPProtocol
