"""The release rule of docs/architecture.md §2: a release never frees memory no sample has
confirmed, and admission never waits for a fresh sample after it to grant what fits; a
request that fits only once the released MiB are confirmed waits for that one sample (also
with wait_s 0) instead of being refused for them.

A released lease's unconfirmed MiB (granted − observed at the last sample) stay booked until
a sample that started after the release shows what its holder still uses; release-triggered
samples are coalesced to at most one per `release_sample_gap_s` per GPU.

The step-by-step cases use an in-process broker with a manual clock (no sample is taken
unless the test takes it); the coalescing case runs a broker with its sampler tasks on the
real clock.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import rbroker
from rbroker.broker.config import BrokerConfig
from rbroker.broker.holders import Holder
from rbroker.broker.leases import Lease
from rbroker.broker.service import Broker
from rbroker.gpu.fake_nvml import FakeNvml
from rbroker.gpu.nvml import NvmlGateway
from rbroker_protocol.errors import RpcError
from rbroker_protocol.localapi import AcquireParams
from tests.conftest import GPU0, SINGLE_24G, BrokerProcess
from tests.desktop.inprocess import DESCRIPTION, InProcessBroker, SleeperPool

TOTAL, HEADROOM = 24576, 1229  # SINGLE_24G with the default headroom
USABLE = TOTAL - HEADROOM  # 23 347
GAP_S = 0.02  # BrokerConfig.release_sample_gap_s, the default


def _grant(h: InProcessBroker, holder: Holder, mib: int) -> Lease:
    task = h.acquire(holder, mib=mib, wait_s=0.0)
    assert task.done(), "admitted without waiting for a sample"
    return task.result()


def _refused(h: InProcessBroker, holder: Holder, mib: int) -> RpcError:
    task = h.acquire(holder, mib=mib, wait_s=0.0)
    h.tick(0.1)  # the expiry step answers a wait_s=0 request it evaluated (no clock move)
    assert task.done(), "still waiting (for a sample?) instead of refused on the numbers"
    err = task.exception()
    assert isinstance(err, RpcError), err
    return err


def _waits_for_release_sample(h: InProcessBroker, holder: Holder, mib: int) -> asyncio.Task[Lease]:
    task = h.acquire(holder, mib=mib, wait_s=0.0)
    h.tick(0.1)  # the expiry step would answer a wait_s=0 request it evaluated
    assert not task.done(), "refused (or granted) before the sample that confirms the release"
    (waiter,) = h.broker.queue
    assert waiter.reason.startswith("waiting for a GPU sample to confirm "), waiter.reason
    assert waiter.reason_kind == "sampling"
    return task


def test_acquire_right_after_a_release_gets_only_what_the_sample_confirmed(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    proc_a, a = pool.spawn()
    _, b = pool.spawn()
    lease = _grant(h, a, 20000)
    h.fake.allocate(GPU0, proc_a.pid, 5000)
    h.sample()  # shows A using 5 000 of its 20 000
    cap = h.broker.capacity(GPU0)
    assert cap is not None
    assert (cap.device_used_mib, cap.outstanding_mib) == (5000, 15000)
    sample = h.broker.slots[GPU0].sample

    h.broker.release(lease.lease_id, "tester")
    # No sample since: A's 15 000 MiB not shown in use stay booked, admission does not wait.
    assert h.broker.lessor.unconfirmed_mib(GPU0) == 15000
    cap = h.broker.capacity(GPU0)
    assert cap is not None
    assert (cap.device_used_mib, cap.outstanding_mib) == (5000, 15000)
    assert cap.available_mib == USABLE - 20000 == 3347
    # more than the confirmed free memory plus all of the release: refused on the numbers
    err = _refused(h, b, USABLE - 5000 + 1)
    assert err.name.value == "capacity_unavailable"
    second = _grant(h, b, 3347)  # exactly what was free before the release, at once
    assert h.broker.slots[GPU0].sample is sample, "a sample was taken: the rule was not tested"
    cap = h.broker.capacity(GPU0)
    assert cap is not None and cap.available_mib == 0
    # one that fits only once the release is confirmed waits for that sample, also with
    # wait_s 0 (never granted on the unconfirmed MiB, never refused for them either)
    waiting = _waits_for_release_sample(h, b, 1)
    assert h.broker.slots[GPU0].sample is sample

    h.broker.release(second.lease_id, "tester")
    assert h.broker.lessor.unconfirmed_mib(GPU0) == 15000 + 3347
    h.sample()  # started after both releases: A still holds its 5 000 MiB, nothing else
    assert h.broker.lessor.unconfirmed_mib(GPU0) == 0
    assert waiting.done() and waiting.result().granted_mib == 1
    cap = h.broker.capacity(GPU0)
    assert cap is not None
    assert (cap.device_used_mib, cap.outstanding_mib) == (5000, 1)
    assert _refused(h, b, USABLE - 5000).name.value == "capacity_unavailable"
    _grant(h, b, USABLE - 5000 - 1)


def test_memory_allocated_after_the_last_sample_is_never_freed_by_the_release(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    proc_a, a = pool.spawn()
    _, b = pool.spawn()
    lease = _grant(h, a, 20000)
    h.fake.allocate(GPU0, proc_a.pid, 5000)
    h.sample()
    h.fake.allocate(GPU0, proc_a.pid, 15000)  # A uses all 20 000 now; no sample shows it yet
    h.broker.release(lease.lease_id, "tester")  # and its process keeps the memory
    waiting = _waits_for_release_sample(h, b, 3348)
    h.sample()  # the sample after the release shows what A still uses: 20 000
    cap = h.broker.capacity(GPU0)
    assert cap is not None
    assert (cap.device_used_mib, cap.outstanding_mib) == (20000, 0)
    h.tick(0.1)  # that sample decided: no room, and it waits no second time
    assert waiting.done()
    err = waiting.exception()
    assert isinstance(err, RpcError) and err.name.value == "capacity_unavailable", err
    assert _refused(h, b, 3348).name.value == "capacity_unavailable"
    _grant(h, b, 3347)


def test_memory_an_ended_lease_kept_never_counts_as_use_of_the_holders_other_lease(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    """The holder's process keeps what it allocated under a released lease, which no
    sample had shown: when the sample after the release lists it, it is memory outside any
    lease, not use of the holder's other lease (whose outstanding MiB would then shrink)."""
    proc_a, a = pool.spawn()
    first = _grant(h, a, 1024)
    h.sample()  # a grant makes the sample stale
    second = _grant(h, a, 12288)
    h.sample()
    h.fake.allocate(GPU0, proc_a.pid, 3072)  # inside `second`; no sample shows it
    h.broker.release(second.lease_id, "tester")
    h.sample()
    cap = h.broker.capacity(GPU0)
    assert cap is not None
    assert cap.device_used_mib == 3072
    assert first.observed_mib[GPU0] == 0
    assert cap.outstanding_mib == 1024  # the other lease is still owed in full
    assert cap.available_mib == USABLE - 3072 - 1024


def test_a_sample_that_began_before_the_release_confirms_nothing(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    """A sample that began at the moment of the release (or before: one in flight, whose
    result lands after the release) does not drop the release's booking."""
    _, a = pool.spawn()
    lease = _grant(h, a, 8000)
    slot = h.broker.slots[GPU0]
    h.clock.advance(0.001)
    began = h.clock.monotonic()
    h.broker.release(lease.lease_id, "tester")
    h.run(h.broker._sample_once(slot))  # began at the release's instant, not after it
    assert slot.sample is not None and slot.sample.started_at == began
    assert h.broker.lessor.unconfirmed_mib(GPU0) == 8000
    h.sample()  # a millisecond later
    assert h.broker.lessor.unconfirmed_mib(GPU0) == 0


def test_release_triggered_samples_are_coalesced(tmp_path: Path) -> None:
    """100 releases 2 ms apart ask for at most one sample per 20 ms of the GPU, and the last
    release is confirmed by a sample soon after it."""
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SINGLE_24G)

    async def scenario_run() -> tuple[int, float, int]:
        fake = FakeNvml(scenario)
        config = BrokerConfig(socket_path=tmp_path / "unused.sock", data_dir=tmp_path)
        assert config.release_sample_gap_s == GAP_S
        broker = Broker(config, NvmlGateway(fake, source="simulated"), fake)
        await broker.start()
        try:
            holder = Holder.of(os.getpid())
            params = AcquireParams.model_validate({**DESCRIPTION, "mib": 64, "wait_s": 10.0})
            leases = [await broker.acquire(params, "tester", holder, 1) for _ in range(100)]
            await asyncio.sleep(0.1)
            samples = 0
            sample_once = broker.sampling.sample_once

            async def counted(slot: object) -> None:
                nonlocal samples
                samples += 1
                await sample_once(broker.slots[GPU0])

            broker.sampling.sample_once = counted  # type: ignore[method-assign,assignment]
            loop = asyncio.get_running_loop()
            began = loop.time()
            for lease in leases:
                broker.release(lease.lease_id, "tester")
                await asyncio.sleep(0.002)
            elapsed = loop.time() - began
            for _ in range(100):  # the last release's sample: within ~20 ms, allow 2 s
                if broker.lessor.unconfirmed_mib(GPU0) == 0:
                    break
                await asyncio.sleep(0.02)
            return samples, elapsed, broker.lessor.unconfirmed_mib(GPU0)
        finally:
            await broker.stop()

    samples, elapsed, left = asyncio.run(scenario_run())
    assert left == 0
    # one per 20 ms of the window, one for the last release, one periodic (1 s interval)
    assert 1 <= samples <= elapsed / GAP_S + 3, (samples, elapsed)


def test_leases_one_after_another_with_no_wait_are_all_granted(broker: BrokerProcess) -> None:
    """Before: the second `with rbroker.lease(20000)` right after the first (the SDK's
    default wait_s 0) was refused "no room now … 20 000 granted not yet allocated": the
    released MiB stay booked until a sample confirms them, and the request did not wait
    for that sample (~20 ms away). Right: every one is granted, each after the sample."""
    for i in range(8):
        with rbroker.lease(
            20000, socket=broker.socket, project="tests", session="loop", purpose=f"step {i}"
        ) as lease:
            assert lease.granted_mib == 20000
