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
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import WORKER, BrokerProcess

NOBODY = 65534

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to act as another user"
)


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
