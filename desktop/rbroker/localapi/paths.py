"""Where the broker listens by default (DESIGN §5, §6a)."""

from __future__ import annotations

import getpass
import os
import sys
import tempfile
from pathlib import Path

import platformdirs

ENV_SOCKET = "RBROKER_SOCKET"


def default_socket_path() -> str:
    """The address jobs and the broker use when none is given.

    `RBROKER_SOCKET` wins; else on Windows `\\\\.\\pipe\\rbroker-<user>`; else
    `<user runtime dir>/rbroker/broker.sock` (e.g. /run/user/1000/rbroker/broker.sock), or
    `<tmp>/rbroker-<uid>/broker.sock` where the runtime dir does not exist.
    """
    env = os.environ.get(ENV_SOCKET)
    if env:
        return env
    if sys.platform == "win32":
        return rf"\\.\pipe\rbroker-{getpass.getuser()}"
    runtime = Path(platformdirs.user_runtime_dir("rbroker", appauthor=False))
    if runtime.parent.is_dir() and os.access(runtime.parent, os.W_OK):
        return str(runtime / "broker.sock")
    return str(Path(tempfile.gettempdir()) / f"rbroker-{os.getuid()}" / "broker.sock")


def default_data_dir() -> Path:
    """The broker's data directory (lease database, keys): the user data dir."""
    return Path(platformdirs.user_data_dir("rbroker", appauthor=False))
