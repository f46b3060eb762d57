"""`rbroker fleet` (and the tray's Fleet tab, the demo) read the coordinator's answer as the
declared `rbroker_protocol.fleet.FleetView` (`--room`: `RoomView`): an answer of another
shape is one line naming the field, and a declared answer is returned as sent; `--room`
prints the GPUs with room, or says none has it (exit 1). A real HTTP server on 127.0.0.1."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from rbroker.base.when import fmt_when
from rbroker.cli.main import main
from rbroker.uplink.fleet import FleetError, fetch_fleet, fetch_room
from tests.fakes.coordinator import Answer, FakeCoordinator

VIEW: dict[str, Any] = {
    "group": "vision",
    "generated_at": "2026-11-30T09:00:00Z",
    "stale_after_s": 15.0,
    "offline_after_s": 600.0,
    "computers": [],
}


@pytest.fixture
def coordinator() -> Iterator[FakeCoordinator]:
    with FakeCoordinator() as fake:
        yield fake


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (b"<html>a proxy's page</html>", "the coordinator's answer is not JSON"),
        (b"[]", "the coordinator's answer is not a JSON object"),
        ({**VIEW, "group": None}, "is not what rbroker expects (group: "),
        ({k: v for k, v in VIEW.items() if k != "computers"}, "(computers: Field required)"),
    ],
)
def test_an_answer_of_another_shape_is_one_line(
    coordinator: FakeCoordinator, tmp_path: Path, answer: Any, said: str
) -> None:
    coordinator.then = Answer(200, answer)
    with pytest.raises(FleetError) as caught:
        fetch_fleet(tmp_path, url=coordinator.url, token="rbv_x")
    text = str(caught.value)
    assert said in text and "\n" not in text and "Traceback" not in text, text


def test_the_declared_answer_is_returned_as_sent(
    coordinator: FakeCoordinator, tmp_path: Path
) -> None:
    coordinator.then = Answer(200, VIEW)
    assert fetch_fleet(tmp_path, url=coordinator.url, token="rbv_x") == VIEW
    assert len(coordinator.arrivals) == 1


ROOM: dict[str, Any] = {
    "group": "vision",
    "generated_at": "2026-11-30T09:00:00Z",
    "mib": 20480,
    "gpus": 1,
    "computers": [
        {
            "id": "c_lab2",
            "name": "lab-2",
            "freshness": {
                "state": "online",
                "last_seen_at": "2026-11-30T08:59:57Z",
                "age_s": 3.2,
                "text": "online",
            },
            "gpus": [
                {
                    "uuid": "GPU-5a1e0000-0000-0000-0000-000000000002",
                    "index": 1,
                    "name": "Simulated A6000",
                    "available_mib": 38502,
                    "total_mib": 49152,
                }
            ],
            "waiting": 0,
        }
    ],
}


def test_room_answers_as_sent_and_the_cli_prints_it_or_says_none_fits(
    coordinator: FakeCoordinator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    coordinator.then = Answer(200, ROOM)
    assert fetch_room(tmp_path, 20480, url=coordinator.url, token="rbv_x") == ROOM
    fleet = ["fleet", "--url", coordinator.url, "--token", "rbv_x", "--data-dir", str(tmp_path)]
    assert main([*fleet, "--room", "20480"]) == 0
    out = capsys.readouterr().out  # a pipe: plain rows
    row = next(line for line in out.splitlines() if line.startswith("lab-2"))
    assert row.split()[:7] == ["lab-2", "online", "3", "s", "GPU", "1", "38502"], row
    assert "Room for 20 480 MiB on a GPU in group vision" in out and "nothing is reserved" in out
    coordinator.then = Answer(200, {**ROOM, "mib": 60000, "gpus": 2, "computers": []})
    assert main([*fleet, "--room", "60000", "--gpus", "2"]) == 1
    out = capsys.readouterr().out
    assert "no computer has 60 000 MiB available on 2 GPUs of one computer" in out, out
    coordinator.then = Answer(400, detail="mib must be a whole number from 1 to 1099511627776")
    assert main([*fleet, "--room", "5"]) == 1
    err = capsys.readouterr().err
    assert "HTTP 400: mib must be a whole number" in err and "Traceback" not in err, err
    coordinator.then = Answer(200, {**ROOM, "computers": [{"id": "c_x"}]})
    with pytest.raises(FleetError, match=r"room view is not what rbroker expects \(computers\.0"):
        fetch_room(tmp_path, 20480, url=coordinator.url, token="rbv_x")
    for bad in ("0", "-5", "1.5", "x", "9" * 20):
        with pytest.raises(SystemExit) as usage:
            main([*fleet, "--room", bad])
        assert usage.value.code == 2
    assert "must be a whole number of MiB from 1 to 1099511627776" in capsys.readouterr().err
    asked = len(coordinator.arrivals)
    assert main([*fleet, "--gpus", "2"]) == 2  # not the whole fleet, --gpus unread
    assert "--gpus K needs --room MIB" in capsys.readouterr().err
    assert len(coordinator.arrivals) == asked


def test_room_shows_what_bookings_leave_and_until_when(
    coordinator: FakeCoordinator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GPU whose bookings hold memory now shows the room they leave, and until when (in
    local time) the room lasts before a booking to come takes it (issue 41)."""
    gpu = {**ROOM["computers"][0]["gpus"][0], "booked_mib": 8000, "room_mib": 30502}
    until = "2026-11-30T14:00:00Z"
    booked = {**ROOM, "computers": [{**ROOM["computers"][0], "gpus": [{**gpu, "until_at": until}]}]}
    coordinator.then = Answer(200, booked)
    fleet = ["fleet", "--url", coordinator.url, "--token", "rbv_x", "--data-dir", str(tmp_path)]
    assert main([*fleet, "--room", "20480"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("lab-2"))
    assert row.split()[:7] == ["lab-2", "online", "3", "s", "GPU", "1", "30502"], row
    at = datetime.fromisoformat(until).timestamp()
    assert fmt_when(at, time.time()) in row, row
