"""One render of a group's fleet fragment per refresh interval, shared by all its viewers.

Every open fleet page asks for `/fleet/live` every `REFRESH_MS`; a group of 300 computers
costs a database read and a render each time. `SharedRenders` keeps, per key, the last
render and hands it to every request of the same key until it is `ttl_s` old; while one
request renders a key, the others of that key wait for its result instead of rendering too.

The key must hold everything a render depends on besides the time: the group's id (never
only its name: a render is never served to another group) and the path prefix the links
carry. The render must hold nothing of one viewer (no CSRF token, no session): the full page
wraps it with those per request.

`etag` is a digest of the group's id and the render's body (the "As of" line left out, so
a render of unchanged data keeps its tag): a viewer that sends it back in `If-None-Match`
gets 304 until the data changes; the group's id in the digest keeps one group's tag from
ever matching another group's render.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

STATE_KEY = "fleet_renders"
"""Key of the app's `SharedRenders` in its `state`."""


@dataclass(frozen=True, slots=True)
class Render:
    """A rendered fragment: `head` (the "As of" line) + `body`, its `etag` (quoted, as the
    header carries it), the group's name and when it was made (`time.monotonic()` s)."""

    group: str
    head: str
    body: str
    etag: str
    made_at_s: float

    @property
    def html(self) -> str:
        return self.head + self.body


def etag_of(scope_id: str, body: str) -> str:
    """A strong entity tag (quoted) of `body` as rendered for group `scope_id`."""
    digest = hashlib.blake2b(f"{scope_id}\0{body}".encode(), digest_size=16).hexdigest()
    return f'"{digest}"'


class SharedRenders:
    """Renders by key, each reused for `ttl_s` seconds; at most `max_keys` kept (least
    recently used dropped). Thread-safe: handlers run in a thread pool.

    `renders` counts the renders made (what the cache saved is requests minus renders).
    """

    def __init__(
        self,
        ttl_s: float,
        max_keys: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self.renders = 0
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, Render] = OrderedDict()
        self._key_locks: dict[Hashable, threading.Lock] = {}

    def get(self, key: Hashable, render: Callable[[], tuple[str, str, str, str]]) -> Render:
        """The render of `key` younger than `ttl_s`, or a new one from `render()`, which
        returns (group id for the tag, group name, head, body). One `render()` at a time
        per key: the requests that arrive meanwhile get its result."""
        fresh = self._fresh(key)
        if fresh is not None:
            return fresh
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            fresh = self._fresh(key)  # made while this request waited for the lock
            if fresh is not None:
                return fresh
            scope_id, group, head, body = render()
            made = Render(group, head, body, etag_of(scope_id, body), self._clock())
            with self._lock:
                self.renders += 1
                self._entries[key] = made
                self._entries.move_to_end(key)
                while len(self._entries) > self.max_keys:
                    old, _ = self._entries.popitem(last=False)
                    self._key_locks.pop(old, None)
            return made

    def _fresh(self, key: Hashable) -> Render | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or self._clock() - entry.made_at_s >= self.ttl_s:
                return None
            self._entries.move_to_end(key)
            return entry
