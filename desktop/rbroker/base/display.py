"""How rbroker writes figures and names for people: MiB with grouped thousands, GPU UUIDs
cut to head and tail, a GPU's capacity split in words. One place for the broker's reasons,
the SDK's warnings, the command line and the tray; no arithmetic here (that is
`rbroker.broker.capacity`)."""

from __future__ import annotations

import math
import re

# A command that only writes MiB loads neither `typing` nor the dates and times of
# `rbroker.base.when` (start-up, docs/architecture.md §10): the idiom type checkers read as
# typing.TYPE_CHECKING (PEP 484's constant, never true at run time).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, Protocol

    class CapacityFigures(Protocol):
        """One GPU's capacity split in MiB, as `rbroker.broker.capacity.Capacity` holds it."""

        @property
        def total_mib(self) -> int: ...
        @property
        def headroom_mib(self) -> int: ...
        @property
        def device_used_mib(self) -> int: ...
        @property
        def outstanding_mib(self) -> int: ...
        @property
        def available_mib(self) -> int: ...
        @property
        def booked_mib(self) -> int: ...


def fmt_mib(value: int) -> str:
    """`24576` → `"24 576"` (thousands grouped by a space, as in architecture.md §2's examples)."""
    return f"{value:,}".replace(",", " ")


def fmt_count(value: int) -> str:
    """A count for people, grouped as MiB are: `1024` → `"1 024"`, `999` → `"999"`."""
    return fmt_mib(value)


def ahead_words(ahead: int) -> str:
    """`1` → `"1 request ahead"`, `1024` → `"1 024 requests ahead"`: the clause a waiting
    request's reason ends with (`AHEAD_SAID` finds it)."""
    return f"{fmt_count(ahead)} request{'s' if ahead != 1 else ''} ahead"


REQUEST_PREFIX = "req-"
"""What a waiting request's number is shown after (`req-7`), everywhere people read it."""


def request_name(request_id: int) -> str:
    """`7` → `"req-7"`: a waiting request as the queue shows it and `rbroker release` takes it."""
    return f"{REQUEST_PREFIX}{request_id}"


def idle_words(idle_state: object, idle_s: object) -> str | None:
    """A listed lease's idleness as the broker measured it (`idle_state`, `idle_s`;
    docs/architecture.md §3 "Idle"): `idle 2 h 10 min` for an idle lease, `idle: unknown`
    where its GPUs' utilization cannot be read, None for an active one (and for a lease from
    a broker older than the idle fields). The words of `rbroker status`, `top` and the tray."""
    if idle_state == "idle" and isinstance(idle_s, int | float) and 0 <= idle_s < math.inf:
        from rbroker.base.when import fmt_duration

        return f"idle {fmt_duration(idle_s)}"
    if idle_state == "unknown":
        return "idle: unknown"
    return None


AHEAD_SAID = re.compile(r"\brequests? ahead\b")
"""Matches a reason that already says how many requests are ahead (`ahead_words`)."""


def short_uuid(uuid: str) -> str:
    """`GPU-3f2a1b…0001`: head and tail of a UUID for messages (full UUIDs stay in the data
    fields); the tail keeps sequentially numbered UUIDs (MIG, simulation) apart."""
    return uuid if len(uuid) <= 16 else uuid[:10] + "…" + uuid[-4:]


def explain(uuid: str, cap: CapacityFigures) -> str:
    """`GPU-3f2… has 6 144 MiB available (24 576 total − 1 228 headroom − 17 204 in use
    − 0 granted not yet allocated)`; where bookings take part, `− 8 192 booked` before the
    parenthesis closes."""
    booked = f" − {fmt_mib(cap.booked_mib)} booked" if cap.booked_mib else ""
    return (
        f"{short_uuid(uuid)} has {fmt_mib(cap.available_mib)} MiB available "
        f"({fmt_mib(cap.total_mib)} total − {fmt_mib(cap.headroom_mib)} headroom − "
        f"{fmt_mib(cap.device_used_mib)} in use − {fmt_mib(cap.outstanding_mib)} granted "
        f"not yet allocated{booked})"
    )


def booking_conflict_words(
    gpu: str, data: Mapping[str, Any], window: Callable[[float, float], str], none_fits: str
) -> str:
    """A `booking_conflict` refusal in words from its data (`rbroker.broker.bookings`:
    `bookable_mib`, `total_mib`, `headroom_mib`, `outside_mib`, `booked_mib`, `bookings`,
    `requested_mib`, `start_at`, `end_at`, `nearest_start_at`), its windows said by
    `window(start_s, end_s)` (the broker's in UTC, the command line's in the viewer's zone),
    `none_fits` where no window fits: `refused: GPU 0 has 7 347 MiB bookable 14:00–18:00:
    24 576 − 1 229 headroom − 16 000 booked by 1 booking; 10 000 requested; it fits
    18:00–22:00`."""
    start, end = float(data["start_at"]), float(data["end_at"])
    outside = int(data.get("outside_mib") or 0)
    count = int(data.get("bookings") or 0)
    nearest = data.get("nearest_start_at")
    where = (
        f"it fits {window(float(nearest), float(nearest) + end - start)}"
        if isinstance(nearest, int | float)
        else none_fits
    )
    return (
        f"refused: {gpu} has {fmt_mib(int(data['bookable_mib']))} MiB bookable "
        f"{window(start, end)}: {fmt_mib(int(data['total_mib']))} − "
        f"{fmt_mib(int(data['headroom_mib']))} headroom"
        + (f" − {fmt_mib(outside)} in use outside leases" if outside else "")
        + f" − {fmt_mib(int(data['booked_mib']))} booked by {count} "
        f"booking{'' if count == 1 else 's'}; {fmt_mib(int(data['requested_mib']))} "
        f"requested; {where}"
    )
