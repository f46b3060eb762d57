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

Failed fleet-read credentials (`CredentialThrottle`) are counted per network and per
credential, so that a scraper with a revoked token does not lock out a valid one on the same
network, and a stranger who knows a token's or a computer's id (it is no secret: token lists,
audit entries, log lines and 429s name it) cannot lock out its holder. A credential is what
a request presents (`credential_key`): a viewer token as its id and a digest of the whole
token (`token <id> <sha256>`: a wrong secret with a right id is another credential), a signed
request as the signing computer's id counted per network (`computer <id>`: a signature a
stranger forged fails in the stranger's network, not in the computer's). The rule:

1. A credential that failed `CREDENTIAL_ID_FAILURES` times in the last minute (a token from
   any network; a computer's id from that network) is refused (429) before it is checked.
2. A network with `CREDENTIAL_FAILURES` failures in the last minute is refused before the
   check, except for a credential that was served to that network in the last `SERVED_S`
   (1 h) and has not failed from it since: that one is checked. A token is let through
   only when its whole text is the one served (which requests are checked depends on the
   network, the id and that digest, so a request learns nothing from it but what the check
   itself answers); a computer's id, by the id.
3. Every failure counts against its network and its credential, and takes the credential
   off its network's served list.

So a network gets no more guesses than with one count per network: `CREDENTIAL_FAILURES` a
minute, plus one per credential that had been served to it (after which that credential,
too, waits for the network); a forgotten scraper's revoked token gets at most
`CREDENTIAL_ID_FAILURES` checks a minute from all networks together. A credential never
served to a network that is over its limit is refused there, a good one too; a stranger in
a computer's own network who sends forged signatures in its name delays that computer's
fleet reads while the network is over its limit (its reports are not throttled here).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
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
from rbroker_server.metrics import health

__all__ = [
    "CredentialThrottle",
    "DbHits",
    "RateLimiter",
    "Throttle",
    "ThrottleGate",
    "Throttles",
    "client_address",
    "credential_key",
    "credential_label",
]

log = logging.getLogger(__name__)

WINDOW_S = 60.0
"""The window of every throttle (seconds)."""
SIGNIN_ATTEMPTS = 10
"""Web sign-ins per address per `WINDOW_S` (every attempt counts)."""
ENROLL_FAILURES = 10
"""Failed enrollments per address per `WINDOW_S`."""
CREDENTIAL_FAILURES = 20
"""Failed fleet-read credentials (viewer token or signature) per address per `WINDOW_S`."""
CREDENTIAL_ID_FAILURES = 20
"""Failures of one credential (a viewer token's id, a computer's id) per `WINDOW_S`, from all
networks together."""
SERVED_S = 3600.0
"""How long a credential served to a network is still checked there while that network is
over `CREDENTIAL_FAILURES` (seconds)."""
SERVED_KIND = "served"
"""The `rate_limit_hits` kind of the served list (kept `SERVED_S`, the others `WINDOW_S`)."""
_SERVED_WRITE_S = 60.0  # a process writes a credential's serving to the database this often
_ID = re.compile(r"^[A-Za-z0-9_-]{1,24}$")
"""A computer id as enrollment makes them (`c_` and 16 hex digits), with room: a longer
name counts against its network only, so every key fits `rate_limit_hits.key` (64)."""


def credential_key(headers: Mapping[str, str]) -> str | None:
    """The credential a fleet read presents (header names in lower case): `token <id>
    <digest>` for a viewer token (the digest: SHA-256 of the whole token, 16 hex digits, so
    that a wrong secret with a right id is another credential), `computer <id>` for a signed
    request; None when it presents none (a malformed one counts against its network only).
    Keeps no secret: `credential_label` is what logs and answers show."""
    computer = headers.get("x-rbroker-computer")
    if computer is not None:
        return f"computer {computer}" if _ID.match(computer) else None
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    from rbroker_server.auth.credentials import VIEWER_PREFIX, parse_credential

    cred = parse_credential(VIEWER_PREFIX, value)
    if cred is None:
        return None
    digest = hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return f"token {cred.id} {digest}"


def credential_label(credential: str) -> str:
    """`credential_key`'s answer as logs and 429s name it: `token <id>` or `computer <id>`."""
    return " ".join(credential.split(" ")[:2])


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

    def recent(self, prefix: str) -> dict[str, float]:
        """The keys starting with `prefix` that hit in the window, each with its last hit."""
        t = self.table
        now = self._clock()
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(t.c.key, sa.func.max(t.c.at))
                .where(
                    t.c.kind == self.kind,
                    t.c.key.startswith(prefix, autoescape=True),
                    t.c.at > now - self.window_s,
                )
                .group_by(t.c.key)
            ).all()
        return {str(key): float(at) for key, at in rows}


def prune_hits(engine: Engine, *, older_than_s: float, now: float | None = None) -> int:
    """Delete every counted hit older than `older_than_s` (the longest window; the served list
    after `SERVED_S`); returns how many (`rbroker_server.db.maintenance.prune`)."""
    from rbroker_server.db.tables import RATE_LIMIT_HITS as t

    now = time.time() if now is None else now
    old = sa.or_(
        sa.and_(t.c.kind != SERVED_KIND, t.c.at < now - older_than_s),
        t.c.at < now - max(SERVED_S, older_than_s),
    )
    with engine.begin() as conn:
        return int(conn.execute(sa.delete(t).where(old)).rowcount or 0)


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
        kind: the `limit` label of its refusals on `/metrics`
            (`rbroker_server_rate_limit_refusals_total`; default: `hits.kind`, else none).
        label: a key as its log line names it (default: the key itself).
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
        kind: str = "",
        label: Callable[[str], str] = str,
    ) -> None:
        self.what = what
        self._label = label
        self.kind = kind or (hits.kind if hits is not None else "")
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
        if self.kind:
            health.RATE_LIMIT_REFUSALS.labels(self.kind).inc()
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
                self._label(key),
                self.limiter.limit,
                self.limiter.window_s,
                before,
            )

    def refused_count(self, address: str) -> int:
        """Attempts refused in the current (or last) episode of `address`'s network."""
        with self._lock:
            return self._episodes.get(limit_key(address), (0.0, 0))[1]


class CredentialThrottle(Throttle):
    """Failed fleet-read credentials, counted per network and per credential (the rule in
    this module's docstring): `check(address, credential)` before the work, `spend` for a
    failure, `served` for a success. `credential` is `credential_key`'s answer (None: the
    network's count alone). The per-credential count is `per_credential`; the served list is
    a `DbHits` of kind `SERVED_KIND` (key: network and credential) when shared, this
    process's memory otherwise, and this process remembers what it read or wrote of it so
    that the ASGI gate answers from memory."""

    def __init__(
        self,
        what: str,
        limit: int,
        window_s: float,
        *,
        per_credential_limit: int,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 10_000,
        hits: DbHits | None = None,
        credential_hits: DbHits | None = None,
        served_hits: DbHits | None = None,
    ) -> None:
        super().__init__(
            what, limit, window_s, clock=clock, max_keys=max_keys, hits=hits, kind="credentials"
        )
        self.per_credential = Throttle(
            "failures of one credential",
            per_credential_limit,
            window_s,
            clock=clock,
            max_keys=max_keys,
            hits=credential_hits,
            kind="credential",
            label=credential_label,
        )
        self.served_list: RateLimiter | DbHits = served_hits or RateLimiter(
            1, SERVED_S, clock=clock, max_keys=max_keys
        )
        self._served: dict[str, float] = {}  # network + credential -> last served (clock)

    @staticmethod
    def _pair(address: str, credential: str) -> str:
        return f"{limit_key(address)} {credential}"

    @staticmethod
    def _counted(address: str, credential: str) -> str:
        """The key of `credential`'s own count: a token's from every network, a computer's
        per network (anyone can name a computer; only its key signs for it)."""
        if credential.startswith("computer "):
            return f"{credential} from {limit_key(address)}"
        return credential

    def _remember(self, pair: str, at: float) -> None:
        with self._lock:
            self._served.pop(pair, None)
            self._served[pair] = at
            while len(self._served) > self._max_keys:
                del self._served[next(iter(self._served))]

    def _served_recently(self, pair: str) -> bool:
        wait_s = self.served_list.wait_s(pair)  # > 0: served within SERVED_S
        if wait_s:
            self._remember(pair, self._clock() + wait_s - SERVED_S)
        else:
            with self._lock:
                self._served.pop(pair, None)
        return bool(wait_s)

    def _served_in_memory(self, pair: str) -> bool:
        with self._lock:
            at = self._served.get(pair)
        return at is not None and self._clock() - at < SERVED_S

    def refusal_s(self, address: str, credential: str | None = None) -> int:
        """0 when this request may be checked, else the `Retry-After` (a refusal counts in
        its episode). Reads the database when shared."""
        if credential is not None:
            retry_after = self.per_credential.refusal_s(self._counted(address, credential))
            if retry_after:
                return retry_after
        key = limit_key(address)
        wait_s = self.limiter.wait_s(key)
        if not wait_s:
            return 0
        if credential is not None and self._served_recently(self._pair(address, credential)):
            return 0
        self._load_served(key)
        return self._refuse_for(key, wait_s)

    def quick_refusal_s(self, address: str, credential: str | None = None) -> int:
        """`refusal_s` from this process's memory only (the routes read the shared counts)."""
        return self.quick_refusal(address, credential)[0]

    def quick_refusal(self, address: str, credential: str | None = None) -> tuple[int, str]:
        """`quick_refusal_s` and the refusal in words (the 429's detail)."""
        if credential is not None:
            retry_after = self.per_credential.quick_refusal_s(self._counted(address, credential))
            if retry_after:
                label = credential_label(credential)
                return retry_after, f"too many failures of this credential ({label})"
        if not self.shared:
            retry_after = self.refusal_s(address, credential)
        elif credential is not None and self._served_in_memory(self._pair(address, credential)):
            retry_after = 0
        else:
            retry_after = super().quick_refusal_s(address)
        return retry_after, f"too many {self.what} from your address"

    def check(self, address: str, credential: str | None = None) -> None:
        """Raises TooManyRequestsException (429, `Retry-After`) while this request is refused."""
        if credential is not None:
            retry_after = self.per_credential.refusal_s(self._counted(address, credential))
            if retry_after:
                raise TooManyRequestsException(
                    f"too many failures of this credential ({credential_label(credential)}); "
                    f"try again in {retry_after} s",
                    headers={"Retry-After": str(retry_after)},
                )
        retry_after = self.refusal_s(address, credential)
        if not retry_after:
            return
        raise TooManyRequestsException(
            f"too many {self.what} from your address; try again in {retry_after} s",
            headers={"Retry-After": str(retry_after)},
        )

    def spend(self, address: str, credential: str | None = None) -> None:
        """Count one failure against `address`'s network and `credential`; the credential
        leaves the network's served list."""
        super().spend(address)
        if credential is None:
            return
        self.per_credential.spend(self._counted(address, credential))
        pair = self._pair(address, credential)
        with self._lock:
            self._served.pop(pair, None)
        self.served_list.reset(pair)

    def served(self, address: str, credential: str | None) -> None:
        """`credential` was served to `address` (written to the shared list at most once a
        minute per process)."""
        if credential is None:
            return
        pair = self._pair(address, credential)
        now = self._clock()
        with self._lock:
            at = self._served.get(pair)
        if at is not None and now - at < _SERVED_WRITE_S:
            return
        if isinstance(self.served_list, RateLimiter):
            self.served_list.reset(pair)
        self.served_list.hit(pair)
        self._remember(pair, now)

    def _load_served(self, key: str) -> None:
        """Remember the credentials served to network `key` (a refused network: the gate
        then lets them through to the routes without reading the database)."""
        if not isinstance(self.served_list, DbHits):
            return
        wall = self.served_list._clock()
        now = self._clock()
        for pair, at in self.served_list.recent(key + " ").items():
            self._remember(pair, now - (wall - at))


class Throttles:
    """The app's throttles (in its `state` under `STATE_KEY`).

    `signin`: every web sign-in (`SIGNIN_ATTEMPTS` per minute). `enroll`: failed
    enrollments, a wrong, used or expired code (`ENROLL_FAILURES`). `credentials`: failed
    fleet-read credentials, a wrong viewer token or signature (`CREDENTIAL_FAILURES` per
    network, `CREDENTIAL_ID_FAILURES` per credential: `CredentialThrottle`). An
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
            kind="signin",
        )
        self.enroll = Throttle(
            "failed enrollments",
            ENROLL_FAILURES,
            WINDOW_S,
            clock=clock,
            hits=hits("enroll", ENROLL_FAILURES),
            kind="enroll",
        )
        self.credentials = CredentialThrottle(
            "failed fleet-read credentials",
            CREDENTIAL_FAILURES,
            WINDOW_S,
            per_credential_limit=CREDENTIAL_ID_FAILURES,
            clock=clock,
            hits=hits("credentials", CREDENTIAL_FAILURES),
            credential_hits=hits("credential", CREDENTIAL_ID_FAILURES),
            served_hits=(DbHits(engine, SERVED_KIND, 1, SERVED_S) if engine is not None else None),
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
            if isinstance(throttle, CredentialThrottle):
                retry_after, what = throttle.quick_refusal(address, _scope_credential(scope))
            else:
                retry_after = throttle.quick_refusal_s(address)
                what = f"too many {throttle.what} from your address"
            if retry_after:
                body = json.dumps(
                    {"status_code": 429, "detail": f"{what}; try again in {retry_after} s"}
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


def _scope_credential(scope: Scope) -> str | None:
    headers: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        if name in (b"authorization", b"x-rbroker-computer"):
            headers[name.decode("latin-1")] = value.decode("latin-1")
    return credential_key(headers)
