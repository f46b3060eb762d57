"""Startup checks shared by `rbroker broker` and `rbroker tray`: one line with the fix for
each `OSError` a starting broker can meet (exit codes: `rbroker_protocol.startup`)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from rbroker_protocol.files import make_dir
from rbroker_protocol.startup import (
    EXIT_NO_SPACE,
    EXIT_PATH_TOO_LONG,
    check_socket_path,
    os_error_code,
    os_error_text,
)


def os_error_line(exc: OSError, socket_path: str, data_dir: Path) -> tuple[int, str]:
    """`(exit code, one line with the fix)` for an `OSError` met while a broker starts
    (creating or binding the socket, locking or opening the data dir); used by
    `rbroker broker` and `rbroker tray`. Codes: `rbroker_protocol.startup`."""
    code = os_error_code(exc)
    if code == EXIT_PATH_TOO_LONG:
        what = os_error_text(exc) if exc.filename else f"{exc}: {socket_path}"
        return code, (
            f"cannot start: {what}; choose a shorter socket path with --socket "
            "(or RBROKER_SOCKET), e.g. under $XDG_RUNTIME_DIR"
        )
    fix = (
        "free some space there, or choose"
        if code == EXIT_NO_SPACE
        else "fix its permissions or file system, or choose"
    )
    return code, (
        f"cannot start: {os_error_text(exc)}; {fix} a socket path and a data directory this "
        f"user can write with --socket and --data-dir (now {socket_path} and {data_dir})"
    )


def check_broker_paths(socket_path: str, data_dir: Path) -> None:
    """Fail before anything starts when a broker could not listen at `socket_path` or keep
    its state in `data_dir`: the path's length, then both directories created (as the broker
    would: 0700, and so are parents made for them, whatever the umask) and a file written
    and removed in each.

    Raises:
        OSError: `SocketPathTooLong`, PermissionError, a read-only or full file system, ...
            with the directory as `filename`.
    """
    check_socket_path(socket_path)
    _check_writable(Path(socket_path).parent, 0o700)
    check_data_dir(data_dir)


def check_data_dir(data_dir: Path) -> None:
    """Create `data_dir` if needed (0700, parents made for it too, whatever the umask) and
    write and remove a file in it.

    Raises:
        OSError: PermissionError, a read-only or full file system, ... with the directory
            as `filename`.
    """
    _check_writable(data_dir, 0o700)


def _check_writable(directory: Path, mode: int) -> None:
    try:
        make_dir(directory, mode)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:  # named after the directory, not the temporary file
        raise OSError(exc.errno, exc.strerror, str(directory)) from None
