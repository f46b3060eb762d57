"""MIG slices are separate capacity units with their own UUIDs (DESIGN §2, issue 3).

The simulated NVML has no MIG mode, so this test wraps it in a library that answers the MIG
calls the way NVML does on a MIG-enabled GPU: one physical GPU whose MIG mode is on, three
slice positions of which two hold a slice; each slice's memory and processes come from the
scenario entry with its MIG UUID. The production gateway enumerates it, and an in-process
broker leases the slices.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pynvml

from rbroker.broker.config import BrokerConfig
from rbroker.broker.holders import Holder
from rbroker.broker.service import Broker
from rbroker.gpu.fake_nvml import FakeNvml, _Handle
from rbroker.gpu.nvml import NvmlGateway
from rbroker_protocol.errors import RpcError
from rbroker_protocol.localapi import AcquireParams

PARENT = "GPU-a1000000-0000-0000-0000-000000000001"
SLICE_A = "MIG-a1000000-0000-0000-0000-00000000000a"
SLICE_B = "MIG-a1000000-0000-0000-0000-00000000000b"

SLICES = f"""
[[gpu]]
uuid = "{SLICE_A}"
name = "slice 3g.40gb"
total_mib = 40192

[[gpu]]
uuid = "{SLICE_B}"
name = "slice 3g.40gb"
total_mib = 40192
used_mib = 10000
"""


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


def test_mig_slices_are_separate_capacity_units(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SLICES)
    lib = MigNvml(scenario)
    gateway = NvmlGateway(lib, source="simulated")
    infos = gateway.enumerate()
    assert [i.uuid for i in infos] == [SLICE_A, SLICE_B]
    assert {i.index for i in infos} == {0}  # both on physical GPU 0 (display only)
    assert PARENT not in {i.uuid for i in infos}

    config = BrokerConfig(socket_path=tmp_path / "unused.sock", data_dir=tmp_path)
    broker = Broker(config, gateway, lib)
    holder = Holder.of(os.getpid())
    desc = {"project": "tests", "session": "mig", "purpose": "slices"}

    async def main() -> None:
        await broker.start()
        try:
            before = {u: broker.capacity(u) for u in (SLICE_A, SLICE_B)}
            assert before[SLICE_A] is not None and before[SLICE_B] is not None
            assert before[SLICE_A].available_mib == 40192 - 2010  # 5 % headroom
            assert before[SLICE_B].available_mib == 40192 - 2010 - 10000

            lease = await broker.acquire(
                AcquireParams(mib=30000, gpu_uuid=SLICE_A, **desc), "tester", holder, 1
            )
            assert lease.gpu_uuids == (SLICE_A,)
            after_b = broker.capacity(SLICE_B)
            assert after_b is not None and after_b.available_mib == before[SLICE_B].available_mib
            after_a = broker.capacity(SLICE_A)
            assert after_a is not None and after_a.outstanding_mib == 30000

            # 30 000 more fit on no slice now: A has 8 182 left, B 28 182
            try:
                await broker.acquire(AcquireParams(mib=30000, **desc), "tester", holder, 1)
            except RpcError as err:
                assert err.name.value == "capacity_unavailable"
            else:
                raise AssertionError("admitted beyond a slice's capacity")
            await asyncio.sleep(1.2)  # a fresh sample after the grant
            other = await broker.acquire(AcquireParams(mib=20000, **desc), "tester", holder, 1)
            assert other.gpu_uuids == (SLICE_B,)
        finally:
            await broker.stop()

    asyncio.run(main())
