"""Finding `nvml.dll` on Windows, with one message that lists every place looked in.

pynvml itself tries `%WINDIR%\\System32\\nvml.dll`, then
`%ProgramFiles%\\NVIDIA Corporation\\NVSMI\\nvml.dll`. DCH drivers keep the library in the
driver store (`%WINDIR%\\System32\\DriverStore\\FileRepository\\nv*\\nvml.dll`) and copy it
to System32 only on some installs; old (pre-DCH) drivers use NVSMI. The search order here:
System32, every `nv*` driver-store folder (newest first), NVSMI. The first library that
loads is handed to pynvml (`pynvml.nvmlLib`, which its loader keeps when already set).

`windows_candidates` and `not_found_message` are pure (tested on any OS with a directory
laid out like Windows'); `preload_windows_nvml` loads, on Windows only.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rbroker.gpu.types import TelemetryState

LIBRARY = "nvml.dll"


def windows_candidates(environ: Mapping[str, str]) -> list[Path]:
    """Where to look for `nvml.dll`, in order, from `WINDIR` (or `SystemRoot`, default
    `C:\\Windows`) and `ProgramFiles` (default `C:\\Program Files`) in `environ`.

    Driver-store folders that exist are listed newest first (modification time), so after
    a driver upgrade the current driver's library comes before a left-over one. Paths are
    listed whether or not the file exists: the message names every place looked in.
    """
    windir = Path(environ.get("WINDIR") or environ.get("SystemRoot") or "C:\\Windows")
    program_files = Path(environ.get("ProgramFiles") or "C:\\Program Files")
    out = [windir / "System32" / LIBRARY]
    store = windir / "System32" / "DriverStore" / "FileRepository"
    try:
        folders = [p for p in store.iterdir() if p.is_dir() and p.name.lower().startswith("nv")]
    except OSError:
        folders = []
    folders.sort(key=lambda p: (-_mtime(p), p.name))
    out += [folder / LIBRARY for folder in folders]
    if not folders:
        out.append(store / "nv*" / LIBRARY)  # named as looked for, so the message says so
    out.append(program_files / "NVIDIA Corporation" / "NVSMI" / LIBRARY)
    return out


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def not_found_message(tried: list[tuple[Path, str]]) -> str:
    """One line naming each place looked in and why it did not do (`missing`, or the
    loader's error)."""
    places = "; ".join(f"{path} ({why})" for path, why in tried)
    return (
        f"no loadable NVIDIA NVML library ({LIBRARY}): looked in {places}. Install or repair "
        "the NVIDIA driver (it provides nvml.dll), or start the broker with --simulate"
    )


class NvmlNotFound(Exception):
    """No candidate loaded; `state` and `reason` match `rbroker.gpu.nvml.TelemetryError`."""

    state = TelemetryState.UNAVAILABLE
    reason = "library_not_found"


def preload_windows_nvml(pynvml_module: Any, environ: Mapping[str, str] | None = None) -> str:
    """Load the first `nvml.dll` of `windows_candidates` into `pynvml_module.nvmlLib`.

    Returns:
        The path loaded, or `"already loaded"`.

    Raises:
        NvmlNotFound: none loads (the message lists every place and why).
        RuntimeError: called on another OS than Windows.
    """
    if sys.platform != "win32":
        raise RuntimeError("preload_windows_nvml is for Windows")
    import ctypes

    if getattr(pynvml_module, "nvmlLib", None) is not None:
        return "already loaded"
    tried: list[tuple[Path, str]] = []
    for path in windows_candidates(os.environ if environ is None else environ):
        if not path.is_file():
            tried.append((path, "missing"))
            continue
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            tried.append((path, str(exc)))
            continue
        pynvml_module.nvmlLib = lib
        return str(path)
    raise NvmlNotFound(not_found_message(tried))
