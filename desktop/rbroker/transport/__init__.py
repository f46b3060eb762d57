"""The transport of the local API: both ends of the OS channel a broker and its clients talk
over (architecture.md §5).

One file per OS serves both ends: `unix.py` (Unix socket: the listening server and the
client's stream) and `pipe_windows.py` (named pipe, with its pure rules in
`pipe_security.py`); `serve()` and `connect()` pick the one for this OS. What they share is
in `base.py`, the errors that say another broker is there included. Also here: the system
broker's fixed places (`system_paths.py`), who holds the Linux system broker's authority as
any user reads it (`system_holder.py`), the directories a privileged broker can trust
(`safe_paths.py`) and Windows' accounts (`win_accounts.py`). The machine-wide locks a broker
takes are hosting's (`rbroker.hosting.machine_lock`). Nothing here imports the broker.
"""

from __future__ import annotations

import sys

# A client's start-up loads no asyncio, no `typing` and not the serving end's types
# (docs/architecture.md §10): the idiom type checkers read as typing.TYPE_CHECKING
# (PEP 484's constant, never true at run time).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio

    from rbroker.transport.base import Handler, ListeningServer, Stream


async def serve(
    address: str, handler: Handler, limit: int, *, shared: bool = False, group: str | None = None
) -> ListeningServer:
    """Listen at `address` (socket path or pipe name) with this OS's transport.

    Each connection is served by the protocol `handler(peer_of, limit)` builds
    (`rbroker.transport.base.Handler`); `limit` is the longest request line (bytes) it
    accepts. `shared` and `group`
    (Unix sockets): a socket for other local users too — every user (`shared`, mode 0666)
    or the members of `group` (mode 0660, owned by that group); else the broker's own
    user's (0660 in a 0700 directory).

    Raises:
        BrokerAlreadyRunning: a live broker already listens there.
        OSError: the address cannot be bound.
    """
    if sys.platform == "win32":
        from rbroker.transport.pipe_windows import serve_pipe

        return await serve_pipe(address, handler, limit)
    else:
        from rbroker.transport.unix import serve_unix

        return await serve_unix(address, handler, limit, shared=shared, group=group)


def connect(address: str, timeout_s: float | None) -> Stream:
    """A client's connection to the broker at `address` (socket path or pipe name), with this
    OS's transport; `timeout_s` bounds the connect and each later read or write (None:
    forever; a busy listener is waited on for at most 5 s on Unix, `timeout_s` or 30 s for
    a pipe).

    Raises:
        PermissionError: this user may not open the socket or pipe.
        FileNotFoundError: nothing listens there.
        UntrustedPipeServer: (Windows) the pipe's server runs as another account.
        OSError: any other failure to connect.
    """
    if sys.platform == "win32":
        from rbroker.transport.pipe_windows import PipeStream

        return PipeStream(address, timeout_s)
    else:
        from rbroker.transport.unix import UnixStream

        return UnixStream(address, timeout_s)


def peer_hung_up(transport: asyncio.BaseTransport) -> bool:
    """Whether the peer of a connection the broker accepted has closed its end, so that
    nothing written to it will be read (Unix: the socket polls as hung up, which a peer's
    close gives and its `shutdown(SHUT_WR)` does not; a named pipe: False, its close is
    seen at the next read). One system call, no read: the lines already received stay."""
    if sys.platform == "win32":
        return False
    else:
        from rbroker.transport.unix import hung_up

        return hung_up(transport)
