"""The frozen Windows app (tests/windows/frozen.py): its programs start without Python or
the checkout, the frozen broker serves the frozen command line over a named pipe, the frozen
tray starts offscreen and attaches to it, and the service host started by a user (not by the
Service Control Manager) says so in one line. The service host under the Service Control
Manager: tests/windows/test_service_windows.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rbroker.base.children import kill_tree
from rbroker.base.version import __version__
from tests.conftest import GPU0, wait_until
from tests.windows.cli import assert_one_line
from tests.windows.frozen import FROZEN_DIR, frozen_exe
from tests.windows.test_pipe_failures_windows import new_pipe

pytestmark = pytest.mark.skipif(
    sys.platform != "win32", reason="Windows only: the frozen Windows app"
)

START_S = 120  # a frozen Qt program's first start under Wine, on a loaded machine


def run_frozen(
    name: str, *args: str, timeout_s: float = START_S
) -> subprocess.CompletedProcess[str]:
    """The frozen program `name` with `args`, to its end, output through pipes; started with
    no Python of this checkout on its path (nothing of the checkout's may leak in)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(
        [frozen_exe(name), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**env, "COLUMNS": "1000"},
        check=False,
    )


@pytest.fixture
def frozen_broker(tmp_path: Path) -> Iterator[str]:
    """`rbroker.exe broker --simulate` on a new named pipe until the test ends; its address."""
    address = new_pipe()
    proc = subprocess.Popen(
        [
            *(frozen_exe("rbroker"), "broker", "--simulate", "--socket", address),
            *("--machine-lock", "per-socket", "--data-dir", str(tmp_path / "data")),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "listening on" in line:
                break
        assert any("listening on" in line for line in lines), "".join(lines)
        yield address
    finally:
        if proc.poll() is None:
            kill_tree(proc)
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()


def test_the_folder_holds_three_programs_and_one_shared_runtime() -> None:
    frozen_exe("rbroker")
    names = sorted(p.name for p in FROZEN_DIR.iterdir())
    assert names == ["_internal", "rbroker-service.exe", "rbroker-tray.exe", "rbroker.exe"]
    internal = FROZEN_DIR / "_internal"
    assert (internal / "python311.dll").is_file()
    assert (internal / "assets" / "rbroker.png").is_file()


def test_version_resource_names_the_release() -> None:
    import win32api

    for name in ("rbroker", "rbroker-tray", "rbroker-service"):
        info = win32api.GetFileVersionInfo(
            frozen_exe(name), "\\StringFileInfo\\040904B0\\FileVersion"
        )
        assert info == __version__, (name, info)


def test_rbroker_exe_prints_its_version() -> None:
    done = run_frozen("rbroker", "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"rbroker {__version__}"


def test_frozen_status_sees_the_frozen_broker_over_the_pipe(frozen_broker: str) -> None:
    done = run_frozen("rbroker", "status", "--socket", frozen_broker)
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    assert GPU0 in out, out
    assert "Traceback" not in done.stderr, done.stderr


def test_frozen_tray_starts_offscreen_and_is_one_instance(
    frozen_broker: str, tmp_path: Path
) -> None:
    """Two frozen trays attached to the frozen broker: one runs, the other finds it and exits
    3 (`EXIT_TRAY_ALREADY_RUNNING`): both started Qt, and one answers on its guard."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["QT_QPA_PLATFORM"] = "offscreen"
    dejavu = Path(r"Z:\usr\share\fonts\truetype\dejavu")
    if dejavu.is_dir():
        env["QT_QPA_FONTDIR"] = str(dejavu)
    args = [frozen_exe("rbroker-tray"), "--attach-only", "--socket", frozen_broker]
    trays = [subprocess.Popen(args, env=env)]
    try:
        time.sleep(5)  # the first one's start is under way (the second may still win)
        assert trays[0].poll() is None, f"the frozen tray exited {trays[0].returncode}"
        trays.append(subprocess.Popen(args, env=env))
        ended: list[subprocess.Popen[bytes]] = wait_until(  # type: ignore[assignment]
            lambda: [t for t in trays if t.poll() is not None] or None,
            timeout_s=START_S,
            interval_s=0.5,
        )
        assert len(ended) == 1 and ended[0].returncode == 3, [t.returncode for t in trays]
        time.sleep(2)
        assert [t.poll() is None for t in trays].count(True) == 1, "the running tray ended"
    finally:
        for tray in trays:
            if tray.poll() is None:
                kill_tree(tray)
            tray.wait(30)


def test_service_host_started_by_a_user_says_so_in_one_line() -> None:
    assert_one_line(
        run_frozen("rbroker-service"), 2, "the Service Control Manager starts this program"
    )
    assert_one_line(run_frozen("rbroker-service", "--port", "1"), 2, "service option '--port'")
