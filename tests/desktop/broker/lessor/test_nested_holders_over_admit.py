"""Reproduction: nested holders — a process that holds a lease and a child process that holds
its own lease — over-admit when the child uses more than its grant (docs/architecture.md §2).

The child's memory is in both holders' trees, so both leases "observe" it. The
`unbacked_mib` cap keeps only what device_used can hold of the holders' processes (the
child's once), but the cap is computed against Σ min(granted, observed), and the child's
use beyond its own grant is counted as use of the parent's lease too: the parent's unused
grant is no longer booked, and a third holder is admitted into it.
"""

from __future__ import annotations

from collections.abc import Callable

import rbroker
from tests.conftest import BrokerProcess, wait_until
from tests.desktop.conftest import WorkerProcess

TOTAL, HEADROOM = 24576, 1024


def test_child_over_its_grant_does_not_unbook_the_parents_unused_grant(
    broker_factory: Callable[..., BrokerProcess], worker: Callable[..., WorkerProcess]
) -> None:
    broker = broker_factory(headroom_mib=HEADROOM)
    with broker.client() as c:
        # this test process is the parent holder: 4096 MiB granted, nothing allocated
        c.call("lease.acquire", mib=4096, project="t", session="parent", purpose="parent")
        # its child holds 4096 MiB and uses 6000 (1904 over its grant)
        w = worker("sim_worker", broker.socket, "--lease", "4096", "--after", "6000")
        while w.read_line() != "ready":
            pass
        wait_until(lambda: c.gpus()[0]["device_used_mib"] == 6000, timeout_s=5)
        wait_until(lambda: c.gpus()[0]["leased_in_use_mib"] > 0, timeout_s=5)
        gpu = c.gpus()[0]
        # committed: the child's 6000 in use + the parent's 4096 granted, not yet allocated
        assert gpu["available_mib"] <= TOTAL - HEADROOM - 6000 - 4096, gpu
        parent = next(x for x in c.leases()["leases"] if x["session"] == "parent")
        assert parent["over_grant"] is False, parent  # the parent uses nothing itself
        # and so a third holder asking for what is really left beyond that is refused
        with rbroker.Client(broker.socket) as other:
            try:
                other.call(
                    "lease.acquire",
                    mib=TOTAL - HEADROOM - 6000 - 4096 + 1,
                    project="t",
                    session="third",
                    purpose="third",
                )
            except rbroker.CapacityUnavailable:
                pass
            else:
                raise AssertionError("over-admitted: the parent's unused grant was given away")
