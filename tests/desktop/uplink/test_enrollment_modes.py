"""Every file the broker and the enrollment write gets its mode from rbroker, never from the
umask (0002 and 0000 here: a group-writable or world-writable default), and the enrollment
(`uplink.json`, `computer.key`) is refused when another account could have written it: one
line naming the file, its mode and owner, and the fix. POSIX only: on Windows the data
folder's ACL (`rbroker.hosting.win_acl`) keeps others out."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nacl.signing
import pytest

from rbroker.base.startup import check_broker_paths
from rbroker.broker.store import LeaseStore
from rbroker.hosting.host import DataDirLock
from rbroker.uplink.config import FILE_NAME, UnsafeEnrollment, UplinkConfig
from rbroker.uplink.enroll import EnrollError, enroll
from rbroker.uplink.fleet import FleetError, fetch_fleet
from rbroker.uplink.keys import FileKeyStore, KeyStoreError
from rbroker.uplink.runner import run_uplink
from rbroker.uplink.runs import RunCounter

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")

CONFIG = UplinkConfig(url="https://coordinator.example", computer_id="c-1", group="g", name="n")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture(params=[0o002, 0o000], ids=["umask-002", "umask-000"])
def open_umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def test_uplink_json_is_0600_in_a_0700_dir(tmp_path: Path, open_umask: int) -> None:
    data = tmp_path / "state" / "rbroker"
    CONFIG.save(data)
    assert _mode(data / FILE_NAME) == 0o600
    assert _mode(data) == 0o700
    assert _mode(tmp_path / "state") == 0o700  # a parent it made too
    assert sorted(p.name for p in data.iterdir()) == [FILE_NAME]  # no temporary file left
    CONFIG.save(data)  # replaced: the new file is 0600 as well
    assert _mode(data / FILE_NAME) == 0o600
    assert UplinkConfig.load(data) == CONFIG


def test_computer_key_is_0600(tmp_path: Path, open_umask: int) -> None:
    store = FileKeyStore(tmp_path / "rbroker" / "computer.key")
    key = nacl.signing.SigningKey.generate()
    store.save(key)
    assert _mode(store.path) == 0o600
    assert _mode(store.path.parent) == 0o700
    loaded = store.load()
    assert loaded is not None and bytes(loaded) == bytes(key)


def test_run_counter_is_0600(tmp_path: Path, open_umask: int) -> None:
    runs = RunCounter(tmp_path / "rbroker")
    assert runs.next() == 1
    assert runs.next() == 2
    assert _mode(runs.path) == 0o600
    assert _mode(runs.path.parent) == 0o700
    assert sorted(p.name for p in runs.path.parent.iterdir()) == ["run_counter"]


def test_lease_store_journal_and_lock_are_0600(tmp_path: Path, open_umask: int) -> None:
    data = tmp_path / "state" / "rbroker"
    check_broker_paths(str(tmp_path / "run" / "rbroker.sock"), data)  # as `rbroker broker`
    assert _mode(data) == 0o700
    assert _mode(tmp_path / "state") == 0o700
    assert _mode(tmp_path / "run") == 0o700
    lock = DataDirLock(data)
    store = LeaseStore(data / "broker.sqlite3")
    try:
        store.put_lease("lease-0a1b2c3d4e5f", "token", {"lease_id": "lease-0a1b2c3d4e5f"})
        modes = {p.name: _mode(p) for p in data.iterdir()}
    finally:
        store.close()
        lock.release()
    assert modes == {
        "broker.lock": 0o600,
        "broker.sqlite3": 0o600,
        "broker.sqlite3-wal": 0o600,
        "broker.sqlite3-shm": 0o600,
        "broker.leases.jsonl": 0o600,
        "broker.owed": 0o600,  # the reserve for ends a full disk could not journal
    }
    assert _mode(data) == 0o700


def test_a_lease_database_made_under_umask_0277_stays_writable(tmp_path: Path) -> None:
    old = os.umask(0o277)  # would leave a new file 0400: the next open could not write it
    try:
        LeaseStore(tmp_path / "rbroker" / "broker.sqlite3").close()
    finally:
        os.umask(old)
    assert _mode(tmp_path / "rbroker" / "broker.sqlite3") == 0o600
    assert _mode(tmp_path / "rbroker" / "broker.leases.jsonl") == 0o600
    assert _mode(tmp_path / "rbroker" / "broker.owed") == 0o600
    assert _mode(tmp_path / "rbroker") == 0o700  # not 0400 either: the dir the store made


@pytest.mark.parametrize(
    ("mode", "who"), [(0o664, "group members"), (0o646, "other users"), (0o666, "other users")]
)
def test_an_enrollment_others_can_write_is_refused(tmp_path: Path, mode: int, who: str) -> None:
    CONFIG.save(tmp_path)
    path = tmp_path / FILE_NAME
    path.chmod(mode)
    with pytest.raises(UnsafeEnrollment) as caught:
        UplinkConfig.load(tmp_path)
    line = str(caught.value)
    assert "\n" not in line
    assert line.startswith(f"refusing to read {path}: mode {mode:04o}, owner root: ")
    assert f"{who} can write it" in line
    assert line.endswith(f"fix: chmod go-w {path}")
    assert isinstance(caught.value, ValueError)  # what the readers catch as a config error


def test_an_enrollment_of_another_account_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another account needs root")
    CONFIG.save(tmp_path)
    path = tmp_path / FILE_NAME
    os.chown(path, 65534, 65534)
    with pytest.raises(UnsafeEnrollment) as caught:
        UplinkConfig.load(tmp_path)
    line = str(caught.value)
    assert line.startswith(f"refusing to read {path}: mode 0600, owner ")
    assert "uid 65534" in line and "not root or this account (root)" in line
    assert line.endswith(f"fix: chown root {path}")


def test_an_own_0644_enrollment_is_read(tmp_path: Path) -> None:
    CONFIG.save(tmp_path)
    (tmp_path / FILE_NAME).chmod(0o644)  # what earlier versions left under umask 022
    assert UplinkConfig.load(tmp_path) == CONFIG


def test_a_key_file_others_can_write_is_refused(tmp_path: Path) -> None:
    store = FileKeyStore(tmp_path / "computer.key")
    store.save(nacl.signing.SigningKey.generate())
    store.path.chmod(0o620)
    with pytest.raises(KeyStoreError) as caught:
        store.load()
    line = str(caught.value)
    assert line.startswith(f"refusing to read {store.path}: mode 0620, owner root: ")
    assert line.endswith(f"fix: chmod go-w {store.path}")


class _Broker:
    """What `run_uplink` asks of a broker: somewhere to publish the link state."""

    def __init__(self) -> None:
        self.status: Any = None

    def set_uplink_status(self, status: Any) -> None:
        self.status = status


def test_the_broker_refuses_a_group_writable_enrollment(tmp_path: Path) -> None:
    CONFIG.save(tmp_path)
    path = tmp_path / FILE_NAME
    path.chmod(0o664)
    broker = _Broker()

    async def scenario() -> str:
        task = asyncio.create_task(run_uplink(broker, tmp_path))  # type: ignore[arg-type]
        try:
            for _ in range(200):
                await asyncio.sleep(0.01)
                link = broker.status()["link"] if broker.status else ""
                if link != "not enrolled":
                    return str(link)
            return "still not enrolled"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    link = asyncio.run(scenario())
    assert link.startswith(f"config error: refusing to read {path}: mode 0664"), link
    assert link.endswith(f"fix: chmod go-w {path}")


def test_enroll_and_fleet_refuse_a_group_writable_enrollment(tmp_path: Path) -> None:
    CONFIG.save(tmp_path)
    path = tmp_path / FILE_NAME
    path.chmod(0o664)
    line = f"refusing to read {path}: mode 0664, owner root: group members can write it"
    with pytest.raises(EnrollError) as enrolling:  # before any request is sent
        enroll("https://127.0.0.1:9", "code", "n", tmp_path, new_identity=True)
    assert enrolling.value.message.startswith(line)
    with pytest.raises(FleetError) as reading:  # its token never goes to the file's URL
        fetch_fleet(tmp_path, token="viewer-token")
    assert reading.value.message.startswith(line)
    assert reading.value.message.endswith(f"fix: chmod go-w {path}")
