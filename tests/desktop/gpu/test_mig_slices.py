"""MIG slices are separate capacity units with their own UUIDs (architecture.md §2, issue 3).

The simulated NVML has no MIG mode, so this test wraps it in a library that answers the MIG
calls the way NVML does on a MIG-enabled GPU (`tests.desktop.mig`). The production gateway
enumerates it, and an in-process broker leases the slices.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from rbroker.broker.config import BrokerConfig
from rbroker.broker.holders import Holder
from rbroker.broker.service import Broker
from rbroker.gpu.nvml import NvmlGateway
from rbroker_protocol.errors import RpcError
from rbroker_protocol.localapi import AcquireParams
from tests.desktop.mig import PARENT, SLICE_A, SLICE_B, SLICES, MigNvml


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
