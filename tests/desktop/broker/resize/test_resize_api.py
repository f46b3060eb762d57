"""`lease.resize` over the local API and `Lease.resize()` in the SDK, against a real broker
process (docs/architecture.md §3, §5): the lease keeps its id, owner and descriptions; a
shrink admits another process's waiting request at once; bad input is a JSON-RPC error with
a stable name, its number and the figures, and the lease is unchanged. (Another user's lease:
tests/desktop/broker/lessor/test_lease_ownership.py; the admission rules:
tests/desktop/broker/resize/test_resize.py.)
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

import rbroker
from rbroker_protocol.localapi import MAX_MIB
from tests.conftest import WORKER, BrokerProcess
from tests.desktop.conftest import RawConnection, WorkerProcess

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

DESCRIPTION = {"project": "tests", "session": "resize", "purpose": "resize over the API"}


def _lease_row(broker: BrokerProcess, lease_id: str) -> dict[str, Any]:
    with broker.client() as c:
        (row,) = [x for x in c.leases()["leases"] if x["lease_id"] == lease_id]
    return dict(row)


def test_sdk_resize_keeps_the_lease_and_changes_the_grant(broker: BrokerProcess) -> None:
    with rbroker.lease(8192, socket=broker.socket, **DESCRIPTION) as lease:
        lease_id = lease.lease_id
        assert lease.resize(4096) is lease
        assert lease.granted_mib == 4096 and lease.lease_id == lease_id
        row = _lease_row(broker, lease_id)
        assert row["granted_mib"] == 4096
        assert (row["project"], row["session"], row["purpose"]) == tuple(DESCRIPTION.values())
        lease.resize(12000, wait_s=10)
        assert lease.granted_mib == 12000 == _lease_row(broker, lease_id)["granted_mib"]
        assert lease.memory_fraction == 0.488281  # 12 000 of 24 576, rounded down
        with pytest.raises(rbroker.Infeasible) as info:
            lease.resize(30000)
        assert info.value.data["usable_mib"] == 23347
        assert lease.granted_mib == 12000 == _lease_row(broker, lease_id)["granted_mib"]


def test_sdk_shrink_admits_another_processes_waiting_request(
    broker: BrokerProcess, worker: Callable[..., WorkerProcess]
) -> None:
    # the holder and the waiter are siblings: a waiter inside the holder's process (or a
    # child of it) that fits only once the holder's lease ends is refused at once (§3)
    holder = subprocess.Popen(
        [sys.executable, "-u", str(WORKER / "resize_on_line.py"), broker.socket, "20000"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline().startswith(b"granted ")
        waiting = worker("hold_lease", broker.socket, "10000", "waiter", "60")
        deadline = time.monotonic() + 10
        while True:
            with broker.client() as c:
                if c.leases()["queue"]:
                    break
            assert time.monotonic() < deadline, "the request never queued"
            time.sleep(0.05)
        started = time.monotonic()
        holder.stdin.write(b"10000\n")
        holder.stdin.flush()
        assert holder.stdout.readline() == b"resized 10000\n"
        line = waiting.read_line()
        assert line.startswith("granted "), line
        # at once (within a sample's time): without the shrink it would wait its whole 60 s
        assert time.monotonic() - started < 10.0
    finally:
        holder.kill()
        holder.wait(10)
        holder.stdin.close()
        holder.stdout.close()


@pytest.mark.parametrize(
    ("params", "name", "number", "data"),
    [
        ({"mib": 0}, "invalid_params", -32602, {"requested_mib": 0, "min_mib": 1}),
        ({"mib": -4096}, "invalid_params", -32602, {"requested_mib": -4096, "max_mib": MAX_MIB}),
        ({"mib": MAX_MIB + 1}, "invalid_params", -32602, {"requested_mib": MAX_MIB + 1}),
        ({"mib": "8192"}, "invalid_params", -32602, {"fields": ["mib"]}),
        ({"mib": True}, "invalid_params", -32602, {"fields": ["mib"]}),
        ({"mib": 1024, "wait_s": -1}, "invalid_params", -32602, {"fields": ["wait_s"]}),
        ({"mib": 30000}, "infeasible", -32011, {"requested_mib": 30000, "usable_mib": 23347}),
        ({"mib": 1024, "lease_id": "lease-000000000000"}, "lease_not_found", -32020, {}),
    ],
)
def test_bad_resizes_are_errors_with_numbers_and_leave_the_lease_unchanged(
    broker: BrokerProcess,
    raw_connect: Callable[[str], RawConnection],
    params: dict[str, Any],
    name: str,
    number: int,
    data: dict[str, Any],
) -> None:
    raw = raw_connect(broker.socket)
    raw.hello()
    granted = raw.request("lease.acquire", {"mib": 4096, **DESCRIPTION})["result"]["lease"]
    answer = raw.request("lease.resize", {"lease_id": granted["lease_id"], **params})
    error = answer["error"]
    assert error["code"] == number and error["data"]["name"] == name, error
    for key, value in data.items():
        assert error["data"][key] == value, (key, error)
    assert _lease_row(broker, granted["lease_id"])["granted_mib"] == 4096
    assert raw.request("leases.list", {})["result"]["queue"] == []


def test_a_second_resize_while_one_waits_is_refused(
    broker: BrokerProcess,
    raw_connect: Callable[[str], RawConnection],
    worker: Callable[..., WorkerProcess],
) -> None:
    raw = raw_connect(broker.socket)
    raw.hello()
    mine = raw.request("lease.acquire", {"mib": 4096, **DESCRIPTION})["result"]["lease"]
    # 1 251 MiB left, held by another process: a growth that fits only once this process's
    # own other leases end is refused at once (architecture.md §3)
    other = worker("hold_lease", broker.socket, "18000", "other", "0").read_line()
    assert other.startswith("granted "), other
    growth = raw.send_request(
        "lease.resize", {"lease_id": mine["lease_id"], "mib": 8192, "wait_s": 30}
    )
    deadline = time.monotonic() + 10
    while not any(q["resize_of"] for q in raw.request("leases.list", {})["result"]["queue"]):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    second = raw.request("lease.resize", {"lease_id": mine["lease_id"], "mib": 2048})["error"]
    assert second["code"] == -32023 and second["data"]["name"] == "resize_pending"
    assert second["data"]["pending_mib"] == 8192 and second["data"]["granted_mib"] == 4096
    assert _lease_row(broker, mine["lease_id"])["granted_mib"] == 4096
    raw.request("lease.release", {"lease_id": mine["lease_id"]})
    ended = raw.read_answer(growth)["error"]
    assert ended["data"]["name"] == "lease_expired"
    gone = raw.request("lease.resize", {"lease_id": mine["lease_id"], "mib": 2048})["error"]
    assert gone["data"]["name"] == "lease_not_found" and gone["data"]["state"] == "released"
