"""The tooltip's available total and the snippet's size count only GPUs whose telemetry is ok.

A lost or telemetry-unavailable GPU keeps showing its last known figures on its card, but the
broker admits nothing on it, so its last known `available_mib` must not be offered. Driven by
a real simulated broker process with two GPUs and a real Qt event loop (offscreen).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QSystemTrayIcon
from pytestqt.qtbot import QtBot

import rbroker
from rbroker.tray.app import TrayApp
from rbroker.tray.state import TrayState
from tests.conftest import GPU0, GPU1, BrokerProcess
from tests.fakes.gpu_scenarios import gpu, scenario

TIMEOUT_MS = 10_000

TWO_24G = scenario(gpu(GPU0, name="Simulated RTX 4090"), gpu(GPU1, name="Simulated RTX 4090"))


@pytest.fixture
def tray_for(
    make_tray: Callable[..., TrayApp], monkeypatch: pytest.MonkeyPatch
) -> Callable[[str], TrayApp]:
    """`tray_for(socket)` → a started TrayApp with a system tray (shut down at teardown)."""
    monkeypatch.setattr(QSystemTrayIcon, "isSystemTrayAvailable", staticmethod(lambda: True))
    return lambda socket: make_tray(socket, snippet_socket=socket)


def test_lost_gpu_is_left_out_of_the_tooltip_and_the_snippet(
    qtbot: QtBot,
    broker_factory: Callable[..., BrokerProcess],
    tray_for: Callable[[str], TrayApp],
) -> None:
    broker = broker_factory(TWO_24G)
    tray = tray_for(broker.socket)
    qtbot.waitUntil(lambda: tray.tray is not None, timeout=TIMEOUT_MS)
    assert tray.tray is not None
    # each GPU: 24 576 total − 1 229 headroom (5 %) = 23 347 available
    qtbot.waitUntil(lambda: tray.state is TrayState.IDLE, timeout=TIMEOUT_MS)
    assert tray.tray.toolTip() == "rbroker: no leases · 46 694 MiB available on 2 GPUs · simulated"

    with rbroker.lease(
        20480, project="p", session="s", purpose="x", gpu_uuid=GPU0, socket=broker.socket
    ):
        with broker.client() as c:
            c.sim_set(GPU1, error="gpu_lost")
        qtbot.waitUntil(lambda: tray.state is TrayState.TELEMETRY, timeout=TIMEOUT_MS)

        def tooltip_counts_only_gpu0() -> None:
            assert tray.tray is not None
            # GPU 0: 23 347 − 20 480 granted = 2 867; GPU 1 is lost: its last known 23 347
            # (still on its card) is not available to anyone. Before: "26 214 MiB … on 2 GPUs".
            assert tray.tray.toolTip() == (
                "rbroker: 1 lease (20 480 MiB) · 2 867 MiB available on 1 GPU "
                "(1 GPU without telemetry) · telemetry lost on GPU 1 · simulated"
            )

        qtbot.waitUntil(tooltip_counts_only_gpu0, timeout=TIMEOUT_MS)
        assert tray.window.local.gpu_list.cards[GPU1].badge.text() == "lost"

        tray.snippet_action.trigger()
        # the best GPU with telemetry has 2 867: the snippet asks for 2 048 (whole GiB), not the
        # lost GPU's last known 23 347 (which gave the default 8 192 before)
        assert (
            QGuiApplication.clipboard()
            .text()
            .startswith(f"RBROKER_SOCKET={broker.socket} rbroker run --mib 2048 ")
        )

        with broker.client() as c:
            c.sim_set(GPU1, error="")
        qtbot.waitUntil(lambda: tray.state is TrayState.ACTIVE, timeout=TIMEOUT_MS)
        assert tray.tray.toolTip() == (
            "rbroker: 1 lease (20 480 MiB) · 26 214 MiB available on 2 GPUs · simulated"
        )
