"""The computer-wide places (architecture.md §5, §6a): the system broker's address on each
OS, `/run/rbroker/broker.sock` on Linux and `\\\\.\\pipe\\rbroker` on Windows
(`$RBROKER_SYSTEM_SOCKET` moves it, for a site or a test that runs it elsewhere), the Linux
system broker's data dir and Windows' machine-wide data folder.

Clients look here last but one (`rbroker.client.paths.discovery_order`); the system
broker's authority lives in its address's directory (`rbroker.hosting.authority`; who holds
it, as any user reads it: `system_holder.py`).
"""

from __future__ import annotations

import os
import sys

# A client reads only the system broker's address here: no pathlib, no `typing` on its
# start (docs/architecture.md §10); the idiom type checkers read as typing.TYPE_CHECKING.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

ENV_SYSTEM_SOCKET = "RBROKER_SYSTEM_SOCKET"

SYSTEM_SOCKET_LINUX = "/run/rbroker/broker.sock"
"""The Linux system broker's socket (its directory made by systemd's `RuntimeDirectory=`)."""
SYSTEM_PIPE_WINDOWS = r"\\.\pipe\rbroker"
"""The Windows service broker's pipe."""
if TYPE_CHECKING:
    SYSTEM_DATA_DIR_LINUX: Path
    """The Linux system broker's data dir (systemd's `StateDirectory=`): `/var/lib/rbroker`,
    a `Path` made on its first use (`__getattr__`)."""


def __getattr__(name: str) -> Path:
    """`SYSTEM_DATA_DIR_LINUX` on its first use (PEP 562), so that importing this module
    loads no pathlib.

    Raises:
        AttributeError: any other name.
    """
    if name != "SYSTEM_DATA_DIR_LINUX":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from pathlib import Path

    value = globals()[name] = Path("/var/lib/rbroker")
    return value


def system_socket_path() -> str:
    """The system broker's address on this OS (`$RBROKER_SYSTEM_SOCKET` wins)."""
    env = os.environ.get(ENV_SYSTEM_SOCKET)
    if env:
        return env
    return SYSTEM_PIPE_WINDOWS if sys.platform == "win32" else SYSTEM_SOCKET_LINUX


def program_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Windows' machine-wide data folder (`C:\\ProgramData` by default).

    With `environ` (a mapping, e.g. in tests): its `ProgramData`, else `C:\\ProgramData`.
    Without: on Windows the known folder `FOLDERID_ProgramData` (pywin32), which is the same
    for every account and for services, whose environment can lack the variable or differ
    (Wine gives a service `C:\\users\\Public`); elsewhere, or where it cannot be read,
    `%ProgramData%`, else `C:\\ProgramData`.
    """
    from pathlib import Path

    if environ is None and sys.platform == "win32":
        try:
            from win32com.shell import shell, shellcon

            return Path(shell.SHGetKnownFolderPath(shellcon.FOLDERID_ProgramData))
        except Exception:  # pywintypes.com_error: fall back to the variable
            pass
    env = os.environ if environ is None else environ
    return Path(env.get("ProgramData") or env.get("PROGRAMDATA") or "C:\\ProgramData")
