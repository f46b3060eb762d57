"""A computer's reported bookings (architecture.md §2a) read on the coordinator: what they
protect on a GPU at an instant, when one to come takes the room asked for, and that in words.

Bookings are stored as the report carries them (`rbroker_protocol.reports.BookingReport` as
JSON): `mib` on each of `gpu_uuids` for [`start_at`, `end_at`), Unix seconds of the computer's
wall clock, and `claimed_mib` of it held by the leases that claim it. While live, a booking
protects `mib - claimed_mib` on each of its GPUs. Instants here are the coordinator's clock
(Unix seconds); the computer's skew is shown apart (`clock_warning`) and not corrected.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

Booking = Mapping[str, Any]
"""One stored booking (`BookingReport`'s fields as JSON)."""


def protected_mib(booking: Booking) -> int:
    """MiB `booking` protects on each of its GPUs while its window holds: its MiB less what
    its claims hold, at least 0."""
    return max(0, int(booking.get("mib") or 0) - int(booking.get("claimed_mib") or 0))


def on_gpus(bookings: Iterable[Booking]) -> dict[str, list[Booking]]:
    """GPU UUID → the bookings on it, by start (then id)."""
    per: dict[str, list[Booking]] = {}
    for b in bookings:
        for uuid in b.get("gpu_uuids") or ():
            per.setdefault(uuid, []).append(b)
    for items in per.values():
        items.sort(key=lambda b: (float(b["start_at"]), str(b.get("booking_id", ""))))
    return per


def booked_at(bookings: Iterable[Booking], at: float) -> int:
    """MiB the `bookings` (of one GPU) protect together at Unix time `at`: those whose window
    [`start_at`, `end_at`) holds it."""
    return sum(
        protected_mib(b) for b in bookings if float(b["start_at"]) <= at < float(b["end_at"])
    )


def room_until(
    bookings: Iterable[Booking], available_mib: int, mib: int, now: float
) -> float | None:
    """The start (Unix seconds) of the first booking after `now` that leaves less than `mib`
    of `available_mib` (the GPU's available MiB now, without bookings) beside the bookings
    that hold then; None when none does. A sweep over the bookings' starts and ends (ends
    first at one instant), O(n log n) in the bookings of the GPU."""
    events: list[tuple[float, int, int]] = []
    level = 0
    for b in bookings:
        start, end, mib_b = float(b["start_at"]), float(b["end_at"]), protected_mib(b)
        if end <= now or mib_b <= 0:
            continue
        if start <= now:
            level += mib_b
        else:
            events.append((start, 1, mib_b))
        events.append((end, 0, -mib_b))
    events.sort()
    for at, starts, change in events:
        level += change
        if starts and available_mib - level < mib:
            return at
    return None


def fmt_mib(mib: int) -> str:
    """`20 480`: MiB grouped by thousands with a space."""
    return f"{mib:,}".replace(",", " ")


def room_text(mib: int, until: datetime | None, now: datetime) -> str:
    """`room for 10 000 MiB now`, or `…, and until 14:00 UTC` (`…, and until 2026-12-08
    14:00 UTC` on another UTC day than `now`)."""
    text = f"room for {fmt_mib(mib)} MiB now"
    if until is None:
        return text
    until = until.astimezone(UTC)
    when = until.strftime("%H:%M")
    if until.date() != now.astimezone(UTC).date():
        when = until.strftime("%Y-%m-%d %H:%M")
    return f"{text}, and until {when} UTC"


def to_datetime(at: float | None) -> datetime | None:
    """Unix seconds as an aware UTC datetime (None stays None)."""
    return None if at is None else datetime.fromtimestamp(at, UTC)
