"""The system broker's authority on Linux: a lock only root or its account can hold, that
every user can see (architecture.md §5, "One broker per computer").

It lives in the system socket's directory (`/run/rbroker`, systemd's `RuntimeDirectory=`;
`$RBROKER_SYSTEM_SOCKET` moves it), which must belong to root or to the broker's account and
be writable by nobody else (`safe_paths.check_private_path`), so no other user can create a
file there:

- `broker.lock` (mode 0600): the system broker holds an exclusive `flock` on it while it
  runs. Only root and the account can open it, so nobody else can hold it, not even a shared
  lock; the kernel frees it when the holder dies (`kill -9` too).
- `broker.holder` (mode 0644): who holds it, one JSON object (`user`, `uid`, `pid`,
  `start_s` — the process's start in seconds since boot, `boot_id` — and `socket`),
  written (a temporary file renamed into place) after the lock is taken. Any user reads it;
  it counts only while the named process lives with that start time, so one left by a
  killed broker names nobody.

A per-user broker (and every client that finds no socket) reads the holder
(`rbroker.transport.system_holder`, where a client reads it without this module): while the
system broker lives, a per-user broker refuses to start, naming it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import sys
from pathlib import Path

import psutil

from rbroker.base.proctime import holder_clock, start_s
from rbroker.transport.base import SYSTEM_LOCK_NAME, LockHolder, MachineLockHeld
from rbroker.transport.safe_paths import check_private_path, open_nofollow
from rbroker.transport.system_holder import HOLDER_FILE, authority_dir, read_system_holder

assert sys.platform.startswith("linux"), "rbroker.hosting.authority is for Linux"

log = logging.getLogger(__name__)

LOCK_FILE = "broker.lock"


def user_name(uid: int) -> str:
    """The user name of `uid`, or its number where the passwd database has none."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _identity(socket_path: str) -> dict[str, object]:
    pid = os.getpid()
    return {
        "user": user_name(os.geteuid()),
        "uid": os.geteuid(),
        "pid": pid,
        "start_s": start_s(psutil.Process(pid)),
        "boot_id": holder_clock(),
        "socket": socket_path,
    }


class SystemAuthority:
    """The held system authority (see the module docstring). `keep()` puts its files back
    when they were removed (`rm -rf /run/rbroker`, systemd-tmpfiles)."""

    def __init__(self, directory: Path, socket_path: str) -> None:
        self.name = SYSTEM_LOCK_NAME
        self.directory = directory
        self._socket_path = socket_path
        self._fd: int | None = None
        self._inode: tuple[int, int] | None = None

    @classmethod
    def acquire(cls, socket_path: str, directory: Path | None = None) -> SystemAuthority:
        """Take the authority in `directory` (default `authority_dir()`), made 0755 when
        missing.

        Raises:
            MachineLockHeld: another system broker holds it (named from its holder file).
            UnsafePath: the directory belongs to another user or others can write it.
            OSError: the directory or the lock file cannot be made.
        """
        held = cls(directory or authority_dir(), socket_path)
        held._take()
        return held

    def _take(self) -> None:
        directory = self.directory
        running = read_system_holder(directory)
        if running is not None and running.pid != os.getpid():  # named before any check
            raise MachineLockHeld(SYSTEM_LOCK_NAME, running)
        check_private_path(directory, only_as_root=False)
        if not directory.exists():
            directory.mkdir(parents=True, mode=0o755)
            os.chmod(directory, 0o755)  # under a umask too: others reach the socket in it
            check_private_path(directory, only_as_root=False)
        fd = open_nofollow(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            holder = read_system_holder(directory) or LockHolder(None, None, None)
            raise MachineLockHeld(SYSTEM_LOCK_NAME, holder) from None
        st = os.fstat(fd)
        self._fd, self._inode = fd, (st.st_dev, st.st_ino)
        self._write_holder()

    def _write_holder(self) -> None:
        tmp = self.directory / f".{HOLDER_FILE}.{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as out:
            os.fchmod(out.fileno(), 0o644)
            out.write(json.dumps(_identity(self._socket_path)) + "\n")
        os.replace(tmp, self.directory / HOLDER_FILE)

    def keep(self) -> None:
        """Put the lock and holder files back where they are gone or no longer ours (a
        second start of this check costs two `stat` calls). Failures are logged."""
        if self._fd is None:
            return
        try:
            st = os.stat(self.directory / LOCK_FILE, follow_symlinks=False)
            ours = (st.st_dev, st.st_ino) == self._inode
        except OSError:
            ours = False
        if ours:
            if not os.path.exists(self.directory / HOLDER_FILE):
                try:
                    self._write_holder()
                except OSError as exc:
                    log.error("cannot write the holder file in %s: %s", self.directory, exc)
            return
        log.warning("the system broker's lock in %s was removed: taking it again", self.directory)
        old = self._fd
        self._fd = None
        try:
            self._take()
        except MachineLockHeld as exc:
            log.error("another system broker took the lock meanwhile: %s", exc)
        except OSError as exc:
            log.error("cannot put the system broker's lock back in %s: %s", self.directory, exc)
        finally:
            if self._fd is None:  # keep the old lock (on the removed file) and try again
                self._fd = old
            else:
                os.close(old)

    def release(self) -> None:
        """Remove the holder file (when still ours) and give the lock back (idempotent)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            st = os.stat(self.directory / LOCK_FILE, follow_symlinks=False)
            if (st.st_dev, st.st_ino) == self._inode:
                os.unlink(self.directory / HOLDER_FILE)
        os.close(self._fd)
        self._fd = None
