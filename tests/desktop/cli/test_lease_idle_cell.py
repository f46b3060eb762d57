"""The lease table's state cell shows what the broker measured of a lease's idleness
(issue 42; docs/architecture.md §3 "Idle"): `idle 2 h 10 min`, `idle: unknown`, else the
lease's state — also for a broker older than the idle fields."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rbroker.cli.main import main
from rbroker.cli.views import lease_state, lease_table
from rbroker.gpu.nvml import in_child_pid_namespace
from rbroker_protocol.results import ListedLease
from tests.conftest import GPU0, SINGLE_24G, BrokerProcess, wait_until


def _lease(**idle: Any) -> ListedLease:
    lease: dict[str, Any] = {
        "lease_id": "lease-0123456789abcdef",
        "gpu_uuid": GPU0,
        "gpu_uuids": [GPU0],
        "granted_mib": 4096,
        "owner": "alice",
        "project": "p",
        "session": "s",
        "purpose": "x",
        "state": "active",
        "granted_at": 0.0,
        "renewed_at": 0.0,
        "ttl_s": 30.0,
        "expires_in_s": 20.0,
        "waited_s": 0.0,
        "observed_mib": {GPU0: 1000},
        "over_grant": False,
        "over_grant_mib": 0,
        "over_grant_noticed": False,
        "adopt": False,
        "admission": {},
        "ended_reason": "",
        "ended_at": 0.0,
        "restored": False,
        "job_id": None,
        "gpu_telemetry": {GPU0: "ok"},
        "flags": [],
        **idle,
    }
    return lease  # type: ignore[return-value]


def test_the_state_cell_says_idle_and_for_how_long() -> None:
    assert lease_state(_lease(idle_state="idle", idle_s=2 * 3600 + 600.0)) == "idle 2 h 10 min"
    assert lease_state(_lease(idle_state="unknown", idle_s=None)) == "idle: unknown"
    assert lease_state(_lease(idle_state="active", idle_s=12.0)) == "active"
    assert lease_state(_lease()) == "active"  # an older broker


def test_the_lease_table_shows_it() -> None:
    sheet = lease_table([_lease(idle_state="idle", idle_s=7800.0)])
    assert "idle 2 h 10 min" in sheet.plain()


@pytest.mark.contract  # it starts a broker process
def test_rbroker_status_shows_a_lease_idle_and_busy_again(
    broker_factory: Callable[..., BrokerProcess],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("[idle]\nidle_after_s = 1\n")
    bp = broker_factory(SINGLE_24G, extra_args=["--config", str(config)])
    # NVML's pids are the host's: from another pid namespace utilization cannot be read
    expected = "idle: unknown" if in_child_pid_namespace() else "idle "

    def row() -> str:
        capsys.readouterr()
        assert main(["status", "--socket", bp.socket]) == 0
        out = capsys.readouterr().out
        return next(line for line in out.splitlines() if line.startswith("lease-"))

    with bp.client() as c:
        c.call("lease.acquire", mib=2000, project="p", session="s", purpose="x")
        c.call("sim.allocate", mib=1000)  # this process is listed on the GPU
        assert wait_until(lambda: expected in row(), timeout_s=10)
        if expected == "idle: unknown":
            return
        c.call("sim.set", gpu_uuid=GPU0, process_utilization={str(os.getpid()): 50})
        assert wait_until(lambda: "idle" not in row(), timeout_s=10)
        assert " active " in row()
