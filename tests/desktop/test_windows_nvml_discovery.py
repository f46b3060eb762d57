"""Where the broker looks for nvml.dll on Windows (issue 13, item 4): System32, the driver
store's `nv*` folders (newest first), NVSMI; and the one message that lists them all.

The search list is pure: here it runs over a directory laid out like a Windows install.
Loading the library (`preload_windows_nvml`) needs Windows.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from rbroker.gpu.nvml_discovery import not_found_message, preload_windows_nvml, windows_candidates


def _windows(tmp_path: Path) -> tuple[Path, Path]:
    windir = tmp_path / "Windows"
    store = windir / "System32" / "DriverStore" / "FileRepository"
    for name, mtime in (
        ("nvltsi.inf_amd64_0a1b2c3d4e5f6a7b", 1_700_000_000),  # an older driver left over
        ("nvlti.inf_amd64_9f8e7d6c5b4a3f2e", 1_760_000_000),  # the current driver
        ("iigd_dch.inf_amd64_1234567890abcdef", 1_770_000_000),  # Intel: not NVIDIA's
    ):
        folder = store / name
        folder.mkdir(parents=True)
        (folder / "nvml.dll").write_bytes(b"MZ")
        os.utime(folder, (mtime, mtime))
    return windir, tmp_path / "Program Files"


def test_search_order_system32_driver_store_newest_first_then_nvsmi(tmp_path: Path) -> None:
    windir, program_files = _windows(tmp_path)
    found = windows_candidates({"WINDIR": str(windir), "ProgramFiles": str(program_files)})
    store = windir / "System32" / "DriverStore" / "FileRepository"
    assert found == [
        windir / "System32" / "nvml.dll",
        store / "nvlti.inf_amd64_9f8e7d6c5b4a3f2e" / "nvml.dll",
        store / "nvltsi.inf_amd64_0a1b2c3d4e5f6a7b" / "nvml.dll",
        program_files / "NVIDIA Corporation" / "NVSMI" / "nvml.dll",
    ]


def test_without_a_driver_store_the_pattern_is_still_named(tmp_path: Path) -> None:
    found = windows_candidates({"SystemRoot": str(tmp_path / "W")})
    store = tmp_path / "W" / "System32" / "DriverStore" / "FileRepository"
    assert found[1] == store / "nv*" / "nvml.dll"
    assert found[-1] == Path("C:\\Program Files") / "NVIDIA Corporation" / "NVSMI" / "nvml.dll"
    assert windows_candidates({})[0] == Path("C:\\Windows") / "System32" / "nvml.dll"


def test_one_message_lists_every_place_and_why(tmp_path: Path) -> None:
    windir, program_files = _windows(tmp_path)
    places = windows_candidates({"WINDIR": str(windir), "ProgramFiles": str(program_files)})
    tried = [(p, "missing") for p in places[:1]]
    tried += [(p, "[WinError 193] %1 is not a valid Win32 application") for p in places[1:3]]
    tried.append((places[3], "missing"))
    message = not_found_message(tried)
    assert "\n" not in message
    for path in places:
        assert str(path) in message
    assert message.count("(missing)") == 2
    assert message.count("WinError 193") == 2
    assert "--simulate" in message


@pytest.mark.skipif(sys.platform == "win32", reason="the refusal off Windows")
def test_preload_is_for_windows_only() -> None:
    with pytest.raises(RuntimeError, match="for Windows"):
        preload_windows_nvml(object())
