"""The booking rules of docs/architecture.md §2a on the in-process broker with a manual clock:
accepting never over-commits the future (refused with the arithmetic and the nearest window),
leases of now fit beside the bookings their horizon overlaps (declared end or `protect_s`),
a claim at the start, a lapse, an overstayer's memory going to the booking first, the bounds,
a restart, and wall-clock steps that move the schedule but never a lease."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rbroker.broker.bookings import BookingSettings
from rbroker.broker.holders import Holder
from rbroker.broker.leases import Lease
from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.localapi import BookParams
from rbroker_protocol.results import BookingView
from tests.conftest import GPU0, SINGLE_24G
from tests.desktop.inprocess import InProcessBroker, SleeperPool
from tests.fakes.gpu_scenarios import GPU1, gpu, scenario

TOTAL, HEADROOM = 24576, 1229  # SINGLE_24G with the default headroom
USABLE = TOTAL - HEADROOM  # 23 347
H = 3600.0


@pytest.fixture
def b(make_inprocess: Callable[..., InProcessBroker]) -> InProcessBroker:
    return make_inprocess(SINGLE_24G, persist=False)


def book(
    h: InProcessBroker, mib: int, start_in_s: float, for_s: float, owner: str = "tester", **kw: Any
) -> BookingView:
    now = h.clock.wall()
    params = BookParams.model_validate(
        {
            "mib": mib,
            "start_at": now + start_in_s,
            "end_at": now + start_in_s + for_s,
            "project": kw.pop("project", "paper"),
            "session": "deadline",
            "purpose": "the deadline run",
            **kw,
        }
    )
    return h.broker.book(params, owner)


def later(h: InProcessBroker, seconds: float) -> None:
    """`seconds` pass (monotonic and wall clock alike): the tick's turn, then a fresh sample."""
    h.clock.advance(seconds)
    h.tick(0.1)
    h.sample()


def refused(h: InProcessBroker, call: Callable[[], object]) -> RpcError:
    with pytest.raises(RpcError) as exc:
        call()
    return exc.value


def lease_refused(h: InProcessBroker, holder: Holder, mib: int, **kw: Any) -> RpcError:
    """A `wait_s` 0 request that does not fit: refused at the tick after its pass."""
    task = h.acquire(holder, mib=mib, wait_s=0.0, **kw)
    h.tick(0.0)
    assert task.done()
    err = task.exception()
    assert isinstance(err, RpcError)
    return err


def lease_now(h: InProcessBroker, holder: Holder, mib: int, **kw: Any) -> Lease:
    task = h.acquire(holder, mib=mib, wait_s=0.0, **kw)
    assert task.done()
    return task.result()


def test_a_booking_is_accepted_on_a_gpu_and_listed(b: InProcessBroker) -> None:
    made = book(b, 16000, H, 2 * H)
    assert made["gpu_uuids"] == [GPU0] and made["state"] == "booked"
    assert made["start_at"] == b.clock.wall() + H and made["end_at"] == b.clock.wall() + 3 * H
    listed = b.broker.bookings_list("tester")
    assert [x["booking_id"] for x in listed["bookings"]] == [made["booking_id"]]
    assert listed["usable_mib"] == {GPU0: USABLE}


def test_a_booking_that_does_not_fit_is_refused_with_the_arithmetic_and_the_nearest_window(
    b: InProcessBroker,
) -> None:
    book(b, 16000, H, 2 * H)
    err = refused(b, lambda: book(b, 10000, 2 * H, 2 * H))
    assert err.name is ErrorCode.BOOKING_CONFLICT
    assert "GPU 0 has 7 347 MiB bookable" in err.message
    assert "24 576 − 1 229 headroom − 16 000 booked by 1 booking; 10 000 requested" in err.message
    assert err.data["bookable_mib"] == 7347 and err.data["booked_mib"] == 16000
    assert err.data["nearest_start_at"] == b.clock.wall() + 3 * H  # when the first one ends
    # the window it names is accepted
    assert book(b, 10000, 3 * H, 2 * H)["state"] == "booked"


def test_bookings_never_overlap_beyond_total_less_headroom_but_may_share_a_gpu(
    b: InProcessBroker,
) -> None:
    book(b, 12000, H, 2 * H)
    book(b, USABLE - 12000, 2 * H, 2 * H)  # exactly fills the overlap
    err = refused(b, lambda: book(b, 1, 2.5 * H, 0.1 * H))
    assert err.data["bookable_mib"] == 0 and err.data["bookings"] == 2
    book(b, USABLE, 4 * H, H)  # after both: the whole GPU


def test_memory_in_use_outside_leases_now_counts_against_a_booking(
    make_inprocess: Callable[..., InProcessBroker],
) -> None:
    h = make_inprocess(scenario(gpu(GPU0, used_mib=8000)), persist=False)
    err = refused(h, lambda: book(h, 16000, H, H))
    assert "− 8 000 in use outside leases" in err.message
    assert err.data["bookable_mib"] == USABLE - 8000


def test_a_lease_without_a_declared_end_fits_beside_the_bookings_of_the_protection_window(
    b: InProcessBroker, pool: SleeperPool
) -> None:
    _, holder = pool.spawn()
    book(b, 16000, H, 2 * H)  # starts within protect_s (4 h)
    err = lease_refused(b, holder, 10000)
    assert err.name is ErrorCode.CAPACITY_UNAVAILABLE
    assert "− 16 000 booked)" in err.message and "16 000 MiB booked from in 60 min by tester" in (
        err.message
    )
    assert err.data["booked_mib"] == 16000 and err.data["available_mib"] == USABLE - 16000
    assert err.data["booked_from_at"] == b.clock.wall() + H
    lease_now(b, holder, USABLE - 16000)  # what is left beside it is granted


def test_a_lease_that_declares_its_end_before_a_booking_starts_is_not_held_back(
    b: InProcessBroker, pool: SleeperPool
) -> None:
    _, holder = pool.spawn()
    book(b, 16000, H, 2 * H)
    lease_now(b, holder, 20000, expected_s=H - 60)  # ends before the start
    err = lease_refused(b, holder, 3000, expected_s=H + 60)
    assert err.data["booked_mib"] == 16000


def test_a_booking_beyond_the_protection_window_does_not_hold_back_undeclared_leases(
    b: InProcessBroker, pool: SleeperPool
) -> None:
    _, holder = pool.spawn()
    book(b, 16000, 5 * H, H)
    lease_now(b, holder, 20000)
    # …but its acceptance already counted: it was accepted, and a later booking sees it
    err = refused(b, lambda: book(b, 10000, 5 * H, H))
    assert err.data["booked_mib"] == 16000


def test_a_claim_at_the_start_is_granted_from_the_booked_memory_ahead_of_the_queue(
    b: InProcessBroker, pool: SleeperPool
) -> None:
    _, holder = pool.spawn()
    made = book(b, 16000, H, 2 * H)
    err = lease_refused(b, holder, 16000, booking_id=made["booking_id"])
    assert err.name is ErrorCode.BOOKING_NOT_STARTED
    later(b, H)
    assert b.broker.bookings_list("tester")["bookings"][0]["state"] == "held"
    other = b.acquire(holder, mib=10000, wait_s=60.0)  # waits: the held memory is protected
    assert not other.done()
    lease = lease_now(b, holder, 16000, booking_id=made["booking_id"])
    assert lease.booking_id == made["booking_id"] and lease.gpu_uuids == (GPU0,)
    view = b.broker.bookings_list("tester")["bookings"][0]
    assert view["state"] == "claimed" and view["claims"] == [lease.lease_id]
    assert view["claimed_mib"] == 16000
    assert not other.done()  # 7 347 left beside the claim
    err = lease_refused(b, holder, 1, booking_id=made["booking_id"])
    assert err.data["unclaimed_mib"] == 0


def test_an_unclaimed_booking_lapses_after_the_grace_and_frees_its_memory(
    b: InProcessBroker, pool: SleeperPool
) -> None:
    _, holder = pool.spawn()
    made = book(b, 16000, H, 2 * H)
    later(b, H)
    waiting = b.acquire(holder, mib=10000, wait_s=3 * H)
    later(b, 15 * 60 - 1)
    assert not waiting.done()
    later(b, 2)
    b.sample()
    assert waiting.done() and waiting.result().granted_mib == 10000
    view = b.broker.bookings_list("tester", include_ended=True)["bookings"][0]
    assert view["state"] == "lapsed" and view["ended_reason"] == "not claimed within 15 min"
    err = lease_refused(b, holder, 1, booking_id=made["booking_id"])
    assert err.name is ErrorCode.BOOKING_ENDED


def test_a_booking_whose_claim_ends_is_held_again_and_can_be_claimed_again(
    b: InProcessBroker, pool: SleeperPool
) -> None:
    _, holder = pool.spawn()
    made = book(b, 16000, H, 2 * H)
    later(b, H)
    first = lease_now(b, holder, 16000, booking_id=made["booking_id"])
    b.broker.release(first.lease_id, "tester")
    assert b.broker.bookings_list("tester")["bookings"][0]["state"] == "held"
    b.sample()
    second = lease_now(b, holder, 16000, booking_id=made["booking_id"])
    assert second.booking_id == made["booking_id"]


def test_a_lease_that_overstays_into_a_booking_gives_its_memory_to_the_booking_first(
    b: InProcessBroker, pool: SleeperPool
) -> None:
    _, holder = pool.spawn()
    _, overstayer = pool.spawn()
    early = lease_now(b, overstayer, 20000, ttl_s=3600.0)  # before the booking: it may overstay
    made = book(b, 16000, 0.5 * H, 2 * H)  # accepted: bookings are checked against bookings
    later(b, 0.5 * H)
    other = b.acquire(holder, mib=5000, wait_s=H)
    claim = b.acquire(holder, mib=16000, wait_s=H, booking_id=made["booking_id"])
    assert not other.done() and not claim.done()
    queue = b.broker.leases_view(asker="tester")["queue"]
    assert queue[0]["mib"] == 16000  # the claim is first in line
    b.broker.release(early.lease_id, "tester")
    b.sample()
    assert claim.done() and claim.result().granted_mib == 16000
    assert other.done() and other.result().granted_mib == 5000  # 7 347 left beside it


def test_the_booking_end_leaves_the_claiming_lease_as_an_ordinary_lease(
    b: InProcessBroker, pool: SleeperPool
) -> None:
    _, holder = pool.spawn()
    made = book(b, 16000, H, 2 * H)
    later(b, H)
    lease = lease_now(b, holder, 16000, booking_id=made["booking_id"])
    b.clock.advance(2 * H)
    b.broker.renew(lease.lease_id, "tester")
    b.tick(0.1)
    assert lease.state.value == "active"
    view = b.broker.bookings_list("tester", include_ended=True)["bookings"][0]
    assert view["state"] == "ended" and view["claims"] == []


def test_wall_clock_steps_move_the_schedule_and_never_a_lease(
    b: InProcessBroker, pool: SleeperPool
) -> None:
    _, holder = pool.spawn()
    made = book(b, 16000, H, 2 * H)
    b.clock.wall_s += H  # a step forward: the start has come, as on a calendar
    b.tick(0.1)
    assert b.broker.bookings_list("tester")["bookings"][0]["state"] == "held"
    b.clock.wall_s -= H  # and back: booked again
    b.tick(0.1)
    assert b.broker.bookings_list("tester")["bookings"][0]["state"] == "booked"
    b.clock.wall_s += H
    b.tick(0.1)
    lease = lease_now(b, holder, 16000, booking_id=made["booking_id"])
    deadline = lease.deadline
    b.clock.wall_s += 30 * 24 * H  # a month forward: the booking ends, the lease does not
    b.tick(0.1)
    assert lease.state.value == "active" and lease.deadline == deadline
    b.clock.wall_s -= 60 * 24 * H
    b.tick(0.1)
    assert lease.state.value == "active" and lease.deadline == deadline


def test_the_bounds_are_refused_each_with_its_code(
    make_inprocess: Callable[..., InProcessBroker],
) -> None:
    h = make_inprocess(
        SINGLE_24G,
        persist=False,
        bookings=BookingSettings(max_per_user=2, horizon_s=24 * H, max_duration_s=4 * H),
    )
    assert refused(h, lambda: book(h, 100, 25 * H, H)).name is ErrorCode.BOOKING_TOO_FAR
    err = refused(h, lambda: book(h, 100, H, 5 * H))
    assert err.name is ErrorCode.BOOKING_TOO_LONG and err.data["limit"] == 4 * H
    assert refused(h, lambda: book(h, 100, -2 * H, H)).name is ErrorCode.INVALID_PARAMS
    assert refused(h, lambda: book(h, USABLE + 1, H, H)).name is ErrorCode.INFEASIBLE
    err = refused(h, lambda: book(h, 100, H, H, gpu_uuid=GPU1))
    assert err.name is ErrorCode.INFEASIBLE
    book(h, 100, H, H)
    book(h, 100, 2 * H, H)
    err = refused(h, lambda: book(h, 100, 3 * H, H))
    assert err.name is ErrorCode.TOO_MANY_BOOKINGS and err.data["count"] == 2
    book(h, 100, 3 * H, H, owner="bob")  # per user


def test_members_and_descriptions_are_checked_as_for_a_lease(
    make_inprocess: Callable[..., InProcessBroker],
) -> None:
    h = make_inprocess(SINGLE_24G, persist=False, members={"vision": ("alice",)})
    err = refused(h, lambda: book(h, 100, H, H, owner="bob", project="vision"))
    assert err.name is ErrorCode.NOT_A_MEMBER
    book(h, 100, H, H, owner="alice", project="vision")
    err = refused(h, lambda: book(h, 100, H, H, project="AKIAIOSFODNN7EXAMPLE"))
    assert err.name is ErrorCode.DESCRIPTION_REJECTED


def test_cancel_by_the_owner_or_an_admin_who_tells_the_owner(b: InProcessBroker) -> None:
    mine = book(b, 16000, H, 2 * H, owner="alice")
    told: list[tuple[str, dict[str, object]]] = []
    b.broker.subscribe(lambda kind, data: told.append((kind, data)))
    err = refused(b, lambda: b.broker.cancel_booking(mine["booking_id"], "bob"))
    assert err.name is ErrorCode.NOT_BOOKING_OWNER
    done = b.broker.cancel_booking(mine["booking_id"], "root", admin=True)
    assert done["state"] == "cancelled" and done["ended_reason"] == "cancelled by admin root"
    assert told[-2] == ("booking", {**told[-2][1], "cancelled_by": "root"})
    assert told[-2][1]["owner"] == "alice"
    assert told[-1] == (
        "booking_notice",
        {
            "booking_id": mine["booking_id"],
            "owner": "alice",
            "notice": "cancelled",
            "to": "alice",
            "lease_id": None,
            "start_at": mine["start_at"],
            "end_at": mine["end_at"],
            "message": f"your booking {mine['booking_id']} was cancelled by admin root",
        },
    )
    book(b, USABLE, H, 2 * H)  # its memory is bookable again
    err = refused(b, lambda: b.broker.cancel_booking(mine["booking_id"], "alice"))
    assert err.name is ErrorCode.BOOKING_ENDED


def test_bookings_and_their_claims_survive_a_restart(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h = make_inprocess(SINGLE_24G, persist=True)
    _, holder = pool.spawn()
    far = book(h, 4000, 5 * H, H)
    now = book(h, 16000, H, 2 * H)
    later(h, H)
    lease = lease_now(h, holder, 12000, booking_id=now["booking_id"])
    h.restart()
    views = {v["booking_id"]: v for v in h.broker.bookings_list("tester")["bookings"]}
    assert views[far["booking_id"]]["state"] == "booked"
    assert views[now["booking_id"]]["state"] == "claimed"
    assert views[now["booking_id"]]["claims"] == [lease.lease_id]
    # the protection holds across the restart: 4 000 of the booking are still unclaimed…
    _, other = pool.spawn()
    h.sample()
    err = lease_refused(h, other, USABLE - 12000 - 4000 + 1)
    assert err.data["booked_mib"] == 4000
    # …and its whole 16 000 stay promised to later bookings of its window
    err = refused(h, lambda: book(h, USABLE - 15999, 1.5 * H, 0.1 * H))
    assert err.data["booked_mib"] == 16000


def test_a_two_gpu_booking_takes_two_gpus_and_a_claim_gets_both(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h = make_inprocess(scenario(gpu(GPU0), gpu(GPU1)), persist=False)
    _, holder = pool.spawn()
    made = book(h, 10000, H, H, gpus=2)
    assert made["gpu_uuids"] == [GPU0, GPU1]
    later(h, H)
    err = lease_refused(h, holder, 10000, booking_id=made["booking_id"])
    assert err.name is ErrorCode.INVALID_PARAMS and err.data["field"] == "gpus"
    lease = lease_now(h, holder, 10000, gpus=2, booking_id=made["booking_id"])
    assert set(lease.gpu_uuids) == {GPU0, GPU1}


def notices_of(h: InProcessBroker) -> list[dict[str, object]]:
    told: list[dict[str, object]] = []
    h.broker.subscribe(lambda kind, data: told.append(data) if kind == "booking_notice" else None)
    return told


def test_a_lease_in_the_way_and_the_booking_s_owner_are_told_once_30_min_ahead(
    b: InProcessBroker, pool: SleeperPool
) -> None:
    _, holder = pool.spawn()
    early = lease_now(b, holder, 20000, ttl_s=3600.0)
    b.clock.advance(1)
    made = book(b, 16000, 40 * 60, H, owner="alice")
    told = notices_of(b)
    later(b, 9 * 60)
    assert told == []  # 31 min ahead: not yet
    later(b, 60)
    assert [(t["notice"], t["to"], t["lease_id"]) for t in told] == [
        ("overlaps", "tester", early.lease_id),
        ("may_wait", "alice", None),
    ]
    assert f"your lease {early.lease_id} (20 000 MiB on GPU 0) overlaps alice's booking" in str(
        told[0]["message"]
    )
    assert "nothing will end it" in str(told[0]["message"])
    assert told[1]["booking_id"] == made["booking_id"]
    later(b, 60)
    b.broker.renew(early.lease_id, "tester")
    later(b, 60)
    assert len(told) == 2  # once per booking and lease


def test_a_lease_declared_to_end_before_the_start_or_one_leaving_room_is_not_told(
    b: InProcessBroker, pool: SleeperPool
) -> None:
    _, holder = pool.spawn()
    lease_now(b, holder, 20000, ttl_s=3600.0, expected_s=20 * 60)  # ends before the start
    lease_now(b, holder, 3000, ttl_s=3600.0)  # runs on, but 16 000 still fit beside it
    b.clock.advance(1)
    book(b, 16000, 40 * 60, H, owner="alice")
    told = notices_of(b)
    later(b, 15 * 60)
    assert told == []


def test_the_claiming_lease_is_told_10_min_before_the_booking_ends(
    b: InProcessBroker, pool: SleeperPool
) -> None:
    _, holder = pool.spawn()
    made = book(b, 16000, H, H)
    later(b, H)
    lease = lease_now(b, holder, 16000, booking_id=made["booking_id"], ttl_s=3600.0)
    told = notices_of(b)
    later(b, 49 * 60)
    assert told == []
    later(b, 60)
    assert [(t["notice"], t["lease_id"]) for t in told] == [("ends_soon", lease.lease_id)]
    assert "goes on as an ordinary lease" in str(told[0]["message"])


def test_a_claimed_booking_s_memory_stays_promised_to_later_bookings_of_its_window(
    b: InProcessBroker, pool: SleeperPool
) -> None:
    """Found by the property: a booking fully claimed protected nothing, so a second booking
    was accepted in its memory, and when the claim ended the two promised 1 000 MiB more
    than the GPU has."""
    _, holder = pool.spawn()
    made = book(b, USABLE, 60, 60)
    later(b, 60)
    lease = lease_now(b, holder, USABLE, booking_id=made["booking_id"])
    err = refused(b, lambda: book(b, 1000, 0, 60))
    assert err.name is ErrorCode.BOOKING_CONFLICT and err.data["booked_mib"] == USABLE
    b.broker.release(lease.lease_id, "tester")
    assert b.broker.bookings_list("tester")["bookings"][0]["state"] == "held"


def test_a_request_waiting_for_a_booking_is_estimated_at_the_booking_s_end(
    b: InProcessBroker, pool: SleeperPool
) -> None:
    _, holder = pool.spawn()
    book(b, 16000, H, 2 * H, owner="alice")
    task = b.acquire(holder, mib=10000, wait_s=6 * H)
    assert not task.done()
    (entry,) = b.broker.leases_view(asker="tester")["queue"]
    assert entry["reason_data"]["booked_until_at"] == b.clock.wall() + 3 * H
    assert entry.get("eta_s") == pytest.approx(3 * H, abs=1)
    assert str(entry.get("eta_reason", "")) == "bookings hold its memory for another 3 h"


def test_a_booking_typed_across_a_dst_change_starts_at_that_day_s_local_time(
    b: InProcessBroker,
) -> None:
    """`tomorrow 14:00` typed in Berlin on the Saturday before clocks go back (25 October
    2026) is 13:00 UTC, not 12:00: the calendar's 14:00 of that day, kept in UTC."""
    zoneinfo = pytest.importorskip("zoneinfo")
    try:
        berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    except zoneinfo.ZoneInfoNotFoundError:
        pytest.skip("no time zone database here (tzdata)")
    from datetime import UTC, datetime

    from rbroker.base.when import parse_when

    saturday_noon = datetime(2026, 10, 24, 10, 0, tzinfo=UTC)  # 12:00 in Berlin (CEST)
    b.clock.wall_s = saturday_noon.timestamp()
    b.tick(0.1)
    start = parse_when("tomorrow 14:00", saturday_noon.astimezone(berlin), zone=berlin)
    assert start == datetime(2026, 10, 25, 13, 0, tzinfo=UTC)
    made = book(b, 8000, start.timestamp() - b.clock.wall(), H)
    b.clock.wall_s = start.timestamp() - 1
    b.tick(0.1)
    assert b.broker.bookings_list("tester")["bookings"][0]["state"] == "booked"
    b.clock.wall_s = start.timestamp()
    b.tick(0.1)
    (view,) = b.broker.bookings_list("tester")["bookings"]
    assert (view["booking_id"], view["state"]) == (made["booking_id"], "held")


def test_a_booking_made_while_requests_wait_does_not_pass_them(
    b: InProcessBroker, pool: SleeperPool
) -> None:
    """Found by a hostile second user: booking 'now' and claiming it jumped the queue. A
    request already waiting when a booking is accepted keeps its place: it is not held back
    by the booking, and the claim goes after it (ahead only of requests that came later)."""
    _, first = pool.spawn()
    _, waiter = pool.spawn()
    _, claimer = pool.spawn()
    early = lease_now(b, first, 20000, ttl_s=3600.0)
    waiting = b.acquire(waiter, mib=15000, wait_s=H)
    b.clock.advance(1)
    made = book(b, 15000, 0, H)  # "now", on the memory the waiting request waits for
    later(b, 1)
    claim = b.acquire(claimer, mib=15000, wait_s=H, booking_id=made["booking_id"])
    later_one = b.acquire(claimer, mib=8000, wait_s=H)  # after the booking: behind its claim
    queue = [q["mib"] for q in b.broker.leases_view(asker="tester")["queue"]]
    assert queue == [15000, 15000, 8000]  # the earlier request first, then the claim
    assert not waiting.done() and not claim.done()
    b.broker.release(early.lease_id, "tester")
    b.sample()
    assert waiting.done() and waiting.result().granted_mib == 15000
    assert not claim.done() and not later_one.done()  # the claim now waits for its memory
    claim.cancel()
    later_one.cancel()


def test_the_admission_s_answer_for_bookings_follows_every_change_within_a_second(
    b: InProcessBroker, pool: SleeperPool
) -> None:
    """`peak_mib` keeps its answers while no booking changes: a new booking, a cancel, a
    claim and a claim's resize within the same second are each seen at once."""
    _, holder = pool.spawn()
    _, other = pool.spawn()
    assert lease_refused(b, holder, USABLE + 1).name is ErrorCode.INFEASIBLE
    first = book(b, 16000, H, H)
    assert lease_refused(b, other, USABLE - 16000 + 1).data["booked_mib"] == 16000
    second = book(b, 4000, H, H)
    assert lease_refused(b, other, USABLE - 20000 + 1).data["booked_mib"] == 20000
    b.broker.cancel_booking(second["booking_id"], "tester")
    assert lease_refused(b, other, USABLE - 16000 + 1).data["booked_mib"] == 16000
    later(b, H)
    claim = lease_now(b, holder, 6000, booking_id=first["booking_id"], ttl_s=3600.0)
    assert lease_refused(b, other, USABLE - 16000 + 1).data["booked_mib"] == 10000
    b.run(b.broker.resize(claim.lease_id, "tester", 2000, 0.0, 1))  # a claim that shrinks
    assert lease_refused(b, other, USABLE - 16000 + 1).data["booked_mib"] == 14000
