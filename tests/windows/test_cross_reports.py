"""A Windows computer reporting to a coordinator on Linux: `rbroker enroll` under Wine keeps the
key in Windows Credential Manager (keyring's WinVaultKeyring), the Windows broker on a named
pipe reads it and signs its reports, and the Linux coordinator's fleet shows that computer and
a lease taken by a second Windows process.

Run from Linux; each Windows process runs under Wine through `.ci/wine python`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_until
from tests.e2e.conftest import CoordinatorProcess, by_name, setup_coordinator
from tests.windows.wine import SKIP_REASON, WINE_READY, unix_to_wine
from tests.windows.winprocs import WineProcesses, wine_procs

pytestmark = pytest.mark.skipif(not WINE_READY, reason=SKIP_REASON)
__all__ = ["wine_procs"]  # the fixture, used by name

HOLD = """
import sys, time
import rbroker
with rbroker.lease(int(sys.argv[2]), socket=sys.argv[1], project="winproj",
                   purpose="held from Windows") as lease:
    print("LEASED", lease.lease_id, flush=True)
    time.sleep(600)
"""

FORGET_KEY = """
import sys
from pathlib import Path
from rbroker.uplink.keys import KeyringKeyStore
KeyringKeyStore(Path(sys.argv[1])).delete()
print("forgotten", flush=True)
"""


@pytest.fixture
def linux_coordinator(tmp_path: Path) -> Iterator[CoordinatorProcess]:
    """A coordinator serving on Linux (SQLite, plain HTTP on 127.0.0.1)."""
    coordinator = setup_coordinator(tmp_path)
    coordinator.start()
    yield coordinator
    coordinator.stop()


@pytest.fixture
def win_data_dir(tmp_path: Path, wine_procs: WineProcesses) -> Iterator[Path]:
    """A broker data dir for the Windows side; its Credential Manager entry is removed at
    teardown (the Wine prefix is shared by every run)."""
    data = tmp_path / "win-data"
    data.mkdir()
    yield data
    forget = WineProcesses()
    try:
        forget.run(["-c", FORGET_KEY, unix_to_wine(data)], timeout_s=60)
    finally:
        forget.stop_all()


def test_windows_broker_reports_lease_to_linux_coordinator(
    linux_coordinator: CoordinatorProcess, win_data_dir: Path, wine_procs: WineProcesses
) -> None:
    name = f"winbox-{uuid.uuid4().hex[:6]}"
    data_win = unix_to_wine(win_data_dir)
    code, out = wine_procs.run(
        ["-m", "rbroker", "enroll", linux_coordinator.url, linux_coordinator.first_code,
         "--name", name, "--data-dir", data_win],
    )  # fmt: skip
    assert code == 0, out
    assert "private key kept in Windows Credential Manager" in out, out
    assert not (win_data_dir / "computer.key").exists()
    uplink = json.loads((win_data_dir / "uplink.json").read_text())
    assert uplink["key_backend"] == "keyring"

    pipe = rf"\\.\pipe\rbroker-cross-{uuid.uuid4().hex[:8]}"
    broker = wine_procs.start(
        ["-m", "rbroker", "broker", "--simulate", "--socket", pipe,
         "--machine-lock", "per-socket", "--data-dir", data_win],
    )  # fmt: skip
    broker.wait_for("listening on", timeout_s=120)
    holder = wine_procs.start(["-c", HOLD, pipe, "1234"])
    holder.wait_for("LEASED", timeout_s=120)
    lease_id = holder.output.split("LEASED", 1)[1].split()[0]

    def shown() -> dict[str, Any] | None:
        computer = by_name(linux_coordinator.fleet()).get(name)
        if computer is None or not computer["leases"]:
            return None
        return computer

    computer = wait_until(shown, timeout_s=60, interval_s=0.5)
    assert isinstance(computer, dict)
    assert computer["id"] == uplink["computer_id"]
    assert computer["freshness"]["state"] == "online"
    assert computer["telemetry_source"] == "simulated"
    (lease,) = computer["leases"]
    assert lease["lease_id"] == lease_id
    assert lease["granted_mib"] == 1234
    assert lease["project"] == "winproj"
    assert lease["purpose"] == "held from Windows"
    assert "\\" in lease["owner"], lease["owner"]  # a Windows account: DOMAIN\user
    assert sum(g["outstanding_mib"] for g in computer["gpus"]) == 1234


def test_windows_broker_without_its_key_names_where_it_looked(
    linux_coordinator: CoordinatorProcess, win_data_dir: Path, wine_procs: WineProcesses
) -> None:
    """Enrolled into Credential Manager, then the entry removed: the broker still serves
    leases, reports nothing, and says which store, entry and OS account it looked in."""
    name = f"winbox-{uuid.uuid4().hex[:6]}"
    data_win = unix_to_wine(win_data_dir)
    code, out = wine_procs.run(
        ["-m", "rbroker", "enroll", linux_coordinator.url, linux_coordinator.first_code,
         "--name", name, "--data-dir", data_win],
    )  # fmt: skip
    assert code == 0, out
    code, out = wine_procs.run(["-c", FORGET_KEY, data_win], timeout_s=60)
    assert code == 0, out

    pipe = rf"\\.\pipe\rbroker-cross-{uuid.uuid4().hex[:8]}"
    broker = wine_procs.start(
        ["-m", "rbroker", "broker", "--simulate", "--socket", pipe,
         "--machine-lock", "per-socket", "--data-dir", data_win],
    )  # fmt: skip
    broker.wait_for("listening on", timeout_s=120)

    def link() -> str | None:
        code, out = wine_procs.run(["-m", "rbroker", "status", "--socket", pipe, "--json"])
        assert code == 0, out
        text = str(json.loads(out)["status"]["coordinator"]["link"])
        return text if text.startswith("key unavailable") else None

    text = wait_until(link, timeout_s=90, interval_s=1)
    assert "the private key is not in Windows Credential Manager of OS account" in str(text)
    assert "--key-file" in str(text)  # the fix is named
    assert "Traceback" not in broker.output, broker.output
    computer = by_name(linux_coordinator.fleet())[name]
    assert computer["reports_applied"] == 0
