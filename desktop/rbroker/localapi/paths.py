"""Where the broker listens by default (architecture.md §5, §6a)."""

from __future__ import annotations

import getpass
import os
import sys
import warnings
from pathlib import Path

import platformdirs

ENV_SOCKET = "RBROKER_SOCKET"


def default_socket_path() -> str:
    """The address jobs and the broker use when none is given.

    `RBROKER_SOCKET` wins; else on Windows `\\\\.\\pipe\\rbroker-<user>`; else
    `<user runtime dir>/rbroker/broker.sock`: `$XDG_RUNTIME_DIR` when it is the user's own
    0700 directory, else `/run/user/<uid>`, else a checked `runtime-<uid>` directory in the
    temporary directory (platformdirs' rules, which refuse directories another user could
    have planted). A runtime dir that cannot be had at all falls back to the data dir.
    """
    env = os.environ.get(ENV_SOCKET)
    if env:
        return env
    if sys.platform == "win32":
        return rf"\\.\pipe\rbroker-{getpass.getuser()}"
    with warnings.catch_warnings():
        # the fallback is the point here; its warning would only repeat this docstring
        warnings.simplefilter("ignore", getattr(platformdirs, "RuntimeDirWarning", Warning))
        try:
            runtime = Path(platformdirs.user_runtime_dir("rbroker", appauthor=False))
        except PermissionError:
            return str(default_data_dir() / "broker.sock")
    return str(runtime / "broker.sock")


def default_data_dir() -> Path:
    """The broker's data directory (lease database, keys): the user data dir."""
    return Path(platformdirs.user_data_dir("rbroker", appauthor=False))
