"""A full data directory loses nothing and invents nothing (docs/architecture.md §3,
"Storage faults"): on a real, small, full file system (a 4 MiB tmpfs mounted for the test),
a grant that the lease journal cannot keep refuses its request in one line,
`storage_unavailable`, and books nothing: the GPU's room is what it was, and no lease that
belongs to nobody is left (a refused 1 024 MiB request used to leave leases in the books
that no one held). Once there is room, requests are granted again, and a restart restores
exactly the leases that were granted. On the in-process broker (manual clock)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rbroker.broker.leases import Lease
from rbroker_protocol.errors import ErrorCode, RpcError
from tests.conftest import SINGLE_24G
from tests.desktop.inprocess import InProcessBroker, SleeperPool

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0 or shutil.which("mount") is None,
    reason="mounts a small tmpfs: Linux, as root (CI is)",
)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs at `tmp_path/disk`, unmounted at the end."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "rbt-small", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path) -> Path:
    """Fill `disk` to the last byte with one file; its path."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        with contextlib.suppress(OSError):  # the last partial block, a byte at a time
            while True:
                f.write(b"\0")
    return filler


def _available(h: InProcessBroker) -> int:
    return int(h.broker.gpus_view()[0]["available_mib"])


def test_a_grant_the_disk_cannot_keep_is_refused_and_books_nothing(
    small_disk: Path, pool: SleeperPool
) -> None:
    scenario = small_disk.parent / "scenario.toml"
    scenario.write_text(SINGLE_24G)
    h = InProcessBroker(scenario, small_disk / "data", persist=True)
    try:
        first = h.acquire(pool.spawn()[1], mib=1024).result()
        filler = _fill(small_disk)
        granted: list[Lease] = [first]
        refused: RpcError | None = None
        # the journal's last block may still take a few lines: ask until it is full
        for _ in range(50):
            before = _available(h)
            task = h.acquire(pool.spawn()[1], mib=1024)
            h.spin()
            exc = task.exception()
            if exc is None:
                granted.append(task.result())
                continue
            assert isinstance(exc, RpcError), exc
            refused = exc
            assert _available(h) == before  # nothing booked
            break
        assert refused is not None, "the full disk never refused a grant"
        assert refused.name is ErrorCode.STORAGE_UNAVAILABLE
        assert "\n" not in refused.message and "data directory" in refused.message
        assert refused.data["reason"]
        assert {x.lease_id for x in h.broker.leases.values()} == {x.lease_id for x in granted}
        assert not h.broker.queue
        filler.unlink()  # room again
        again = h.acquire(pool.spawn()[1], mib=1024).result()
        granted.append(again)
        h.restart()
        assert set(h.broker.leases) == {x.lease_id for x in granted}
    finally:
        h.close()
