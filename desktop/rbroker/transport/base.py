"""What the OS files of the transport share (architecture.md §5): who is on the other end
(`Peer`, read from the OS, never from a request), the server's handler and listener, the
client's `Stream`, and the errors that say another broker is there (`BrokerAlreadyRunning`,
and `MachineLockHeld` naming its `LockHolder`).

`unix.py` and `pipe_windows.py` each serve both ends on their OS; `rbroker.transport.serve`
and `rbroker.transport.connect` pick the one for this OS.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, TypeAlias

if TYPE_CHECKING:  # a client's start-up loads no asyncio (docs/architecture.md §10)
    import asyncio


@dataclass(frozen=True, slots=True)
class Peer:
    """Who is on the other end: `pid` of the connecting process and its OS user name;
    `uid` on Unix; on Windows the account's `sid` and `elevated_admin` (the token's
    Administrators group is enabled: an elevated administrator)."""

    pid: int
    user: str
    uid: int | None = None
    sid: str | None = None
    elevated_admin: bool = False


def account_of(peer: Peer) -> str:
    """The account behind `peer`'s name, as jobs keep it (`uid 1001` on Unix, `sid S-1-5-…`
    on Windows; "" where neither was read): a name can be given to a new account, a uid or
    SID in use is that account's."""
    if peer.uid is not None:
        return f"uid {peer.uid}"
    if peer.sid:
        return f"sid {peer.sid}"
    return ""


PeerOf: TypeAlias = "Callable[[asyncio.BaseTransport], Peer]"
"""Reads who is on the other end of a connection the transport has just made, from the OS
(never from a request). Raises OSError when it cannot be read: the connection is then
closed unserved."""

Handler: TypeAlias = "Callable[[PeerOf, int], asyncio.Protocol]"
"""Builds the protocol of one accepted connection: `handler(peer_of, limit)`, `limit` the
longest request line (bytes) it accepts. Its `connection_made` calls `peer_of(transport)`."""


class BrokerAlreadyRunning(RuntimeError):
    """Another broker answers at this address; it is left alone."""


class ListeningServer(Protocol):
    """What `rbroker.transport.serve()` returns."""

    address: str

    async def close(self) -> None:
        """Stop accepting, close the listening endpoint, remove its file if any."""


Readiness = Literal["data", "closed", "woken", "timeout"]


class Stream(Protocol):
    """A client's connection, read line by line through its own buffer (what
    `rbroker.transport.connect()` returns): a read that times out loses nothing and the
    connection stays usable."""

    def write(self, data: bytes) -> None:
        """Send all of `data`. Raises OSError (closed) and TimeoutError."""

    def readline(self) -> bytes:
        """One line with its newline; b"" at end of stream. Raises TimeoutError (what came
        stays buffered) and OSError (this stream was closed)."""

    def settimeout(self, timeout_s: float | None) -> None:
        """Seconds each later read or write may wait (None: forever)."""

    def wait_readable(self, timeout_s: float, wake: socket.socket | None) -> Readiness:
        """Wait until the broker sends something or closes ("data" / "closed"), `wake`
        becomes readable ("woken") or `timeout_s` passes ("timeout")."""

    def close(self) -> None:
        """Close the connection; a read or write in another thread ends at once."""


@dataclass(frozen=True, slots=True)
class LockHolder:
    """Who holds the lock, as far as it could be read (None: not known)."""

    user: str | None
    pid: int | None
    socket: str | None
    answered: bool = True
    """False: the holder did not answer as a broker does (a process that took the name
    without listening on it, or that sends no identity): no broker is claimed to run."""

    def describe(self) -> str:
        """`user alice, pid 1234, socket /run/rbroker/broker.sock` (unknown parts say so)."""
        return (
            f"user {self.user or 'unknown'}, pid {self.pid if self.pid else 'unknown'}, "
            f"socket {self.socket or 'unknown'}"
        )


SYSTEM_LOCK_NAME = "the system broker's lock"
"""`MachineLockHeld.name` when the system broker's authority is what is held."""


class MachineLockHeld(BrokerAlreadyRunning):
    """Another broker holds the machine-wide lock; `holder` says who. A holder that did not
    answer as a broker (`holder.answered` false) is named as a process, never as a broker:
    by user and pid when they could be read, else with the command that finds it."""

    def __init__(self, name: str, holder: LockHolder) -> None:
        self.name = name
        self.holder = holder
        if name == SYSTEM_LOCK_NAME and not holder.pid:
            text = (
                "the system broker's lock is held by a process of root or the broker's "
                "account that names itself nowhere; find it with `fuser -v "
                "/run/rbroker/broker.lock` (as root, in the system socket's directory)"
            )
        elif name == SYSTEM_LOCK_NAME:
            text = f"the system broker is running on this computer ({holder.describe()})"
        elif holder.answered:
            text = (
                f"another rbroker broker is already running on this computer ({holder.describe()})"
            )
        elif holder.pid:
            text = (
                f"the computer's broker lock {name!r} (an abstract Unix socket) is held by a "
                f"process that does not answer as a broker (user {holder.user or 'unknown'}, "
                f"pid {holder.pid}); no broker runs: ask that user or an administrator to stop "
                "it, or run the system broker (`rbroker broker --system`), which it cannot block"
            )
        else:
            text = (
                f"the computer's broker lock {name!r} (an abstract Unix socket) is held by a "
                "process that does not answer as a broker and that this account cannot name; "
                f"no broker runs: find it with `ss -xlp | grep {name}` (as root), or run the "
                "system broker (`rbroker broker --system`), which it cannot block"
            )
        super().__init__(text)
