"""The Fleet tab against a real coordinator process: an enrolled broker reports, and the
tray reads the group's fleet signed with that computer's key (architecture.md §7)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import pytest
from pytestqt.qtbot import QtBot

import rbroker
from rbroker.tray.app import TrayApp
from rbroker.tray.fleet import UplinkFleet
from tests.conftest import GPU0, wait_until

if importlib.util.find_spec("litestar") is None:  # pragma: no cover - server extra missing
    pytest.skip("needs rbroker[server] for the coordinator", allow_module_level=True)

from tests.e2e.conftest import (  # after the skip: it needs the server extra
    CoordinatorProcess,
    UplinkBroker,
    coordinator,  # noqa: F401 - fixtures used by name
    shared_coordinator,  # noqa: F401
    uplink_broker,  # noqa: F401
)

pytestmark = pytest.mark.slow


@pytest.fixture
def tray_for(make_tray: Callable[..., TrayApp]) -> Callable[[UplinkBroker], TrayApp]:
    def make(ub: UplinkBroker) -> TrayApp:
        data_dir = ub.broker.data_dir
        return make_tray(ub.broker.socket, fleet=UplinkFleet(data_dir), data_dir=data_dir)

    return make


def test_fleet_tab_reads_the_coordinator_signed_by_this_computer(
    qtbot: QtBot,
    coordinator: CoordinatorProcess,  # noqa: F811
    uplink_broker: Callable[..., UplinkBroker],  # noqa: F811
    tray_for: Callable[[UplinkBroker], TrayApp],
) -> None:
    ub = uplink_broker(coordinator, "tray-ws-01")
    source = UplinkFleet(ub.broker.data_dir)
    assert source.enrolled()
    with rbroker.lease(
        4096, project="vision", session="run-7", purpose="fine-tune", socket=ub.broker.socket
    ):

        def reported() -> bool:
            cs = {c["name"]: c for c in source.computers()}
            c = cs.get("tray-ws-01")
            return bool(c and c["freshness"] == "online" and c["leases"])

        wait_until(reported, timeout_s=30, interval_s=0.5)
        tray = tray_for(ub)
        fleet = tray.window.fleet
        qtbot.waitUntil(lambda: fleet.computers.rowCount() == 1, timeout=15_000)
        assert fleet.stack.currentIndex() == 1
        assert fleet.detail_title.text() == "tray-ws-01"
        assert fleet.detail_fresh.text() == "online"
        assert list(fleet.gpu_list.cards) == [GPU0]
        assert fleet.leases.rowCount() == 1
        assert fleet.leases.row(0)["session"] == "run-7"
        settings = tray.window.settings_tab
        qtbot.waitUntil(lambda: settings.link_state.text().startswith("ok"), timeout=15_000)
        assert ub.computer_id in settings.link_state.text()
