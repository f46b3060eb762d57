"""Windows named-pipe transport: the pipe's access list, its instances, the caller's token.

The rules are in `rbroker.localapi.pipe_security` (tested on any OS); this module applies
them with the proactor event loop (the default loop on Windows):

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
  WaitNamedPipe and tries again (`pipe_client_windows`);
- the caller is the process `GetNamedPipeClientProcessId` names, its user read from that
  process's token (`win_accounts.process_account`), never from a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import sys

from rbroker.localapi.pipe_security import PoolPolicy, listeners_to_add, sddl_for
from rbroker.localapi.transport import BrokerAlreadyRunning, Handler, Peer

log = logging.getLogger(__name__)

BUFFER_BYTES = 64 * 1024
ERROR_FILE_NOT_FOUND = 2
ERROR_ACCESS_DENIED = 5
ERROR_PIPE_BUSY = 231
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

    from rbroker.localapi.win_accounts import is_elevated_admin, own_sid, process_account

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
            self.connected = 0
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
            self.connected += 1
            self._refill()  # before serving: the next client finds an instance waiting
            reader = asyncio.StreamReader(limit=self._limit)
            protocol = asyncio.StreamReaderProtocol(reader, self._serve)
            self._loop._make_duplex_pipe_transport(  # type: ignore[attr-defined]
                pipe, protocol, extra={"addr": self.address}
            )

        async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                pipe = writer.get_extra_info("pipe")
                try:
                    pid = _client_pid(int(pipe.handle))
                    sid, user = process_account(pid)
                except (OSError, pywintypes.error) as exc:
                    log.info("closing a pipe client whose account cannot be read: %s", exc)
                    writer.close()
                    return
                peer = Peer(pid=pid, user=user, sid=sid, elevated_admin=is_elevated_admin(pid))
                await self._handler(reader, writer, peer)
            finally:
                self.connected -= 1

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
        """Serve `address` (see the module docstring).

        Raises:
            NotAPipeName: `address` is no local pipe name (`pipe_name_problem`).
            BrokerAlreadyRunning: the pipe name exists already.
            OSError: the instances cannot be created.
        """
        server = PipeServer(address, handler, limit, policy or PoolPolicy())
        server.start()
        return server
