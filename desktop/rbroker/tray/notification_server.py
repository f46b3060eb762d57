"""Whether the desktop's notification server reads markup in what the tray sends it.

On Linux, Qt sends `QSystemTrayIcon.showMessage` to the session's freedesktop notification
server (`org.freedesktop.Notifications.Notify`) when its tray icon is a D-Bus one (a
`org.kde.StatusNotifierWatcher` is on the session bus); the Desktop Notifications
Specification lets a server read a body as markup (`<b>`, `<i>`, `<u>`, `<a href>`,
`<img src>`), which it says by listing `body-markup` among its capabilities. Otherwise
(an XEmbed tray) Qt shows its own balloon, and Windows and macOS show plain text.
`rbroker.tray.plain.notification_body` writes the body for either.
"""

from __future__ import annotations

import logging
import sys
from typing import Final

log = logging.getLogger(__name__)

NOTIFICATIONS: Final = "org.freedesktop.Notifications"
"""The notification server's bus name and interface (its object is `NOTIFICATIONS_PATH`)."""
NOTIFICATIONS_PATH: Final = "/org/freedesktop/Notifications"
TRAY_WATCHER: Final = "org.kde.StatusNotifierWatcher"
"""On the session bus when Qt's tray icon is a D-Bus one (StatusNotifierItem)."""
CALL_TIMEOUT_MS: Final = 1000
"""How long the capability call may take (it is made once, at the first notice)."""


def reads_markup() -> bool:
    """True when a notice the tray shows goes to a notification server that reads its body
    as markup: on Linux, a D-Bus tray (`TRAY_WATCHER` registered) and a server whose
    `GetCapabilities` lists `body-markup`. False on Windows and macOS, without a session
    bus, a tray watcher or a server, or when the call fails (within `CALL_TIMEOUT_MS`)."""
    if sys.platform in ("win32", "darwin"):
        return False
    try:
        from PySide6.QtDBus import QDBusConnection, QDBusMessage
    except ImportError:
        return False
    bus = QDBusConnection.sessionBus()
    if not bus.isConnected():
        return False
    registered = bus.interface().isServiceRegistered(TRAY_WATCHER)
    if not registered.isValid() or not registered.value():
        return False
    call = QDBusMessage.createMethodCall(
        NOTIFICATIONS, NOTIFICATIONS_PATH, NOTIFICATIONS, "GetCapabilities"
    )
    reply = bus.call(call, timeout=CALL_TIMEOUT_MS)
    if reply.type() != QDBusMessage.MessageType.ReplyMessage or not reply.arguments():
        log.debug("no notification server capabilities: %s", reply.errorMessage())
        return False
    capabilities = reply.arguments()[0]
    return isinstance(capabilities, list) and "body-markup" in capabilities
