"""Change events: who wants to hear of lease, queue, job and capacity changes, and telling them.

Kinds and data: `("lease", {"lease_id", "state"})`, `("queue", {"request_id"})`,
`("job", {"job_id", "state"})`, `("capacity", {"gpu_uuid"})`, `("over_grant", {"lease_id",
"owner", "project", "session", "purpose", "gpu_uuid", "granted_mib", "observed_mib",
"over_mib", "over_s"})` (once per episode, see `overgrant`). The local API pushes them to
subscribed connections (and `over_grant` to the lease's own connection); the uplink uses
them to report sooner.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

Listener = Callable[[str, dict[str, Any]], None]


class Events:
    """The listeners of one broker, called in subscription order on the broker's loop."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(kind, data)` on lease, queue and capacity changes; returns an
        unsubscribe function. Listeners must not block."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        """Tell every listener; a failing listener is logged and never breaks the broker."""
        for listener in list(self._listeners):
            try:
                listener(kind, data)
            except Exception:  # a broken listener never breaks the broker
                log.exception("event listener failed")
