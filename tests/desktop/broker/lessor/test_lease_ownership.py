"""Who may use the broker and whose lease is whose (architecture.md §3, §5).

The owner of a lease is the OS user of the connecting process, read from the socket
(SO_PEERCRED), never from the request. These tests need root to act as a second user.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import WORKER, BrokerProcess

NOBODY = 65534

pytestmark = [
    pytest.mark.contract,
    pytest.mark.skipif(
        not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to act as another user"
    ),
]


def _as_nobody(broker: BrokerProcess, lease_id: str) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            str(Path(WORKER) / "as_other_user.py"),
            str(NOBODY),
            *(broker.socket, lease_id),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_other_users_cannot_reach_the_socket(broker: BrokerProcess) -> None:
    out = _as_nobody(broker, "lease-000000000000")
    assert "Permission denied" in out["unavailable"]


def test_another_user_cannot_touch_my_lease(broker: BrokerProcess) -> None:
    with broker.client() as c:
        lease_id = c.call(
            "lease.acquire", mib=2048, project="tests", session="mine", purpose="root's"
        )["lease"]["lease_id"]
        # open the socket to everyone, as a site would with a shared `rbroker` group
        os.chmod(os.path.dirname(broker.socket), 0o711)
        os.chmod(broker.socket, 0o666)
        out = _as_nobody(broker, lease_id)
        assert out["owner"] == "nobody"
        assert out["lease.renew"] == "not_lease_owner"
        assert out["lease.release"] == "not_lease_owner"
        assert out["lease.resize"] == "not_lease_owner"
        assert out["acquired_owner"] == "nobody"
        mine = [x for x in c.leases()["leases"] if x["lease_id"] == lease_id]
        assert mine and mine[0]["owner"] == getpass.getuser()
        assert mine[0]["state"] == "active" and mine[0]["granted_mib"] == 2048


def _rbroker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rbroker", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_an_admin_cancels_another_users_waiter_and_ends_their_lease(
    broker: BrokerProcess,
) -> None:
    """The operator guide's shared-server example, with two real OS users: root and `nobody` hold
    10 000 MiB each of the 23 347 usable and `nobody` waits for 5 000 more; root (an
    administrator of every broker) cancels the waiting request with `rbroker release req-N`,
    then ends `nobody`'s lease with `rbroker release ID`. `nobody`'s own processes are told
    each time."""
    os.chmod(os.path.dirname(broker.socket), 0o711)
    os.chmod(broker.socket, 0o666)
    mine = broker.client()
    mine.call("lease.acquire", mib=10000, project="tests", session="root", purpose="root's")
    worker = subprocess.Popen(
        [sys.executable, str(Path(WORKER) / "hold_and_wait_as.py"), str(NOBODY), broker.socket,
         "10000", "5000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert worker.stdout is not None
        held = worker.stdout.readline().split()
        assert held[:1] == ["held"], (held, worker.stderr.read() if worker.stderr else "")
        lease_id = held[1]
        with broker.client() as c:
            deadline = time.monotonic() + 20
            while not c.leases()["queue"] and time.monotonic() < deadline:
                time.sleep(0.05)
            (request,) = c.leases()["queue"]
        assert request["owner"] == "nobody"
        cancel = _rbroker("release", "--socket", broker.socket, f"req-{request['request_id']}")
        assert cancel.returncode == 0, cancel.stderr
        assert cancel.stdout.startswith(
            f"cancelled req-{request['request_id']} (5 000 MiB, nobody: "
        ), cancel.stdout
        told = worker.stdout.readline()
        assert told.startswith("waiter cancelled request cancelled by admin root"), told
        end = _rbroker("release", "--socket", broker.socket, lease_id[len("lease-") :][:8])
        assert end.returncode == 0, end.stderr
        assert end.stdout.startswith(f"released {lease_id} (10 000 MiB, "), end.stdout
        assert end.stdout.strip().endswith("nobody's lease, released by admin root"), end.stdout
        lost = worker.stdout.readline()
        assert lost.startswith("lost ") and "released by admin root" in lost, lost
        assert worker.wait(30) == 0
        with broker.client() as c:
            view = c.leases()
        assert view["queue"] == [] and [x["session"] for x in view["leases"]] == ["root"]
    finally:
        mine.close()
        if worker.poll() is None:
            worker.kill()
        worker.communicate(timeout=10)
