"""A graceful stop (SIGTERM, Ctrl-C: what `systemctl restart` and an upgrade send) keeps
every live lease: connected clients are told `broker.stopping {leases_kept: true}`, the
restarted broker restores the leases exactly as after a crash, and the holders' SDK
re-attaches. Only `--release-all-on-exit` ends them.

Before: SIGTERM ended every lease ("holder connection closed") while kill -9 kept them.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import SINGLE_24G, BrokerProcess, start_broker, wait_until
from tests.desktop.conftest import RawConnection, WorkerProcess

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

HEADROOM = 1024


def test_sigterm_keeps_leases_for_the_restarted_broker(
    short_dir: Path, worker: Callable[..., WorkerProcess]
) -> None:
    broker: BrokerProcess = start_broker(SINGLE_24G, headroom_mib=HEADROOM, root=short_dir)
    try:
        holder = worker("hold_lease", broker.socket, "6144", "graceful", "0")
        lease_id = holder.read_line().split()[1]
        watcher = RawConnection(broker.socket)
        try:
            assert broker.stop(signal.SIGTERM) == 0
            notice = watcher.read_message()
        finally:
            watcher.close()
        assert notice == {
            "jsonrpc": "2.0",
            "method": "broker.stopping",
            "params": {"leases_kept": True},
        }
        broker = start_broker(SINGLE_24G, headroom_mib=HEADROOM, root=short_dir)
        with broker.client() as c:
            (lease,) = c.leases()["leases"]
            assert lease["lease_id"] == lease_id and lease["restored"]
            # past the re-attach grace: still there, because its SDK came back
            wait_until(lambda: "re-attached by its holder" in broker.log(), timeout_s=15)
            (gpu,) = c.gpus()
            assert gpu["outstanding_mib"] == 6144
            assert [x["lease_id"] for x in c.leases()["leases"]] == [lease_id]
    finally:
        broker.stop(signal.SIGKILL)


def test_release_all_on_exit_ends_every_lease(
    short_dir: Path, worker: Callable[..., WorkerProcess]
) -> None:
    args = ["--release-all-on-exit"]
    broker = start_broker(SINGLE_24G, headroom_mib=HEADROOM, root=short_dir, extra_args=args)
    try:
        holder = worker("hold_lease", broker.socket, "6144", "release-all", "0")
        lease_id = holder.read_line().split()[1]
        assert broker.stop(signal.SIGTERM) == 0
        broker = start_broker(SINGLE_24G, headroom_mib=HEADROOM, root=short_dir)
        with broker.client() as c:
            assert c.leases()["leases"] == []
            (gpu,) = c.gpus()
        assert gpu["outstanding_mib"] == 0
        assert f"lease {lease_id} released: the broker stopped (release all on exit)" in (
            broker.log()
        )
    finally:
        broker.stop(signal.SIGKILL)
