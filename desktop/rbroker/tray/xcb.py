"""Before Qt starts on Linux: can its xcb platform plugin load? If not, say which libraries
are missing and which Debian/Ubuntu packages provide them.

Without this, a minimal Debian or Ubuntu desktop ends `rbroker tray` with Qt's "Could not
load the Qt platform plugin "xcb"" and an abort, without naming a library. Here the plugin
(`PySide6/Qt/plugins/platforms/libqxcb.so`, or the one in `QT_QPA_PLATFORM_PLUGIN_PATH`) is
checked with `ldd` for libraries that are `not found`, before Qt is imported.

`DEBIAN_PACKAGES` lists every system library the plugin links to, directly or through
PySide6's own libraries, beyond the C library: found with `ldd` on PySide6 6.x's
`libqxcb.so` and `dpkg -S` on Debian 12 (the same package names on Ubuntu 22.04 and 24.04).
No Qt is imported here.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

DEBIAN_PACKAGES: dict[str, str] = {
    "libEGL.so.1": "libegl1",
    "libGL.so.1": "libgl1",
    "libGLX.so.0": "libglx0",
    "libGLdispatch.so.0": "libglvnd0",
    "libfontconfig.so.1": "libfontconfig1",
    "libfreetype.so.6": "libfreetype6",
    "libglib-2.0.so.0": "libglib2.0-0",
    "libgthread-2.0.so.0": "libglib2.0-0",
    "libdbus-1.so.3": "libdbus-1-3",
    "libX11.so.6": "libx11-6",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libxcb.so.1": "libxcb1",
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-util.so.1": "libxcb-util1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libXau.so.6": "libxau6",
    "libXdmcp.so.6": "libxdmcp6",
    "libpng16.so.16": "libpng16-16",
    "libbrotlicommon.so.1": "libbrotli1",
    "libbrotlidec.so.1": "libbrotli1",
    "libbsd.so.0": "libbsd0",
    "libmd.so.0": "libmd0",
    "libexpat.so.1": "libexpat1",
    "libz.so.1": "zlib1g",
    "libzstd.so.1": "libzstd1",
    "libstdc++.so.6": "libstdc++6",
    "libgcc_s.so.1": "libgcc-s1",
    "libcap.so.2": "libcap2",
    "libgcrypt.so.20": "libgcrypt20",
    "libgpg-error.so.0": "libgpg-error0",
    "liblz4.so.1": "liblz4-1",
    "liblzma.so.5": "liblzma5",
    "libpcre2-8.so.0": "libpcre2-8-0",
    "libsystemd.so.0": "libsystemd0",
}
"""Shared library (soname) → the Debian/Ubuntu package that provides it."""

GLIBC: frozenset[str] = frozenset(
    {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"}
)
"""Parts of the C library (package libc6), present wherever Python runs."""

BASE_PACKAGES: frozenset[str] = frozenset(
    {
        "libc6", "libgcc-s1", "libstdc++6", "zlib1g", "libzstd1", "liblzma5", "liblz4-1",
        "libcap2", "libgcrypt20", "libgpg-error0", "libsystemd0", "libpcre2-8-0", "libmd0",
        "libbsd0", "libexpat1", "libbrotli1", "libpng16-16", "libfreetype6", "libglvnd0",
        "libglx0", "libxau6", "libxdmcp6",
    }
)  # fmt: skip
"""Packages that are in every Debian/Ubuntu system or that apt installs anyway as
dependencies of `DESKTOP_PACKAGES`."""

DESKTOP_PACKAGES: tuple[str, ...] = tuple(sorted(set(DEBIAN_PACKAGES.values()) - BASE_PACKAGES))
"""What to `apt-get install` on a minimal Debian/Ubuntu for the tray (the user guide's list)."""

_NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found\s*$")
LDD_TIMEOUT_S = 10.0


def plugin_path() -> Path | None:
    """The xcb platform plugin Qt would load: `libqxcb.so` in `QT_QPA_PLATFORM_PLUGIN_PATH`
    when that is set and holds one, else in PySide6's `Qt/plugins/platforms`; None when
    PySide6 is not installed or has no xcb plugin."""
    override = os.environ.get("QT_QPA_PLATFORM_PLUGIN_PATH")
    if override:
        candidate = Path(override) / "libqxcb.so"
        if candidate.is_file():
            return candidate
    try:
        spec = importlib.util.find_spec("PySide6")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "Qt" / "plugins" / "platforms" / "libqxcb.so"
        if candidate.is_file():
            return candidate
    return None


def missing_libraries(plugin: Path) -> list[str] | None:
    """Sonames that the dynamic loader cannot find for `plugin`, in `ldd`'s order without
    repeats; None when that cannot be told (no `ldd`, or it failed)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return None
    try:
        proc = subprocess.run(
            [ldd, str(plugin)], capture_output=True, text=True, timeout=LDD_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    missing: list[str] = []
    for line in proc.stdout.splitlines():
        m = _NOT_FOUND.match(line)
        if m is not None and m.group(1) not in missing:
            missing.append(m.group(1))
    if proc.returncode != 0 and not missing:
        return None
    return missing


def explain(missing: list[str]) -> str:
    """The message for a user: the missing libraries by name, and the `apt-get` line for
    those whose Debian/Ubuntu package is known."""
    packages = sorted({DEBIAN_PACKAGES[lib] for lib in missing if lib in DEBIAN_PACKAGES})
    unknown = [lib for lib in missing if lib not in DEBIAN_PACKAGES]
    lines = [
        "rbroker tray: Qt's xcb platform plugin cannot load; these libraries are missing:",
        "  " + ", ".join(missing),
    ]
    if packages:
        lines.append("On Debian/Ubuntu install them with:")
        lines.append("  sudo apt-get install " + " ".join(packages))
    if unknown and any(lib.startswith("libQt6") or lib.startswith("libicu") for lib in unknown):
        lines.append("Qt's own libraries are missing too: reinstall PySide6-Essentials.")
    return "\n".join(lines)


def xcb_is_used(environ: Mapping[str, str] | None = None) -> bool:
    """True when Qt will use the xcb plugin: on Linux, with `QT_QPA_PLATFORM` unset or
    naming xcb (`xcb`, `xcb:…`, or xcb in a `;` list before anything else), and unless the
    desktop session is Wayland with no platform chosen (Qt then tries wayland first)."""
    env = os.environ if environ is None else environ
    if not sys.platform.startswith("linux"):
        return False
    chosen = env.get("QT_QPA_PLATFORM", "").strip()
    if not chosen:
        return env.get("XDG_SESSION_TYPE", "") != "wayland"
    first = chosen.split(";")[0].split(":")[0].strip()
    return first == "xcb"


NO_DISPLAY = (
    "rbroker tray: no display to show the tray on (DISPLAY and WAYLAND_DISPLAY are unset): "
    "start it inside a desktop session; on a server run `rbroker broker` instead"
)


def check(environ: Mapping[str, str] | None = None) -> str | None:
    """The message to print when the xcb plugin will be used and cannot work — no X display
    to connect to (Qt would abort), or libraries missing — else None."""
    env = os.environ if environ is None else environ
    if not xcb_is_used(env):
        return None
    if not env.get("DISPLAY") and not env.get("WAYLAND_DISPLAY"):
        return NO_DISPLAY
    plugin = plugin_path()
    if plugin is None:
        return None
    missing = missing_libraries(plugin)
    if not missing:
        return None
    return explain(missing)


__all__ = [
    "BASE_PACKAGES",
    "DEBIAN_PACKAGES",
    "DESKTOP_PACKAGES",
    "GLIBC",
    "NO_DISPLAY",
    "check",
    "explain",
    "missing_libraries",
    "plugin_path",
    "xcb_is_used",
]
