"""Where clients look for a broker, and where a per-user broker listens (architecture.md
§5, §6a).

A client (SDK, CLI, tray) looks in this order: `--socket`, `$RBROKER_SOCKET`, the system
broker's address, the per-user address (`discovery_order`). The system broker's address,
`/run/rbroker/broker.sock` on Linux and `\\\\.\\pipe\\rbroker` on Windows, is the transport's
(`rbroker.transport.system_paths`: `$RBROKER_SYSTEM_SOCKET` moves it).

An empty `--socket ''` (or the SDK's `socket=""`) names no address and is refused
(`socket_option`, `discovery_order`); an empty `$RBROKER_SOCKET` counts as unset, as an empty
variable does for POSIX shells (`RBROKER_SOCKET= rbroker status` looks as if it were not set).
"""

from __future__ import annotations

import os
import sys

from rbroker.transport.system_paths import system_socket_path

# What a client given its address needs is all it loads (start-up, issue 44): no dataclasses,
# pathlib or `typing`; the idiom type checkers read as typing.TYPE_CHECKING (PEP 484's
# constant, never true at run time).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

ENV_SOCKET = "RBROKER_SOCKET"

FOUND_OPTION = "--socket"
FOUND_ENV = ENV_SOCKET
FOUND_SYSTEM = "the system broker's address"
FOUND_PER_USER = "the per-user address"


class Candidate:
    """One address to try and how it was found (`FOUND_*`: shown by `rbroker status`). A
    value: equal to another of the same address and finding, hashable, not changed once
    made. A plain class: `@dataclass` would load `inspect` and compile code at run time on
    every client command's start (issue 44)."""

    __slots__ = ("address", "found_by")

    address: str
    found_by: str

    def __init__(self, address: str, found_by: str) -> None:
        object.__setattr__(self, "address", address)
        object.__setattr__(self, "found_by", found_by)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}: a Candidate is not changed")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Candidate):
            return NotImplemented
        return (self.address, self.found_by) == (other.address, other.found_by)

    def __hash__(self) -> int:
        return hash((self.address, self.found_by))

    def __repr__(self) -> str:
        return f"Candidate(address={self.address!r}, found_by={self.found_by!r})"


EMPTY_ADDRESS = (
    "an empty address: give the broker's socket path (its pipe name on Windows), or leave "
    "the option out to use the default"
)


def socket_option(text: str) -> str:
    """The argparse type of every `--socket`: the address as given, when it is not empty.

    Raises:
        argparse.ArgumentTypeError: an empty address (a usage error, exit 2), which would
            otherwise read as "not given" and quietly use the default one.
    """
    if not text:
        import argparse  # only the command line needs it; `import rbroker` stays light

        raise argparse.ArgumentTypeError(EMPTY_ADDRESS)
    return text


def per_user_socket_path() -> str:
    """The per-user broker's address: on Windows `\\\\.\\pipe\\rbroker-<user>`; else
    `<user runtime dir>/rbroker/broker.sock`: `$XDG_RUNTIME_DIR` when it is the user's own
    0700 directory, else `/run/user/<uid>`, else a checked `runtime-<uid>` directory in the
    temporary directory (platformdirs' rules, which refuse directories another user could
    have planted). A runtime dir that cannot be had at all falls back to the data dir.
    """
    if sys.platform == "win32":
        import getpass

        return rf"\\.\pipe\rbroker-{getpass.getuser()}"
    import warnings
    from pathlib import Path

    import platformdirs  # only where the per-user address is needed (start-up, issue 44)

    with warnings.catch_warnings():
        # the fallback is the point here; its warning would only repeat this docstring
        warnings.simplefilter("ignore", getattr(platformdirs, "RuntimeDirWarning", Warning))
        try:
            runtime = Path(platformdirs.user_runtime_dir("rbroker", appauthor=False))
        except PermissionError:
            return str(default_data_dir() / "broker.sock")
    return str(runtime / "broker.sock")


def default_socket_path() -> str:
    """Where a per-user broker (`rbroker broker`, the tray's) listens when no `--socket` is
    given: `$RBROKER_SOCKET`, else `per_user_socket_path()` (an empty variable counts as
    unset)."""
    return os.environ.get(ENV_SOCKET) or per_user_socket_path()


def discovery_order(explicit: str | None = None) -> list[Candidate]:
    """The addresses a client tries, in order, with how each was found.

    `explicit` (a `--socket` or the SDK's `socket=`) or `$RBROKER_SOCKET` is the only
    candidate when given: nothing else is tried. Otherwise the system broker's address, then
    the per-user one. An empty `$RBROKER_SOCKET` counts as unset.

    Raises:
        ValueError: `explicit` is the empty string (`EMPTY_ADDRESS`): given, yet no address.
    """
    if explicit == "":
        raise ValueError(f"socket: {EMPTY_ADDRESS}")
    if explicit:
        return [Candidate(explicit, FOUND_OPTION)]
    env = os.environ.get(ENV_SOCKET)
    if env:
        return [Candidate(env, FOUND_ENV)]
    return [
        Candidate(system_socket_path(), FOUND_SYSTEM),
        Candidate(per_user_socket_path(), FOUND_PER_USER),
    ]


def default_data_dir() -> Path:
    """The broker's data directory (lease database, keys): the user data dir."""
    from pathlib import Path

    import platformdirs

    return Path(platformdirs.user_data_dir("rbroker", appauthor=False))
