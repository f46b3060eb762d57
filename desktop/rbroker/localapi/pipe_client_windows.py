"""The client end of the Windows named pipe: connect, wait when busy, check the server.

`PipeStream(address, timeout_s)` is the client's connection: `open_pipe(address, timeout_s)`
opens the pipe with the access the broker's access list
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
import errno
import select
import socket
import sys
import threading
import time
from typing import Any

from rbroker.localapi.pipe_security import (
    CLIENT_OPEN_ACCESS,
    check_server_account,
    expected_server_sid,
    plan_after,
)

ERROR_BROKEN_PIPE = 109
ERROR_PIPE_NOT_CONNECTED = 233
_CLOSED_BY_BROKER = (ERROR_BROKEN_PIPE, ERROR_PIPE_NOT_CONNECTED)

if sys.platform == "win32":
    import _winapi

    import pywintypes
    import win32api
    import win32event
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

    class PipeStream:
        """The named pipe, opened for overlapped I/O and its server checked by
        `open_pipe`, read line by line through its own buffer.

        Each read and write waits on its completion and on this stream's cancel event at once,
        so a timeout (`settimeout`, as on a socket: `TimeoutError`, nothing lost) and `close()`
        from another thread end it at once. (A synchronous read on a pipe is not ended by
        closing its handle: a thread blocked in one would stay there.) Writes and reads take
        turns under one lock; `close()` sets the cancel event, then closes the handle once the
        read or write in progress has left.
        """

        def __init__(self, path: str, timeout_s: float | None) -> None:
            self._buffer = bytearray()
            self._timeout_s = timeout_s
            self._closed = False
            self._io_lock = threading.Lock()
            self._state_lock = threading.Lock()
            self._handle = open_pipe(path, timeout_s)
            self._cancel = win32event.CreateEvent(None, True, False, None)  # manual reset

        def _wait(self, ov: Any, timeout_s: float | None) -> tuple[int, bool]:
            """Wait for the overlapped operation `ov` until it completes, `timeout_s` passes or
            `close()` is called; `(bytes transferred, cancelled)`. Raises OSError (109, the
            broker closed the pipe, among others)."""
            ms = _winapi.INFINITE if timeout_s is None else max(0, int(timeout_s * 1000))
            done = win32event.WaitForMultipleObjects([ov.event, self._cancel], False, ms)
            cancelled = done != win32event.WAIT_OBJECT_0
            if cancelled:
                with contextlib.suppress(OSError):
                    ov.cancel()
            transferred, _err = ov.GetOverlappedResult(True)  # waits for a cancel to finish
            return int(transferred), cancelled

        def _check_open(self) -> None:
            if self._closed:
                raise OSError(errno.EBADF, "the pipe client is closed")

        def write(self, data: bytes) -> None:
            """Write all of `data`. Raises OSError (the broker closed the pipe, this stream was
            closed) and TimeoutError (the broker read nothing for the timeout)."""
            view = memoryview(data)
            with self._io_lock:
                while view:
                    self._check_open()
                    ov, _err = _winapi.WriteFile(self._handle, view, overlapped=True)
                    written, cancelled = self._wait(ov, self._timeout_s)
                    view = view[written:]
                    if cancelled and view:
                        self._check_open()
                        raise TimeoutError("the broker read nothing in time")

        def _read_chunk(self) -> bytes:
            """What has arrived (at most 64 KiB), waiting for it; b"" when the broker closed
            the pipe. Raises TimeoutError (nothing arrived in time) and OSError (closed)."""
            with self._io_lock:
                self._check_open()
                try:
                    ov, _err = _winapi.ReadFile(self._handle, 65536, overlapped=True)
                    read, cancelled = self._wait(ov, self._timeout_s)
                except BrokenPipeError:
                    return b""
                except OSError as exc:
                    if getattr(exc, "winerror", None) in (
                        ERROR_BROKEN_PIPE,
                        ERROR_PIPE_NOT_CONNECTED,
                    ):
                        return b""
                    raise
                if read:
                    return bytes(ov.getbuffer() or b"")
                if cancelled:
                    self._check_open()
                    raise TimeoutError("nothing from the broker in time")
                return b""

        def readline(self) -> bytes:
            """One line with its newline; b"" at end of stream. Raises TimeoutError (nothing
            lost: what came stays buffered) and OSError (this stream was closed)."""
            while b"\n" not in self._buffer:
                chunk = self._read_chunk()
                if not chunk:
                    out = bytes(self._buffer)
                    self._buffer.clear()
                    return out
                self._buffer += chunk
            end = self._buffer.index(b"\n") + 1
            line = bytes(self._buffer[:end])
            del self._buffer[:end]
            return line

        def settimeout(self, timeout_s: float | None) -> None:
            self._timeout_s = timeout_s

        def wait_readable(self, timeout_s: float, wake: socket.socket | None) -> str:
            """As `rbroker.localapi.client._UnixStream.wait_readable`. A pipe cannot be
            selected: it is looked at (PeekNamedPipe) every 50 ms while the wait watches
            `wake`."""
            end = time.monotonic() + timeout_s
            while True:
                if self._buffer:
                    return "data"
                self._check_open()
                try:
                    available = _winapi.PeekNamedPipe(self._handle, 0)[0]
                except OSError:
                    return "closed"  # broken: the broker closed it
                if available:
                    return "data"
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return "timeout"
                step_s = min(remaining, 0.05)
                if wake is None:
                    time.sleep(step_s)
                elif select.select([wake], [], [], step_s)[0]:
                    return "woken"

        def close(self) -> None:
            """End the read or write in progress (another thread's) and close the pipe."""
            with self._state_lock:
                if self._closed:
                    return
                self._closed = True
                win32event.SetEvent(self._cancel)
            with self._io_lock:  # the operation in progress leaves at once
                _winapi.CloseHandle(self._handle)
                win32api.CloseHandle(self._cancel)
