"""The broker's data dir and lease database are private under the default umask 022: the
dir 0700, `broker.sqlite3`, its WAL and SHM files and the lease journal beside it 0600 (an
older, more open file is tightened when the store opens it)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from rbroker.base.startup import check_broker_paths
from rbroker.broker.store import LeaseStore

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _files(data: Path) -> dict[str, int]:
    names = ("broker.sqlite3", "broker.sqlite3-wal", "broker.sqlite3-shm", "broker.leases.jsonl")
    return {n: _mode(data / n) for n in names if (data / n).exists()}


def test_a_new_data_dir_and_lease_database_are_private(tmp_path: Path, umask_022: None) -> None:
    data = tmp_path / "state" / "rbroker"
    check_broker_paths(str(tmp_path / "run" / "rbroker.sock"), data)  # as `rbroker broker`
    assert _mode(data) == 0o700
    store = LeaseStore(data / "broker.sqlite3")
    try:
        store.put_lease("lease-0a1b2c3d4e5f", "token", {"lease_id": "lease-0a1b2c3d4e5f"})
        files = _files(data)
        assert "broker.sqlite3-wal" in files and "broker.sqlite3-shm" in files
        assert "broker.leases.jsonl" in files
        assert files == dict.fromkeys(files, 0o600)
    finally:
        store.close()
    assert _mode(data) == 0o700


def test_an_open_lease_database_is_tightened(tmp_path: Path, umask_022: None) -> None:
    data = tmp_path / "rbroker"
    LeaseStore(data / "broker.sqlite3").close()
    data.chmod(0o755)
    (data / "broker.sqlite3").chmod(0o644)
    (data / "broker.leases.jsonl").chmod(0o644)
    store = LeaseStore(data / "broker.sqlite3")
    try:
        store.put_lease("lease-0a1b2c3d4e5f", "token", {"lease_id": "lease-0a1b2c3d4e5f"})
        assert _mode(data) == 0o750
        files = _files(data)
        assert files == dict.fromkeys(files, 0o600)
    finally:
        store.close()
