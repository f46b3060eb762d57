"""`rbroker tray` as a new user starts it: it starts the broker in-process, refuses a second
instance (showing the first), and stops the broker cleanly when told to quit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import rbroker
from tests.conftest import short_tmp, wait_until

pytestmark = [
    pytest.mark.contract,
    pytest.mark.skipif(sys.platform == "win32", reason="uses SIGTERM"),
]


def test_rbroker_tray_starts_the_broker_and_is_single_instance(tmp_path: Path) -> None:
    root = short_tmp()
    sock = str(root / "b.sock")
    env = {
        **os.environ,
        "QT_QPA_PLATFORM": "offscreen",
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
    }
    args = [sys.executable, "-m", "rbroker", "tray", "--socket", sock, "--simulate"]
    first = subprocess.Popen(
        [*args, "--data-dir", str(root / "data")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:

        def answers() -> bool:
            try:
                with rbroker.Client(sock, timeout_s=2) as c:
                    return bool(c.hello()["simulated"])
            except rbroker.BrokerUnavailable:
                assert first.poll() is None, first.stdout.read() if first.stdout else ""
                return False

        wait_until(answers, timeout_s=30, interval_s=0.1)
        second = subprocess.run(args, env=env, capture_output=True, text=True, timeout=30)
        assert second.returncode == 3, second.stderr
        assert "already running" in second.stdout
        with rbroker.Client(sock) as c:  # the second start left the broker alone
            assert len(c.gpus()) == 2
        first.send_signal(signal.SIGTERM)
        assert first.wait(20) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(5)
        if first.stdout:
            first.stdout.close()
    assert not os.path.exists(sock)  # the in-process broker stopped and removed its socket
