"""Private files of the broker and the coordinator alike: a data dir 0700 (an existing one
keeps at most 0750, for a service group), a SQLite database 0600 and an append-only file
beside it 0600 (`private_append`: the broker's lease journal), whatever the umask.

SQLite creates a database's `-wal`, `-shm` and `-journal` files with the database file's
own mode, so the database is created 0600 before SQLite first opens it; files that an
older version created more open are tightened when they are opened again.
Nothing changes on systems without POSIX modes (Windows) or for files of other owners.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Final

DIR_MODE: Final = 0o700
"""Mode of a data dir the broker or the coordinator creates."""
FILE_MODE: Final = 0o600
"""Mode of the database and its WAL, SHM and journal files."""
_SIDE_FILES: Final = ("-wal", "-shm", "-journal")
_LINK: Final = "a symbolic link where a database file belongs (not followed; remove it)"


def _tighten(path: Path, allowed: int) -> None:
    with contextlib.suppress(OSError):  # not ours, or gone: leave it
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & ~allowed:
            path.chmod(mode & allowed)


def private_dir(path: Path) -> Path:
    """Create `path` (with its parents) as `DIR_MODE`; an existing directory loses group
    write and every right of others (0750 at most). Returns `path`.

    Raises:
        OSError: it cannot be created.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    if os.name == "posix":
        _tighten(path, 0o750)
    return path


def private_sqlite(path: Path) -> None:
    """Make SQLite database `path` private before it is opened: its directory as
    `private_dir`, the file created `FILE_MODE` when missing, and the file with its WAL,
    SHM and journal files tightened to `FILE_MODE` when they exist.

    None of them may be a symbolic link (`O_NOFOLLOW`): a process run as root would
    otherwise write its database over whatever file the link names.

    Raises:
        OSError: the directory or the file cannot be created; ELOOP: one of the files is a
            symbolic link (`filename` names it).
    """
    path = Path(path)
    private_dir(path.parent)
    if os.name != "posix":
        return
    nofollow = os.O_NOFOLLOW | os.O_CLOEXEC  # type: ignore[attr-defined,unused-ignore]
    for candidate in (path, *(path.with_name(path.name + s) for s in _SIDE_FILES)):
        if candidate.is_symlink():
            raise OSError(errno.ELOOP, _LINK, str(candidate))
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | nofollow, FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link put there since the look above
            raise OSError(errno.ELOOP, _LINK, str(path)) from None
        raise
    os.close(fd)
    for candidate in (path, *(path.with_name(path.name + s) for s in _SIDE_FILES)):
        _tighten(candidate, FILE_MODE)


def private_append(path: Path) -> int:
    """Open file `path` for appending (`O_APPEND`, binary) and return its descriptor: its
    directory as `private_dir`, the file created `FILE_MODE` when missing and tightened to it
    when it exists. It may not be a symbolic link (`O_NOFOLLOW`, as `private_sqlite`). The
    descriptor reads too (from offset 0 after `os.lseek`); writes always go to the end.

    Raises:
        OSError: the directory or the file cannot be created or opened; ELOOP: the file is a
            symbolic link (`filename` names it).
    """
    path = Path(path)
    private_dir(path.parent)
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0)
    if os.name != "posix":
        return os.open(path, flags, FILE_MODE)
    if path.is_symlink():
        raise OSError(errno.ELOOP, _LINK, str(path))
    nofollow = os.O_NOFOLLOW | os.O_CLOEXEC  # type: ignore[attr-defined,unused-ignore]
    try:
        fd = os.open(path, flags | nofollow, FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link put there since the look above
            raise OSError(errno.ELOOP, _LINK, str(path)) from None
        raise
    _tighten(path, FILE_MODE)
    return fd
