"""The coordinator deployed on Windows, a broker on Linux reporting to it: `rbroker-server setup
--non-interactive` and `serve` under Wine on 127.0.0.1, a Linux broker enrolled with its code,
its report and its lease in the Windows coordinator's fleet; a second `serve` on the same
port refused with the address-in-use line and exit code.

Run from Linux; the coordinator runs under Wine through `.ci/wine python`.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import rbroker
from rbroker_protocol.startup import EXIT_ADDRESS_IN_USE
from tests.conftest import SINGLE_24G, short_tmp, start_broker, wait_until
from tests.e2e.conftest import by_name, enroll_cli
from tests.ports import free_port
from tests.windows.wine import SKIP_REASON, WINE_READY, unix_to_wine
from tests.windows.winprocs import WineProcesses, wine_procs

pytestmark = pytest.mark.skipif(not WINE_READY, reason=SKIP_REASON)
__all__ = ["wine_procs"]  # the fixture, used by name


@dataclass
class WindowsCoordinator:
    """A coordinator serving under Wine, seen from Linux."""

    data_dir: Path
    port: int
    token: str
    code: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fleet(self) -> dict[str, Any]:
        r = httpx.get(self.url + "/api/v1/fleet", headers={"Authorization": f"Bearer {self.token}"})
        assert r.status_code == 200, r.text
        return dict(r.json())


def serve_args(data_dir: Path, port: int) -> list[str]:
    return ["-m", "rbroker_server", "serve", "--data-dir", unix_to_wine(data_dir),
            "--port", str(port)]  # fmt: skip


@pytest.fixture
def windows_coordinator(tmp_path: Path, wine_procs: WineProcesses) -> Iterator[WindowsCoordinator]:
    """`rbroker-server setup --non-interactive` then `serve` under Wine, answering /healthz."""
    data_dir = tmp_path / "coordinator"
    port = free_port()
    code, out = wine_procs.run(
        ["-m", "rbroker_server", "setup", "--non-interactive", "--data-dir",
         unix_to_wine(data_dir), "--bind", "127.0.0.1", "--public-hostname", "127.0.0.1",
         "--port", str(port)],
    )  # fmt: skip
    assert code == 0, out
    token = re.search(r"viewer token:\s+(rbv_[A-Za-z0-9_-]+)", out)
    enroll_code = re.search(r"enrollment code:\s+(rbe_[A-Za-z0-9_-]+)", out)
    assert token and enroll_code, out
    assert (data_dir / "config.toml").is_file()
    assert (data_dir / "rbroker-server.db").is_file()
    coordinator = WindowsCoordinator(data_dir, port, token.group(1), enroll_code.group(1))
    serving = wine_procs.start(serve_args(data_dir, port))

    def healthy() -> bool:
        assert serving.proc.poll() is None, serving.output
        try:
            return httpx.get(coordinator.url + "/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, timeout_s=120, interval_s=0.5)
    yield coordinator


def test_linux_broker_reports_to_windows_coordinator(
    windows_coordinator: WindowsCoordinator,
) -> None:
    root = short_tmp()
    done = enroll_cli(
        windows_coordinator.url, windows_coordinator.code, root / "data", "linux-box", "--key-file"
    )
    assert done.returncode == 0, done.stderr
    computer_id = json.loads((root / "data" / "uplink.json").read_text())["computer_id"]
    broker = start_broker(SINGLE_24G, root=root)
    try:
        with rbroker.lease(3072, socket=str(broker.socket), project="linproj") as lease:

            def shown() -> dict[str, Any] | None:
                computer = by_name(windows_coordinator.fleet()).get("linux-box")
                return computer if computer is not None and computer["leases"] else None

            computer = wait_until(shown, timeout_s=60, interval_s=0.5)
            assert isinstance(computer, dict)
            assert computer["id"] == computer_id
            assert computer["freshness"]["state"] == "online"
            (shown_lease,) = computer["leases"]
            assert shown_lease["lease_id"] == lease.lease_id
            assert shown_lease["granted_mib"] == 3072
            assert shown_lease["project"] == "linproj"
            assert computer["gpus"][0]["outstanding_mib"] == 3072
    finally:
        broker.stop(signal.SIGKILL)


def test_second_windows_coordinator_on_the_port_is_refused(
    windows_coordinator: WindowsCoordinator, wine_procs: WineProcesses
) -> None:
    """Windows' SO_REUSEADDR would let a second socket bind beside the listening one; the
    coordinator does not set it there, so the second `serve` fails in one line."""
    code, out = wine_procs.run(serve_args(windows_coordinator.data_dir, windows_coordinator.port))
    assert code == EXIT_ADDRESS_IN_USE, out
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    assert lines[0].startswith(
        f"rbroker-server: cannot listen on 127.0.0.1:{windows_coordinator.port}: "
    ), out
    assert "another process (another coordinator?) listens there" in lines[0]
    assert httpx.get(windows_coordinator.url + "/healthz", timeout=5).status_code == 200
