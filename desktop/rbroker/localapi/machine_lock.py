"""The machine-wide broker lock: one admission authority per computer (architecture.md §5).

Every broker (`rbroker broker`, `rbroker broker --system`, the tray's in-process broker) takes
this lock before it opens its data dir or listens; a second one, of any OS user, fails with
`MachineLockHeld` naming the holder's user, pid and socket, and `rbroker broker` exits 3.

Linux: the abstract Unix socket `\\0<name>` (`machine_lock_linux`). Windows: the
`Global\\<name>` mutex (`machine_lock_windows`). Elsewhere (macOS): no lock.

The name: a broker on real GPUs always takes `rbroker-broker` (another name would let a
second broker admit against the same real memory): it refuses any other `--machine-lock` and
ignores `$RBROKER_BROKER_LOCK`. A simulated broker takes `configured` (the `--machine-lock`
option), else `$RBROKER_BROKER_LOCK`, else `rbroker-broker`; the value `per-socket` derives a
name from the broker's socket address, so several simulated brokers can run on one computer
(the test suite, the demo). The lock code is the same for every name.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from dataclasses import dataclass
from typing import Protocol

from rbroker.localapi.transport import BrokerAlreadyRunning

ENV_LOCK = "RBROKER_BROKER_LOCK"
DEFAULT_LOCK_NAME = "rbroker-broker"
PER_SOCKET = "per-socket"
_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,80}")


@dataclass(frozen=True, slots=True)
class LockHolder:
    """Who holds the lock, as far as it could be read (None: not known)."""

    user: str | None
    pid: int | None
    socket: str | None

    def describe(self) -> str:
        """`user alice, pid 1234, socket /run/rbroker/broker.sock` (unknown parts say so)."""
        return (
            f"user {self.user or 'unknown'}, pid {self.pid if self.pid else 'unknown'}, "
            f"socket {self.socket or 'unknown'}"
        )


class MachineLockHeld(BrokerAlreadyRunning):
    """Another broker holds the machine-wide lock; `holder` says who."""

    def __init__(self, name: str, holder: LockHolder) -> None:
        self.name = name
        self.holder = holder
        super().__init__(
            f"another rbroker broker is already running on this computer ({holder.describe()})"
        )


class MachineLock(Protocol):
    """A held machine-wide lock."""

    name: str

    def release(self) -> None:
        """Give the lock back (idempotent); process exit gives it back too."""


def lock_name(configured: str | None, socket_path: str, *, simulated: bool) -> str:
    """The lock's name (see the module docstring): always `DEFAULT_LOCK_NAME` unless
    `simulated`.

    Raises:
        ValueError: the name is not 1–80 letters, digits, `.`, `_` or `-`; or a broker on
            real GPUs (`simulated` false) was given another name than `DEFAULT_LOCK_NAME`.
    """
    if not simulated:
        if configured and configured != DEFAULT_LOCK_NAME:
            raise ValueError(
                f"a broker on real GPUs always takes the computer's lock {DEFAULT_LOCK_NAME!r} "
                f"(another name, here {configured!r}, would let a second broker admit against "
                "the same GPU memory); other names are for --simulate only"
            )
        return DEFAULT_LOCK_NAME
    name = configured or os.environ.get(ENV_LOCK) or DEFAULT_LOCK_NAME
    if name == PER_SOCKET:
        digest = hashlib.sha256(os.path.abspath(socket_path).encode()).hexdigest()[:24]
        return f"{DEFAULT_LOCK_NAME}-{digest}"
    if not _NAME_RE.fullmatch(name):
        raise ValueError(
            f"machine lock name {name!r}: use 1 to 80 letters, digits, '.', '_' or '-'"
        )
    return name


def ignored_lock_variable(simulated: bool) -> str | None:
    """The value of `$RBROKER_BROKER_LOCK` a broker on real GPUs ignores (None: nothing is
    ignored: the broker is simulated, or the variable is unset or names the default)."""
    value = os.environ.get(ENV_LOCK)
    if simulated or not value or value == DEFAULT_LOCK_NAME:
        return None
    return value


def acquire_machine_lock(name: str, socket_path: str, user: str) -> MachineLock:
    """Take the machine-wide lock `name` for the broker of `user` listening at `socket_path`.

    Raises:
        MachineLockHeld: a live broker holds it (its identity in the exception).
        OSError: the lock could not be created for another reason.
    """
    if sys.platform == "win32":
        from rbroker.localapi.machine_lock_windows import acquire_windows_lock

        return acquire_windows_lock(name, socket_path, user)
    if sys.platform.startswith("linux"):
        from rbroker.localapi.machine_lock_linux import AbstractSocketLock

        return AbstractSocketLock.acquire(name, socket_path, user)
    return NoLock(name)  # pragma: no cover - macOS: no machine-wide lock


class NoLock:
    """Where there is no machine-wide lock (macOS)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def release(self) -> None:
        """Nothing to give back."""
