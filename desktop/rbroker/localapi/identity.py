"""Who is on the other end of a connection, as a process: its `Holder` (pid and start time),
what a lease is bound to (docs/architecture.md §3, §5). Only `lease.acquire` asks
(`Connection.holder`, read once per connection: the process on the other end of a socket
never changes).
"""

from __future__ import annotations

import sys

from rbroker.broker.holders import Holder
from rbroker.broker.launchers import interpreter_of, snapshot_around
from rbroker.transport.base import Peer
from rbroker_protocol.errors import ErrorCode, RpcError


def holder_of(peer: Peer) -> Holder:
    """The identity of the peer process (pid + start time). On Windows a launcher on the
    pipe (a venv's `python.exe`, `py.exe`, a console-script shim) stands for the
    interpreter it started (`rbroker.broker.launchers`): that is the process the driver
    lists.

    Raises:
        RpcError: `not_allowed` when the OS gives pid 0 (the peer is in a pid namespace
            the broker cannot see); `cancelled` when the peer has exited.
    """
    if peer.pid == 0:
        raise RpcError(
            ErrorCode.NOT_ALLOWED,
            "cannot identify the calling process (another pid namespace): run the "
            "client in the broker's pid namespace, or the broker in the client's",
            reason="peer_pid_unknown",
        )
    pid = peer.pid
    if sys.platform == "win32":
        pid = interpreter_of(snapshot_around(pid), pid)
    try:
        return Holder.of(pid)
    except ProcessLookupError:
        raise RpcError(ErrorCode.CANCELLED, "the requesting process has exited") from None
