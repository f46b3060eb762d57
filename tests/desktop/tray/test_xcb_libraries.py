"""`rbroker tray` names the libraries Qt's xcb plugin lacks, before Qt aborts without names.

The plugin is PySide6's real `libqxcb.so`, read by the real `ldd`. To make libraries really
missing without uninstalling anything, the plugin is copied into an empty directory: its
RUNPATH (`$ORIGIN/../../lib`) then leads nowhere, so Qt's own libraries are not found, as Qt
itself would find when loading that copy through `QT_QPA_PLATFORM_PLUGIN_PATH`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rbroker.tray import xcb

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

ROOT = Path(__file__).resolve().parents[3]

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("ldd") is None,
    reason="the xcb plugin and ldd are Linux things",
)


@pytest.fixture
def real_plugin() -> Path:
    plugin = xcb.plugin_path()
    if plugin is None:
        pytest.skip("PySide6 without an xcb platform plugin")
    return plugin


@pytest.fixture
def stranded_plugin(real_plugin: Path, tmp_path: Path) -> Path:
    """A copy of the real plugin whose Qt libraries cannot be found."""
    platforms = tmp_path / "platforms"
    platforms.mkdir()
    shutil.copy2(real_plugin, platforms / "libqxcb.so")
    return platforms / "libqxcb.so"


def _ldd(path: Path) -> list[tuple[str, str]]:
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"^\s*(\S+)\s+=>\s+(.+?)(?:\s+\(0x[0-9a-f]+\))?\s*$", out, re.M)


@linux_only
def test_missing_libraries_are_named(stranded_plugin: Path) -> None:
    missing = xcb.missing_libraries(stranded_plugin)
    assert missing is not None
    for lib in ("libQt6XcbQpa.so.6", "libQt6Gui.so.6", "libQt6Core.so.6"):
        assert lib in missing
    assert len(missing) == len(set(missing))
    assert all(lib.startswith("lib") and ".so" in lib for lib in missing)


@linux_only
def test_every_library_the_plugin_needs_has_its_debian_package(real_plugin: Path) -> None:
    """The user guide's list is complete: every system library `ldd` reports for the plugin
    (found or not) maps to a Debian/Ubuntu package."""
    pyside = real_plugin.parents[3]
    unknown = []
    for soname, where in _ldd(real_plugin):
        if soname in xcb.GLIBC or soname.startswith("ld-linux"):
            continue
        if where != "not found" and Path(where).resolve().is_relative_to(pyside.resolve()):
            continue  # shipped inside PySide6
        if soname not in xcb.DEBIAN_PACKAGES:
            unknown.append(soname)
    assert not unknown, f"add their Debian packages to rbroker.tray.xcb: {unknown}"


def test_message_names_libraries_and_the_packages_to_install() -> None:
    text = xcb.explain(["libxcb-icccm.so.4", "libxcb-keysyms.so.1"])
    assert "libxcb-icccm.so.4, libxcb-keysyms.so.1" in text
    assert "sudo apt-get install libxcb-icccm4 libxcb-keysyms1" in text
    qt = xcb.explain(["libQt6XcbQpa.so.6"])
    assert "libQt6XcbQpa.so.6" in qt and "apt-get" not in qt and "PySide6" in qt


def test_readme_lists_every_desktop_package() -> None:
    guide = (ROOT / "docs" / "user-guide.md").read_text(encoding="utf-8")
    m = re.search(r"sudo apt-get install (libdbus[^`]*?)\n```", guide)
    assert m is not None, "the user guide's tray section lost its apt-get line"
    listed = m.group(1).replace("\\\n", " ").split()
    assert sorted(listed) == sorted(xcb.DESKTOP_PACKAGES)
    for pkg in ("libxcb-cursor0", "libxcb-icccm4", "libxcb-keysyms1"):
        assert pkg in listed


def test_xcb_is_used_only_where_qt_picks_it() -> None:
    linux = sys.platform.startswith("linux")
    assert xcb.xcb_is_used({}) is linux
    assert xcb.xcb_is_used({"QT_QPA_PLATFORM": "xcb"}) is linux
    assert xcb.xcb_is_used({"QT_QPA_PLATFORM": "xcb:display=:1"}) is linux
    assert xcb.xcb_is_used({"QT_QPA_PLATFORM": "offscreen"}) is False
    assert xcb.xcb_is_used({"QT_QPA_PLATFORM": "wayland;xcb"}) is False
    assert xcb.xcb_is_used({"XDG_SESSION_TYPE": "wayland"}) is False


@linux_only
def test_rbroker_tray_prints_the_missing_libraries_instead_of_aborting(
    stranded_plugin: Path, tmp_path: Path
) -> None:
    env = dict(os.environ)
    env.update(
        QT_QPA_PLATFORM="xcb",
        QT_QPA_PLATFORM_PLUGIN_PATH=str(stranded_plugin.parent),
        RBROKER_SOCKET=str(tmp_path / "none.sock"),
        DISPLAY=":99",
    )
    rbroker = str(Path(sys.executable).parent / "rbroker")
    proc = subprocess.run(
        [rbroker, "tray", "--attach-only"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert "xcb platform plugin cannot load" in proc.stderr
    assert "libQt6XcbQpa.so.6" in proc.stderr
    assert "Aborted" not in proc.stderr and "core dumped" not in proc.stderr


@linux_only
def test_rbroker_tray_without_a_display_says_so_in_one_line(tmp_path: Path) -> None:
    """Before: Qt aborted (SIGABRT, exit 134) with a message that blamed libxcb-cursor0."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM", "XDG_SESSION_TYPE")
    }
    env["RBROKER_SOCKET"] = str(tmp_path / "none.sock")
    rbroker = str(Path(sys.executable).parent / "rbroker")
    proc = subprocess.run(
        [rbroker, "tray", "--attach-only"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip() == xcb.NO_DISPLAY
    assert xcb.check({"QT_QPA_PLATFORM": "offscreen"}) is None
