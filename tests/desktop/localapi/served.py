"""The local API served in a thread of the test process: the production `Broker` on simulated
GPUs and its `LocalApi` on this OS's transport (a Unix socket; a named pipe on Windows), on
an event loop of their own. For tests that need the real transport and a look inside the
server at once (its connections, its counters, its clock); clients connect with
`rbroker.transport.connect`, as the SDK does.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from rbroker.broker.config import BrokerConfig
from rbroker.broker.service import Broker
from rbroker.gpu.fake_nvml import FakeNvml
from rbroker.gpu.nvml import NvmlGateway
from rbroker.hosting.machine_lock import PER_SOCKET
from rbroker.localapi.server import LocalApi
from rbroker.transport import connect
from rbroker.transport.base import Stream
from tests.conftest import SINGLE_24G, short_tmp

T = TypeVar("T")


class ServedApi:
    """A served local API: its `address`, the `api` and its `loop` (another thread's)."""

    def __init__(self, address: str, api: LocalApi, loop: asyncio.AbstractEventLoop) -> None:
        self.address = address
        self.api = api
        self.loop = loop

    def call(self, fn: Callable[[], T], timeout_s: float = 30.0) -> T:
        """`fn()` run on the server's loop (its state is only touched there)."""

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout_s)

    def connect(self, timeout_s: float = 30.0) -> Stream:
        """A client connection, as the SDK opens it."""
        return connect(self.address, timeout_s)


@contextmanager
def served_api(**config: Any) -> Iterator[ServedApi]:
    """Serve a broker on one simulated 24 GiB GPU (`config`: `BrokerConfig` changes) until
    the block ends."""
    tmp = short_tmp()
    data_dir = Path(tmp) / "data"
    data_dir.mkdir()
    scenario = data_dir / "gpus.toml"
    scenario.write_text(SINGLE_24G)
    if sys.platform == "win32":
        address = rf"\\.\pipe\rbroker-test-{uuid.uuid4().hex[:12]}"
    else:
        address = str(Path(tmp) / "b.sock")
    cfg = BrokerConfig(
        socket_path=Path(address), data_dir=data_dir, machine_lock=PER_SOCKET, **config
    )
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        fake = FakeNvml(scenario)
        broker = Broker(cfg, NvmlGateway(fake, source="simulated"), fake)
        await broker.start()
        api = LocalApi(broker, address)
        await api.start()
        stop = asyncio.Event()
        box.update(api=api, stop=stop)
        ready.set()
        await stop.wait()
        await api.close()
        await broker.stop()

    def run() -> None:
        try:
            loop.run_until_complete(main())
        except BaseException as exc:  # reported by the waiting test
            box["failed"] = exc
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert ready.wait(60) and "failed" not in box, box.get("failed")
        yield ServedApi(address, box["api"], loop)
    finally:
        if "stop" in box:
            loop.call_soon_threadsafe(box["stop"].set)
        thread.join(30)
        if not thread.is_alive():
            loop.close()
        shutil.rmtree(tmp, ignore_errors=True)
