"""Wire a broker to its local API and run it: used by `rbroker broker` and the tray."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path

from rbroker.broker.config import BrokerConfig
from rbroker.broker.service import Broker
from rbroker.gpu.select import open_gateway
from rbroker.localapi.server import LocalApi

log = logging.getLogger(__name__)


class BrokerHost:
    """A broker plus its local API on one event loop.

    `await start()` enumerates GPUs and starts listening; `await stop()` undoes it.

    Raises (from `start`):
        ScenarioError: invalid scenario file. TelemetryError: no GPU could be enumerated.
        BrokerAlreadyRunning: a live broker already listens on the address.
    """

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        gateway, fake = open_gateway(config.simulate, config.scenario)
        self.broker = Broker(config, gateway, fake)
        self.api = LocalApi(self.broker, str(config.socket_path))

    @property
    def simulated(self) -> bool:
        return self.broker.fake is not None

    async def start(self) -> None:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        await self.broker.start()
        await self.api.start()

    async def stop(self) -> None:
        await self.api.close()
        await self.broker.stop()

    async def run_forever(self, ready: asyncio.Event | None = None) -> None:
        """Start, then run until SIGINT/SIGTERM (or cancellation), then stop."""
        await self.start()
        if ready is not None:
            ready.set()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        if sys.platform != "win32":
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            with contextlib.suppress(Exception):
                await self.stop()


def make_config(
    socket_path: str,
    data_dir: Path,
    simulate: bool,
    scenario: Path | None,
    headroom_mib: int | None,
) -> BrokerConfig:
    """A `BrokerConfig` from CLI-level arguments."""
    return BrokerConfig(
        socket_path=Path(socket_path),
        data_dir=data_dir,
        simulate=simulate,
        scenario=scenario,
        headroom_mib=headroom_mib,
    )
