"""The booking SDK (issue 41): `rbroker.book()`, `Booking.cancel()`, `rbroker.cancel_booking()`,
`rbroker.bookings()`, and `rbroker.lease/alease(..., booking=ID)`, against a broker process:
the wire paths. A broker process runs on the real clock, so a claim at a booking's start is
the broker harness's (tests/desktop/broker/bookings); here a claim is refused before it, and
one a second after a booking's start takes what it has unclaimed."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest

import rbroker
from tests.conftest import GPU0, BrokerProcess

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

DESC = {"project": "vision", "purpose": "fine-tune ViT-B"}


def test_book_answers_a_booking_with_aware_times(broker: BrokerProcess) -> None:
    before = time.time()
    booking = rbroker.book(16_000, start="+2h", duration="4h", socket=broker.socket, **DESC)
    assert isinstance(booking, rbroker.Booking)
    assert booking.booking_id.startswith("book-")
    assert (booking.mib, booking.gpu_uuids, booking.state) == (16_000, (GPU0,), "booked")
    assert (booking.project, booking.purpose) == ("vision", "fine-tune ViT-B")
    assert booking.session  # the program's name, as for a lease
    assert booking.start.tzinfo is not None and booking.end.utcoffset() == timedelta(0)
    assert booking.end - booking.start == timedelta(hours=4)
    assert before + 7200 <= booking.start_at <= time.time() + 7200
    assert booking.live and booking.claim_until is None and booking.claims == ()

    (listed,) = rbroker.bookings(socket=broker.socket)
    assert listed == booking


def test_datetimes_naive_local_or_aware_and_an_end(broker: BrokerProcess) -> None:
    start = (datetime.now() + timedelta(hours=3)).replace(microsecond=0)  # naive: local
    booking = rbroker.book(
        1_000,
        start=start,
        end=start.astimezone(UTC) + timedelta(minutes=90),
        session="nightly",
        socket=broker.socket,
        **DESC,
    )
    assert booking.start == start.astimezone(UTC)
    assert booking.end_at - booking.start_at == 5400.0
    assert booking.session == "nightly"


def test_cancel_and_the_list_with_ended(broker: BrokerProcess) -> None:
    one = rbroker.book(8_000, start="+1h", duration=3600, socket=broker.socket, **DESC)
    two = rbroker.book(8_000, start="+5h", duration="30m", socket=broker.socket, **DESC)
    assert one.cancel().state == "cancelled"
    assert rbroker.cancel_booking(two.booking_id, socket=broker.socket).state == "cancelled"
    assert rbroker.bookings(socket=broker.socket) == []
    ended = rbroker.bookings(include_ended=True, socket=broker.socket)
    assert {b.booking_id: b.state for b in ended} == {
        one.booking_id: "cancelled",
        two.booking_id: "cancelled",
    }
    with pytest.raises(rbroker.BookingNotFound):
        rbroker.cancel_booking("book-00000000", socket=broker.socket)


def test_a_conflict_is_refused_with_the_arithmetic(broker: BrokerProcess) -> None:
    rbroker.book(16_000, start="+2h", duration="4h", socket=broker.socket, **DESC)
    with pytest.raises(rbroker.BookingRefused) as refused:
        rbroker.book(16_000, start="+3h", duration="1h", socket=broker.socket, **DESC)
    assert refused.value.code == "booking_conflict"
    assert "16 000 requested" in str(refused.value)


def test_a_lease_claiming_a_booking_before_its_start_is_refused(broker: BrokerProcess) -> None:
    booking = rbroker.book(6_000, start="+2h", duration="1h", socket=broker.socket, **DESC)
    with (
        pytest.raises(rbroker.BookingNotClaimable) as refused,
        rbroker.lease(6_000, booking=booking.booking_id, socket=broker.socket, **DESC),
    ):
        pytest.fail("granted before the booking's start")
    assert refused.value.code == "booking_not_started"

    async def claim() -> None:
        async with rbroker.alease(2_000, booking=booking.booking_id, socket=broker.socket):
            pytest.fail("granted before the booking's start")

    with pytest.raises(rbroker.BookingNotClaimable):
        asyncio.run(claim())
    # refused, not queued: a lease of now still fits beside it
    with rbroker.lease(1_000, socket=broker.socket, expected_s=60, **DESC) as held:
        assert held.granted_mib == 1_000


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"start": "soonish", "duration": "1h"}, 'start: "soonish"'),
        ({"start": "+1h"}, "duration or end"),
        ({"start": "+1h", "duration": "1h", "end": "+2h"}, "duration or end"),
        ({"start": "+1h", "duration": "90"}, "needs a unit"),
        ({"start": "+1h", "duration": -5}, "seconds over 0, got -5"),
        ({"start": "+1h", "end": "now"}, "end must come after"),
        ({"start": 1e13, "duration": "1h"}, "start: 10000000000000.0 is not a time (Unix"),
        ({"start": [1], "duration": "1h"}, "a datetime or text"),
    ],
)
def test_bad_times_are_one_line_invalid_params(kw: dict[str, object], words: str) -> None:
    """Read before any broker is asked (no socket needed)."""
    with pytest.raises(rbroker.InvalidParams) as bad:
        rbroker.book(10, socket="/nonexistent/broker.sock", **DESC, **kw)  # type: ignore[arg-type]
    assert words in str(bad.value) and "\n" not in str(bad.value)


def test_a_lease_in_a_booking_s_way_is_told_once_as_a_warning(
    broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """30 min before a booking's start, a lease granted before it that leaves it no room is
    told (the `booking_notice` event on the lease's own connection): the SDK logs it."""
    with (
        caplog.at_level("WARNING", logger="rbroker._lease"),
        rbroker.lease(20_000, socket=broker.socket, **DESC) as lease,
    ):
        time.sleep(0.01)  # the booking is accepted after the grant
        booking = rbroker.book(16_000, start="+20m", duration="1h", socket=broker.socket, **DESC)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not caplog.records:
            time.sleep(0.05)
        (record,) = [r for r in caplog.records if getattr(r, "rbroker_booking_notice", False)]
        message = record.getMessage()
        assert message.startswith(f"rbroker: your lease {lease.lease_id} (20 000 MiB on GPU 0)")
        assert f"booking {booking.booking_id}" in message and "nothing will end it" in message


def test_a_timedelta_and_unix_seconds_are_times_too(broker: BrokerProcess) -> None:
    """Found by a new user: `duration=timedelta(hours=1)` and a Unix-time `start` were
    refused."""
    start = time.time() + 7200
    booking = rbroker.book(
        2_000, start=start, duration=timedelta(hours=1), socket=broker.socket, **DESC
    )
    assert booking.start_at == pytest.approx(start, abs=1e-3)
    assert booking.end_at - booking.start_at == pytest.approx(3600.0)
    for bad in (float("inf"), -1.0, float("nan")):
        with pytest.raises(rbroker.InvalidParams) as exc:
            rbroker.book(2_000, start=bad, duration="1h", socket=broker.socket, **DESC)
        assert "start: " in str(exc.value) and "\n" not in str(exc.value)


def test_a_claim_without_mib_takes_what_the_booking_has_unclaimed(broker: BrokerProcess) -> None:
    """`rbroker.lease(booking=ID)` with no `mib` (nor `gpus`): the booking's unclaimed MiB on
    its GPUs, as `rbroker run --booking`; once claimed in full, a claim without `mib` is one
    line; without a booking `mib` is needed."""
    booking = rbroker.book(
        6_000, start=time.time() + 1, duration="1h", socket=broker.socket, **DESC
    )
    time.sleep(max(0.0, booking.start_at - time.time()) + 0.2)  # started: claimable

    async def claim_in_full() -> None:
        async with rbroker.alease(booking=booking.booking_id, socket=broker.socket, **DESC):
            pytest.fail("a booking claimed in full was claimed again")

    with rbroker.lease(booking=booking.booking_id, socket=broker.socket, **DESC) as held:
        assert held.granted_mib == 6_000 and held.gpu_uuids == [GPU0]
        with pytest.raises(rbroker.InvalidParams) as full:
            asyncio.run(claim_in_full())
        assert str(full.value) == f"booking {booking.booking_id} is claimed in full (6 000 MiB)"
    with pytest.raises(rbroker.InvalidParams) as none, rbroker.lease(socket=broker.socket):
        pytest.fail("granted without mib or booking")
    assert "give the MiB to lease" in str(none.value)
