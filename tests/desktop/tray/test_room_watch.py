""" "Tell me when N MiB are free" in the tray (issue 42) on a real Qt event loop (offscreen),
with a real simulated broker process: the link's room thread asks `room.check` for the one
watch set; while a lease holds the memory nothing is told, once it is released exactly one
notice says where the room is, and a watch cancelled tells nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from PySide6.QtWidgets import QInputDialog
from pytestqt.qtbot import QtBot

import rbroker
from rbroker.tray.app import TrayApp
from rbroker.tray.room import RoomWatch, room_text
from rbroker_protocol.results import RoomCheckResult
from tests.conftest import BrokerProcess

TIMEOUT_MS = 20_000
QUIET_MS = 2500
"""How long nothing must be told: more than two checks (`CHECK_EVERY_S`)."""
ROOM = "room now: GPU 0 has 23 347 MiB available for 8 000 MiB asked"


def _told(tray: TrayApp, title: str) -> list[str]:
    return [text for t, text in tray.notices if t == title]


def _started(broker: BrokerProcess, make_tray: Callable[..., TrayApp], qtbot: QtBot) -> TrayApp:
    tray = make_tray(broker.socket)
    qtbot.waitUntil(lambda: tray.snapshot is not None, timeout=TIMEOUT_MS)
    return tray


def test_room_is_told_once_when_a_lease_is_released(
    qtbot: QtBot, broker: BrokerProcess, make_tray: Callable[..., TrayApp]
) -> None:
    tray = _started(broker, make_tray, qtbot)
    with rbroker.lease(20000, project="vision", session="s", purpose="hold", socket=broker.socket):
        watch = tray.set_room_watch(8000)
        assert tray.link.room_watch is watch
        assert tray.unwatch_action.isEnabled()
        assert tray.unwatch_action.text() == "Cancel the watch for 8 000 MiB"
        qtbot.wait(QUIET_MS)
        assert _told(tray, "rbroker: room now") == []
        assert tray.room_watch is watch
    qtbot.waitUntil(lambda: _told(tray, "rbroker: room now") != [], timeout=TIMEOUT_MS)
    qtbot.wait(QUIET_MS)  # the watch ended: told once
    assert _told(tray, "rbroker: room now") == [ROOM]
    assert tray.room_watch is None and tray.link.room_watch is None
    assert not tray.unwatch_action.isEnabled()
    with rbroker.Client(broker.socket) as c:  # nothing was taken
        assert c.leases()["leases"] == []


def test_a_cancelled_watch_tells_nothing(
    qtbot: QtBot, broker: BrokerProcess, make_tray: Callable[..., TrayApp]
) -> None:
    tray = _started(broker, make_tray, qtbot)
    with rbroker.lease(20000, project="vision", session="s", purpose="hold", socket=broker.socket):
        tray.set_room_watch(8000)
        qtbot.wait(1200)
        tray.unwatch_action.trigger()
        assert tray.room_watch is None and tray.link.room_watch is None
        assert not tray.unwatch_action.isEnabled()
    qtbot.wait(QUIET_MS)
    assert _told(tray, "rbroker: room now") == []


def test_one_watch_at_a_time_and_a_refused_one_is_told(
    qtbot: QtBot, broker: BrokerProcess, make_tray: Callable[..., TrayApp]
) -> None:
    tray = _started(broker, make_tray, qtbot)
    with rbroker.lease(20000, project="vision", session="s", purpose="hold", socket=broker.socket):
        first = tray.set_room_watch(8000)
        second = tray.set_room_watch(6000, 1)  # replaces the first
        assert tray.link.room_watch is second is not first
        tray.set_room_watch(30000)  # more than the GPU can ever offer: refused, the watch ends
        qtbot.waitUntil(lambda: _told(tray, "rbroker: watch ended") != [], timeout=TIMEOUT_MS)
    (ended,) = _told(tray, "rbroker: watch ended")
    assert ended.startswith("no watch for 30 000 MiB: ")
    assert tray.room_watch is None
    qtbot.wait(QUIET_MS)
    assert _told(tray, "rbroker: room now") == []


def test_the_menu_asks_for_mib_and_gpus(
    qtbot: QtBot,
    broker: BrokerProcess,
    make_tray: Callable[..., TrayApp],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tray = _started(broker, make_tray, qtbot)
    answers = iter([(8000, True), (2, True), (4000, False)])
    asked: list[str] = []

    def get_int(parent: Any, title: str, label: str, *rest: Any) -> tuple[int, bool]:
        asked.append(label)
        return next(answers)

    monkeypatch.setattr(QInputDialog, "getInt", get_int)
    with rbroker.lease(20000, project="vision", session="s", purpose="hold", socket=broker.socket):
        tray.watch_action.trigger()
        watch = tray.room_watch
        assert watch is not None and (watch.mib, watch.gpus) == (8000, 2)
        assert tray.unwatch_action.text() == "Cancel the watch for 8 000 MiB on each of 2 GPUs"
        tray.watch_action.trigger()  # cancelled dialog: the watch stays
        assert tray.room_watch is watch
    assert "One watch at a time" in asked[0]
    assert "replaces the one for 8 000 MiB on each of 2 GPUs" in asked[2]
    tray.cancel_room_watch()


def test_room_text_names_each_gpu() -> None:
    answer: RoomCheckResult = {
        "fits": True,
        "gpus": [
            {"uuid": "a", "index": 0, "available_mib": 23347},
            {"uuid": "b", "index": 1, "available_mib": 9000},
        ],
        "reason": "",
        "reason_kind": "",
        "reason_data": {},
    }
    assert room_text(answer, 8000) == (
        "room now: GPU 0 has 23 347 MiB available, GPU 1 has 9 000 MiB available "
        "for 8 000 MiB asked"
    )
    assert RoomWatch(8000).describe() == "8 000 MiB"
