"""Who holds the Linux system broker's authority, as any user reads it (architecture.md §5,
"One broker per computer").

The system broker holds its authority (`rbroker.hosting.authority`) in the system socket's
directory (`/run/rbroker`; `$RBROKER_SYSTEM_SOCKET` moves it) and writes who it is to
`broker.holder` there (mode 0644): one JSON object (`user`, `uid`, `pid`, `start_s` — the
process's start in seconds since boot, `boot_id` — and `socket`). Any user reads it; it
counts only while the named process lives with that start time, so one left by a killed
broker names nobody. A per-user broker reads it before it starts (and refuses while the
system broker lives, naming it), and so does a client that finds no socket (to say the
system broker runs and puts its socket back). Only Linux has such a file: elsewhere nothing
reads it.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import psutil

from rbroker.base.proctime import holder_clock, start_s
from rbroker.transport.base import LockHolder
from rbroker.transport.safe_paths import open_nofollow
from rbroker.transport.system_paths import system_socket_path

HOLDER_FILE = "broker.holder"


def authority_dir() -> Path:
    """Where the system broker's authority lives: the system socket's directory."""
    return Path(os.path.dirname(os.path.abspath(system_socket_path())))


def read_system_holder(directory: Path | None = None) -> LockHolder | None:
    """The live system broker named by `directory/broker.holder` (default `authority_dir()`),
    or None: no file, a file another user could have written (the directory or the file not
    root's or the directory owner's), or a process that no longer lives with that start."""
    directory = directory or authority_dir()
    try:
        dir_st = os.stat(directory)
        fd = open_nofollow(directory / HOLDER_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        trusted = {0, dir_st.st_uid}
        if st.st_uid not in trusted or dir_st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return None
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        said = json.loads(data)
        pid, started = int(said["pid"]), float(said["start_s"])
        user, sock = str(said["user"]), str(said["socket"])
    except (ValueError, KeyError, TypeError):
        return None
    if said.get("boot_id") != holder_clock():
        return None  # written before this boot
    try:
        alive = abs(start_s(psutil.Process(pid)) - started) < 0.05
    except psutil.AccessDenied:  # hidepid: alive, its start unknown
        alive = psutil.pid_exists(pid)
    except (psutil.NoSuchProcess, ValueError):
        alive = False
    return LockHolder(user, pid, sock) if alive else None
