"""Bookings on the coordinator (issue 41): each computer's view carries its live bookings,
group-scoped like everything else; each GPU says what they protect now (`booked_mib`); the
room read takes them off the room and says until when the asked MiB stay free."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from rbroker_protocol.fleet import RoomView
from rbroker_protocol.reports import BookingReport, GpuReport
from rbroker_server.fleet.bookings import room_text, room_until
from tests.fakes.reports import gpu_report, payload
from tests.server.conftest import Coordinator

GPU_1 = "GPU-5a1e0000-0000-0000-0000-000000000001"
GPU_2 = "GPU-5a1e0000-0000-0000-0000-000000000002"


def _gpu(uuid: str, index: int, available_mib: int) -> GpuReport:
    return gpu_report(uuid, index, total_mib=49152, available_mib=available_mib)


def _booking(n: int, gpus: list[str], mib: int, start: float, hours: float, **kw: Any) -> Any:
    return BookingReport(
        booking_id=f"book-{n:04d}",
        gpu_uuids=gpus,
        mib=mib,
        start_at=start,
        end_at=start + hours * 3600,
        owner=kw.pop("owner", "alice"),
        project="vision",
        purpose=kw.pop("purpose", "fine-tune ViT-B"),
        **kw,
    )


def test_each_computer_shows_its_bookings_to_its_own_group_only(coordinator: Coordinator) -> None:
    coordinator.group("alpha")
    coordinator.group("beta")
    a = coordinator.enroll("alpha", "alpha-1")
    b = coordinator.enroll("beta", "beta-1")
    now = time.time()
    mine = _booking(1, [GPU_1], 8000, now - 600, 2, state="claimed", claimed_mib=3000)
    later = _booking(2, [GPU_1], 20000, now + 7200, 1)
    theirs = _booking(3, [GPU_1], 9000, now - 60, 1, owner="mallory", purpose="beta secret plan")
    assert (
        a.report(
            payload("alpha-1", gpus=[_gpu(GPU_1, 0, 30000)], bookings=[mine, later])
        ).status_code
        == 200
    )
    assert (
        b.report(payload("beta-1", gpus=[_gpu(GPU_1, 0, 30000)], bookings=[theirs])).status_code
        == 200
    )

    fleet = coordinator.fleet("alpha")
    [computer] = fleet["computers"]
    assert [x["booking_id"] for x in computer["bookings"]] == ["book-0001", "book-0002"]
    assert computer["bookings"][0]["claimed_mib"] == 3000 and computer["bookings_left_out"] == 0
    assert computer["gpus"][0]["booked_mib"] == 5000  # 8 000 booked less 3 000 claimed, now
    assert coordinator.computer("alpha", a.id)["bookings"] == computer["bookings"]
    viewer = coordinator.viewer("alpha")
    for path in ("/api/v1/fleet", f"/api/v1/computers/{a.id}", "/api/v1/fleet/room?mib=1"):
        text = coordinator.http.get(path, headers=viewer).text
        assert "beta secret plan" not in text and "mallory" not in text and "book-0003" not in text
    r = coordinator.http.get(f"/api/v1/computers/{b.id}", headers=viewer)
    assert r.status_code == 404
    # signed by a computer of the group: the same
    signed = a.get("/api/v1/fleet").json()
    assert [x["booking_id"] for x in signed["computers"][0]["bookings"]] == [
        "book-0001",
        "book-0002",
    ]
    theirs_seen = b.get("/api/v1/fleet").json()["computers"][0]["bookings"]
    assert [(x["booking_id"], x["purpose"]) for x in theirs_seen] == [
        ("book-0003", "beta secret plan")
    ]


def test_a_report_without_bookings_shows_none(coordinator: Coordinator) -> None:
    coordinator.group("alpha")
    pc = coordinator.enroll("alpha", "alpha-1")
    assert pc.report(payload("alpha-1")).status_code == 200
    view = coordinator.computer("alpha", pc.id)
    assert view["bookings"] == [] and view["gpus"][0]["booked_mib"] == 0


def test_room_takes_the_bookings_off_and_says_until_when(coordinator: Coordinator) -> None:
    coordinator.group("alpha")
    pc = coordinator.enroll("alpha", "lab-1")
    now = time.time()
    start = (int(now) // 60 + 120) * 60  # on a minute, about 2 h ahead
    bookings = [
        # held now on GPU 1: protects 5 000 of its 30 000
        _booking(1, [GPU_1], 8000, now - 600, 3, state="claimed", claimed_mib=3000),
        # from `start` on both GPUs: GPU 1 then keeps 30 000 - 5 000 - 20 000 = 5 000
        _booking(2, [GPU_1, GPU_2], 20000, start, 1),
        # ended before it matters (window past): protects nothing
        _booking(3, [GPU_2], 40000, now - 7200, 1),
    ]
    gpus = [_gpu(GPU_1, 0, 30000), _gpu(GPU_2, 1, 40000)]
    assert pc.report(payload("lab-1", gpus=gpus, bookings=bookings)).status_code == 200

    def room(query: str) -> dict[str, Any]:
        r = coordinator.http.get(f"/api/v1/fleet/room?{query}", headers=coordinator.viewer("alpha"))
        assert r.status_code == 200, r.text
        return RoomView.model_validate(r.json()).model_dump(mode="json")

    until = datetime.fromtimestamp(start, UTC)
    same_day = until.date() == datetime.now(UTC).date()
    hhmm = until.strftime("%H:%M" if same_day else "%Y-%m-%d %H:%M")
    [computer] = room("mib=10000")["computers"]
    first, second = computer["gpus"]
    assert (second["index"], second["booked_mib"], second["room_mib"]) == (0, 5000, 25000)
    assert second["until_at"] is not None
    assert datetime.fromisoformat(second["until_at"]).timestamp() == start
    assert second["text"] == f"room for 10 000 MiB now, and until {hhmm} UTC"
    # GPU 2 keeps 40 000 - 20 000 = 20 000 from `start`: room for 10 000 all along
    assert (first["index"], first["room_mib"], first["until_at"]) == (1, 40000, None)
    assert first["text"] == "room for 10 000 MiB now"
    assert computer["until_at"] is None  # one GPU: GPU 2's, which no booking takes
    [both] = room("mib=10000&gpus=2")["computers"]
    assert datetime.fromisoformat(both["until_at"]).timestamp() == start
    # 26 000 fit GPU 1's available 30 000 but not beside the 5 000 booked now
    assert [g["index"] for g in room("mib=26000")["computers"][0]["gpus"]] == [1]
    assert room("mib=26000&gpus=2")["computers"] == []
    assert room("mib=4000")["computers"][0]["gpus"][1]["until_at"] is None


def test_room_until_sweeps_ends_before_starts() -> None:
    def b(mib: int, start: float, end: float, claimed: int = 0) -> dict[str, Any]:
        return {"mib": mib, "start_at": start, "end_at": end, "claimed_mib": claimed}

    # 10 000 available; one booking ends at 200 as the next starts: never both at once
    back_to_back = [b(6000, 100, 200), b(6000, 200, 300)]
    assert room_until(back_to_back, 10_000, 4000, 0) is None
    assert room_until(back_to_back, 10_000, 4001, 0) == 100
    overlapping = [b(3000, 100, 250), b(3000, 200, 300), b(9000, 500, 600, claimed=9000)]
    assert room_until(overlapping, 10_000, 4001, 0) == 200
    assert room_until(overlapping, 10_000, 4001, 260) is None  # the first has ended by then
    assert room_until([], 10_000, 10_000, 0) is None


def test_room_text_says_the_date_on_another_day() -> None:
    now = datetime(2026, 12, 7, 22, 0, tzinfo=UTC)
    assert room_text(20480, None, now) == "room for 20 480 MiB now"
    same = datetime(2026, 12, 7, 23, 30, tzinfo=UTC)
    assert room_text(20480, same, now) == "room for 20 480 MiB now, and until 23:30 UTC"
    nxt = datetime(2026, 12, 8, 1, 15, tzinfo=UTC)
    assert room_text(1_048_576, nxt, now) == (
        "room for 1 048 576 MiB now, and until 2026-12-08 01:15 UTC"
    )
