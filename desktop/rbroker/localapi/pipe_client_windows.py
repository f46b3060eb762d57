"""The client end of the Windows named pipe: connect, wait when busy, check the server.

`open_pipe(address, timeout_s)` opens the pipe with the access the broker's access list
grants clients (`CLIENT_OPEN_ACCESS`: read, write data, never create instances), for
overlapped I/O (so a read can wait with a timeout and be ended by another thread), retries
while every instance is busy (WaitNamedPipe, `plan_after`), and before anything is sent
checks that the process serving it runs as the account the address requires
(`expected_server_sid`: LocalSystem for the service pipe, this user for a per-user one) —
from `GetNamedPipeServerProcessId` and that process's token, or, where a standard user may
not open the server's token, the pipe's owner. Windows only.
"""

from __future__ import annotations

import contextlib
import sys
import time

from rbroker.localapi.pipe_security import (
    CLIENT_OPEN_ACCESS,
    check_server_account,
    expected_server_sid,
    plan_after,
)

if sys.platform == "win32":
    import _winapi

    import pywintypes
    import win32pipe

    from rbroker.localapi.win_accounts import own_sid, owner_sid, process_account

    def server_account(handle: int) -> tuple[int | None, str | None]:
        """`(server pid, server account SID)` of a connected pipe handle; None parts are
        unreadable."""
        try:
            pid: int | None = int(win32pipe.GetNamedPipeServerProcessId(handle))
        except pywintypes.error:
            pid = None
        sid: str | None = None
        if pid:
            try:
                sid = process_account(pid)[0]
            except pywintypes.error:
                sid = None  # a standard user cannot open a LocalSystem process's token
        if sid is None:
            try:
                sid = owner_sid(handle)
            except pywintypes.error:
                sid = None
        return pid, sid

    def open_pipe(address: str, timeout_s: float | None) -> int:
        """A handle on the pipe opened with FILE_FLAG_OVERLAPPED, its server checked; the
        caller closes it (`_winapi.CloseHandle`).

        Raises:
            FileNotFoundError: no broker listens at `address`.
            TimeoutError: every instance stayed busy for `timeout_s`.
            UntrustedPipeServer: the server runs as another account (nothing was sent).
            OSError: any other failure to open it.
        """
        deadline = time.monotonic() + (30.0 if timeout_s is None else timeout_s)
        while True:
            try:
                handle = _winapi.CreateFile(
                    address,
                    CLIENT_OPEN_ACCESS,
                    0,
                    0,
                    _winapi.OPEN_EXISTING,
                    _winapi.FILE_FLAG_OVERLAPPED,
                    0,
                )
                break
            except OSError as exc:
                plan = plan_after(getattr(exc, "winerror", 0) or 0, deadline - time.monotonic())
                if plan.action == "absent":
                    raise FileNotFoundError(2, f"no pipe {address}") from None
                if plan.action == "timeout":
                    raise TimeoutError(f"every instance of {address} stayed busy") from None
                if plan.action == "error":
                    raise
                # still busy, or gone, after the wait: the next CreateFile says which
                with contextlib.suppress(OSError):
                    _winapi.WaitNamedPipe(address, plan.wait_ms)
        try:
            pid, sid = server_account(handle)
            check_server_account(address, expected_server_sid(address, own_sid()), sid, pid)
        except BaseException:
            _winapi.CloseHandle(handle)
            raise
        return int(handle)
