"""A stopping broker sends one last report that says so, and the fleet shows the computer
offline at once ("broker stopped") with its last known values, rather than online, then
stale, then offline minutes later. A new run brings it back online.

Real broker processes with their reporters, a real coordinator process, real signed reports.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

from tests.conftest import SINGLE_24G, start_broker, wait_until
from tests.e2e.conftest import CoordinatorProcess, UplinkBroker


def test_a_stopped_broker_shows_offline_at_once(
    coordinator_factory: Callable[..., CoordinatorProcess],
    uplink_broker: Callable[..., UplinkBroker],
) -> None:
    # thresholds far longer than the test: only the last report can make it offline
    c = coordinator_factory(stale_after_s=600.0, offline_after_s=1200.0)
    ub = uplink_broker(c, "lab-stop")
    try:
        wait_until(
            lambda: c.computer(ub.computer_id)["freshness"]["state"] == "online", timeout_s=30
        )
        assert ub.broker.stop(signal.SIGTERM) == 0
        stopped = c.computer(ub.computer_id)
        assert stopped["freshness"]["state"] == "offline", stopped["freshness"]
        assert stopped["freshness"]["text"].startswith("offline (broker stopped); last known")
        assert [g["uuid"] for g in stopped["gpus"]]  # the last known values stay
        assert "last report (stopping) sent" in ub.broker.log()

        ub.broker = start_broker(SINGLE_24G, root=ub.broker.scenario.parent)
        wait_until(
            lambda: c.computer(ub.computer_id)["freshness"]["state"] == "online", timeout_s=30
        )
    finally:
        ub.broker.stop(signal.SIGKILL)
