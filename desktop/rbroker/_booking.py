"""`rbroker.book()`: MiB on GPUs booked ahead for a wall-clock window (issue 41,
architecture.md §2a), `rbroker.bookings()` and `rbroker.cancel_booking()`.

    booking = rbroker.book(16_000, start="tomorrow 14:00", duration="4h",
                           project="vision", purpose="fine-tune ViT-B")
    ...  # at its start:
    with rbroker.lease(16_000, booking=booking.booking_id, project="vision") as lease:
        ...

Times are aware `datetime`s (a naive one is local time) or text read by
`rbroker.base.when.parse_when` (`"14:00"`, `"tomorrow 09:30"`, `"+2h"`, ISO 8601); durations
are seconds or text read by `parse_duration` (`"4h"`, `"1h30m"`). The time helpers are
imported when first used, so `import rbroker` stays as light as it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from rbroker._lease import _descriptions
from rbroker.base.exceptions import InvalidParams
from rbroker.client.local import Client
from rbroker_protocol.params import MAX_UNIX_S
from rbroker_protocol.results import BookingView


@dataclass(frozen=True, slots=True)
class Booking:
    """A booking as the broker last showed it: `mib` MiB on each of `gpu_uuids` for
    [`start`, `end`) (aware UTC datetimes; `start_at`/`end_at` the same in Unix seconds).
    `state`: `booked` (before its start), `held` (started, waiting for its owner's claim),
    `claimed`, `ended`, `lapsed` or `cancelled`; `claimed_mib`: MiB of it that claiming leases
    hold on each GPU; `claim_until`: while `held`, when it lapses unless claimed (aware UTC
    datetime) else None. `socket`: the broker that holds it (None: the default one)."""

    booking_id: str
    owner: str
    project: str
    session: str
    purpose: str
    mib: int
    gpu_uuids: tuple[str, ...]
    start: datetime
    end: datetime
    created: datetime
    state: str
    claims: tuple[str, ...]
    claimed_mib: int
    claim_until: datetime | None
    ended_reason: str
    socket: str | None = None

    @property
    def start_at(self) -> float:
        """The start, Unix seconds (UTC)."""
        return self.start.timestamp()

    @property
    def end_at(self) -> float:
        """The end, Unix seconds (UTC)."""
        return self.end.timestamp()

    @property
    def live(self) -> bool:
        """Booked, held or claimed: it still protects its memory."""
        return self.state in ("booked", "held", "claimed")

    @classmethod
    def from_view(cls, view: BookingView, socket: str | None = None) -> Booking:
        """The booking of a `BookingView` (the broker's answer)."""
        until = view.get("claim_until")
        return cls(
            booking_id=view["booking_id"],
            owner=view["owner"],
            project=view["project"],
            session=view["session"],
            purpose=view["purpose"],
            mib=int(view["mib"]),
            gpu_uuids=tuple(view["gpu_uuids"]),
            start=_utc(view["start_at"]),
            end=_utc(view["end_at"]),
            created=_utc(view["created_at"]),
            state=view["state"],
            claims=tuple(view.get("claims") or ()),
            claimed_mib=int(view.get("claimed_mib") or 0),
            claim_until=_utc(until) if until is not None else None,
            ended_reason=view.get("ended_reason") or "",
            socket=socket,
        )

    def cancel(self) -> Booking:
        """Cancel it (its owner, or an administrator); answers it as it is now.

        Raises:
            BookingNotFound, NotBookingOwner, BrokerUnavailable."""
        return cancel_booking(self.booking_id, socket=self.socket)


def _utc(at_s: float) -> datetime:
    return datetime.fromtimestamp(at_s, UTC)


def _instant(value: datetime | str | float, now: datetime, name: str) -> datetime:
    """`value` as an aware UTC datetime: a naive datetime is local time, a number is Unix
    seconds, text is read by `parse_when` from `now`. Raises InvalidParams (one line) for
    unreadable text or an absurd number."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not (math.isfinite(value) and 0 <= value <= MAX_UNIX_S):
            raise InvalidParams(
                f"{name}: {value} is not a time (Unix seconds, 0 to {MAX_UNIX_S:.0f})",
                "invalid_params",
                field=name,
            )
        return datetime.fromtimestamp(float(value), UTC)
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            return datetime.fromtimestamp(value.timestamp(), UTC)  # local rules at its date
        return value.astimezone(UTC)
    if isinstance(value, str):
        from rbroker.base.when import parse_when

        try:
            return parse_when(value, now)
        except ValueError as exc:
            raise InvalidParams(f"{name}: {exc}", "invalid_params", field=name) from None
    raise InvalidParams(
        f"{name}: a datetime or text like 'tomorrow 14:00', not {type(value).__name__}",
        "invalid_params",
        field=name,
    )


def _seconds(value: float | str | timedelta, name: str) -> float:
    """`value` as seconds over 0: a number, a `timedelta`, or text read by
    `parse_duration`. Raises InvalidParams (one line)."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, str):
        from rbroker.base.when import parse_duration

        try:
            return parse_duration(value)
        except ValueError as exc:
            raise InvalidParams(f"{name}: {exc}", "invalid_params", field=name) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidParams(
            f"{name}: seconds or text like '4h', not {type(value).__name__}",
            "invalid_params",
            field=name,
        )
    if not (math.isfinite(value) and value > 0):
        raise InvalidParams(
            f"{name}: must be a finite number of seconds over 0, got {value}", "invalid_params"
        )
    return float(value)


def window(
    start: datetime | str | float,
    duration: float | str | timedelta | None = None,
    end: datetime | str | float | None = None,
    now: datetime | None = None,
) -> tuple[float, float]:
    """[start, end) in Unix seconds (UTC) from `start` and exactly one of `duration` (seconds
    or text) and `end` (as `start`), seen from `now` (default: the wall clock now).

    Raises:
        InvalidParams: neither or both of `duration` and `end`, an unreadable time or
            duration, an end not after the start (one line each)."""
    if (duration is None) == (end is None):
        raise InvalidParams(
            "give the booking's length: duration or end (one of them)", "invalid_params"
        )
    now = now or datetime.now(UTC)
    start_t = _instant(start, now, "start")
    if duration is not None:
        start_s = start_t.timestamp()
        end_s = start_s + _seconds(duration, "duration")
    else:
        assert end is not None
        # `end` as text is read from the start (an `until 18:00` after a start tomorrow
        # means 18:00 that day, a `+4h` four hours after the start)
        end_t = _instant(end, start_t, "end")
        start_s, end_s = start_t.timestamp(), end_t.timestamp()
    if not end_s > start_s:
        raise InvalidParams("the booking's end must come after its start", "invalid_params")
    return start_s, end_s


def book(
    mib: int,
    *,
    start: datetime | str | float,
    duration: float | str | timedelta | None = None,
    end: datetime | str | float | None = None,
    gpus: int = 1,
    gpu_uuid: str | None = None,
    project: str,
    purpose: str,
    session: str | None = None,
    socket: str | None = None,
) -> Booking:
    """Book `mib` MiB on each of `gpus` GPU(s) (or on the pinned `gpu_uuid`) from `start` for
    `duration` or until `end` (give one). `start`/`end`: an aware `datetime` (naive: local
    time), Unix seconds, or text (`"14:00"`, `"tomorrow 09:30"`, `"mon 14:00"`, `"+2h"`, ISO
    8601; an `end` as text is read from the start); `duration`: seconds, a `timedelta`, or
    text (`"4h"`, `"1h30m"`).
    Claim it at its start with `rbroker.lease(mib, booking=booking.booking_id, ...)`. The
    `session` defaults to the program's name, as for `lease()`.

    Raises:
        BookingRefused: it does not fit beside the bookings of its window (`code`
            `booking_conflict`: the message carries the arithmetic and the nearest window
            where it fits), or a per-user bound (`too_many_bookings`, `booking_too_far`,
            `booking_too_long`). InvalidParams: unreadable times, an end not after the
            start, a bad size. DescriptionRejected, BrokerUnavailable.
    """
    start_s, end_s = window(start, duration, end)
    project, session, purpose = _descriptions(project, session, purpose)
    with Client(socket) as client:
        view = client.book(
            mib=mib,
            start_at=start_s,
            end_at=end_s,
            project=project,
            session=session,
            purpose=purpose,
            gpus=gpus,
            gpu_uuid=gpu_uuid,
        )
    return Booking.from_view(view, socket)


def bookings(*, include_ended: bool = False, socket: str | None = None) -> list[Booking]:
    """The broker's bookings: the asker's first, then everyone's, each by start;
    `include_ended` adds the ended, lapsed and cancelled ones it keeps. Raises
    BrokerUnavailable."""
    with Client(socket) as client:
        listed = client.bookings(include_ended)
    return [Booking.from_view(v, socket) for v in listed["bookings"]]


def cancel_booking(booking_id: str, *, socket: str | None = None) -> Booking:
    """Cancel a booking (its owner's, or anyone's for an administrator); answers it as it is
    now. Raises BookingNotFound, NotBookingOwner, BrokerUnavailable."""
    with Client(socket) as client:
        return Booking.from_view(client.cancel_booking(booking_id), socket)


__all__ = ["Booking", "book", "bookings", "cancel_booking", "window"]
