"""Directories a privileged broker can trust (architecture.md §5, "Root-safe paths").

A broker run as root (or the system broker, whose authority lives in its socket's
directory) acts on paths by name: it binds its socket, gives it a group, opens its lease
database. Where another user can write a directory on the way, that user can swap a name for
a symbolic link between two of those steps and turn the broker's root rights on a file of
their choosing. So such a broker refuses a directory that another user owns or can write,
and every directory above it that another user could rename it in, with one line naming it.

The rule for one directory (`unsafe_reason`): owned by root or by the broker's own user, and
writable by nobody else (no group or other write bit). Above it, a directory writable by
others is still safe when it has the sticky bit (`/tmp`): nobody else may rename or remove
what the broker owns there. A symbolic link anywhere is followed as the kernel would and the
rule applies to what it leads to, except the last component: a symlink there is refused.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from pathlib import Path


class UnsafePath(PermissionError):
    """A directory another user owns or can write, refused by a privileged broker;
    `filename` names it and `strerror` says why (exit 11, `rbroker_protocol.startup`)."""

    def __init__(self, path: Path | str, why: str) -> None:
        super().__init__(errno.EPERM, why, str(path))


def _owner_ok(st: os.stat_result) -> bool:
    if sys.platform == "win32":
        return True
    return st.st_uid in (0, os.geteuid())


def unsafe_reason(path: Path, *, last: bool) -> str | None:
    """Why directory `path` is unsafe for a privileged broker, in words; None when it is
    safe or missing (a missing directory is made by the broker itself, 0700). `last`: the
    directory the broker writes in (no sticky exception, no symlink)."""
    try:
        st = os.lstat(path) if last else os.stat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link, which another user may have placed"
    if not stat.S_ISDIR(st.st_mode):
        return None  # not a directory: the caller's own error names it
    mode = stat.S_IMODE(st.st_mode)
    if not _owner_ok(st):
        return f"it belongs to uid {st.st_uid}, not to root or this broker's user"
    if mode & (stat.S_IWGRP | stat.S_IWOTH) and (last or not mode & stat.S_ISVTX):
        return f"other users can write in it (mode {mode:04o})"
    return None


def check_private_path(directory: Path | str, *, only_as_root: bool = True) -> None:
    """Refuse `directory` (and the directories above it) when another user could swap names
    in it (the module docstring's rule). With `only_as_root`, only a process of uid 0 checks.

    Raises:
        UnsafePath: naming the first unsafe directory, from the top.
    """
    if sys.platform == "win32" or (only_as_root and os.geteuid() != 0):
        return
    target = Path(os.path.abspath(directory))
    chain = [*reversed(target.parents), target]
    for item in chain:
        why = unsafe_reason(item, last=item == target)
        if why is not None:
            raise UnsafePath(item, f"unsafe for a broker run as root or as a system broker: {why}")


def open_nofollow(path: Path | str, flags: int, mode: int = 0o600) -> int:
    """`os.open(path, flags | O_NOFOLLOW | O_CLOEXEC, mode)`: a symbolic link at `path` is
    refused (OSError ELOOP) instead of followed.

    Raises:
        OSError: as `os.open`; ELOOP for a symbolic link.
    """
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    cloexec = getattr(os, "O_CLOEXEC", 0)
    return os.open(path, flags | nofollow | cloexec, mode)
