"""Desktop notifications show other users' names as text whatever shows them: a
freedesktop notification server that reads markup (`body-markup`) gets the body escaped,
anything else (a server without markup, Qt's own balloon, Windows) gets `tray_tip`'s word
joiners. The capability check runs against a real private D-Bus session bus with a
notification server that answers `GetCapabilities` (tests/fakes/notification_server.py).
Which server a real desktop runs (GNOME Shell, Plasma, dunst) is not exercised here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rbroker.tray.plain import WORD_JOINER, notification_body

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

CHECK = (
    "from PySide6.QtCore import QCoreApplication; app = QCoreApplication([]); "
    "from rbroker.tray.notification_server import reads_markup; print(reads_markup())"
)


def test_the_body_is_escaped_for_a_markup_server_and_joined_for_others() -> None:
    hostile = "<img src=x width=20000> <b>bold</b> & <a href='x'>l</a>\x1b[31m\nline 2"
    assert notification_body(hostile, markup=True) == (
        "&lt;img src=x width=20000&gt; &lt;b&gt;bold&lt;/b&gt; &amp; "
        "&lt;a href='x'&gt;l&lt;/a&gt;[31m\nline 2"
    )
    plain = notification_body(hostile, markup=False)
    assert f"<{WORD_JOINER}img" in plain and f"&{WORD_JOINER}" in plain and "\x1b" not in plain
    assert plain.replace(WORD_JOINER, "") == hostile.replace("\x1b", "")


@pytest.fixture
def session_bus(tmp_path: Path) -> Iterator[str]:
    """A private session bus (`dbus-daemon --session`) listening in `tmp_path`: its
    address."""
    if shutil.which("dbus-daemon") is None:
        pytest.skip("needs dbus-daemon (Debian: dbus)")
    address = f"unix:path={tmp_path / 'bus'}"
    daemon = subprocess.Popen(
        ["dbus-daemon", "--session", "--nofork", f"--address={address}", "--print-address=1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert daemon.stdout is not None and daemon.stdout.readline().startswith("unix:")
        yield address
    finally:
        daemon.kill()
        daemon.communicate()


def _env(address: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DBUS_SESSION_BUS_ADDRESS"}
    env["QT_QPA_PLATFORM"] = "offscreen"
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    if address is not None:
        env["DBUS_SESSION_BUS_ADDRESS"] = address
    return env


def _reads_markup(address: str | None) -> bool:
    out = subprocess.run(
        [sys.executable, "-c", CHECK],
        env=_env(address),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return {"True\n": True, "False\n": False}[out.stdout]


@pytest.mark.parametrize(
    ("capabilities", "watcher", "markup"),
    [
        ("body,body-markup,actions", True, True),
        ("body,actions", True, False),  # a server that shows bodies as they are
        ("body,body-markup", False, False),  # no D-Bus tray: Qt shows its own balloon
    ],
)
def test_the_markup_check_asks_the_session_s_notification_server(
    session_bus: str, capabilities: str, watcher: bool, markup: bool
) -> None:
    args = [capabilities, *(["watcher"] if watcher else [])]
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.notification_server", *args],
        env=_env(session_bus),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline() == "ready\n"
        assert _reads_markup(session_bus) is markup
    finally:
        server.kill()
        server.communicate()


def test_without_a_session_bus_or_a_server_nothing_reads_markup(session_bus: str) -> None:
    assert _reads_markup(None) is False
    assert _reads_markup(session_bus) is False  # a bus, no server
