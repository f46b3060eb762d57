"""Start the tray at login: the HKCU Run key on Windows, an XDG autostart entry elsewhere.

No Qt here. The command started is the `rbroker-tray` gui-script when it sits next to the
running Python (or the frozen executable of a PyInstaller build), else `python -m rbroker
tray`.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from rbroker_protocol.files import replace_file

APP_NAME = "rbroker-tray"
RUN_KEY = r"Software\Microsoft\Windows\CurrentVersion\Run"


def tray_command() -> list[str]:
    """The argv that starts the tray at login."""
    if getattr(sys, "frozen", False):
        return [sys.executable]
    exe = Path(sys.executable)
    names = ["rbroker-tray.exe"] if sys.platform == "win32" else ["rbroker-tray"]
    for name in names:
        script = exe.with_name(name)
        if script.exists():
            return [str(script)]
    if sys.platform == "win32":
        pythonw = exe.with_name("pythonw.exe")  # no console window at login
        if pythonw.exists():
            exe = pythonw
    return [str(exe), "-m", "rbroker", "tray"]


def autostart_file() -> Path:
    """`$XDG_CONFIG_HOME/autostart/rbroker-tray.desktop` (default `~/.config`)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "autostart" / f"{APP_NAME}.desktop"


def location() -> str:
    """Where the start-at-login entry lives, as the Settings tab shows it: the registry
    value `HKEY_CURRENT_USER\\<RUN_KEY>\\rbroker-tray` on Windows, else the XDG file."""
    if sys.platform == "win32":
        return rf"Registry: HKEY_CURRENT_USER\{RUN_KEY}\{APP_NAME}"
    return f"Autostart entry: {autostart_file()}"


def desktop_entry(command: list[str]) -> str:
    """The text of the XDG autostart entry."""
    return (
        "[Desktop Entry]\n"
        "Type=Application\n"
        "Name=rbroker\n"
        "Comment=GPU memory leases on this computer\n"
        f"Exec={shlex.join(command)}\n"
        "Icon=rbroker\n"
        "Terminal=false\n"
        "X-GNOME-Autostart-enabled=true\n"
    )


def is_enabled() -> bool:
    """True when the tray is set to start at login."""
    if sys.platform == "win32":  # pragma: no cover - Windows only
        import winreg

        try:
            with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY) as key:
                winreg.QueryValueEx(key, APP_NAME)
        except OSError:
            return False
        return True
    return autostart_file().exists()


def enable(command: list[str] | None = None) -> None:
    """Start the tray at login with `command` (default `tray_command()`).

    Raises:
        OSError: the entry cannot be written.
    """
    command = command or tray_command()
    if sys.platform == "win32":  # pragma: no cover - Windows only
        import winreg

        with winreg.CreateKey(winreg.HKEY_CURRENT_USER, RUN_KEY) as key:
            winreg.SetValueEx(key, APP_NAME, 0, winreg.REG_SZ, subprocess.list2cmdline(command))
        return
    path = autostart_file()
    # 0644 whatever the umask: a group-writable entry lets another account choose what runs
    # at this user's login
    replace_file(path, desktop_entry(command).encode("utf-8"), 0o644)


def disable() -> None:
    """Stop starting the tray at login (nothing happens when it was not set)."""
    if sys.platform == "win32":  # pragma: no cover - Windows only
        import winreg

        try:
            with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY, 0, winreg.KEY_SET_VALUE) as k:
                winreg.DeleteValue(k, APP_NAME)
        except FileNotFoundError:
            pass
        return
    autostart_file().unlink(missing_ok=True)


def set_enabled(on: bool) -> None:
    """`enable()` or `disable()`."""
    if on:
        enable()
    else:
        disable()
