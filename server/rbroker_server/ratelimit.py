"""Per-client rate limits (token buckets in this process's memory).

Every limit is keyed by `rbroker_server.net.client_address(request)`, the one place that
decides who a client is (X-Forwarded-For believed only from trusted proxies); sign-in uses
it, and enrollment can reuse both. Buckets live in one process: with
several coordinator processes behind a load balancer each enforces its own limit, so the
effective limit is at most `processes x limit`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rbroker_server.net import client_address

__all__ = ["RateLimiter", "client_address"]


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
