"""One tray per user: a second instance (another process, as when the tray is started
again) finds the first, asks it to show, waits for its answer, and gives up; once the first
is gone the next start wins."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from pytestqt.qtbot import QtBot

from rbroker.tray.single import SingleInstance, instance_name

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

SECOND = """
import sys
from PySide6.QtCore import QCoreApplication
from rbroker.tray.single import SingleInstance
app = QCoreApplication([])
print("first" if SingleInstance(sys.argv[1]).acquire() else "second", flush=True)
"""


def test_second_instance_activates_the_first(qtbot: QtBot) -> None:
    name = f"rbroker-tray-test-{uuid.uuid4().hex[:8]}"
    first = SingleInstance(name)
    assert first.acquire()
    try:
        with qtbot.waitSignal(first.activated, timeout=10_000):
            second = subprocess.Popen(
                [sys.executable, "-c", SECOND, name],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
            )
        qtbot.waitUntil(lambda: second.poll() is not None, timeout=30_000)
        out, _ = second.communicate()
        assert out.decode().strip() == "second"
    finally:
        first.release()
    third = SingleInstance(name)  # the first one is gone: the next start wins
    assert third.acquire()
    third.release()


def test_instance_names_are_per_user_and_broker() -> None:
    assert instance_name() == instance_name(None)
    assert instance_name("/a/broker.sock") != instance_name("/b/broker.sock")
    assert instance_name().startswith("rbroker-tray-")
