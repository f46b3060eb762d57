"""The tray says when the broker left other users' leases or requests out of its answer
(`leases.list`'s `leases_left_out` and `queue_left_out`), in the boxes' titles; a real
Qt widget (offscreen)."""

from __future__ import annotations

from pytestqt.qtbot import QtBot

from rbroker.tray.state import Snapshot
from rbroker.tray.window import LocalTab


def test_the_titles_count_what_the_broker_left_out(qtbot: QtBot) -> None:
    tab = LocalTab()
    qtbot.addWidget(tab)
    tab.apply(Snapshot(status={"version": "1"}))
    assert (tab.leases_box.title(), tab.queue_box.title()) == ("Leases (0)", "Waiting (0)")
    tab.apply(Snapshot(status={"version": "1"}, leases_left_out=1500, queue_left_out=3))
    assert tab.leases_box.title() == "Leases (0 shown, 1 500 more of other users)"
    assert tab.queue_box.title() == "Waiting (0 shown, 3 more of other users)"
