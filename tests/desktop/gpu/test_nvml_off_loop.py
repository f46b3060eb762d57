"""No NVML call ever runs on the broker's event loop, and a hung one is never doubled
(issue 3: hung calls never stall heartbeats or the local API; one call in flight).

An in-process `Broker` with its background tasks runs on the simulated NVML library, whose
system-level calls (device count, driver version) are made to hang as a hung driver's do.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from rbroker.broker.config import BrokerConfig
from rbroker.broker.service import Broker
from rbroker.gpu.fake_nvml import FakeNvml
from rbroker.gpu.nvml import NvmlGateway
from tests.conftest import SINGLE_24G


def test_hung_driver_calls_stay_off_the_loop_and_single(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SINGLE_24G)
    fake = FakeNvml(scenario)
    config = BrokerConfig(
        socket_path=tmp_path / "unused.sock",
        data_dir=tmp_path,
        enumerate_interval_s=0.05,
        nvml_deadline_s=0.1,
    )
    broker = Broker(config, NvmlGateway(fake, source="simulated"), fake)
    release = threading.Event()
    in_flight = {"now": 0, "most": 0, "calls": 0}
    lock = threading.Lock()

    def hung_count() -> int:
        with lock:
            in_flight["now"] += 1
            in_flight["calls"] += 1
            in_flight["most"] = max(in_flight["most"], in_flight["now"])
        release.wait(20)
        with lock:
            in_flight["now"] -= 1
        return 1

    def hung_driver_version() -> str:
        release.wait(20)
        return "hung"

    async def main() -> list[float]:
        await broker.start()
        assert broker.status()["driver_version"] == "simulated"
        fake.nvmlDeviceGetCount = hung_count  # type: ignore[method-assign]
        fake.nvmlSystemGetDriverVersion = hung_driver_version  # type: ignore[method-assign]
        took = []
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            started = time.monotonic()
            status = broker.status()
            took.append(time.monotonic() - started)
            assert status["gpus"]
            await asyncio.sleep(0.05)
        release.set()
        await asyncio.sleep(0.3)
        await broker.stop()
        return took

    try:
        took = asyncio.run(main())
    finally:
        release.set()
    assert max(took) < 0.1, max(took)  # the driver version is not read on the loop
    assert in_flight["calls"] >= 1  # re-enumeration did try during the hang
    assert in_flight["most"] == 1  # and never started a second call beside the hung one
