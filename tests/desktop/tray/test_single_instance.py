"""One tray per user: a second instance finds the first, asks it to show, and gives up."""

from __future__ import annotations

import uuid

from pytestqt.qtbot import QtBot

from rbroker.tray.single import SingleInstance, instance_name


def test_second_instance_activates_the_first(qtbot: QtBot) -> None:
    name = f"rbroker-tray-test-{uuid.uuid4().hex[:8]}"
    first = SingleInstance(name)
    assert first.acquire()
    try:
        second = SingleInstance(name)
        with qtbot.waitSignal(first.activated, timeout=5000):
            assert not second.acquire()
        assert second.server is None
    finally:
        first.release()
    third = SingleInstance(name)  # the first one is gone: the next start wins
    assert third.acquire()
    third.release()


def test_instance_names_are_per_user_and_broker() -> None:
    assert instance_name() == instance_name(None)
    assert instance_name("/a/broker.sock") != instance_name("/b/broker.sock")
    assert instance_name().startswith("rbroker-tray-")
