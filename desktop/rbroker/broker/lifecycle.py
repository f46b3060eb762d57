"""The broker's lifecycle: start (fail closed when NVML does not initialise, then retry),
and stop (keep leases for the restart, or end them all when configured).

Fail closed, never open: where `nvmlInit` fails no GPU is invented and nothing is admitted;
requests wait or are refused with the NVML error in words; leases restored from the store
stay; NVML is retried with backoff (0.5 s doubling to `nvml_retry_max_s`) and the broker
serves normally once it answers. Where the OS shows no NVIDIA GPU at all, requests are
refused as infeasible with the way to try rbroker (`--simulate`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from rbroker.broker.admission import NvmlProblem
from rbroker.broker.config import HeadroomTooLarge
from rbroker.broker.leases import LeaseState
from rbroker.broker.restore import restore
from rbroker.broker.ticks import tick_loop
from rbroker.gpu.nvml import TelemetryError, describe
from rbroker.gpu.presence import nvidia_device_present
from rbroker_protocol.errors import ErrorCode, RpcError

if TYPE_CHECKING:
    from rbroker.broker.service import Broker

log = logging.getLogger(__name__)


async def start(b: Broker, background: bool) -> None:
    """Enumerate GPUs, take a first sample of each, restore the store, start the tasks."""
    try:
        await b.sampling.enumerate()
    except TelemetryError as exc:
        nvml_failed(b, exc)
    else:
        # read once, off the loop: an NVML call on the loop would block the local API
        # whenever the driver hangs
        b.driver_version = await asyncio.to_thread(b.gateway.driver_version)
        await b.sampling.sample_all()
        check_headroom(b)
    if b.store is not None:
        restore(b.store, b.table, b.waiting, b.jobs, b.clock, b.config)
    if not background:
        return
    if b.nvml_problem is not None:
        b._spawn(retry_nvml(b))
    for slot in b.slots.values():
        b._spawn(b.sampling.sample_loop(slot))
    b._spawn(tick_loop(b.clock, b.config, b._grace, b._check_holders, b._expire))
    if b.nvml_problem is None:
        b._spawn(b.sampling.enumerate_loop(b._spawn))
    log.info("broker started: %d GPUs, telemetry %s", len(b.slots), b.gateway.source)


def check_headroom(b: Broker) -> None:
    """Refuse a configured headroom (`--headroom-mib`, or one GPU's override) that is not
    below the total of a GPU sampled at start (architecture.md §2: usable = total −
    headroom − …); a GPU whose first sample failed is not judged.

    Raises:
        HeadroomTooLarge: for the first such GPU.
    """
    for slot in b.slots.values():
        total_mib = slot.total_mib
        override = slot.headroom_override
        if override is not None and total_mib is not None and override >= total_mib:
            raise HeadroomTooLarge(
                f"headroom {override} MiB is not below the {total_mib} MiB of GPU "
                f"{slot.info.index} ({slot.uuid}, {slot.info.name}): nothing could ever be "
                "granted there; give a headroom below the GPU's total (--headroom-mib)"
            )


def nvml_failed(b: Broker, exc: TelemetryError) -> None:
    """Record why NVML does not initialise and whether a GPU exists at all."""
    present = b.fake is not None or nvidia_device_present()
    b.nvml_problem = NvmlProblem(exc.reason, exc.words or describe(exc.reason), present)
    b.admission.problem = b.nvml_problem
    if present:
        log.error(
            "NVML failed at start: %s; nothing is admitted until it answers (retrying)",
            b.nvml_problem.words,
        )
    else:
        log.warning(
            "no NVIDIA GPU on this computer (%s); to try rbroker without one, run "
            "`rbroker broker --simulate`",
            b.nvml_problem.words,
        )


async def retry_nvml(b: Broker) -> None:
    """Retry `nvmlInit` and enumeration with backoff until they work; then sample, serve
    and admit normally (waiters get every GPU found)."""
    delay_s = 0.5
    while b.nvml_problem is not None:
        await asyncio.sleep(delay_s)
        delay_s = min(b.config.nvml_retry_max_s, delay_s * 2)
        try:
            await asyncio.wait_for(b.sampling.enumerate(), b.config.nvml_deadline_s * 4)
        except TimeoutError:
            continue
        except TelemetryError as exc:
            if exc.reason != b.nvml_problem.reason:
                nvml_failed(b, exc)
            continue
        log.warning("NVML answers again: %d GPUs; admitting", len(b.slots))
        b.nvml_problem = None
        b.admission.problem = None
        b.driver_version = await asyncio.to_thread(b.gateway.driver_version)
        await b.sampling.sample_all()
        check_headroom(b)
        for slot in b.slots.values():
            b.table.update_observed(slot)
            b._spawn(b.sampling.sample_loop(slot))
        b._spawn(b.sampling.enumerate_loop(b._spawn))
        b.waiting.widen(b.admission.unpinned_candidates)
        b.emit("capacity", {})
        b._admit()


def begin_stop(b: Broker) -> bool:
    """The broker is about to stop. With `release_all_on_exit`, end every lease now;
    otherwise keep every lease and persisted waiter in the store, so that connections
    closing from here on end nothing and the restarted broker restores them exactly as
    after a crash. Returns True when leases are kept."""
    if b.config.release_all_on_exit:
        for lease in list(b.leases.values()):
            b._end(lease, LeaseState.RELEASED, "the broker stopped (release all on exit)")
        return False
    b.stopping = True
    log.info("stopping: %d leases kept for the restarted broker", len(b.leases))
    return True


async def stop(b: Broker) -> None:
    """Cancel background tasks and fail every waiter (persisted waiters stay in the
    store); leases stay in the store unless `begin_stop` ended them."""
    pending = set(b._tasks)
    while pending:
        # cancel again until done: Python 3.11's asyncio.wait_for can swallow a
        # cancellation that arrives as its inner future completes (a GPU's sampler
        # kicked by a lease ending just as the broker stops), and the task runs on
        for task in pending:
            task.cancel()
        done, pending = await asyncio.wait(pending, timeout=0.5)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                log.warning("background task ended with %r", task.exception())
    b._tasks.clear()
    for slot in b.slots.values():
        slot.began_sample()  # drop a coalesced kick still scheduled
    b.waiting.fail_all(RpcError(ErrorCode.CANCELLED, "broker stopping"))
    b.sampling.close()
    if b.store is not None:
        b.store.close()
