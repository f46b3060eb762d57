"""The tray process's lifetime around Qt's event loop: SIGINT/SIGTERM quit it cleanly, and
after the loop everything is torn down in an order that never leaves Qt objects for the
interpreter's exit to free."""

from __future__ import annotations

import contextlib
import signal
import sys
from typing import TYPE_CHECKING

from PySide6.QtCore import QEvent, QTimer
from PySide6.QtWidgets import QApplication

if TYPE_CHECKING:
    from rbroker.tray.app import TrayApp
    from rbroker.tray.single import SingleInstance


def quit_on_signals(controller: TrayApp) -> None:
    """SIGINT/SIGTERM quit cleanly (the in-process broker stops, its socket is removed).

    Python runs signal handlers between bytecodes, so a timer wakes the interpreter while
    Qt's event loop is idle."""
    if sys.platform == "win32":  # pragma: no cover - no SIGTERM from the session manager
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: QTimer.singleShot(0, controller.quit))
    wake = QTimer(controller)
    wake.timeout.connect(lambda: None)
    wake.start(250)


def teardown(app: QApplication, controller: TrayApp, guard: SingleInstance) -> None:
    """After the event loop: end everything that could call into Qt, then delete the Qt
    objects in order while Qt still runs, then the application itself, so nothing is left
    for the interpreter's exit to free in an arbitrary order (which once crashed with
    "Fatal Python error: bool_dealloc").

    Order: signal handlers back to the default (they queue Qt timers); the controller's
    shutdown (threads joined, timers stopped, the broker stopped; idempotent); signal
    connections cut; windows and the tray icon deleted and the deletions run; the
    application shut down (PySide6 `QCoreApplication.shutdown`)."""
    if sys.platform != "win32":
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
    controller.shutdown()
    with contextlib.suppress(RuntimeError, TypeError):
        app.aboutToQuit.disconnect(controller.shutdown)
    with contextlib.suppress(RuntimeError, TypeError):
        guard.activated.disconnect()
    for child in controller.findChildren(QTimer):
        child.stop()
    if controller.tray is not None:
        controller.tray.deleteLater()
    controller.window.deleteLater()
    controller.deleteLater()
    app.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    app.processEvents()
    shutdown = getattr(app, "shutdown", None)
    if shutdown is not None:
        shutdown()
