"""Rules of the Windows named-pipe transport, as pure functions (architecture.md §5).

Kept apart from `pipe_windows` (which needs Windows) so that every rule is tested on any OS:

- names: the service listens at `SERVICE_PIPE` (`\\\\.\\pipe\\rbroker`), a per-user broker
  (the tray on a single-user desktop, `rbroker broker`) at `\\\\.\\pipe\\rbroker-<user>`;
- the access list (SDDL) of each: the server's account may create instances; clients get
  read + write data, never `FILE_CREATE_PIPE_INSTANCE`, so nobody else can add instances
  to the name; network logons are denied; who the clients are: Authenticated Users for the
  service, the user alone for a per-user broker;
- which account a client expects the server to run as, and the refusal when it does not;
- how many listening instances to keep ahead of demand (`listeners_to_add`), and what a
  connecting client does when every instance is busy (`PipeConnectPlan`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rbroker.transport.system_paths import SYSTEM_PIPE_WINDOWS

SERVICE_PIPE = SYSTEM_PIPE_WINDOWS
"""The Windows service broker's fixed address (one per computer; the system address of the
clients' discovery order, `rbroker.client.paths`)."""

LOCAL_SYSTEM_SID = "S-1-5-18"
"""The account the rbroker service runs as (LocalSystem): the only one that may create
instances of `SERVICE_PIPE`, and what clients check the server process against."""

# Access rights (winnt.h). A pipe's FILE_APPEND_DATA bit is FILE_CREATE_PIPE_INSTANCE.
FILE_READ_DATA = 0x0001
FILE_WRITE_DATA = 0x0002
FILE_CREATE_PIPE_INSTANCE = 0x0004
FILE_READ_EA = 0x0008
FILE_READ_ATTRIBUTES = 0x0080
READ_CONTROL = 0x00020000
SYNCHRONIZE = 0x00100000
GENERIC_READ = 0x80000000

CLIENT_RIGHTS = (
    FILE_READ_DATA | FILE_WRITE_DATA | FILE_READ_EA | FILE_READ_ATTRIBUTES | READ_CONTROL
) | SYNCHRONIZE
"""What a client may do with the pipe: FILE_GENERIC_READ plus FILE_WRITE_DATA (0x12008B).
READ_CONTROL lets it read the pipe's owner (the server-account check)."""

CLIENT_OPEN_ACCESS = GENERIC_READ | FILE_WRITE_DATA
"""What a client asks for in CreateFile. GENERIC_WRITE would include FILE_APPEND_DATA,
which on a pipe is FILE_CREATE_PIPE_INSTANCE, and is refused by the access list."""


def pipe_sddl(server_sid: str, client_sids: tuple[str, ...]) -> str:
    """The security descriptor (SDDL) of every instance of a broker pipe.

    Owner and group: the server's account. DACL, protected (no inherited entries): network
    logons (`NU`) denied everything; LocalSystem and the server's account all rights
    (`GA`, which includes creating instances); each client SID (a SID string or an SDDL
    alias such as `AU`, Authenticated Users) `CLIENT_RIGHTS` only.

    Raises:
        ValueError: a SID that is empty or has characters SDDL would misread.
    """
    for sid in (server_sid, *client_sids):
        if not sid or not all(ch.isalnum() or ch == "-" for ch in sid):
            raise ValueError(f"not a SID or SDDL account alias: {sid!r}")
    aces = ["(D;;GA;;;NU)", f"(A;;GA;;;{'SY'})"]
    if server_sid != LOCAL_SYSTEM_SID:
        aces.append(f"(A;;GA;;;{server_sid})")
    for sid in client_sids:
        if sid not in (server_sid, "SY", LOCAL_SYSTEM_SID):
            aces.append(f"(A;;0x{CLIENT_RIGHTS:08x};;;{sid})")
    return f"O:{server_sid}G:{server_sid}D:P{''.join(aces)}"


def sddl_for(address: str, server_sid: str) -> str:
    """The access list for a broker listening at `address` as account `server_sid`: the
    service pipe admits Authenticated Users, any other pipe only the server's own user."""
    if address.lower() == SERVICE_PIPE.lower():
        return pipe_sddl(server_sid, ("AU",))
    return pipe_sddl(server_sid, (server_sid,))


def expected_server_sid(address: str, own_sid: str) -> str:
    """The account a client requires of the process serving `address`: LocalSystem for the
    service pipe, the client's own account for any other (its per-user broker)."""
    return LOCAL_SYSTEM_SID if address.lower() == SERVICE_PIPE.lower() else own_sid


class UntrustedPipeServer(ConnectionRefusedError):
    """The pipe's server runs as another account than the one required: nothing was sent."""


def check_server_account(
    address: str, expected_sid: str, server_sid: str | None, server_pid: int | None
) -> None:
    """Refuse a pipe server whose account is not `expected_sid`.

    `server_sid` is the account of the server process's token, or, where that token cannot
    be read (a standard user cannot open a LocalSystem process), the pipe's owner, which
    only a process of that account can have set. None: neither could be read.

    Raises:
        UntrustedPipeServer: naming the address, the pid and both accounts.
    """
    if server_sid is not None and server_sid.upper() == expected_sid.upper():
        return
    who = f"pid {server_pid}" if server_pid else "an unknown process"
    seen = f"runs as {server_sid}" if server_sid else "whose account cannot be read"
    raise UntrustedPipeServer(
        f"the pipe {address} is served by {who}, which {seen}, not {expected_sid}: not "
        "an rbroker broker this account trusts, so nothing was sent to it"
    )


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    """How many pipe instances wait for clients.

    `min_listening` instances always wait; while clients are connected,
    `spare_fraction` of their number more (a burst after a burst is likely); all instances
    together at most `max_instances`.
    """

    min_listening: int = 32
    spare_fraction: float = 0.25
    max_instances: int = 4096


def listeners_to_add(listening: int, connected: int, policy: PoolPolicy) -> int:
    """Instances to create now so that clients keep finding one waiting (≥ 0)."""
    want = policy.min_listening + math.ceil(connected * policy.spare_fraction)
    room = policy.max_instances - connected - listening
    return max(0, min(want - listening, room))


ERROR_FILE_NOT_FOUND = 2
ERROR_PIPE_BUSY = 231
ERROR_SEM_TIMEOUT = 121


@dataclass(frozen=True, slots=True)
class PipeConnectPlan:
    """What a client does after CreateFile fails with `winerror`, `remaining_s` before its
    deadline: `"wait"` (WaitNamedPipe up to `wait_ms`, then try again), `"absent"` (no
    broker at the address), `"timeout"` (every instance stayed busy until the deadline),
    or `"error"` (raise it)."""

    action: str
    wait_ms: int = 0


def plan_after(winerror: int, remaining_s: float, max_wait_ms: int = 1000) -> PipeConnectPlan:
    """The client's next step (see `PipeConnectPlan`). ERROR_PIPE_BUSY is never the end
    while time remains: every instance is connected, and the server is adding more."""
    if winerror == ERROR_FILE_NOT_FOUND:
        return PipeConnectPlan("absent")
    if winerror in (ERROR_PIPE_BUSY, ERROR_SEM_TIMEOUT):
        if remaining_s <= 0:
            return PipeConnectPlan("timeout")
        return PipeConnectPlan("wait", max(1, min(max_wait_ms, int(remaining_s * 1000))))
    return PipeConnectPlan("error")
