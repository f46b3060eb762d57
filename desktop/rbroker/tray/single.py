"""One tray per user: a `QLocalServer` guard (after Vorta's `qt_single_application.py`).

The first instance listens on a per-user name; a second one connects, sends `show`, waits
for the first's `ok` (or `CONNECT_TIMEOUT_MS`) and exits, and the first instance raises its
window. The second closes its end only after the answer: on a named pipe (QLocalSocket on
Windows) a message whose writer has already closed may never reach the reader.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import time

from PySide6.QtCore import QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

CONNECT_TIMEOUT_MS = 500


def instance_name(socket: str | None = None) -> str:
    """The guard's name: per user, and per broker address when one is given."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    suffix = hashlib.sha256((socket or "").encode()).hexdigest()[:8] if socket else "default"
    return f"rbroker-tray-{user}-{suffix}"


class SingleInstance(QObject):
    """`acquire()` → True for the first instance (it then listens), False when another one
    answered (it was asked to show itself). `activated` fires in the first instance when a
    later one starts."""

    activated = Signal()

    def __init__(self, name: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.name = name
        self.server: QLocalServer | None = None

    def _ping_running(self) -> bool:
        sock = QLocalSocket()
        sock.connectToServer(self.name)
        if not sock.waitForConnected(CONNECT_TIMEOUT_MS):
            return False
        sock.write(b"show\n")
        sock.waitForBytesWritten(CONNECT_TIMEOUT_MS)
        deadline = time.monotonic() + CONNECT_TIMEOUT_MS / 1000
        answer = b""
        while b"\n" not in answer and time.monotonic() < deadline:
            if not sock.bytesAvailable() and not sock.waitForReadyRead(CONNECT_TIMEOUT_MS):
                break  # an older first instance closes without answering: it was asked
            answer += bytes(sock.readAll().data())
        sock.disconnectFromServer()
        return True

    def acquire(self) -> bool:
        if self._ping_running():
            return False
        QLocalServer.removeServer(self.name)  # a stale socket left by a crashed instance
        server = QLocalServer(self)
        server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        if not server.listen(self.name):
            # lost a start-up race: the winner answers now
            return not self._ping_running()
        server.newConnection.connect(self._on_connection)
        self.server = server
        return True

    def _on_connection(self) -> None:
        assert self.server is not None
        while self.server.hasPendingConnections():
            conn = self.server.nextPendingConnection()
            if not conn.bytesAvailable():
                conn.waitForReadyRead(CONNECT_TIMEOUT_MS)  # the message follows at once
            data = bytes(conn.readAll().data())
            if b"show" in data:
                conn.write(b"ok\n")
                conn.waitForBytesWritten(CONNECT_TIMEOUT_MS)
            conn.disconnectFromServer()
            conn.deleteLater()
            if b"show" in data:
                self.activated.emit()

    def release(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
