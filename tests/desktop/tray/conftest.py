"""Tray tests run on Qt's offscreen platform (no display needed); set before Qt loads.

`make_tray(socket, **kw)` is the one way the tests start a tray app: a `TrayApp` with
default settings, its config dir private to the test, started, and shut down at teardown.
On Windows every test's start-at-login entry goes to a registry key of its own under
`HKEY_CURRENT_USER\\Software\\rbroker-tests`, removed afterwards (never the user's Run key).
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
if sys.platform == "win32" and os.path.isdir(r"Z:\usr\share\fonts\truetype\dejavu"):
    # under Wine (Z: is the Linux root), which passes no QT_* variable: the host's fonts
    os.environ.setdefault("QT_QPA_FONTDIR", r"Z:\usr\share\fonts\truetype\dejavu")

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytestqt.qtbot import QtBot

    from rbroker.tray.app import TrayApp


@pytest.fixture(autouse=True)
def private_run_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The registry key (under HKEY_CURRENT_USER) that stands for the Run key in this test;
    on Windows a fresh one, deleted at teardown; elsewhere the unused Run key's name."""
    from rbroker.tray import autostart

    if sys.platform != "win32":
        yield autostart.RUN_KEY
        return
    import winreg

    parent = r"Software\rbroker-tests"
    key = rf"{parent}\{uuid.uuid4().hex}"
    monkeypatch.setattr(autostart, "RUN_KEY", key)
    yield key
    for path in (key, parent):  # a parent that still holds another test's key stays
        with contextlib.suppress(OSError):
            winreg.DeleteKey(winreg.HKEY_CURRENT_USER, path)


@pytest.fixture
def make_tray(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., TrayApp]]:
    """`make_tray(socket, **kw)` → a started `TrayApp(socket, TraySettings(), **kw)` whose
    settings live under the test's own `XDG_CONFIG_HOME`; every app made is shut down at
    teardown."""
    from rbroker.tray.app import TrayApp
    from rbroker.tray.settings import TraySettings

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    apps: list[TrayApp] = []

    def make(socket: str, **kw: object) -> TrayApp:
        app = TrayApp(socket, TraySettings(), **kw)  # type: ignore[arg-type]
        qtbot.addWidget(app.window)
        app.start()
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.shutdown()
