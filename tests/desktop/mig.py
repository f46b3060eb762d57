"""A simulated MIG-enabled GPU: the fake NVML library wrapped to answer NVML's MIG calls.

One physical GPU whose MIG mode is on, three slice positions of which two hold a slice; each
slice's memory and processes come from the scenario entry with its MIG UUID. The production
gateway enumerates it as it would a real one. Run as a module
(`python -m tests.desktop.mig SOCKET DATA_DIR`), it serves a broker on these slices over the
real local API, as `rbroker broker` would.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pynvml

from rbroker.gpu.fake_nvml import FakeNvml, _Handle
from tests.fakes.gpu_scenarios import gpu, scenario

PARENT = "GPU-a1000000-0000-0000-0000-000000000001"
SLICE_A = "MIG-a1000000-0000-0000-0000-00000000000a"
SLICE_B = "MIG-a1000000-0000-0000-0000-00000000000b"

SLICES = scenario(
    gpu(SLICE_A, name="slice 3g.40gb", total_mib=40192),
    gpu(SLICE_B, name="slice 3g.40gb", total_mib=40192, used_mib=10000),
)


class MigNvml(FakeNvml):
    """One physical GPU in MIG mode; its slices are the scenario's GPUs."""

    def nvmlDeviceGetCount(self) -> int:
        super().nvmlDeviceGetCount()  # the initialised check
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if index != 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(PARENT)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return PARENT if handle == _Handle(PARENT) else super().nvmlDeviceGetUUID(handle)

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return "Simulated A100" if handle == _Handle(PARENT) else super().nvmlDeviceGetName(handle)

    def nvmlDeviceGetMigMode(self, handle: Any) -> tuple[int, int]:
        return (1, 1)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return 3

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> _Handle:
        uuids = [g.uuid for g in self.gpus()]
        if index >= len(uuids):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)  # an empty slice position
        return _Handle(uuids[index])


def serve(socket_path: str, data_dir: Path) -> None:
    """Serve a broker on the MIG slices of `SLICES` at `socket_path` until killed."""
    from rbroker.broker.config import BrokerConfig
    from rbroker.broker.service import Broker
    from rbroker.gpu.nvml import NvmlGateway
    from rbroker.localapi.server import LocalApi

    data_dir.mkdir(parents=True, exist_ok=True)
    scenario = data_dir / "mig.toml"
    scenario.write_text(SLICES)
    lib = MigNvml(scenario)
    gateway = NvmlGateway(lib, source="simulated")
    broker = Broker(BrokerConfig(socket_path=Path(socket_path), data_dir=data_dir), gateway, lib)

    async def main() -> None:
        await broker.start()
        api = LocalApi(broker, socket_path)
        await api.start()
        await asyncio.Event().wait()

    asyncio.run(main())


if __name__ == "__main__":
    serve(sys.argv[1], Path(sys.argv[2]))
