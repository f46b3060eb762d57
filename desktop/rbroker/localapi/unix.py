"""Unix-domain-socket transport (Linux, macOS): peer credentials from the kernel.

The socket file gets mode 0660 (owner and, when configured, the allowed group), 0666 for a
system broker open to every local user. A socket
file left by a crashed broker is removed at start; when a live broker answers, start fails
with `BrokerAlreadyRunning` and the live one is left alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import os
import pwd
import socket
import struct
import sys
from pathlib import Path

from rbroker.localapi.transport import BrokerAlreadyRunning, Handler, Peer

# Unix only; on Windows `transport.serve` uses pipe_windows (and type checkers skip the rest).
assert sys.platform != "win32", "rbroker.localapi.unix is not for Windows"


LISTEN_BACKLOG = 1024
"""Connections the kernel queues before the broker accepts them (capped by
net.core.somaxconn). A burst of clients past it is answered EAGAIN; the SDK retries."""


def peer_of(sock: socket.socket) -> Peer:
    """Read the connecting process's pid and user from the kernel.

    Linux: SO_PEERCRED; macOS/BSD: LOCAL_PEERPID (pid) and getpeereid (uid).
    """
    if sys.platform.startswith("linux"):
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", creds)
    else:  # pragma: no cover - macOS
        local_peerpid = 0x002
        pid = struct.unpack("i", sock.getsockopt(0, local_peerpid, 4))[0]
        uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    return Peer(pid=pid, user=user, uid=uid)


def _live_broker_at(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return False
    else:
        return True
    finally:
        probe.close()


class UnixServer:
    """A listening Unix socket; `close()` removes the file it created."""

    def __init__(self, address: str, server: asyncio.Server, inode: int) -> None:
        self.address = address
        self._server = server
        self._inode = inode

    async def close(self) -> None:
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2.0)
        with contextlib.suppress(OSError):
            if os.stat(self.address).st_ino == self._inode:
                os.unlink(self.address)


async def serve_unix(
    address: str, handler: Handler, limit: int, *, shared: bool = False, group: str | None = None
) -> UnixServer:
    """Bind `address`, replacing a stale socket file; see the module docstring and
    `transport.serve` for `shared` and `group`.

    Raises:
        KeyError: `group` is no OS group.
    """
    path = Path(address)
    gid = grp.getgrnam(group).gr_gid if group else -1
    open_to_others = shared or group is not None
    if not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if open_to_others:  # others must reach the socket inside it
            os.chmod(path.parent, 0o755)
    if path.exists() or path.is_symlink():
        if _live_broker_at(address):
            raise BrokerAlreadyRunning(f"a broker is already listening at {address}")
        if not path.is_socket():
            raise FileExistsError(f"{address} exists and is not a socket; not removing it")
        path.unlink()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        try:
            peer = peer_of(sock)
        except OSError:
            writer.close()
            return
        await handler(reader, writer, peer)

    old_umask = os.umask(0o117)
    try:
        server = await asyncio.start_unix_server(
            on_connect, path=address, limit=limit, backlog=LISTEN_BACKLOG
        )
    finally:
        os.umask(old_umask)
    if gid != -1:
        os.chown(address, -1, gid)
    os.chmod(address, 0o660 if group is not None or not shared else 0o666)
    return UnixServer(address, server, os.stat(address).st_ino)
