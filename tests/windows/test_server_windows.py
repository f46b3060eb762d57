"""The coordinator on Windows: `rbroker-server setup --non-interactive` into a data dir,
`serve` on a free port, `/healthz`, a Windows broker's signed report accepted and shown in the
fleet, and a second `serve` on the same port refused in one line with its exit code.

Runs under the Windows interpreter (real Windows or Wine).
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import httpx
import pytest

from rbroker.demo.coordinator import LocalCoordinator, run_module
from rbroker_protocol.startup import EXIT_ADDRESS_IN_USE
from tests.windows.cli import wait_until_reported

pytestmark = pytest.mark.skipif(
    sys.platform != "win32", reason="Windows only: the coordinator served by a Windows process"
)


def test_setup_writes_config_and_database(coordinator: LocalCoordinator) -> None:
    config = tomllib.loads((coordinator.data_dir / "config.toml").read_text(encoding="utf-8"))
    assert config["bind_port"] == coordinator.port
    assert (coordinator.data_dir / "rbroker-server.db").is_file()
    assert coordinator.token.startswith("rbv_")
    assert coordinator.first_code.startswith("rbe_")


def test_healthz_answers(coordinator: LocalCoordinator) -> None:
    r = httpx.get(coordinator.url + "/healthz", timeout=10)
    assert r.status_code == 200
    assert r.json()["status"] == "ok"


def test_windows_broker_report_is_accepted(coordinator: LocalCoordinator, tmp_path: Path) -> None:
    name = f"win-{uuid.uuid4().hex[:6]}"
    data_dir = tmp_path / "broker"
    computer_id = coordinator.enroll(name, data_dir)
    assert (data_dir / "computer.key").is_file()
    pipe = rf"\\.\pipe\rbroker-srvtest-{uuid.uuid4().hex[:8]}"
    with open(tmp_path / "broker.log", "wb") as log:
        broker = subprocess.Popen(
            [sys.executable, "-m", "rbroker", "broker", "--simulate", "--socket", pipe,
             "--machine-lock", "per-socket", "--data-dir", str(data_dir)],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        computer = wait_until_reported(coordinator, name, broker, tmp_path / "broker.log")
        assert computer["id"] == computer_id
        assert computer["freshness"]["state"] == "online"
        assert computer["telemetry_source"] == "simulated"
        assert len(computer["gpus"]) == 2
    finally:
        broker.kill()
        broker.wait(30)


def test_second_serve_on_the_port_is_refused(coordinator: LocalCoordinator) -> None:
    """Windows' SO_REUSEADDR would let a second socket bind beside the listening one."""
    done = run_module(
        "rbroker_server", "serve", "--data-dir", str(coordinator.data_dir),
        "--port", str(coordinator.port), timeout=120,
    )  # fmt: skip
    assert done.returncode == EXIT_ADDRESS_IN_USE, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"rbroker-server: cannot listen on 127.0.0.1:{coordinator.port}: ")
    assert "another process (another coordinator?) listens there" in lines[0]
    assert coordinator.healthy(timeout_s=10)
