"""Per-client rate limits (token buckets in this process's memory).

Every limit is keyed by `rbroker_server.net.client_address(request)`, the one place that
decides who a client is (X-Forwarded-For believed only from trusted proxies). `Throttle`
puts a `RateLimiter` in front of one kind of attempt (sign-in, failed enrollments, failed
fleet-read credentials), answers 429 with `Retry-After` past it and logs one line per
episode of refusals from an address. Buckets live in one process: with several coordinator
processes behind a load balancer each enforces its own limit, so the effective limit is at
most `processes x limit`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from litestar import Request
from litestar.exceptions import TooManyRequestsException
from litestar.types import ASGIApp, Receive, Scope, Send

from rbroker_server.net import Network, client_address, forwarded_client

__all__ = ["RateLimiter", "Throttle", "ThrottleGate", "Throttles", "client_address"]

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


class Throttle:
    """One kind of attempt, limited per client address: `check` before the work (429 past
    the limit, spending nothing), `spend` for each attempt that counts (every sign-in; a
    failed enrollment or fleet-read credential).

    The first refusal of an episode logs one WARNING line naming the address; later
    refusals only count. An episode ends when its address has been refused nothing for a
    whole window; the next refusal after that starts a new one (and a line that says how
    many attempts the last episode refused).

    Args:
        what: the attempts in words, for the 429 and the log ("failed enrollments").
        limit, window_s: `RateLimiter`'s (a burst of `limit`, then `limit` per `window_s`).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        what: str,
        limit: int,
        window_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 10_000,
    ) -> None:
        self.what = what
        self.limiter = RateLimiter(limit, window_s, clock=clock, max_keys=max_keys)
        self._clock = clock
        self._max_keys = max_keys
        self._episodes: dict[str, tuple[float, int]] = {}  # key -> (last refusal, refused)
        self._lock = threading.Lock()

    def refusal_s(self, key: str) -> int:
        """0 when `key` may try now, else the whole seconds to wait (the `Retry-After`); a
        refusal counts in the episode."""
        wait_s = self.limiter.wait_s(key)
        if not wait_s:
            return 0
        self._refused(key)
        return int(wait_s) + 1

    def check(self, key: str) -> None:
        """Raises TooManyRequestsException (429, `Retry-After`) while `key` is over."""
        retry_after = self.refusal_s(key)
        if not retry_after:
            return
        raise TooManyRequestsException(
            f"too many {self.what} from your address; try again in {retry_after} s",
            headers={"Retry-After": str(retry_after)},
        )

    def spend(self, key: str) -> None:
        """Count one attempt for `key`."""
        self.limiter.hit(key)

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

    def refused_count(self, key: str) -> int:
        """Attempts refused in `key`'s current (or last) episode."""
        with self._lock:
            return self._episodes.get(key, (0.0, 0))[1]


class Throttles:
    """The app's throttles (in its `state` under `STATE_KEY`).

    `signin`: every web sign-in (`SIGNIN_ATTEMPTS` per minute). `enroll`: failed
    enrollments, a wrong, used or expired code (`ENROLL_FAILURES`). `credentials`: failed
    fleet-read credentials, a wrong viewer token or signature (`CREDENTIAL_FAILURES`). An
    honest computer enrolls once and an honest viewer signs in rarely; a guesser is refused
    before any database work.
    """

    STATE_KEY = "throttles"

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.signin = Throttle("sign-in attempts", SIGNIN_ATTEMPTS, WINDOW_S, clock=clock)
        self.enroll = Throttle("failed enrollments", ENROLL_FAILURES, WINDOW_S, clock=clock)
        self.credentials = Throttle(
            "failed fleet-read credentials", CREDENTIAL_FAILURES, WINDOW_S, clock=clock
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
    honest reports. Wraps the app inside `PrefixStrip` (paths are the app's own).
    """

    def __init__(self, app: ASGIApp, throttles: Throttles, trusted: Sequence[Network]) -> None:
        self.app = app
        self.throttles = throttles
        self.trusted = tuple(trusted)

    def _throttle(self, method: str, path: str) -> Throttle | None:
        if method == "POST" and path.rstrip("/") == "/api/v1/enroll":
            return self.throttles.enroll
        if method == "GET" and (
            path.startswith(("/api/v1/fleet", "/api/v1/computers/")) or path == "/metrics"
        ):
            return self.throttles.credentials
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        throttle = (
            self._throttle(scope["method"], scope["path"]) if scope["type"] == "http" else None
        )
        if throttle is not None:
            client = scope.get("client")
            peer = str(client[0]) if client else ""
            forwarded = [
                v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"x-forwarded-for"
            ]
            address = forwarded_client(peer, forwarded, self.trusted) if peer else peer
            retry_after = throttle.refusal_s(address)
            if retry_after:
                body = json.dumps(
                    {
                        "status_code": 429,
                        "detail": f"too many {throttle.what} from your address; "
                        f"try again in {retry_after} s",
                    }
                ).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 429,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"retry-after", str(retry_after).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
