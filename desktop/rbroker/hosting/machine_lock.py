"""The machine-wide broker lock: one admission authority per computer (architecture.md §5).

Every broker on real GPUs (`rbroker broker`, `rbroker broker --system`, the tray's in-process
broker) takes this lock before it opens its data dir or listens; a second one, of any OS
user, fails with `MachineLockHeld` naming the holder's user, pid and socket, and `rbroker
broker` exits 3.

Linux has two levels. The system broker's authority (`rbroker.hosting.authority`): a lock
file in the system socket's directory, which only root or the broker's account can hold and
every user can see; a per-user broker refuses while it is held. Below it, the abstract Unix
socket `\\0<name>` (`machine_lock_linux`) keeps two per-user brokers apart; the system
broker takes it too where it is free and starts all the same where it is not (saying who
holds it), so no unprivileged user can keep the system broker down. Windows: the
`Global\\<name>` mutex (`machine_lock_windows`). Elsewhere (macOS): no lock.

The name: a broker on real GPUs always takes `rbroker-broker` (another name would let a
second broker admit against the same real memory): it refuses any other `--machine-lock` and
ignores `$RBROKER_BROKER_LOCK`. A simulated broker admits against invented GPUs, so by
default it takes a name of its own derived from its socket address (`per-socket`) and looks
at no system broker: it neither blocks a real broker nor is blocked by one. Given a name
(`configured`, the `--machine-lock` option, else `$RBROKER_BROKER_LOCK`), it takes exactly
what a real broker takes under that name, system authority included: the tests use
`--machine-lock rbroker-broker` (or a name of their own) to stand for real brokers.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
from typing import Any, Protocol

from rbroker.transport.base import SYSTEM_LOCK_NAME, MachineLockHeld

ENV_LOCK = "RBROKER_BROKER_LOCK"
DEFAULT_LOCK_NAME = "rbroker-broker"
PER_SOCKET = "per-socket"
log = logging.getLogger(__name__)
_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,80}")


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
    name = configured or os.environ.get(ENV_LOCK) or PER_SOCKET
    if name == PER_SOCKET:
        digest = hashlib.sha256(os.path.abspath(socket_path).encode()).hexdigest()[:24]
        return f"{DEFAULT_LOCK_NAME}-{digest}"
    if not _NAME_RE.fullmatch(name):
        raise ValueError(
            f"machine lock name {name!r}: use 1 to 80 letters, digits, '.', '_' or '-'"
        )
    return name


def sees_system_broker(configured: str | None, *, simulated: bool) -> bool:
    """Whether a broker takes the computer's locks at all: every broker on real GPUs, and a
    simulated one given a name (option or variable) other than `per-socket`."""
    if not simulated:
        return True
    return (configured or os.environ.get(ENV_LOCK) or PER_SOCKET) != PER_SOCKET


def ignored_lock_variable(simulated: bool) -> str | None:
    """The value of `$RBROKER_BROKER_LOCK` a broker on real GPUs ignores (None: nothing is
    ignored: the broker is simulated, or the variable is unset or names the default)."""
    value = os.environ.get(ENV_LOCK)
    if simulated or not value or value == DEFAULT_LOCK_NAME:
        return None
    return value


def acquire_machine_lock(
    name: str,
    socket_path: str,
    user: str,
    *,
    system: bool = False,
    check_system: bool = True,
) -> MachineLock:
    """Take the machine-wide lock `name` for the broker of `user` listening at `socket_path`.

    Linux: `system` takes the system broker's authority first (`rbroker.hosting.authority`)
    and then `name` where it is free; otherwise `name`, then, with `check_system`, a look at
    the system broker's authority (before taking the name, to name the system broker even where
    another process holds the name, and after, so that a per-user broker and a system broker
    starting together never both miss each other).

    Raises:
        MachineLockHeld: a live broker holds it (its identity in the exception), or a process
            that does not answer as a broker holds `name` (named as far as it can be).
        UnsafePath: (`system`) the authority's directory belongs to another user or others
            can write it.
        OSError: the lock could not be created for another reason.
    """
    if sys.platform == "win32":
        from rbroker.hosting.machine_lock_windows import acquire_windows_lock

        return acquire_windows_lock(name, socket_path, user)
    if sys.platform.startswith("linux"):
        from rbroker.hosting.authority import SystemAuthority
        from rbroker.hosting.machine_lock_linux import AbstractSocketLock
        from rbroker.transport.system_holder import read_system_holder

        if system:
            authority = SystemAuthority.acquire(socket_path)
            try:
                named: MachineLock | None = AbstractSocketLock.acquire(name, socket_path, user)
            except MachineLockHeld as exc:
                log.warning(
                    "starting all the same as the system broker, which holds %s: %s; a "
                    "per-user broker there admits against the same GPUs: stop it",
                    authority.directory,
                    exc,
                )
                named = None
            except BaseException:
                authority.release()
                raise
            return _Locks(name, authority, named)
        running = read_system_holder() if check_system else None
        if running is not None:  # named first, even where a squatter holds `name`
            raise MachineLockHeld(SYSTEM_LOCK_NAME, running)
        taken = AbstractSocketLock.acquire(name, socket_path, user)
        running = read_system_holder() if check_system else None
        if running is not None:  # started meanwhile: it saw `name` taken and says so
            taken.release()
            raise MachineLockHeld(SYSTEM_LOCK_NAME, running)
        return taken
    return NoLock(name)  # pragma: no cover - macOS: no machine-wide lock


class _Locks:
    """The system broker's locks: its authority and, where it was free, the named lock."""

    def __init__(self, name: str, authority: Any, named: MachineLock | None) -> None:
        self.name = name
        self.authority = authority
        self._named = named

    def keep(self) -> None:
        """Put the authority's files back where they were removed."""
        self.authority.keep()

    def release(self) -> None:
        """Give both back (idempotent)."""
        if self._named is not None:
            self._named.release()
        self.authority.release()


class NoLock:
    """Where there is no machine-wide lock (macOS)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def release(self) -> None:
        """Nothing to give back."""
