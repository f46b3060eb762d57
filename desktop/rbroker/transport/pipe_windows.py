"""Windows named-pipe transport, both ends: the broker's pipe (its access list, its
instances, the caller's token) and the client's stream.

The rules are in `rbroker.transport.pipe_security` (tested on any OS); this module applies
them. The broker's end (`serve_pipe`), with the proactor event loop (the default loop on
Windows):

- every instance is created with the access list of `sddl_for(address, <server account>)`:
  the service pipe `\\\\.\\pipe\\rbroker` lets Authenticated Users read and write and only
  the service's account (LocalSystem) create instances; a per-user pipe admits its user
  alone; network clients are rejected (`PIPE_REJECT_REMOTE_CLIENTS` and a deny entry);
- a name that exists already (a running broker, or someone squatting it) is refused before
  anything is created (`_name_exists`), and the first instance is created with
  `FILE_FLAG_FIRST_PIPE_INSTANCE`, so a name taken in between is refused too: the broker
  does not start (`BrokerAlreadyRunning`);
- a pool of listening instances is kept ahead of demand (`listeners_to_add`: 32 waiting,
  plus a quarter of the connected clients), refilled as each client connects, so a burst
  of clients finds instances waiting; a client that still meets ERROR_PIPE_BUSY waits with
  WaitNamedPipe and tries again (below);
- the caller is the process `GetNamedPipeClientProcessId` names, its user read from that
  process's token (`win_accounts.process_account`), never from a request.

The client's end (`PipeStream(address, timeout_s)`, its connection): `open_pipe(address,
timeout_s)` opens the pipe with the access the broker's access list grants clients
(`CLIENT_OPEN_ACCESS`: read, write data, never create instances), for overlapped I/O (so a
read can wait with a timeout and be ended by another thread), retries while every instance is
busy (WaitNamedPipe, `plan_after`), and before anything is sent checks that the process
serving it runs as the account the address requires (`expected_server_sid`: LocalSystem for
the service pipe, this user for a per-user one) — from `GetNamedPipeServerProcessId` and that
process's token, or, where a standard user may not open the server's token, the pipe's owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import select
import socket
import sys
import threading
import time
from typing import Any

from rbroker.transport.base import BrokerAlreadyRunning, Handler, Peer, Readiness
from rbroker.transport.pipe_security import (
    CLIENT_OPEN_ACCESS,
    PoolPolicy,
    check_server_account,
    expected_server_sid,
    listeners_to_add,
    plan_after,
    sddl_for,
)

log = logging.getLogger(__name__)

BUFFER_BYTES = 64 * 1024
ERROR_FILE_NOT_FOUND = 2
ERROR_ACCESS_DENIED = 5
ERROR_BROKEN_PIPE = 109
ERROR_PIPE_BUSY = 231
ERROR_PIPE_NOT_CONNECTED = 233
PIPE_REJECT_REMOTE_CLIENTS = 0x00000008


PIPE_PREFIX = "\\\\.\\pipe\\"
"""`\\\\.\\pipe\\`: a local pipe's name starts with it (case does not matter)."""
PIPE_NAME_MAX_CHARS = 256


def pipe_name_problem(address: str) -> str | None:
    """Why a broker cannot listen at `address` on Windows, or None when it is a local pipe
    name: `\\\\.\\pipe\\NAME`, NAME not empty and without a backslash, at most 256
    characters in all (CreateNamedPipe's rules). One line, saying what to give instead."""
    fix = "on Windows the broker listens on a named pipe: give \\\\.\\pipe\\NAME"
    if not address.lower().startswith(PIPE_PREFIX):
        return f"{address} is not a named pipe; {fix}"
    name = address[len(PIPE_PREFIX) :]
    if not name:
        return f"{address} names no pipe; {fix}"
    if "\\" in name:
        return f"{address}: a pipe's NAME cannot contain a backslash; {fix}"
    if len(address) > PIPE_NAME_MAX_CHARS:
        return (
            f"{address} is {len(address)} characters long; a pipe name has at most "
            f"{PIPE_NAME_MAX_CHARS}"
        )
    return None


class NotAPipeName(OSError):
    """The address a pipe server was given is not a local pipe name (`pipe_name_problem`)."""

    def __init__(self, text: str) -> None:
        super().__init__(errno.EINVAL, text)


def _in_use_text(address: str) -> str:
    return (
        f"the pipe {address} exists already (another broker, or another program holding the name)"
    )


if sys.platform == "win32":
    import _winapi
    import ctypes
    from asyncio import windows_utils
    from ctypes import wintypes

    import pywintypes
    import win32api
    import win32event
    import win32pipe

    from rbroker.transport.win_accounts import (
        is_elevated_admin,
        own_sid,
        owner_sid,
        process_account,
    )

    _kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    _advapi32 = ctypes.WinDLL("advapi32", use_last_error=True)
    _GetNamedPipeClientProcessId = _kernel32.GetNamedPipeClientProcessId
    _GetNamedPipeClientProcessId.argtypes = [wintypes.HANDLE, ctypes.POINTER(wintypes.ULONG)]
    _GetNamedPipeClientProcessId.restype = wintypes.BOOL
    _Sddl2Sd = _advapi32.ConvertStringSecurityDescriptorToSecurityDescriptorW
    _Sddl2Sd.argtypes = [
        wintypes.LPCWSTR,
        wintypes.DWORD,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(wintypes.ULONG),
    ]
    _Sddl2Sd.restype = wintypes.BOOL
    _LocalFree = _kernel32.LocalFree
    _LocalFree.argtypes = [ctypes.c_void_p]
    _LocalFree.restype = ctypes.c_void_p

    class _SECURITY_ATTRIBUTES(ctypes.Structure):
        _fields_ = [
            ("nLength", wintypes.DWORD),
            ("lpSecurityDescriptor", ctypes.c_void_p),
            ("bInheritHandle", wintypes.BOOL),
        ]

    def _name_exists(address: str) -> bool:
        """Whether a pipe of this name exists now (instances waiting or all busy), asked
        without connecting: WaitNamedPipe fails with ERROR_FILE_NOT_FOUND only when there is
        none. `FILE_FLAG_FIRST_PIPE_INSTANCE` stays the atomic guard (a name taken between
        this look and the creation); this look refuses before anything is created, also
        where that flag is not honoured."""
        try:
            _winapi.WaitNamedPipe(address, 1)
        except OSError as exc:
            return getattr(exc, "winerror", None) != ERROR_FILE_NOT_FOUND
        return True

    def _client_pid(handle: int) -> int:
        pid = wintypes.ULONG(0)
        if not _GetNamedPipeClientProcessId(handle, ctypes.byref(pid)):
            raise ctypes.WinError(ctypes.get_last_error())
        return int(pid.value)

    class _SecurityAttributes:
        """A SECURITY_ATTRIBUTES built from SDDL, freed by `close()`."""

        def __init__(self, sddl: str) -> None:
            self._sd = ctypes.c_void_p()
            if not _Sddl2Sd(sddl, 1, ctypes.byref(self._sd), None):  # SDDL_REVISION_1
                raise ctypes.WinError(ctypes.get_last_error())
            self.struct = _SECURITY_ATTRIBUTES(
                ctypes.sizeof(_SECURITY_ATTRIBUTES), self._sd.value, False
            )

        @property
        def address(self) -> int:
            return ctypes.addressof(self.struct)

        def close(self) -> None:
            if self._sd.value:
                _LocalFree(self._sd)
                self._sd = ctypes.c_void_p()

    class PipeServer:
        """The listening instances of one pipe name and their connected clients."""

        def __init__(self, address: str, handler: Handler, limit: int, policy: PoolPolicy) -> None:
            self.address = address
            self._handler = handler
            self._limit = limit
            self._policy = policy
            self._loop = asyncio.get_running_loop()
            self._security = _SecurityAttributes(sddl_for(address, own_sid()))
            self._listening: set[windows_utils.PipeHandle] = set()
            self._waits: set[asyncio.Future[windows_utils.PipeHandle]] = set()
            self._served: set[windows_utils.PipeHandle] = set()
            self._closed = False

        def _create(self, first: bool) -> windows_utils.PipeHandle:
            flags = _winapi.PIPE_ACCESS_DUPLEX | _winapi.FILE_FLAG_OVERLAPPED
            if first:
                flags |= _winapi.FILE_FLAG_FIRST_PIPE_INSTANCE
            # PIPE_TYPE_BYTE | PIPE_READMODE_BYTE are 0: lines are framed by the protocol
            mode = _winapi.PIPE_WAIT | PIPE_REJECT_REMOTE_CLIENTS
            handle = _winapi.CreateNamedPipe(
                self.address,
                flags,
                mode,
                _winapi.PIPE_UNLIMITED_INSTANCES,
                BUFFER_BYTES,
                BUFFER_BYTES,
                0,
                self._security.address,
            )
            return windows_utils.PipeHandle(handle)

        def start(self) -> None:
            """Create the first instance (refusing a name that exists), then the pool.

            Raises:
                NotAPipeName: the address is no local pipe name (a file path, say).
                BrokerAlreadyRunning: the name is taken (a broker, or a squatter).
            """
            problem = pipe_name_problem(self.address)
            if problem is not None:
                self._security.close()
                raise NotAPipeName(problem)
            if _name_exists(self.address):
                self._security.close()
                raise BrokerAlreadyRunning(_in_use_text(self.address))
            try:
                first = self._create(first=True)
            except OSError as exc:
                self._security.close()
                if getattr(exc, "winerror", None) in (ERROR_ACCESS_DENIED, ERROR_PIPE_BUSY):
                    raise BrokerAlreadyRunning(_in_use_text(self.address)) from None
                raise
            self._listen(first)
            self._refill()

        def _listen(self, pipe: windows_utils.PipeHandle) -> None:
            proactor = self._loop._proactor  # type: ignore[attr-defined]
            self._listening.add(pipe)
            wait: asyncio.Future[windows_utils.PipeHandle] = proactor.accept_pipe(pipe)
            self._waits.add(wait)
            wait.add_done_callback(functools.partial(self._accepted, pipe=pipe))

        def _refill(self) -> None:
            for _ in range(listeners_to_add(len(self._listening), self.connected, self._policy)):
                try:
                    self._listen(self._create(first=False))
                except OSError as exc:
                    log.warning("cannot add an instance of %s: %s", self.address, exc)
                    break

        def _accepted(
            self,
            wait: asyncio.Future[windows_utils.PipeHandle],
            *,
            pipe: windows_utils.PipeHandle,
        ) -> None:
            self._waits.discard(wait)
            self._listening.discard(pipe)
            if self._closed or wait.cancelled() or wait.exception() is not None:
                pipe.close()
                if not self._closed:
                    self._refill()
                return
            self._served.add(pipe)
            self._refill()  # before serving: the next client finds an instance waiting
            protocol = self._handler(self._peer_of, self._limit)
            self._loop._make_duplex_pipe_transport(  # type: ignore[attr-defined]
                pipe, protocol, extra={"addr": self.address}
            )

        @property
        def connected(self) -> int:
            """Clients connected now (instances served and not yet closed)."""
            self._served = {pipe for pipe in self._served if pipe.handle is not None}
            return len(self._served)

        def _peer_of(self, transport: asyncio.BaseTransport) -> Peer:
            """The caller: the process `GetNamedPipeClientProcessId` names and the account of
            its token. Raises OSError when either cannot be read."""
            pipe = transport.get_extra_info("pipe")
            try:
                pid = _client_pid(int(pipe.handle))
                sid, user = process_account(pid)
                elevated = is_elevated_admin(pid)
            except (OSError, pywintypes.error) as exc:
                log.info("closing a pipe client whose account cannot be read: %s", exc)
                text = f"the pipe client's account cannot be read: {exc}"
                raise OSError(errno.EACCES, text) from exc
            return Peer(pid=pid, user=user, sid=sid, elevated_admin=elevated)

        async def close(self) -> None:
            """Stop listening: cancel the waiting instances and close them."""
            self._closed = True
            for wait in list(self._waits):
                wait.cancel()
            for pipe in list(self._listening):
                with contextlib.suppress(OSError):
                    pipe.close()
            self._listening.clear()
            await asyncio.sleep(0)
            self._security.close()

    async def serve_pipe(
        address: str, handler: Handler, limit: int, policy: PoolPolicy | None = None
    ) -> PipeServer:
        """Serve `address` (see the module docstring): each client with the protocol
        `handler(peer_of, limit)` builds (`rbroker.transport.base.Handler`).

        Raises:
            NotAPipeName: `address` is no local pipe name (`pipe_name_problem`).
            BrokerAlreadyRunning: the pipe name exists already.
            OSError: the instances cannot be created.
        """
        server = PipeServer(address, handler, limit, policy or PoolPolicy())
        server.start()
        return server

    # -- the client's end --------------------------------------------------------------------
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

        def wait_readable(self, timeout_s: float, wake: socket.socket | None) -> Readiness:
            """As `rbroker.transport.base.Stream.wait_readable`. A pipe cannot be selected:
            it is looked at (PeekNamedPipe) every 50 ms while the wait watches `wake`."""
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
