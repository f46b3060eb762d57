"""`rbroker fleet` (and the tray's Fleet tab, the demo) read the coordinator's answer as the
declared `rbroker_protocol.fleet.FleetView`: an answer of another shape is one line naming
the field, and a declared answer is returned as sent. A real HTTP server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rbroker.uplink.fleet import FleetError, fetch_fleet
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
