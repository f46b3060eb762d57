"""Render the main window, fed by a demo broker, to PNG files.

    python -m rbroker.tray.screenshot [OUT_DIR]     # default: docs/

Writes `screenshot-local.png` (This computer: live data from a simulated broker with real
lease holders and waiting requests) and `screenshot-fleet.png` (the Fleet tab, fed by the
demo fleet source while the coordinator link is not built). Runs on any Qt platform: under
Xvfb, or with QT_QPA_PLATFORM=offscreen.
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
    args = parser.parse_args(argv)
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from rbroker.tray.app import TrayApp
    from rbroker.tray.demo import DemoBroker, demo_fleet
    from rbroker.tray.fleet import StaticFleet
    from rbroker.tray.settings import TraySettings

    app = QApplication.instance() or QApplication(sys.argv[:1])
    demo = DemoBroker()
    demo.start()
    controller = TrayApp(
        demo.socket,
        TraySettings(coordinator_url="https://coordinator.example.org"),
        fleet=StaticFleet(demo_fleet),
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
        args.out.mkdir(parents=True, exist_ok=True)
        win.tabs.setCurrentIndex(0)
        pump(0.3)
        local = args.out / "screenshot-local.png"
        win.grab().save(str(local))
        win.tabs.setCurrentIndex(1)
        pump(0.5)
        fleet = args.out / "screenshot-fleet.png"
        win.grab().save(str(fleet))
        print(local)
        print(fleet)
    finally:
        controller.shutdown()
        demo.stop()
    del app
    return 0


if __name__ == "__main__":
    sys.exit(main())
