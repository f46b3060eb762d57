"""Render the main window, fed by a demo broker, to PNG files.

    python -m rbroker.tray.screenshot [OUT_DIR]     # default: docs/

Writes `screenshot-local.png` (This computer: live data from a simulated broker with real
lease holders, waiting requests and jobs) and `screenshot-fleet.png` (the Fleet tab, read
from a local coordinator that this demo computer and three more simulated ones report to;
`--static-fleet`, or no `server` extra, uses fixed demo data instead). Runs on any Qt
platform: under Xvfb, or with QT_QPA_PLATFORM=offscreen.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rbroker.tray.screenshot")
    parser.add_argument("out", nargs="?", default="docs", type=Path)
    parser.add_argument("--width", type=int, default=1180)
    parser.add_argument("--height", type=int, default=960)
    parser.add_argument("--settle-s", type=float, default=4.0, help="live updates before shots")
    parser.add_argument(
        "--static-fleet",
        action="store_true",
        help="feed the Fleet tab from fixed demo data instead of a local coordinator",
    )
    args = parser.parse_args(argv)
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from rbroker.demo.fleet import DemoFleet, demo_fleet
    from rbroker.demo.world import DemoBroker
    from rbroker.tray.app import TrayApp
    from rbroker.tray.fleet import FleetSource, StaticFleet, UplinkFleet
    from rbroker.tray.settings import TraySettings

    app = QApplication.instance() or QApplication(sys.argv[:1])
    demo = DemoBroker()
    demo.start()
    coordinator: DemoFleet | None = None
    source: FleetSource = StaticFleet(demo_fleet)
    if not args.static_fleet and DemoFleet.available():
        coordinator = DemoFleet(demo)
        coordinator.start()
        source = UplinkFleet(demo.root / "data")
    controller = TrayApp(
        demo.socket,
        TraySettings(coordinator_url=coordinator.url if coordinator else ""),
        fleet=source,
        show_window=True,
        origin="demo broker",
    )
    win = controller.window
    win.resize(args.width, args.height)
    win.show()
    controller.start()

    def pump(seconds: float) -> None:
        loop = QEventLoop()
        QTimer.singleShot(int(seconds * 1000), loop.quit)
        loop.exec()

    try:
        deadline = time.monotonic() + 30
        while (
            controller.snapshot is None
            or len(controller.snapshot.leases) < 4
            or len(controller.snapshot.queue) < 2
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("the window never showed the demo broker's state")
            pump(0.1)
        pump(args.settle_s)
        if coordinator is not None:
            coordinator.settle()
            controller.fleet_feed.refresh()
            pump(3)
        args.out.mkdir(parents=True, exist_ok=True)
        win.tabs.setCurrentIndex(0)
        pump(0.3)
        local = args.out / "screenshot-local.png"
        win.grab().save(str(local))
        win.tabs.setCurrentIndex(1)
        fleet_tab = win.fleet
        for row in range(fleet_tab.computers.rowCount()):
            if fleet_tab.computers.row(row).get("name") == "lab-ws-01":
                proxy = fleet_tab.computers_view.model()
                fleet_tab.computers_view.selectRow(
                    proxy.mapFromSource(fleet_tab.computers.index(row, 0)).row()  # type: ignore[attr-defined]
                )
        pump(0.5)
        fleet = args.out / "screenshot-fleet.png"
        win.grab().save(str(fleet))
        print(local)
        print(fleet)
    finally:
        controller.shutdown()
        if coordinator is not None:
            coordinator.stop()
        demo.stop()
    del app
    return 0


if __name__ == "__main__":
    sys.exit(main())
