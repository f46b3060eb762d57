"""A freedesktop notification server that only answers `GetCapabilities`, for the tray's
markup check (`rbroker.tray.notification_server`): run as
`python -m tests.fakes.notification_server CAPS [watcher]` on a session bus
(`DBUS_SESSION_BUS_ADDRESS`); CAPS is comma-separated (`body,body-markup`), and with
`watcher` it also takes `org.kde.StatusNotifierWatcher` (a D-Bus tray host). Prints `ready`
once both names are its."""

from __future__ import annotations

import sys

from PySide6.QtCore import ClassInfo, QCoreApplication, QObject, Slot
from PySide6.QtDBus import QDBusConnection

from rbroker.tray.notification_server import NOTIFICATIONS, NOTIFICATIONS_PATH, TRAY_WATCHER


@ClassInfo({"D-Bus Interface": NOTIFICATIONS})
class Server(QObject):
    """The server object; its slots are the interface's methods."""

    def __init__(self, capabilities: list[str]) -> None:
        super().__init__()
        self.capabilities = capabilities

    @Slot(result="QStringList")
    def GetCapabilities(self) -> list[str]:
        return self.capabilities


def main() -> None:
    app = QCoreApplication([])
    bus = QDBusConnection.sessionBus()
    server = Server([c for c in sys.argv[1].split(",") if c])
    exported = QDBusConnection.RegisterOption.ExportAllSlots
    if not (
        bus.registerObject(NOTIFICATIONS_PATH, server, exported)
        and bus.registerService(NOTIFICATIONS)
    ):
        sys.exit("cannot take the notification server's name")
    if sys.argv[2:] == ["watcher"] and not bus.registerService(TRAY_WATCHER):
        sys.exit("cannot take the tray watcher's name")
    print("ready", flush=True)
    app.exec()


if __name__ == "__main__":
    main()
