"""Answer bytes a user's connections leave unsent, together (docs/architecture.md §5).

One connection that does not read holds its own answers back at `max_unsent_bytes`
(`rbroker.localapi.connection`), but a user with many such connections would multiply that
(500 connections × 4 MiB grew a broker by 2 GiB). So after every write the connection's
user is checked: when the connections of one OS user together hold more than
`max_unsent_bytes_per_user` unsent, the one holding the most is dropped at once, with the
reason `unsent_over_limit` in the broker's log, until the user is under the cap again.

Only connections with at least `COUNTED_FROM_BYTES` unsent are counted (so a write costs a
look at that user's backed-up connections only, not at all of them): a user's connections
below it add at most 512 × 16 KiB = 8 MiB to the cap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rbroker_protocol.errors import ErrorCode

if TYPE_CHECKING:
    from rbroker.localapi.connection import Connection

COUNTED_FROM_BYTES = 16 * 1024
"""A connection with less than this unsent (bytes) is not counted against its user."""


class UnsentBudget:
    """The per-user cap on unsent answer bytes, `per_user_bytes`, over all connections."""

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
