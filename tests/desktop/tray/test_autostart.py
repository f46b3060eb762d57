"""Start at login: the XDG autostart entry is written and removed (Linux)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rbroker.tray import autostart

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="XDG autostart is for Linux")


def test_enable_writes_an_xdg_entry_and_disable_removes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    entry = tmp_path / "autostart" / "rbroker-tray.desktop"
    assert autostart.autostart_file() == entry
    assert not autostart.is_enabled()

    autostart.enable()
    assert autostart.is_enabled()
    text = entry.read_text()
    assert "[Desktop Entry]" in text and "Type=Application" in text
    exec_line = next(line for line in text.splitlines() if line.startswith("Exec="))
    assert "rbroker-tray" in exec_line or exec_line.endswith("-m rbroker tray")

    autostart.disable()
    assert not entry.exists()
    assert not autostart.is_enabled()
    autostart.disable()  # idempotent


def test_exec_line_quotes_paths_with_spaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    autostart.enable(["/opt/my apps/python", "-m", "rbroker", "tray"])
    assert "Exec='/opt/my apps/python' -m rbroker tray\n" in autostart.autostart_file().read_text()


def test_command_prefers_the_gui_script_next_to_python() -> None:
    cmd = autostart.tray_command()
    script = Path(sys.executable).with_name("rbroker-tray")
    assert cmd == ([str(script)] if script.exists() else [sys.executable, "-m", "rbroker", "tray"])
