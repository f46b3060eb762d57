"""A user's connections that never read cost the broker at most `max_unsent_bytes_per_user`
together (architecture.md §5): past it, the connection holding the most is dropped with the
reason `unsent_over_limit`, and the user's other connections keep working.

Before, each connection kept up to 4 MiB on its own: 500 connections of one user that never
read grew a broker to 2 185 MiB. Only a real socket shows a peer that does not read, so this
serves the local API on a Unix socket (a broker on simulated GPUs, in a thread) with small
caps: 256 KiB per connection and 512 KiB per user.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from rbroker.broker.config import BrokerConfig
from rbroker.broker.service import Broker
from rbroker.gpu.fake_nvml import FakeNvml
from rbroker.gpu.nvml import NvmlGateway
from rbroker.localapi.server import LocalApi
from tests.conftest import SINGLE_24G, short_tmp

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="a Unix socket")

PER_CONNECTION = 256 * 1024
PER_USER = 512 * 1024


def _serve(sock_path: str, data_dir: Path, ready: threading.Event, box: dict[str, object]) -> None:
    scenario = data_dir / "gpus.toml"
    scenario.write_text(SINGLE_24G)
    fake = FakeNvml(scenario)
    config = BrokerConfig(
        socket_path=Path(sock_path),
        data_dir=data_dir,
        max_unsent_bytes=PER_CONNECTION,
        max_unsent_bytes_per_user=PER_USER,
    )
    loop = asyncio.new_event_loop()
    box["loop"] = loop

    async def main() -> None:
        broker = Broker(config, NvmlGateway(fake, source="simulated"), fake)
        await broker.start()
        api = LocalApi(broker, sock_path)
        await api.start()
        box["api"] = api
        ready.set()
        stop = asyncio.Event()
        box["stop"] = stop
        await stop.wait()
        await api.close()
        await broker.stop()

    loop.run_until_complete(main())
    loop.close()


def _hammer(path: str, requests: int) -> socket.socket:
    """A connection that sends `requests` `hello`s and never reads."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    line = json.dumps(
        {"jsonrpc": "2.0", "id": 1, "method": "hello", "params": {"protocol_version": 1}}
    ).encode()
    s.setblocking(False)
    payload = (line + b"\n") * requests
    threading.Thread(target=_send_all, args=(s, payload), daemon=True).start()
    return s


def _send_all(s: socket.socket, payload: bytes) -> None:
    view = memoryview(payload)
    end = time.monotonic() + 30
    while view and time.monotonic() < end:
        try:
            view = view[s.send(view) :]
        except BlockingIOError:
            time.sleep(0.01)
        except OSError:
            return


def test_a_users_unread_answers_are_capped_together_and_the_worst_is_dropped() -> None:
    tmp = short_tmp()
    try:
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        path = str(Path(tmp) / "b.sock")
        ready, box = threading.Event(), {}
        server = threading.Thread(target=_serve, args=(path, data_dir, ready, box), daemon=True)
        server.start()
        assert ready.wait(30)
        api = box["api"]
        assert isinstance(api, LocalApi)
        hammers = [_hammer(path, 40_000) for _ in range(6)]  # ~5 MB of answers each
        try:
            deadline = time.monotonic() + 30
            while api.unsent.dropped < 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert api.unsent.dropped >= 1
            # what stays unsent, over all of this user's connections, is about the cap
            time.sleep(1.0)
            unsent = sum(c.unsent_bytes() for c in api._connections if not c.closed)
            assert unsent <= PER_USER + PER_CONNECTION + 64 * 1024, unsent
            # a connection of the same user that reads is served as before
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as ok:
                ok.settimeout(10)
                ok.connect(path)
                ok.sendall(b'{"jsonrpc":"2.0","id":7,"method":"gpus.list"}\n')
                answer = json.loads(ok.makefile("rb").readline())
                assert answer["id"] == 7 and answer["result"]["gpus"]
        finally:
            for s in hammers:
                with contextlib.suppress(OSError):
                    s.close()
            loop, stop = box["loop"], box["stop"]
            loop.call_soon_threadsafe(stop.set)  # type: ignore[attr-defined]
            server.join(10)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
