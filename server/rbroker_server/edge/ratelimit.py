"""Per-client rate limits, shared by every coordinator process on one database.

Every limit is keyed by the network of `rbroker_server.edge.net.client_address(request)`, the one
place that decides who a client is (X-Forwarded-For believed only from trusted proxies that
send the proxy secret, when one is set): `net.limit_key`, its /24 for IPv4 and its /64 for
IPv6, so rotating addresses inside one network does not escape a limit. `Throttle` puts a
counter in front of one kind of attempt (sign-in, failed enrollments, failed fleet-read
credentials), answers 429 with `Retry-After` past it and logs one line per episode of
refusals from a network. The app's counters are `DbHits`: the attempts of the last window
in the table `rate_limit_hits`, so all processes on the database count together (two
`serve` processes allow 10 sign-ins a minute from a network, not 20). `RateLimiter` is the
in-memory token bucket a `Throttle` without a database uses.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import sqlalchemy as sa
from litestar import Request
from litestar.exceptions import TooManyRequestsException
from litestar.types import (
    ASGIApp,
    HTTPResponseBodyEvent,
    HTTPResponseStartEvent,
    HTTPScope,
    Receive,
    Scope,
    Send,
)
from sqlalchemy.engine import Engine

from rbroker_server.edge.net import Network, client_address, limit_key, scope_client

__all__ = ["DbHits", "RateLimiter", "Throttle", "ThrottleGate", "Throttles", "client_address"]

log = logging.getLogger(__name__)

WINDOW_S = 60.0
"""The window of every throttle (seconds)."""
SIGNIN_ATTEMPTS = 10
"""Web sign-ins per address per `WINDOW_S` (every attempt counts)."""
ENROLL_FAILURES = 10
"""Failed enrollments per address per `WINDOW_S`."""
CREDENTIAL_FAILURES = 20
"""Failed fleet-read credentials (viewer token or signature) per address per `WINDOW_S`."""


class RateLimiter:
    """At most `limit` hits per `window_s` seconds per key, refilled continuously.

    A token bucket of capacity `limit` that regains `limit / window_s` tokens a second; a
    burst of `limit` is allowed, then one hit every `window_s / limit` seconds. Thread-safe.
    At most `max_keys` buckets are kept: full buckets (keys that have been quiet a whole
    window) are dropped first, then the oldest.
    """

    def __init__(
        self,
        limit: int,
        window_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 10_000,
    ) -> None:
        if limit < 1 or window_s <= 0:
            raise ValueError("need limit >= 1 and window_s > 0")
        self.limit = limit
        self.window_s = window_s
        self._rate = limit / window_s
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)
        self._lock = threading.Lock()

    def hit(self, key: str) -> float:
        """Spend one token for `key`. Returns 0.0 when allowed, else the seconds to wait
        until the next hit would be allowed (nothing is spent then)."""
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.pop(key, (float(self.limit), now))
            tokens = min(float(self.limit), tokens + (now - at) * self._rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                self._trim(now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self._rate

    def wait_s(self, key: str) -> float:
        """Seconds until `key` may spend a token (0.0: now); spends nothing."""
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.get(key, (float(self.limit), now))
        tokens = min(float(self.limit), tokens + (now - at) * self._rate)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self._rate

    def reset(self, key: str) -> None:
        """Forget `key`'s bucket (a full one is made at its next hit)."""
        with self._lock:
            self._buckets.pop(key, None)

    def _trim(self, now: float) -> None:
        if len(self._buckets) <= self._max_keys:
            return
        for key, (tokens, at) in list(self._buckets.items()):
            if tokens + (now - at) * self._rate >= self.limit:
                del self._buckets[key]
        while len(self._buckets) > self._max_keys:  # dicts keep insertion order: oldest first
            del self._buckets[next(iter(self._buckets))]


class DbHits:
    """At most `limit` hits per any `window_s` seconds per key, counted in the database
    (`rate_limit_hits`: one row per hit), so every coordinator process on it shares them.

    A sliding log: a key may hit while fewer than `limit` of its hits are younger than
    `window_s`; the wait is until the oldest of its last `limit` hits leaves the window.
    A hit deletes its key's rows that left the window; `prune` deletes everyone's. Two
    processes that both read `limit - 1` at the same instant may both hit (one over); the
    limit is not meant to be exact to the attempt, only not to multiply with processes.
    Times are Unix seconds of this host's clock (hosts sharing a database keep theirs in
    step, as for report freshness).
    """

    def __init__(
        self,
        engine: Engine,
        kind: str,
        limit: int,
        window_s: float,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if limit < 1 or window_s <= 0:
            raise ValueError("need limit >= 1 and window_s > 0")
        from rbroker_server.db.tables import RATE_LIMIT_HITS

        self.table: sa.Table = RATE_LIMIT_HITS
        self.engine = engine
        self.kind = kind
        self.limit = limit
        self.window_s = window_s
        self._clock = clock

    def _wait(self, conn: sa.Connection, key: str, now: float) -> float:
        t = self.table
        recent = (
            conn.execute(
                sa.select(t.c.at)
                .where(t.c.kind == self.kind, t.c.key == key, t.c.at > now - self.window_s)
                .order_by(t.c.at.desc())
                .limit(self.limit)
            )
            .scalars()
            .all()
        )
        if len(recent) < self.limit:
            return 0.0
        return max(recent[-1] + self.window_s - now, 0.001)

    def wait_s(self, key: str) -> float:
        """Seconds until `key` may hit (0.0: now); writes nothing."""
        with self.engine.connect() as conn:
            return self._wait(conn, key, self._clock())

    def hit(self, key: str) -> float:
        """Count one hit for `key` (whatever its wait); returns the wait after it (0.0:
        another hit is allowed now)."""
        from rbroker_server.db.engine import write_lock

        t = self.table
        now = self._clock()
        with write_lock(self.engine), self.engine.begin() as conn:
            conn.execute(
                sa.delete(t).where(
                    t.c.kind == self.kind, t.c.key == key, t.c.at <= now - self.window_s
                )
            )
            conn.execute(sa.insert(t).values(kind=self.kind, key=key, at=now))
            return self._wait(conn, key, now)

    def reset(self, key: str) -> None:
        """Forget `key`'s hits."""
        from rbroker_server.db.engine import write_lock

        t = self.table
        with write_lock(self.engine), self.engine.begin() as conn:
            conn.execute(sa.delete(t).where(t.c.kind == self.kind, t.c.key == key))


def prune_hits(engine: Engine, *, older_than_s: float, now: float | None = None) -> int:
    """Delete every counted hit older than `older_than_s` (the longest window); returns how
    many (`rbroker_server.db.maintenance.prune`)."""
    from rbroker_server.db.tables import RATE_LIMIT_HITS as t

    cutoff = (time.time() if now is None else now) - older_than_s
    with engine.begin() as conn:
        return int(conn.execute(sa.delete(t).where(t.c.at < cutoff)).rowcount or 0)


class Throttle:
    """One kind of attempt, limited per client address: `check` before the work (429 past
    the limit, spending nothing), `spend` for each attempt that counts (every sign-in; a
    failed enrollment or fleet-read credential).

    The first refusal of an episode logs one WARNING line naming the address; later
    refusals only count. An episode ends when its address has been refused nothing for a
    whole window; the next refusal after that starts a new one (and a line that says how
    many attempts the last episode refused).

    Every method takes a client address and counts it under its network (`net.limit_key`).
    With a database (`hits` a `DbHits`) the counts are shared by all processes; this
    process also remembers until when a network is refused, so `quick_refusal_s` (the ASGI
    gate, async code) answers from memory without touching the database.

    Args:
        what: the attempts in words, for the 429 and the log ("failed enrollments").
        limit, window_s: at most `limit` attempts per `window_s`.
        clock: monotonic seconds (the episodes, the remembered refusals and the in-memory
            counter's buckets).
        hits: the shared counter; None: a `RateLimiter` in this process's memory (a burst
            of `limit`, then `limit` per `window_s`).
    """

    def __init__(
        self,
        what: str,
        limit: int,
        window_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 10_000,
        hits: DbHits | None = None,
    ) -> None:
        self.what = what
        self.limiter: RateLimiter | DbHits = hits or RateLimiter(
            limit, window_s, clock=clock, max_keys=max_keys
        )
        self.shared = hits is not None
        self._clock = clock
        self._max_keys = max_keys
        self._episodes: dict[str, tuple[float, int]] = {}  # key -> (last refusal, refused)
        self._blocked: dict[str, float] = {}  # key -> refused until (clock), shared only
        self._lock = threading.Lock()

    def _refuse_for(self, key: str, wait_s: float) -> int:
        if self.shared:
            with self._lock:
                self._blocked.pop(key, None)
                self._blocked[key] = self._clock() + wait_s
                while len(self._blocked) > self._max_keys:
                    del self._blocked[next(iter(self._blocked))]
        self._refused(key)
        return int(wait_s) + 1

    def refusal_s(self, address: str) -> int:
        """0 when `address` may try now, else the whole seconds to wait (the `Retry-After`);
        a refusal counts in the episode. Reads the database when shared (not in async
        code: see `quick_refusal_s`)."""
        key = limit_key(address)
        wait_s = self.limiter.wait_s(key)
        if not wait_s:
            return 0
        return self._refuse_for(key, wait_s)

    def quick_refusal_s(self, address: str) -> int:
        """`refusal_s` from this process's memory only: what the last read or spend here
        said about `address`'s network (the routes read the shared count again)."""
        if not self.shared:
            return self.refusal_s(address)
        key = limit_key(address)
        with self._lock:
            until = self._blocked.get(key)
        if until is None:
            return 0
        wait_s = until - self._clock()
        if wait_s <= 0:
            with self._lock:
                self._blocked.pop(key, None)
            return 0
        self._refused(key)
        return int(wait_s) + 1

    def check(self, address: str) -> None:
        """Raises TooManyRequestsException (429, `Retry-After`) while `address` is over."""
        retry_after = self.refusal_s(address)
        if not retry_after:
            return
        raise TooManyRequestsException(
            f"too many {self.what} from your address; try again in {retry_after} s",
            headers={"Retry-After": str(retry_after)},
        )

    def spend(self, address: str) -> None:
        """Count one attempt for `address`."""
        key = limit_key(address)
        wait_s = self.limiter.hit(key)
        if self.shared and wait_s:
            with self._lock:
                self._blocked.pop(key, None)
                self._blocked[key] = self._clock() + wait_s

    def _refused(self, key: str) -> None:
        now = self._clock()
        with self._lock:
            last, refused = self._episodes.pop(key, (None, 0))
            ended = last is not None and now - last > self.limiter.window_s
            self._episodes[key] = (now, 1 if ended or last is None else refused + 1)
            while len(self._episodes) > self._max_keys:
                del self._episodes[next(iter(self._episodes))]
        if last is None or ended:
            before = f" (the last episode refused {refused})" if ended else ""
            log.warning(
                "rate limit: too many %s from %s (over %d per %.0f s); answering 429 "
                "until they slow down%s",
                self.what,
                key,
                self.limiter.limit,
                self.limiter.window_s,
                before,
            )

    def refused_count(self, address: str) -> int:
        """Attempts refused in the current (or last) episode of `address`'s network."""
        with self._lock:
            return self._episodes.get(limit_key(address), (0.0, 0))[1]


class Throttles:
    """The app's throttles (in its `state` under `STATE_KEY`).

    `signin`: every web sign-in (`SIGNIN_ATTEMPTS` per minute). `enroll`: failed
    enrollments, a wrong, used or expired code (`ENROLL_FAILURES`). `credentials`: failed
    fleet-read credentials, a wrong viewer token or signature (`CREDENTIAL_FAILURES`). An
    honest computer enrolls once and an honest viewer signs in rarely; a guesser is refused
    before the work. With `engine` the counts live in its `rate_limit_hits` (`DbHits`),
    shared by every process on the database; without, in this process.
    """

    STATE_KEY = "throttles"

    def __init__(
        self, engine: Engine | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        def hits(kind: str, limit: int) -> DbHits | None:
            return DbHits(engine, kind, limit, WINDOW_S) if engine is not None else None

        self.signin = Throttle(
            "sign-in attempts",
            SIGNIN_ATTEMPTS,
            WINDOW_S,
            clock=clock,
            hits=hits("signin", SIGNIN_ATTEMPTS),
        )
        self.enroll = Throttle(
            "failed enrollments",
            ENROLL_FAILURES,
            WINDOW_S,
            clock=clock,
            hits=hits("enroll", ENROLL_FAILURES),
        )
        self.credentials = Throttle(
            "failed fleet-read credentials",
            CREDENTIAL_FAILURES,
            WINDOW_S,
            clock=clock,
            hits=hits("credentials", CREDENTIAL_FAILURES),
        )

    @classmethod
    def of(cls, request: Request[Any, Any, Any]) -> Throttles:
        """The throttles of `request`'s app."""
        throttles: Throttles = request.app.state[cls.STATE_KEY]
        return throttles


class ThrottleGate:
    """ASGI wrapper that refuses an address over its limit before the framework sees the
    request: `POST /api/v1/enroll` under `Throttles.enroll`, the fleet reads and `/metrics`
    under `Throttles.credentials`. The same 429 the routes give (they check again), at a
    fraction of the cost, so that a guesser hammering the coordinator leaves its CPU to
    honest reports. It answers from this process's memory (`Throttle.quick_refusal_s`: no
    database work); the routes read the shared count. Wraps the app inside `PrefixStrip`
    (paths are the app's own).
    """

    def __init__(
        self,
        app: ASGIApp,
        throttles: Throttles,
        trusted: Sequence[Network],
        proxy_secret: str = "",
    ) -> None:
        self.app = app
        self.throttles = throttles
        self.trusted = tuple(trusted)
        self.proxy_secret = proxy_secret

    def _throttle(self, method: str, path: str) -> Throttle | None:
        if method == "POST" and path.rstrip("/") == "/api/v1/enroll":
            return self.throttles.enroll
        if method == "GET" and (
            path.startswith(("/api/v1/fleet", "/api/v1/computers/")) or path == "/metrics"
        ):
            return self.throttles.credentials
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        throttle = None
        if scope["type"] == "http":
            http = cast("HTTPScope", scope)
            throttle = self._throttle(http["method"], http["path"])
        if throttle is not None:
            address = scope_client(scope, self.trusted, self.proxy_secret)
            retry_after = throttle.quick_refusal_s(address)
            if retry_after:
                body = json.dumps(
                    {
                        "status_code": 429,
                        "detail": f"too many {throttle.what} from your address; "
                        f"try again in {retry_after} s",
                    }
                ).encode()
                start: HTTPResponseStartEvent = {
                    "type": "http.response.start",
                    "status": 429,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"retry-after", str(retry_after).encode()),
                    ],
                }
                await send(start)
                end: HTTPResponseBodyEvent = {
                    "type": "http.response.body",
                    "body": body,
                    "more_body": False,
                }
                await send(end)
                return
        await self.app(scope, receive, send)
