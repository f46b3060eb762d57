"""Start at login: the XDG autostart entry (Linux) or the HKCU Run value (Windows) is
written and removed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rbroker.tray import autostart

xdg_only = pytest.mark.skipif(sys.platform == "win32", reason="XDG autostart is for Linux")


@xdg_only
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


@xdg_only
def test_exec_line_quotes_paths_with_spaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    autostart.enable(["/opt/my apps/python", "-m", "rbroker", "tray"])
    assert "Exec='/opt/my apps/python' -m rbroker tray\n" in autostart.autostart_file().read_text()


@xdg_only
def test_command_prefers_the_gui_script_next_to_python() -> None:
    cmd = autostart.tray_command()
    script = Path(sys.executable).with_name("rbroker-tray")
    assert cmd == ([str(script)] if script.exists() else [sys.executable, "-m", "rbroker", "tray"])


@pytest.mark.skipif(sys.platform != "win32", reason="the HKCU Run key is Windows'")
def test_enable_writes_the_run_value_and_disable_removes_it(private_run_key: str) -> None:
    import winreg

    assert private_run_key == autostart.RUN_KEY  # never the user's own Run key
    assert not autostart.is_enabled()
    autostart.enable([r"C:\Program Files\rbroker\rbroker-tray.exe"])
    assert autostart.is_enabled()
    with winreg.OpenKey(winreg.HKEY_CURRENT_USER, private_run_key) as key:
        value, kind = winreg.QueryValueEx(key, autostart.APP_NAME)
    assert (value, kind) == (r'"C:\Program Files\rbroker\rbroker-tray.exe"', winreg.REG_SZ)
    assert autostart.location() == (
        rf"Registry: HKEY_CURRENT_USER\{private_run_key}\{autostart.APP_NAME}"
    )
    autostart.disable()
    assert not autostart.is_enabled()
    autostart.disable()  # idempotent


@xdg_only
@pytest.mark.parametrize("umask", [0o002, 0o000, 0o077])
def test_the_entry_and_the_tray_settings_keep_their_modes_under_any_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask: int
) -> None:
    """The login entry is 0644 (read by the desktop, written by this user only: a
    group-writable one lets another account choose what runs at this user's login) and the
    tray's settings 0600 in a 0700 folder, whatever the umask (a umask of 002 left both
    group-writable)."""
    import os
    import stat

    from rbroker.tray.settings import TraySettings

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    old = os.umask(umask)
    try:
        autostart.enable(["/usr/bin/rbroker-tray"])
        settings = tmp_path / "rbroker" / "tray.json"
        TraySettings(coordinator_url="https://coordinator.example").save(settings)
    finally:
        os.umask(old)
    entry = autostart.autostart_file()
    assert stat.S_IMODE(entry.stat().st_mode) == 0o644
    assert stat.S_IMODE(settings.stat().st_mode) == 0o600
    assert stat.S_IMODE(settings.parent.stat().st_mode) == 0o700
    assert TraySettings.load(settings).coordinator_url == "https://coordinator.example"
    assert sorted(p.name for p in entry.parent.iterdir()) == [entry.name]  # no temporary left
