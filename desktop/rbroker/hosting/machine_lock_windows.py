"""The Windows machine-wide broker lock: the `Global\\<name>` named mutex (architecture.md §5).

`Global\\` puts the mutex in the namespace every session shares, so the brokers of every
signed-in user and of the service see one another. The mutex is owned by its handle: when the
holder exits, or is killed, Windows closes the handle and the name is free again. A mutex that
already exists (ERROR_ALREADY_EXISTS), or that another user's default security descriptor
keeps this one from opening (ERROR_ACCESS_DENIED), is held by a live broker: never taken over.
The holder writes who it is to `<ProgramData>\\rbroker\\locks\\<name>.json` for the message
of the second broker (best effort: a mutex carries no data). Where the service has secured
that folder (`rbroker.hosting.win_acl.LOCKS_DIR_SDDL`) every user may add a file to
`locks\\` and read the others', and change or delete only their own: a file left behind by
another user's broker that crashed is not overwritten (the lock holds without it, and the
second broker's message may name that stale holder).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sys
from pathlib import Path

from rbroker.transport.base import LockHolder, MachineLockHeld
from rbroker.transport.system_paths import program_data_dir

ERROR_ALREADY_EXISTS = 183
ERROR_ACCESS_DENIED = 5


def _identity_file(name: str) -> Path:
    # the known folder, not the variable: a service's environment can say another place
    return program_data_dir() / "rbroker" / "locks" / f"{name}.json"


def _read_identity(name: str) -> LockHolder:
    try:
        said = json.loads(_identity_file(name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return LockHolder(None, None, None)
    if not isinstance(said, dict):
        return LockHolder(None, None, None)
    user, pid, sock = said.get("user"), said.get("pid"), said.get("socket")
    return LockHolder(
        user if isinstance(user, str) else None,
        pid if isinstance(pid, int) else None,
        sock if isinstance(sock, str) else None,
    )


if sys.platform == "win32":
    from ctypes import wintypes

    _kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    _CreateMutexW = _kernel32.CreateMutexW
    _CreateMutexW.argtypes = [wintypes.LPVOID, wintypes.BOOL, wintypes.LPCWSTR]
    _CreateMutexW.restype = wintypes.HANDLE
    _CloseHandle = _kernel32.CloseHandle
    _CloseHandle.argtypes = [wintypes.HANDLE]
    _CloseHandle.restype = wintypes.BOOL

    class WindowsMutexLock:
        """A held `Global\\<name>` mutex; `release()` closes its handle."""

        def __init__(self, name: str, handle: int, identity: Path | None) -> None:
            self.name = name
            self._handle: int | None = handle
            self._identity = identity

        def release(self) -> None:
            """Close the mutex (idempotent) and remove the identity file it wrote."""
            if self._handle is None:
                return
            if self._identity is not None:
                with contextlib.suppress(OSError):
                    self._identity.unlink()
            _CloseHandle(self._handle)
            self._handle = None

    def acquire_windows_lock(name: str, socket_path: str, user: str) -> WindowsMutexLock:
        """Create and own `Global\\name`.

        Raises:
            MachineLockHeld: the mutex exists (a live broker of any user holds it).
            OSError: CreateMutexW failed for another reason.
        """
        ctypes.set_last_error(0)
        handle = _CreateMutexW(None, True, "Global\\" + name)
        error = ctypes.get_last_error()
        if not handle:
            if error == ERROR_ACCESS_DENIED:
                raise MachineLockHeld(name, _read_identity(name))
            raise ctypes.WinError(error)
        if error == ERROR_ALREADY_EXISTS:
            _CloseHandle(handle)
            raise MachineLockHeld(name, _read_identity(name))
        path: Path | None = _identity_file(name)
        try:
            assert path is not None
            if not path.parent.is_dir():  # the service's `locks\` lets users add files only
                path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(
                json.dumps({"user": user, "pid": os.getpid(), "socket": socket_path}),
                encoding="utf-8",
            )
        except OSError:
            path = None  # the lock holds without it; the second broker's message says less
        return WindowsMutexLock(name, int(handle), path)
