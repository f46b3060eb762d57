"""`room.check` (`rbroker watch`): whether a request would be granted now, nothing taken —
the admission's rules without a pass: behind the requests waiting on a GPU, beside the
bookings, on fresh samples only; on the in-process harness with a manual clock."""

from __future__ import annotations

import pytest

from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.localapi import BookParams, RoomCheckParams
from tests.conftest import GPU0
from tests.desktop.inprocess import InProcessBroker, SleeperPool

USABLE = 24576 - 1229


def check(h: InProcessBroker, mib: int, **kw: object) -> dict[str, object]:
    """`room.check` as the local API calls it: on the broker's loop."""
    params = RoomCheckParams.model_validate({"mib": mib, **kw})

    async def on_the_loop() -> dict[str, object]:
        return dict(h.broker.check_room(params, "alice"))

    return h.run(on_the_loop())


def test_room_on_an_empty_gpu_names_it_and_takes_nothing(h: InProcessBroker) -> None:
    assert check(h, 16000) == {
        "fits": True,
        "gpus": [{"uuid": GPU0, "index": 0, "available_mib": USABLE}],
        "reason": "",
        "reason_kind": "",
        "reason_data": {},
    }
    assert h.broker.leases_view(asker="alice")["leases"] == []


def test_no_room_says_why_with_the_numbers(h: InProcessBroker, pool: SleeperPool) -> None:
    _, holder = pool.spawn()
    task = h.acquire(holder, mib=20000)
    assert task.done()
    answer = check(h, 8000)
    assert answer["fits"] is False and answer["gpus"] == []
    assert answer["reason_kind"] == "capacity"
    assert str(answer["reason"]).startswith("waiting: GPU-5a1e")
    assert answer["reason_data"]["available_mib"] == USABLE - 20000  # type: ignore[index]
    assert check(h, USABLE - 20000)["fits"] is True


def test_a_request_waiting_on_the_gpu_comes_first(h: InProcessBroker, pool: SleeperPool) -> None:
    _, holder = pool.spawn()
    _, other = pool.spawn()
    h.acquire(holder, mib=20000)
    waiting = h.acquire(other, mib=USABLE, wait_s=60.0)  # cannot fit: waits
    assert not waiting.done()
    answer = check(h, 100)  # 100 would fit, but FIFO: the waiter is served first
    assert answer["fits"] is False and "1 request ahead" in str(answer["reason"])
    queue = h.broker.leases_view(asker="tester")["queue"]
    assert [q["request_id"] for q in queue] == [2]  # no request number used up by checks
    waiting.cancel()


def test_beside_bookings_and_a_declared_end(h: InProcessBroker) -> None:
    now = h.clock.wall()
    h.broker.book(
        BookParams(
            mib=16000,
            start_at=now + 3600,
            end_at=now + 7200,
            project="paper",
            session="s",
            purpose="deadline",
        ),
        "bob",
    )
    answer = check(h, 10000)
    assert answer["fits"] is False and "booked from in 60 min by bob" in str(answer["reason"])
    assert check(h, 10000, expected_s=1800)["fits"] is True


def test_a_stale_sample_or_a_request_that_can_never_fit(h: InProcessBroker) -> None:
    h.clock.advance(60)  # the sample is stale now: no room is claimed on it
    answer = check(h, 100)
    assert answer["fits"] is False and answer["reason_kind"] == "sampling"
    with pytest.raises(RpcError) as exc:
        check(h, USABLE + 1)
    assert exc.value.name is ErrorCode.INFEASIBLE
