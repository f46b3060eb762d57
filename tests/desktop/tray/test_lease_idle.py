"""The tray's lease table says what the broker measured of a lease's idleness (issue 42;
docs/architecture.md §3 "Idle") in the words of `rbroker status`: `idle 2 h 10 min`,
`idle: unknown`, nothing more for an active lease; its tool tip says what idle means."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtGui import Qt
from pytestqt.qtbot import QtBot

import rbroker
from rbroker.gpu.nvml import in_child_pid_namespace
from rbroker.tray.app import TrayApp
from rbroker.tray.models import LeasesModel
from tests.conftest import GPU0, SINGLE_24G, BrokerProcess

TIMEOUT_MS = 10_000
NOW = 1_800_000_000.0
TIP = Qt.ItemDataRole.ToolTipRole


def _lease(lease_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "lease_id": lease_id,
        "owner": "<b>maria</b>",
        "project": "vision",
        "session": "run-42",
        "purpose": "fine-tune ViT-B",
        "granted_mib": 8192,
        "gpu_uuids": [GPU0],
        "state": "active",
        "granted_at": NOW - 125,
        "expires_in_s": 27.4,
        "observed_mib": {GPU0: 6000},
        "over_grant": False,
        **extra,
    }


def test_the_state_cell_says_idle_and_the_tip_what_idle_means(qtbot: QtBot) -> None:
    model = LeasesModel()
    model.set_rows(
        [
            _lease("lease-a", idle_state="idle", idle_s=2 * 3600 + 600.0),
            _lease("lease-b", idle_state="unknown", idle_s=None, over_grant=True),
            _lease("lease-c", idle_state="active", idle_s=12.0),
            _lease("lease-d"),  # from a broker older than the idle fields
        ],
        NOW,
    )

    def cell(row: int, col: int, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        return model.data(model.index(row, col), role)

    states = [cell(r, LeasesModel.STATE) for r in range(4)]
    assert states == ["idle 2 h 10 min", "idle: unknown · over grant", "active", "active"]
    idle_tip = cell(0, LeasesModel.STATE, TIP)
    assert idle_tip.startswith("idle 2 h 10 min\nIdle: no GPU utilization by the lease's ")
    assert "no job progress for the broker's idle_after_s" in idle_tip
    unknown_tip = cell(1, LeasesModel.STATE, TIP)
    assert unknown_tip.startswith("idle: unknown · over grant\nUnknown: the GPU utilization")
    assert "never counted idle" in unknown_tip and "idle_after_s" in unknown_tip
    assert cell(2, LeasesModel.STATE, TIP) == "active"  # nothing extra
    for row in range(4):  # the owner's name stays the text it is; the tips are plain text
        assert cell(row, LeasesModel.OWNER) == "<b>maria</b>"
        assert not Qt.mightBeRichText(cell(row, LeasesModel.STATE, TIP))


@pytest.mark.contract  # it starts a broker process
def test_the_window_shows_a_lease_idle_and_busy_again(
    qtbot: QtBot,
    broker_factory: Callable[..., BrokerProcess],
    make_tray: Callable[..., TrayApp],
    tmp_path: Path,
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("[idle]\nidle_after_s = 1\n")
    bp = broker_factory(SINGLE_24G, extra_args=["--config", str(config)])
    # NVML's pids are the host's: from another pid namespace utilization cannot be read
    expected = "idle: unknown" if in_child_pid_namespace() else "idle "
    tray = make_tray(bp.socket)
    leases = tray.window.local.leases

    def state() -> str:
        assert leases.rowCount() == 1
        return str(leases.data(leases.index(0, LeasesModel.STATE)))

    with rbroker.lease(2000, socket=bp.socket) as lease, bp.client() as c:
        c.sim_allocate(1000, lease.gpu_uuid)  # this process is listed on the GPU, unused
        qtbot.waitUntil(lambda: state().startswith(expected), timeout=TIMEOUT_MS)
        tip = str(leases.data(leases.index(0, LeasesModel.STATE), TIP))
        assert "no GPU utilization by the lease's processes" in tip
        if expected == "idle: unknown":
            return
        c.call("sim.set", gpu_uuid=GPU0, process_utilization={str(os.getpid()): 50})
        qtbot.waitUntil(lambda: state() == "active", timeout=TIMEOUT_MS)
        assert leases.data(leases.index(0, LeasesModel.STATE), TIP) == "active"
