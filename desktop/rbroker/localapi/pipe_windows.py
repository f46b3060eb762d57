"""Windows named-pipe transport (`\\\\.\\pipe\\rbroker-<user>`): peer from the pipe itself.

The pipe is created with the default security descriptor, which gives full access to
LocalSystem, Administrators and the creating user, and read-only access to others, so only
the broker's own user (and administrators) can send requests. The connecting process is
read with `GetNamedPipeClientProcessId`, its user from its token (through psutil).
"""

from __future__ import annotations

import asyncio
import ctypes
import sys
from typing import Any

import psutil

from rbroker.localapi.transport import BrokerAlreadyRunning, Handler, Peer

if sys.platform == "win32":
    from ctypes import wintypes

    _kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    _GetNamedPipeClientProcessId = _kernel32.GetNamedPipeClientProcessId
    _GetNamedPipeClientProcessId.argtypes = [wintypes.HANDLE, ctypes.POINTER(wintypes.ULONG)]
    _GetNamedPipeClientProcessId.restype = wintypes.BOOL

    def _client_pid(handle: int) -> int:
        pid = wintypes.ULONG(0)
        if not _GetNamedPipeClientProcessId(handle, ctypes.byref(pid)):
            raise ctypes.WinError(ctypes.get_last_error())
        return int(pid.value)

    def _pipe_exists(address: str) -> bool:
        import os

        try:
            fd = os.open(address, os.O_RDWR)
        except OSError:
            return False
        os.close(fd)
        return True

    class PipeServer:
        """Listening pipe instances created by the proactor loop."""

        def __init__(self, address: str, servers: list[Any]) -> None:
            self.address = address
            self._servers = servers

        async def close(self) -> None:
            for server in self._servers:
                server.close()

    async def serve_pipe(address: str, handler: Handler, limit: int) -> PipeServer:
        """Serve `address` on the proactor event loop (the default loop on Windows)."""
        if _pipe_exists(address):
            raise BrokerAlreadyRunning(f"a broker is already listening at {address}")
        loop = asyncio.get_running_loop()

        def factory() -> asyncio.StreamReaderProtocol:
            reader = asyncio.StreamReader(limit=limit)

            async def on_connect(r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                pipe = writer.get_extra_info("pipe")
                handle = getattr(pipe, "handle", None)
                try:
                    pid = _client_pid(int(handle)) if handle is not None else 0
                    user = psutil.Process(pid).username() if pid else "unknown"
                except (OSError, psutil.Error):
                    writer.close()
                    return
                await handler(r, writer, Peer(pid=pid, user=user))

            return asyncio.StreamReaderProtocol(reader, on_connect)

        servers = await loop.start_serving_pipe(factory, address)  # type: ignore[attr-defined]
        return PipeServer(address, list(servers))
