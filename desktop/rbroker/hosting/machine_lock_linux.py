"""The Linux machine-wide broker lock: a listening abstract Unix socket (architecture.md §5).

The lock is the abstract socket name `\\0<name>` (default `rbroker-broker`). The kernel frees
the name when the holder dies, `kill -9` included, so a stale lock never blocks; every user of
the network namespace sees it; a second broker connects to it, reads the holder's uid and pid
from SO_PEERCRED and its socket from one JSON line the holder answers. A live holder of any
user is never taken over: the name cannot be bound while it lives.

Any user can bind the name first, so it only keeps per-user brokers apart: the system broker's
authority is a lock only root or its account can hold (`rbroker.hosting.authority`). A holder
that does not answer as a broker (bound without listening, or silent) is named by user and
pid where /proc shows it (`ss -xlp` finds it otherwise), never as a running broker.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import socket
import struct
import sys
import threading
import time

from rbroker.transport.base import LockHolder, MachineLockHeld

assert sys.platform.startswith("linux"), "rbroker.hosting.machine_lock_linux is for Linux"


class AbstractSocketLock:
    """The Linux lock: a listening abstract Unix socket, answered by a daemon thread."""

    def __init__(self, name: str, sock: socket.socket, identity: bytes) -> None:
        self.name = name
        self._sock = sock
        self._identity = identity
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._answer, name="rbroker-lock", daemon=True)
        self._thread.start()

    @classmethod
    def acquire(cls, name: str, socket_path: str, user: str) -> AbstractSocketLock:
        """Bind `\\0name`; on EADDRINUSE read the holder and raise `MachineLockHeld`.

        A holder that has bound but not yet listens (it is starting) is retried for ~1 s.
        """
        identity = (
            json.dumps({"user": user, "pid": os.getpid(), "socket": socket_path}) + "\n"
        ).encode()
        for _attempt in range(20):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                sock.bind("\0" + name)
            except OSError as exc:
                sock.close()
                if exc.errno != errno.EADDRINUSE:
                    raise
                holder = _read_holder(name)
                if holder is not None:
                    raise MachineLockHeld(name, holder) from None
                time.sleep(0.05)  # bound, not yet listening: look again
                continue
            sock.listen(64)
            return cls(name, sock, identity)
        raise MachineLockHeld(name, _bound_by(name))

    def _answer(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed by release()
            with contextlib.suppress(OSError), conn:
                conn.settimeout(1.0)
                conn.sendall(self._identity)

    def release(self) -> None:
        """Stop answering and free the name."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self._sock.close()
        self._thread.join(2.0)


def _read_holder(name: str) -> LockHolder | None:
    """Connect to the lock and read who holds it; None when nobody listens on it yet."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    probe.settimeout(1.0)
    try:
        probe.connect("\0" + name)
    except (ConnectionRefusedError, FileNotFoundError):
        probe.close()
        return None
    except OSError:
        probe.close()
        return _bound_by(name)
    with probe:
        creds = probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", creds)
        said: dict[str, object] = {}
        with contextlib.suppress(OSError, ValueError):
            data = b""
            while not data.endswith(b"\n") and len(data) < 4096:
                chunk = probe.recv(4096)
                if not chunk:
                    break
                data += chunk
            loaded = json.loads(data)
            if isinstance(loaded, dict):
                said = loaded
    sock_path = said.get("socket")
    answered = isinstance(sock_path, str) and isinstance(said.get("pid"), int)
    return LockHolder(
        _user_name(uid), pid, sock_path if isinstance(sock_path, str) else None, answered
    )


def _bound_by(name: str) -> LockHolder:
    """Who bound `\\0name` without listening on it (a broker never does that for long): the
    socket's inode from /proc/net/unix, then the process with that inode among its open
    files (every process for root; only this user's otherwise). Unknown parts are None."""
    inodes: set[str] = set()
    with (
        contextlib.suppress(OSError),
        open("/proc/net/unix", encoding="utf-8", errors="replace") as table,
    ):
        for line in table:
            fields = line.split()
            if len(fields) >= 8 and fields[7] == "@" + name:
                inodes.add(fields[6])
    wanted = {f"socket:[{inode}]" for inode in inodes}
    if wanted:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                for fd in os.scandir(f"/proc/{entry.name}/fd"):
                    with contextlib.suppress(OSError):
                        if os.readlink(fd.path) in wanted:
                            uid = os.stat(f"/proc/{entry.name}").st_uid
                            return LockHolder(_user_name(uid), int(entry.name), None, False)
    return LockHolder(None, None, None, False)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
