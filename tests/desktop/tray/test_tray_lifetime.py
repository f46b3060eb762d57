"""The tray starts and stops 50 times (real `rbroker tray` processes, Qt offscreen, each
hosting its broker): every stop exits 0 with nothing on stderr. Before, about one stop in 13
died with "Fatal Python error: bool_dealloc" (Qt objects left for the interpreter's exit to
free; `rbroker.tray.app.teardown` now deletes them in order), and the event thread
could touch a socket the shutdown had closed.

Stops come at different moments: as soon as the broker answers, and a little later, while
the link and the fleet reads run.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rbroker
from tests.conftest import short_tmp

pytestmark = [
    pytest.mark.contract,
    pytest.mark.skipif(sys.platform == "win32", reason="stops the tray with SIGTERM"),
]

OFFSCREEN_NOTE = "This plugin does not support propagateSizeHints()"
"""What Qt's offscreen platform (the tests' display) says about every top-level window: not
rbroker's output, and never printed on a real display."""

ROUNDS = 10
AT_ONCE = 5  # 10 rounds of 5 trays side by side: 50 starts and stops


def _start(root: Path) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "QT_QPA_PLATFORM": "offscreen",
        "XDG_CONFIG_HOME": str(root / "config"),
        "XDG_DATA_HOME": str(root / "xdg-data"),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "rbroker", "tray", "--simulate", "--socket", str(root / "b.sock"),
         "--data-dir", str(root / "data")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def _answers(sock: str) -> bool:
    try:
        with rbroker.Client(sock, timeout_s=2):
            return True
    except rbroker.BrokerUnavailable:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("round_no", range(ROUNDS))
def test_the_tray_starts_and_stops_cleanly_every_time(round_no: int) -> None:
    roots = [short_tmp() for _ in range(AT_ONCE)]
    procs = [_start(root) for root in roots]
    try:
        deadline = time.monotonic() + 60
        waiting = set(range(AT_ONCE))
        while waiting and time.monotonic() < deadline:
            for i in list(waiting):
                assert procs[i].poll() is None, procs[i].communicate(timeout=5)[1]
                if _answers(str(roots[i] / "b.sock")):
                    waiting.discard(i)
            time.sleep(0.05)
        assert not waiting, f"trays {sorted(waiting)} never answered"
        for i, proc in enumerate(procs):
            time.sleep(0.3 * ((i + round_no) % 3))  # at once, 0.3 s and 0.6 s after the last
            proc.send_signal(signal.SIGTERM)
        for i, proc in enumerate(procs):
            _, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, (i, proc.returncode, err)
            ours = [line for line in err.splitlines() if line != OFFSCREEN_NOTE]
            assert ours == [], (i, err)
            assert not (roots[i] / "b.sock").exists(), i  # its broker stopped and cleaned up
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=10)
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
