"""What the report path knows of each sender, kept between its reports: the public key
with its loaded verify key, the current run, its counter, the last applied seq, when that
report was received and the newest history bucket.

A cached view only saves the read; it never decides. The conditional UPDATE of a report
(`statements.update_computer`) repeats every condition the view was used for (same run and
an older seq, or the old run; not revoked; the same public key), so a view made stale by
another coordinator process on the same database, a revocation or a new key only costs a
0-row update, after which the ingest path reads the row again and decides on that.
Revoked computers are never cached.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

import nacl.signing
from sqlalchemy.engine import Engine

from rbroker_protocol.signing import EnvelopeError, load_verify_key
from rbroker_server.reports import statements as st

MAX_COMPUTERS: Final = 100_000
"""Views kept at most (≈ 1 KiB each); past it the oldest are dropped first."""


@dataclass(frozen=True, slots=True)
class ComputerView:
    """One computer's row as the report path needs it (`statements.SELECT_COMPUTER`).

    `verify_key` is None when the stored key is not 32 bytes of Ed25519 key material
    (its reports are then refused as unauthenticated).
    """

    public_key: str
    verify_key: nacl.signing.VerifyKey | None
    revoked: bool
    run_id: str | None
    run_counter: int | None
    seq: int | None
    history_at: datetime | None
    generated_at: datetime | None = None
    """When the current run's latest applied report was generated (the computer's clock)."""
    last_seen_at: datetime | None = None
    """When the latest applied report was received (the coordinator's clock)."""

    @classmethod
    def from_row(cls, row: Any) -> ComputerView:
        """A view of a `SELECT_COMPUTER` row."""
        try:
            key: nacl.signing.VerifyKey | None = load_verify_key(row.public_key)
        except EnvelopeError:
            key = None
        return cls(
            public_key=row.public_key,
            verify_key=key,
            revoked=row.revoked_at is not None,
            run_id=row.run_id,
            run_counter=row.run_counter,
            seq=row.seq,
            history_at=row.history_at,
            generated_at=row.generated_at,
            last_seen_at=row.last_seen_at,
        )

    def after(
        self,
        run_id: str,
        seq: int,
        run_counter: int | None,
        history_at: datetime | None,
        generated_at: datetime | None = None,
        last_seen_at: datetime | None = None,
    ) -> ComputerView:
        """This view once a report of (`run_id`, `seq`), generated at `generated_at` and
        received at `last_seen_at`, is applied; `history_at` is the bucket it wrote (None:
        it wrote none)."""
        return replace(
            self,
            run_id=run_id,
            seq=seq,
            run_counter=run_counter,
            history_at=history_at or self.history_at,
            generated_at=generated_at,
            last_seen_at=last_seen_at,
        )


def load_view(engine: Engine, computer_id: str) -> ComputerView | None:
    """Read `computer_id`'s row (None: no such computer).

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database could not be read.
    """
    with engine.connect() as conn:
        row = conn.execute(st.SELECT_COMPUTER, {"w_id": computer_id}).first()
    return None if row is None else ComputerView.from_row(row)


class ComputerCache:
    """computer id → `ComputerView`, at most `max_computers` of them (thread-safe: the
    event loop reads while writes settle)."""

    def __init__(self, max_computers: int = MAX_COMPUTERS) -> None:
        self._views: dict[str, ComputerView] = {}
        self._max = max_computers
        self._lock = threading.Lock()

    def get(self, computer_id: str) -> ComputerView | None:
        """The cached view, or None."""
        return self._views.get(computer_id)

    def put(self, computer_id: str, view: ComputerView | None) -> None:
        """Remember `view` (None, or a revoked computer's: forget the computer)."""
        with self._lock:
            self._views.pop(computer_id, None)
            if view is None or view.revoked:
                return
            self._views[computer_id] = view
            while len(self._views) > self._max:  # dicts keep insertion order: oldest first
                del self._views[next(iter(self._views))]

    def __len__(self) -> int:
        return len(self._views)
