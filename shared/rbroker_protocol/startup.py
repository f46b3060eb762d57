"""Startup failures of `rbroker broker`, `rbroker tray` and `rbroker-server serve`.

Each failure to start is one line on stderr saying what failed and how to fix it, and an
exit code per kind of failure, the same for the three commands (docs/user-guide.md lists
them). Codes 1 to 3 are the ones these commands used before; the rest are distinct per cause,
so scripts and service managers can tell them apart.
"""

from __future__ import annotations

import errno
import sys

EXIT_CANNOT_START = 1
"""Broker: another broker already runs here, bad scenario, GPUs cannot be read. Server: an
admin error or a missing config."""
EXIT_USAGE = 2
"""Bad arguments."""
EXIT_TRAY_ALREADY_RUNNING = 3
"""Tray only: another tray already runs (it was asked to show its window)."""
EXIT_BROKER_ALREADY_RUNNING = 3
"""Broker: another broker, of any user, holds this computer's broker lock (the line names its
user, pid and socket)."""
EXIT_PATH_TOO_LONG = 10
"""The Unix socket path is over the OS limit (`SOCKET_PATH_MAX_BYTES`)."""
EXIT_PERMISSION = 11
"""Permission denied on a directory or file (socket dir, data dir, config, TLS files), or
on a privileged port."""
EXIT_ADDRESS_IN_USE = 12
"""The server's address and port are taken by another process."""
EXIT_READ_ONLY = 13
"""A file the command must write is on a read-only file system."""
EXIT_NO_SPACE = 14
"""No space (or quota) left where the command must write."""
EXIT_DATABASE = 15
"""The database cannot be opened, reached or migrated."""
EXIT_TLS = 16
"""The server's TLS certificate or key cannot be loaded."""
EXIT_OS_ERROR = 19
"""Any other operating-system error (the line names it)."""
EXIT_INTERNAL = 70
"""An unexpected error at startup (sysexits' EX_SOFTWARE); `-v` shows the traceback."""

SOCKET_PATH_MAX_BYTES = 107 if sys.platform.startswith("linux") else 103
"""Longest Unix socket path: `sun_path` is 108 bytes on Linux and 104 on macOS/BSD, one of
them the terminating NUL (unix(7))."""


class SocketPathTooLong(OSError):
    """A Unix socket path longer than `SOCKET_PATH_MAX_BYTES` (errno ENAMETOOLONG)."""

    def __init__(self, path: str) -> None:
        self.length = len(path.encode(errors="surrogateescape"))
        super().__init__(
            errno.ENAMETOOLONG,
            f"the socket path is {self.length} bytes, over the OS limit of "
            f"{SOCKET_PATH_MAX_BYTES} for Unix sockets",
            path,
        )


def check_socket_path(path: str) -> None:
    """Raise `SocketPathTooLong` when `path` cannot be a Unix socket address (not on Windows,
    where the broker listens on a named pipe)."""
    if sys.platform == "win32" or path.startswith("\\\\"):
        return
    if len(path.encode(errors="surrogateescape")) > SOCKET_PATH_MAX_BYTES:
        raise SocketPathTooLong(path)


def os_error_code(exc: OSError) -> int:
    """The exit code for an `OSError` met at startup (see the `EXIT_*` constants)."""
    if exc.errno == errno.ENAMETOOLONG or "path too long" in str(exc):
        # Python's socket module raises `OSError("AF_UNIX path too long")` with no errno
        return EXIT_PATH_TOO_LONG
    if exc.errno in (errno.EACCES, errno.EPERM):
        return EXIT_PERMISSION
    if exc.errno == errno.EADDRINUSE:
        return EXIT_ADDRESS_IN_USE
    if exc.errno == errno.EROFS:
        return EXIT_READ_ONLY
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return EXIT_NO_SPACE
    return EXIT_OS_ERROR


def os_error_text(exc: OSError) -> str:
    """What the OS said, with the file it was about: `Permission denied: '/srv/rbroker'`."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    if isinstance(exc, SocketPathTooLong):
        return f"{reason}: {exc.filename}"
    name = exc.filename
    return f"{reason}: {name!r}" if name else reason


def one_line(text: str) -> str:
    """`text` on one line (messages from drivers and databases can span several)."""
    return " ".join(text.split())
