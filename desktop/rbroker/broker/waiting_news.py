"""Telling waiting requests what they wait for, pushed (docs/architecture.md §5,
`notify_waiting`).

A request queued with `notify_waiting` is told its queue entry (reason, place, estimate) when
something it depends on may have changed: an admission pass (the only place reasons are set),
a lease or queue event on the broker's bus, and every `refresh_s` while any is watched (its
estimate counts down and is played again). The changes of one turn of the event loop are told
together, in one pass over the queue for every watched request (`entries`), so that N waiting
requests cost one pass per change rather than N reads per poll (each waiter's connection read
its own entry every 0.25 s before: 2 048 waiters held the loop for seconds without a memo).
Whether a told entry is worth an `event` to the client is the connection's rule
(`rbroker.broker.eta.retell`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Container, Iterable

from rbroker.broker.clock import Clock
from rbroker.broker.leases import Waiter
from rbroker_protocol.results import QueuedRequest

log = logging.getLogger(__name__)

Tell = Callable[[QueuedRequest], None]
"""Given a watched request's queue entry as it is now; must not block."""

Entries = Callable[[Container[Waiter]], Iterable[tuple[Waiter, QueuedRequest]]]
"""The queue entries of those of the given waiters that admission has evaluated, worked out
in one pass over the queue."""


class WaitingNews:
    """The watched waiting requests of one broker and when they are told.

    Args:
        entries: their entries now (`Entries`), from the broker's read of the queue.
        clock: the broker's clock (monotonic seconds).
        refresh_s: the longest time between two tellings while any request is watched.
    """

    def __init__(self, entries: Entries, clock: Clock, refresh_s: float) -> None:
        self._entries = entries
        self._clock = clock
        self._refresh_s = refresh_s
        self._watched: dict[Waiter, Tell] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending = False
        self._told_at = -math.inf
        self.passes = 0
        """Tellings so far (each one pass over the queue)."""

    def watch(self, waiter: Waiter, tell: Tell) -> Callable[[], None]:
        """Tell `tell` the entry of `waiter` now (once admission has evaluated it) and after
        each change; returns the function that stops it. Call on the broker's loop."""
        self._loop = asyncio.get_running_loop()
        self._watched[waiter] = tell
        self.changed()

        def stop() -> None:
            self._watched.pop(waiter, None)

        return stop

    def changed(self) -> None:
        """What a waiting request's entry rests on may have changed: tell every watched
        request once, after this turn of the loop (changes of one turn coalesce)."""
        if self._pending or not self._watched or self._loop is None or self._loop.is_closed():
            return
        self._pending = True
        self._loop.call_soon(self._tell)

    def tick(self, now: float) -> None:
        """The broker's tick: tell again after `refresh_s` without a change (the estimates
        count down and are played again)."""
        if self._watched and now - self._told_at >= self._refresh_s:
            self.changed()

    def _tell(self) -> None:
        self._pending = False
        if not self._watched:
            return
        self._told_at = self._clock.monotonic()
        self.passes += 1
        for waiter, entry in self._entries(self._watched):
            tell = self._watched.get(waiter)
            if tell is None:
                continue
            try:
                tell(entry)
            except Exception:  # one connection's hook never stops the others being told
                log.exception("telling a waiting request failed")
