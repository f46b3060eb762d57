"""Unix-domain-socket transport (Linux, macOS), both ends: the broker's listening socket
with peer credentials from the kernel (`serve_unix`), and the client's stream (`UnixStream`).

The socket file gets mode 0660 (owner and, when configured, the allowed group), 0666 for a
system broker open to every local user: the mode from the umask at bind and the group in a
private directory before the file is renamed into place, so nothing is done by name where
another user could have put a symbolic link (`bind_in_place`). A broker run as root refuses
a socket directory another user owns or can write (`safe_paths`). A socket file left by a
crashed broker is removed at start; when a live broker answers, start fails with
`BrokerAlreadyRunning` and the live one is left alone. A socket file removed while the broker
runs is bound again within `WATCH_EVERY_S`.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import select
import socket
import struct
import sys
import time

# The serving end imports what only it uses where it runs (asyncio, logging, pathlib,
# tempfile, the transport's shared types, the safe-path checks): a client's start-up loads
# none of them (docs/architecture.md §10). The idiom type checkers read as
# typing.TYPE_CHECKING (PEP 484's constant, never true at run time).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio
    from collections.abc import Awaitable, Callable
    from pathlib import Path
    from typing import Any, TypeAlias

    from rbroker.transport.base import Handler, Peer, Readiness

# Unix only; on Windows `rbroker.transport` uses pipe_windows (type checkers skip the rest).
assert sys.platform != "win32", "rbroker.transport.unix is not for Windows"

LISTEN_BACKLOG = 1024
"""Connections the kernel queues before the broker accepts them (capped by
net.core.somaxconn). A burst of clients past it is answered EAGAIN; the SDK retries."""


def peer_of(sock: socket.socket) -> Peer:
    """Read the connecting process's pid and user from the kernel.

    Linux: SO_PEERCRED; macOS/BSD: LOCAL_PEERPID (pid) and getpeereid (uid).
    """
    from rbroker.transport.base import Peer

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


_HUNG_UP = select.POLLHUP | select.POLLERR | select.POLLNVAL


def hung_up(transport: asyncio.BaseTransport) -> bool:
    """Whether the peer of `transport` (an accepted Unix socket) closed its end: the socket
    polls as hung up (POLLHUP: both directions shut, which a peer's close gives; its
    `shutdown(SHUT_WR)` alone does not, so a client that half-closes after its request
    still gets its answer), or is in error. False when the socket is not there any more
    (the transport is closed: see `is_closing`). One `poll` with no wait."""
    sock = transport.get_extra_info("socket")
    fd = sock.fileno() if sock is not None else -1
    if fd < 0:
        return False
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    try:
        events = poller.poll(0)
    except OSError:
        return False
    return any(mask & _HUNG_UP for _fd, mask in events)


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


WATCH_EVERY_S = 1.0
"""How often a broker checks that its socket file is still there; one removed (by
systemd-tmpfiles, `rm -rf /run/rbroker`) is bound again within about this long."""


class UnixServer:
    """A listening Unix socket that puts its file back when it is removed; `close()` removes
    the file it created."""

    def __init__(self, address: str, server: asyncio.Server, inode: int, rebind: _Rebind) -> None:
        self.address = address
        self._server = server
        self._inode = inode
        self._rebind = rebind
        import asyncio

        self._watch = asyncio.create_task(self._keep_present())

    async def _keep_present(self) -> None:
        import asyncio
        import logging

        log = logging.getLogger(__name__)
        said = False
        while True:
            await asyncio.sleep(WATCH_EVERY_S)
            try:
                os.stat(self.address, follow_symlinks=False)
                continue  # there (ours, or another's put there on purpose: left alone)
            except FileNotFoundError:
                pass
            except OSError:
                continue
            try:
                server, inode = await self._rebind()
            except OSError as exc:
                if not said:
                    log.error("the socket %s was removed and cannot be made again: %s",
                              self.address, exc)  # fmt: skip
                    said = True
                continue
            log.warning("the socket %s was removed: listening there again", self.address)
            said = False
            old, self._server, self._inode = self._server, server, inode
            old.close()  # the listener nobody can reach any more; connections stay

    async def close(self) -> None:
        import asyncio

        self._watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._watch
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2.0)
        with contextlib.suppress(OSError):
            if os.stat(self.address, follow_symlinks=False).st_ino == self._inode:
                os.unlink(self.address)


_Rebind: TypeAlias = "Callable[[], Awaitable[tuple[asyncio.Server, int]]]"


def _make_parent(path: Path, open_to_others: bool) -> None:
    if not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if open_to_others:  # others must reach the socket inside it
            os.chmod(path.parent, 0o755)


def bind_in_place(address: str, mode: int, gid: int) -> socket.socket:
    """A Unix socket bound at `address` with `mode` and group `gid` (-1: unchanged), never
    acting through a symbolic link: bound (under a umask giving `mode`) in a fresh 0700
    directory beside `address`, given its group there, then renamed into place; where that
    longer path would pass the OS's limit, bound at `address` itself (mode from the umask,
    the group set with `lchown`). It is listening (backlog `LISTEN_BACKLOG`) before its path
    appears, so a client never finds a path that refuses connections.

    Raises:
        OSError: it cannot be bound, chowned or renamed.
    """
    import tempfile

    from rbroker_protocol.startup import SOCKET_PATH_MAX_BYTES

    directory = os.path.dirname(os.path.abspath(address))
    private = tempfile.mkdtemp(prefix=".rb", dir=directory)  # 0700, before the umask
    temporary = os.path.join(private, "s")
    direct = len(temporary.encode(errors="surrogateescape")) > SOCKET_PATH_MAX_BYTES
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old_umask = os.umask(0o777 & ~mode)
        try:
            sock.bind(address if direct else temporary)
        finally:
            os.umask(old_umask)
        if gid != -1:
            os.chown(address if direct else temporary, -1, gid, follow_symlinks=False)
        # listening before the rename: a client that finds the path connects (a socket file
        # that is not yet listening would answer it "connection refused")
        sock.listen(LISTEN_BACKLOG)
        if not direct:
            os.rename(temporary, address)
    except BaseException:
        sock.close()
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        os.rmdir(private)
    return sock


async def serve_unix(
    address: str, handler: Handler, limit: int, *, shared: bool = False, group: str | None = None
) -> UnixServer:
    """Bind `address`, replacing a stale socket file, and serve each connection with the
    protocol `handler(peer_of, limit)` builds (`rbroker.transport.base.Handler`); see the
    module docstring and `rbroker.transport.serve` for `shared` and `group`.

    Raises:
        KeyError: `group` is no OS group.
        UnsafePath: (as root) the socket's directory, or one above it, belongs to another
            user or others can write it.
    """
    import asyncio
    from pathlib import Path

    from rbroker.transport.base import BrokerAlreadyRunning
    from rbroker.transport.safe_paths import check_private_path

    path = Path(address)
    gid = grp.getgrnam(group).gr_gid if group else -1
    open_to_others = shared or group is not None
    mode = 0o660 if group is not None or not shared else 0o666
    check_private_path(path.parent)
    _make_parent(path, open_to_others)
    if path.exists() or path.is_symlink():
        if _live_broker_at(address):
            raise BrokerAlreadyRunning(f"a broker is already listening at {address}")
        if not path.is_socket() or path.is_symlink():
            raise FileExistsError(f"{address} exists and is not a socket; not removing it")
        path.unlink()

    def peer_of_transport(transport: asyncio.BaseTransport) -> Peer:
        return peer_of(transport.get_extra_info("socket"))

    def accepted() -> asyncio.Protocol:
        return handler(peer_of_transport, limit)

    async def listen() -> tuple[asyncio.Server, int]:
        _make_parent(path, open_to_others)
        sock = bind_in_place(address, mode, gid)
        try:
            inode = os.stat(address, follow_symlinks=False).st_ino
            loop = asyncio.get_running_loop()
            server = await loop.create_unix_server(accepted, sock=sock, backlog=LISTEN_BACKLOG)
        except BaseException:
            sock.close()
            raise
        return server, inode

    server, inode = await listen()
    return UnixServer(address, server, inode, listen)


# -- the client's end ------------------------------------------------------------------------
class UnixStream:
    """The client's end: a connected Unix socket read line by line through its own buffer,
    so a read that times out loses nothing and the connection stays usable (a
    `rbroker.transport.base.Stream`).

    Raises (at connect):
        PermissionError: this user may not open the socket.
        FileNotFoundError, ConnectionRefusedError: nothing listens there.
        BlockingIOError: the listen backlog stayed full for `timeout_s` (at most 5 s).
    """

    def __init__(self, path: str, timeout_s: float | None) -> None:
        # A full listen backlog (a burst of clients) answers EAGAIN at once on a Unix
        # socket instead of waiting: retry within the timeout (at most 5 s) before
        # calling the broker unavailable.
        deadline = time.monotonic() + min(timeout_s if timeout_s is not None else 5.0, 5.0)
        delay_s = 0.001
        while True:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout_s)
            try:
                self.sock.connect(path)
                break
            except BlockingIOError:
                self.sock.close()
                if time.monotonic() + delay_s > deadline:
                    raise
                time.sleep(delay_s)
                delay_s = min(delay_s * 2, 0.05)
            except OSError:
                self.sock.close()
                raise
        self._buf = bytearray()

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def readline(self) -> bytes:
        """One line with its newline; b"" at end of stream. Raises TimeoutError."""
        while True:
            end = self._buf.find(b"\n")
            if end >= 0:
                line = bytes(self._buf[: end + 1])
                del self._buf[: end + 1]
                return line
            chunk = self.sock.recv(65536)
            if not chunk:
                rest, self._buf = bytes(self._buf), bytearray()
                return rest
            self._buf += chunk

    def settimeout(self, timeout_s: float | None) -> None:
        self.sock.settimeout(timeout_s)

    def wait_readable(self, timeout_s: float, wake: socket.socket | None) -> Readiness:
        """Wait until the broker sends something or closes ("data" / "closed"), `wake`
        becomes readable ("woken") or `timeout_s` passes ("timeout")."""
        if self._buf:
            return "data"
        watched: list[Any] = [self.sock] + ([wake] if wake is not None else [])
        ready, _, _ = select.select(watched, [], [], timeout_s)
        if wake is not None and wake in ready:
            return "woken"
        if not ready:
            return "timeout"
        try:
            peeked = self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return "timeout"
        except OSError:
            return "closed"
        return "data" if peeked else "closed"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
