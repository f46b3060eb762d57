"""Private files of the broker and the coordinator alike, whatever the umask: a data dir
0700 (an existing one keeps at most 0750, for a service group; parents it makes are 0700 too),
a SQLite database 0600, an append-only file beside it 0600 (`private_append`: the broker's lease
journal) and small files written whole 0600 (`private_create`, `private_replace`: the
enrollment, the key, the run counter). A mode is set with `fchmod` on the new file's own
descriptor after `os.open`, so neither a umask that opens it (0002, 0000) nor one that closes
it (0277) changes it. `unsafe_file` is the reading side: a file another account could have
written, for a reader that must not trust it (the broker's enrollment).

SQLite creates a database's `-wal`, `-shm` and `-journal` files with the database file's
own mode, so the database is created 0600 before SQLite first opens it; files that an
older version created more open are tightened when they are opened again.
Nothing changes on systems without POSIX modes (Windows, where the data folder's ACL keeps
others out) or for files of other owners.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Final, NamedTuple

DIR_MODE: Final = 0o700
"""Mode of a data dir the broker or the coordinator creates (and of parents it creates)."""
FILE_MODE: Final = 0o600
"""Mode of the database, its WAL, SHM and journal files and every other private file."""
_SIDE_FILES: Final = ("-wal", "-shm", "-journal")
_LINK: Final = "a symbolic link where a database file belongs (not followed; remove it)"


def _tighten(path: Path, allowed: int) -> None:
    with contextlib.suppress(OSError):  # not ours, or gone: leave it
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & ~allowed:
            path.chmod(mode & allowed)


def set_mode(fd: int, mode: int = FILE_MODE) -> None:
    """Give the open file `fd` exactly `mode` when this account owns it (POSIX only), as
    `os.open`'s mode is only what the umask leaves of it. A file of another owner (a root
    process's view of a user's file) is left as it is, and so is any error."""
    if sys.platform == "win32":
        return
    with contextlib.suppress(OSError):
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)


def make_dir(path: Path, mode: int) -> bool:
    """Create directory `path` and its missing parents, each with exactly `mode` (set after
    `mkdir`, so the umask neither opens nor closes it). An existing directory is left as it
    is. Returns whether `path` itself was created.

    Raises:
        OSError: a directory cannot be created (`filename` names it).
    """
    path = Path(path)
    missing = []
    for item in (path, *path.parents):
        if item.exists():
            break
        missing.append(item)
    for item in reversed(missing):
        try:
            item.mkdir(mode=mode)
        except FileExistsError:
            continue  # made by another process meanwhile: its mode is its maker's
        if os.name == "posix":
            os.chmod(item, mode)
    if not path.is_dir():
        path.mkdir()  # raises FileExistsError (a file there) or what blocked the creation
    return bool(missing)


def private_dir(path: Path) -> Path:
    """Create `path` (with its parents) as `DIR_MODE` (`make_dir`); an existing directory
    loses group write and every right of others (0750 at most). Returns `path`.

    Raises:
        OSError: it cannot be created.
    """
    path = Path(path)
    make_dir(path, DIR_MODE)
    if os.name == "posix":
        _tighten(path, 0o750)
    return path


class UnsafeFile(NamedTuple):
    """Why a file must not be trusted (`unsafe_file`): `problem` is its mode and owner and
    who else can write it, `fix` the command that makes it safe."""

    problem: str
    fix: str


def _account(uid: int) -> str:
    if sys.platform == "win32":
        return str(uid)
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def unsafe_file(path: Path, st: os.stat_result) -> UnsafeFile | None:
    """Why file `path`, whose `os.stat`/`os.fstat` is `st`, could have been written by an
    account other than root and this process's own (its group or others may write it, or it
    belongs to another non-root account), or None when only those could. POSIX only: always
    None on Windows, where the data folder's ACL (`rbroker.hosting.win_acl`) decides."""
    if sys.platform == "win32":
        return None
    mode = stat.S_IMODE(st.st_mode)
    owner = _account(st.st_uid)
    said = f"mode {mode:04o}, owner {owner}"
    me = os.geteuid()
    if st.st_uid not in (0, me):
        who = owner if owner.startswith("uid ") else f"{owner} (uid {st.st_uid})"
        return UnsafeFile(
            f"{said}: it belongs to {who}, not root or this account ({_account(me)})",
            f"chown {_account(me)} {path}",
        )
    pairs = ((stat.S_IWGRP, "group members"), (stat.S_IWOTH, "other users"))
    writers = [who for bit, who in pairs if mode & bit]
    if writers:
        return UnsafeFile(f"{said}: {' and '.join(writers)} can write it", f"chmod go-w {path}")
    return None


def private_create(path: Path, data: bytes) -> None:
    """Create file `path` holding `data`, mode `FILE_MODE`, in a `private_dir`; never
    replacing a file (`O_EXCL`) nor following a symbolic link there (`O_NOFOLLOW`).

    Raises:
        FileExistsError: something is at `path` already (a file or a link; left as it is).
        OSError: the directory or the file cannot be created or written.
    """
    path = Path(path)
    private_dir(path.parent)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    flags |= getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, FILE_MODE)
    try:
        set_mode(fd)
        os.write(fd, data)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)


def private_replace(path: Path, data: bytes) -> None:
    """Replace file `path` by one holding `data`, mode `FILE_MODE`, in a `private_dir`,
    atomically (`replace_file`).

    Raises:
        OSError: the directory or the file cannot be created, written or renamed (the
            temporary file is removed).
    """
    path = Path(path)
    private_dir(path.parent)
    _replace(path, data, FILE_MODE)


def replace_file(path: Path, data: bytes, mode: int, dir_mode: int = DIR_MODE) -> None:
    """Replace file `path` by one holding `data` with exactly `mode` (e.g. 0644 for a file
    others read but must not write, such as a desktop entry run at login), its missing
    parents made `dir_mode` (`make_dir`; an existing one is left as it is), atomically: a
    new temporary file beside it (`tempfile.mkstemp`: `O_EXCL`, `O_NOFOLLOW`, a name nobody
    chose in advance) written, flushed to disk and renamed over `path`. A reader sees the
    old content or the new, never a part; a symbolic link at `path` is replaced, never
    followed.

    Raises:
        OSError: the directory or the file cannot be created, written or renamed (the
            temporary file is removed).
    """
    path = Path(path)
    make_dir(path.parent, dir_mode)
    _replace(path, data, mode)


def _replace(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        set_mode(fd, mode)
        os.write(fd, data)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def private_sqlite(path: Path) -> None:
    """Make SQLite database `path` private before it is opened: its directory as
    `private_dir`, the file created `FILE_MODE` when missing and given exactly that mode
    when it exists (this account's file), its WAL, SHM and journal files tightened to
    `FILE_MODE` when they exist.

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
    set_mode(fd)  # new or older: exactly 0600, whatever the umask left
    os.close(fd)
    for candidate in (path, *(path.with_name(path.name + s) for s in _SIDE_FILES)):
        _tighten(candidate, FILE_MODE)


def private_append(path: Path, append: bool = True) -> int:
    """Open file `path` for appending (`O_APPEND`, binary; with `append` False for writes at
    any offset) and return its descriptor: its
    directory as `private_dir`, the file created `FILE_MODE` when missing and given exactly
    that mode when it exists (this account's file). It may not be a symbolic link
    (`O_NOFOLLOW`, as `private_sqlite`). The descriptor reads too (from offset 0 after
    `os.lseek`); writes always go to the end.

    Raises:
        OSError: the directory or the file cannot be created or opened; ELOOP: the file is a
            symbolic link (`filename` names it).
    """
    path = Path(path)
    private_dir(path.parent)
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0) | (os.O_APPEND if append else 0)
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
    set_mode(fd)
    return fd
