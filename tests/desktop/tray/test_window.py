"""The window and the tray controller, fed by a real simulated broker process.

The tray reads the broker only through the local API client (events.subscribe + reads on
its own threads), so these tests drive a real broker with real clients and wait for the
window to show what they did.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtWidgets import QSystemTrayIcon
from pytestqt.qtbot import QtBot

import rbroker
from rbroker.tray.app import TrayApp
from rbroker.tray.fleet import FleetUnavailable, NotEnrolled, StaticFleet
from rbroker.tray.icons import state_icon
from rbroker.tray.models import LeasesModel, QueueModel
from rbroker.tray.settings import TraySettings
from rbroker.tray.state import TrayState
from tests.conftest import GPU0, BrokerProcess
from tests.desktop.conftest import WorkerProcess

TIMEOUT_MS = 10_000


def test_window_shows_a_lease_held_by_a_real_client(
    qtbot: QtBot, broker: BrokerProcess, make_tray: Callable[..., TrayApp]
) -> None:
    tray = make_tray(broker.socket, show_window=True)
    win = tray.window
    with (
        rbroker.lease(
            8192,
            project="vision",
            session="run-42",
            purpose="fine-tune ViT-B",
            socket=broker.socket,
        ) as lease,
        broker.client() as c,
    ):
        c.sim_allocate(3000, lease.gpu_uuid)  # the lease holder (this process) uses 3 000
        leases = win.local.leases

        def shows_lease() -> None:
            assert leases.rowCount() == 1
            assert win.local.gpu_list.cards[GPU0].parts["leased"] == 3000

        qtbot.waitUntil(shows_lease, timeout=TIMEOUT_MS)
        row = [leases.data(leases.index(0, col)) for col in range(leases.columnCount())]
        assert row[: LeasesModel.GPU + 1] == [
            c.hello()["owner"],
            "vision",
            "run-42",
            "fine-tune ViT-B",
            "8 192",
            "GPU 0",
        ]
        assert row[LeasesModel.STATE] == "active"
        card = win.local.gpu_list.cards[GPU0]
        # 24 576 total, 1 229 headroom, 3 000 in use by the lease, 5 192 granted not yet used
        assert card.legend_text() == (
            "in use by leases 3 000 MiB  granted, not yet in use 5 192 MiB  "
            "in use by others 0 MiB  available 15 155 MiB  headroom 1 229 MiB"
        )
        assert "1 lease" in card.summary.text() and "24 576 MiB total" in card.summary.text()
        assert card.badge.text() == "telemetry ok"
        assert win.local.leases_box.title() == "Leases (1)"
        assert tray.state is TrayState.ACTIVE
        assert "1 lease (8 192 MiB)" in tray.status_action.text()
        assert "Simulated GPUs" in win.banner.text()
    qtbot.waitUntil(lambda: win.local.leases.rowCount() == 0, timeout=TIMEOUT_MS)
    qtbot.waitUntil(lambda: tray.state is TrayState.IDLE, timeout=TIMEOUT_MS)


def test_waiting_request_shows_with_its_reason(
    qtbot: QtBot,
    broker: BrokerProcess,
    make_tray: Callable[..., TrayApp],
    worker: Callable[..., WorkerProcess],
) -> None:
    tray = make_tray(broker.socket)
    queue = tray.window.local.queue
    errors: list[BaseException] = []
    waiter = broker.client(timeout_s=None)

    def wait_for_room() -> None:
        try:
            waiter.call(
                "lease.acquire",
                timeout_s=None,
                mib=20000,
                project="genai",
                session="sdxl",
                purpose="SDXL LoRA",
                wait_s=60,
            )
        except rbroker.RBrokerError as exc:
            errors.append(exc)

    t = threading.Thread(target=wait_for_room, daemon=True)
    try:
        # held by another process: behind its own lease the waiter would be refused at once
        holder = worker("hold_lease", broker.socket, "10000", "a", "0")
        assert holder.read_line().startswith("granted ")
        t.start()
        qtbot.waitUntil(lambda: queue.rowCount() == 1, timeout=TIMEOUT_MS)
        qtbot.waitUntil(lambda: tray.state is TrayState.WAITING, timeout=TIMEOUT_MS)

        def shown() -> str:
            return str(queue.data(queue.index(0, QueueModel.REASON)))

        def reason() -> str:
            """Why it waits: the column's text after its estimate (`… — why`)."""
            return shown().partition(" — ")[2]

        # the reason with the numbers (the grant above left the sample usable)
        qtbot.waitUntil(lambda: reason().startswith("GPU 0 has"), timeout=TIMEOUT_MS)
        assert reason().startswith("GPU 0 has 13 347 MiB available (24 576 total − 1 229 headroom")
        assert reason().endswith("20 000 requested")
        # before it, when: the lease ahead declared no duration and none has ended yet
        assert shown().startswith("no estimate yet ("), shown()
        assert queue.data(queue.index(0, QueueModel.MIB)) == "20 000"
        assert tray.window.local.queue_box.title() == "Waiting (1)"
        waiter.close()  # the waiter leaves; nothing is left behind
        t.join(5)
        qtbot.waitUntil(lambda: queue.rowCount() == 0, timeout=TIMEOUT_MS)
    finally:
        waiter.close()
        if t.is_alive():
            t.join(5)
    assert errors  # the closed connection ended the wait


def test_pause_from_the_window_reaches_the_broker(
    qtbot: QtBot, broker: BrokerProcess, make_tray: Callable[..., TrayApp]
) -> None:
    tray = make_tray(broker.socket)
    local = tray.window.local
    qtbot.waitUntil(local.pause_box.isEnabled, timeout=TIMEOUT_MS)
    local.pause_box.setChecked(True)
    with broker.client() as c:
        qtbot.waitUntil(lambda: c.status()["paused"] is True, timeout=TIMEOUT_MS)
        qtbot.waitUntil(lambda: tray.pause_action.isChecked(), timeout=TIMEOUT_MS)
        assert "New admissions are paused" in tray.window.banner.text()
        tray.pause_action.trigger()  # the tray menu resumes
        qtbot.waitUntil(lambda: c.status()["paused"] is False, timeout=TIMEOUT_MS)
    qtbot.waitUntil(lambda: not local.pause_box.isChecked(), timeout=TIMEOUT_MS)


def test_jobs_view_handles_a_broker_without_jobs_list(
    qtbot: QtBot, broker: BrokerProcess, make_tray: Callable[..., TrayApp]
) -> None:
    tray = make_tray(broker.socket, show_window=True)
    qtbot.waitUntil(lambda: tray.snapshot is not None, timeout=TIMEOUT_MS)
    assert tray.snapshot is not None
    local = tray.window.local
    if tray.snapshot.jobs is None:
        assert "does not report jobs yet" in local.jobs_empty.text()
        assert local.jobs_view.isHidden()
    else:
        assert local.jobs_box.title() == f"Jobs ({len(tray.snapshot.jobs)})"


def test_broker_going_away_shows_broker_down_and_comes_back(
    qtbot: QtBot, broker_factory: Callable[..., BrokerProcess], make_tray: Callable[..., TrayApp]
) -> None:
    first = broker_factory()
    tray = make_tray(first.socket)
    qtbot.waitUntil(lambda: tray.state is TrayState.IDLE, timeout=TIMEOUT_MS)
    first.stop()
    qtbot.waitUntil(lambda: tray.state is TrayState.BROKER_DOWN, timeout=TIMEOUT_MS)
    assert "Broker not running" in tray.window.banner.text()
    assert not tray.pause_action.isEnabled()
    assert tray.status_action.text() == "Broker not running"
    # a new broker on the same socket: the tray reconnects by itself
    second = broker_factory(root=first.scenario.parent)
    assert second.socket == first.socket
    qtbot.waitUntil(lambda: tray.state is TrayState.IDLE, timeout=TIMEOUT_MS)
    assert tray.window.banner.text().startswith("Simulated GPUs")


def test_no_broker_at_start_shows_broker_down(
    qtbot: QtBot, tmp_path: Path, make_tray: Callable[..., TrayApp]
) -> None:
    tray = make_tray(str(tmp_path / "nothing.sock"))
    qtbot.waitUntil(lambda: "Broker not running" in tray.window.banner.text(), timeout=TIMEOUT_MS)
    assert tray.state is TrayState.BROKER_DOWN


def test_tray_icon_appears_late_and_follows_the_state(
    qtbot: QtBot,
    broker: BrokerProcess,
    make_tray: Callable[..., TrayApp],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    available = False
    monkeypatch.setattr(QSystemTrayIcon, "isSystemTrayAvailable", staticmethod(lambda: available))
    tray = make_tray(broker.socket)
    # no system tray yet (early at login): the window stays reachable, minimised
    assert tray.tray is None
    assert tray.window.isVisible() and tray.window.isMinimized()
    assert tray.tray_timer.isActive()
    assert not tray.window.close_to_tray
    tray.window.close()  # closing minimises instead of hiding: still reachable
    assert tray.window.isVisible()

    available = True  # the desktop's tray appears
    qtbot.waitUntil(lambda: tray.tray is not None, timeout=TIMEOUT_MS)
    assert tray.tray is not None
    assert tray.window.close_to_tray and not tray.tray_timer.isActive()
    assert tray.tray.contextMenu() is tray.menu
    actions = [a.text() for a in tray.menu.actions() if not a.isSeparator()]
    assert actions[1:] == [
        "Open rbroker",
        "Pause new admissions",
        "Tell me when … MiB are free…",
        "Cancel the watch for free MiB",
        "Copy a `rbroker run` snippet",
        "Quit",
    ]
    qtbot.waitUntil(lambda: tray.state is TrayState.IDLE, timeout=TIMEOUT_MS)
    assert tray.tray.icon().cacheKey() == state_icon(TrayState.IDLE).cacheKey()
    assert tray.tray.toolTip().startswith("rbroker: no leases · 23 347 MiB available on 1 GPU")

    with rbroker.lease(4096, project="p", session="s", purpose="x", socket=broker.socket):
        qtbot.waitUntil(lambda: tray.state is TrayState.ACTIVE, timeout=TIMEOUT_MS)
        assert tray.tray.icon().cacheKey() == state_icon(TrayState.ACTIVE).cacheKey()
        with broker.client() as c:
            c.sim_set(GPU0, error="gpu_lost")
            qtbot.waitUntil(lambda: tray.state is TrayState.TELEMETRY, timeout=TIMEOUT_MS)
            assert tray.tray.icon().cacheKey() == state_icon(TrayState.TELEMETRY).cacheKey()
            card = tray.window.local.gpu_list.cards[GPU0]
            assert card.badge.text() == "lost"
            assert card.reason.isVisibleTo(card)
            c.sim_set(GPU0, error="")
            qtbot.waitUntil(lambda: tray.state is TrayState.ACTIVE, timeout=TIMEOUT_MS)
    tray.window.close()
    assert not tray.window.isVisible()  # with a tray, closing hides to the tray


def test_copy_snippet_puts_a_run_command_on_the_clipboard(
    qtbot: QtBot, broker: BrokerProcess, make_tray: Callable[..., TrayApp]
) -> None:
    from PySide6.QtGui import QGuiApplication

    tray = make_tray(broker.socket, snippet_socket=broker.socket)
    qtbot.waitUntil(lambda: tray.snapshot is not None, timeout=TIMEOUT_MS)
    tray.snippet_action.trigger()
    text = QGuiApplication.clipboard().text()
    assert text.startswith(f"RBROKER_SOCKET={broker.socket} rbroker run --mib 8192 ")


def test_fleet_tab_not_enrolled_then_computers(
    qtbot: QtBot, tmp_path: Path, make_tray: Callable[..., TrayApp]
) -> None:
    from rbroker.demo.fleet import demo_fleet

    tray = make_tray(str(tmp_path / "none.sock"), fleet=NotEnrolled())
    fleet = tray.window.fleet
    qtbot.waitUntil(lambda: fleet.stack.currentIndex() == 0, timeout=TIMEOUT_MS)
    assert "not enrolled" in fleet.empty_page.text()

    computers = demo_fleet()
    tray.fleet_feed.source = StaticFleet(computers)
    tray.fleet_feed.refresh()
    qtbot.waitUntil(lambda: fleet.computers.rowCount() == 4, timeout=TIMEOUT_MS)
    assert fleet.stack.currentIndex() == 1
    assert fleet.detail_title.text() == "lab-ws-01"
    assert set(fleet.gpu_list.cards) == {g["uuid"] for g in computers[0]["gpus"]}
    assert fleet.leases.rowCount() == 2 and fleet.jobs.rowCount() == 2
    fleet.computers_view.selectRow(2)
    assert fleet.detail_title.text() == "gpu-box-03"
    assert fleet.detail_fresh.text() == "stale · last known 7 min ago"
    assert len(fleet.gpu_list.cards) == 4

    class Down:
        def enrolled(self) -> bool:
            return True

        def computers(self) -> list[dict[str, object]]:
            raise FleetUnavailable("coordinator unreachable (connection refused)")

    tray.fleet_feed.source = Down()
    tray.fleet_feed.refresh()
    qtbot.waitUntil(lambda: "Cannot read the fleet" in fleet.status_line.text(), timeout=TIMEOUT_MS)
    assert fleet.computers.rowCount() == 4  # the last read stays


def test_settings_tab_saves_and_toggles_start_at_login(
    qtbot: QtBot, tmp_path: Path, make_tray: Callable[..., TrayApp], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rbroker.tray import autostart, settings

    path = tmp_path / "tray.json"
    monkeypatch.setattr(settings, "settings_path", lambda: path)
    tray = make_tray(str(tmp_path / "none.sock"))
    tab = tray.window.settings_tab
    tab.url.setText("https://coord.example.org")
    tab.headroom.setValue(2048)
    tab.save_button.click()
    assert TraySettings.load(path) == TraySettings("https://coord.example.org", 2048)
    assert tab.message.text() == "Saved."

    assert not tab.autostart.isChecked()
    tab.autostart.setChecked(True)
    assert autostart.is_enabled()  # the XDG file, or the registry value on Windows
    assert tab.autostart_note.text() == autostart.location()
    tab.autostart.setChecked(False)
    assert not autostart.is_enabled()

    tab.code.setText("ABCD-1234")
    tab.enroll_button.click()  # no data dir known: the terminal command is shown
    assert "rbroker enroll https://coord.example.org" in tab.enroll_state.text()


def test_settings_show_the_coordinator_link(
    qtbot: QtBot, broker: BrokerProcess, make_tray: Callable[..., TrayApp]
) -> None:
    tray = make_tray(broker.socket)
    link = tray.window.settings_tab.link_state
    qtbot.waitUntil(lambda: link.text().startswith("not enrolled"), timeout=TIMEOUT_MS)
