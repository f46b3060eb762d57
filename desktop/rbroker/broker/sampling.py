"""Sampling: what the broker knows about each GPU, the per-GPU NVML loop and the freshness rule.

NVML is read off the event loop by `AsyncSampler`; the loop only ever uses finished samples.
Freshness rule (docs/architecture.md §2): a GPU takes part in an admission pass only when its
latest sample is at most `max_sample_age_s` old, its telemetry is ok, and the sample started
after the latest simulated memory change on that GPU (`last_change_at`, set by
`Broker.memory_changed`; a request waiting for that sample kicks the GPU's loop, so it comes
at once) (`GpuSlot.fresh`). A grant or a resize does not make the sample unfresh: the
lessor books the grant in full, less only its claim (adoption), so the previous sample plus
the booking is as cautious as a new sample, given the attribution rules of
`rbroker.broker.lessor`: (1) a sample that started before a lease's grant gives it only its
claim, and whatever it shows the holder holding beyond its older leases' grants is outside
its leases (its baseline); (2) observed use discounts outstanding only by memory that the
same sample's device_used can hold: at most what the holders' listed processes show less
what all listed processes show beyond device_used (`capacity.unbacked_mib`). A simulated
change does make it unfresh: it changes device_used with no booking. A release does not
either (its unconfirmed MiB stay booked by the lessor instead): it asks for a sample
with `GpuSlot.sample_soon`, which coalesces such requests to at most one per
`release_sample_gap_s` per GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

from rbroker.broker.capacity import default_headroom_mib
from rbroker.broker.config import BrokerConfig
from rbroker.broker.holders import Ancestry, Chain, Holder
from rbroker.gpu.nvml import AsyncSampler, NvmlGateway, TelemetryError
from rbroker.gpu.types import GpuInfo, GpuSample, ProcessSample, TelemetryState

_LOOP_CLOCK_RESOLUTION_S = time.get_clock_info("monotonic").resolution
"""The resolution of asyncio's clock (`BaseEventLoop.time` is `time.monotonic`), by which a
timer may run early (`BaseEventLoop._run_once`): 1e-9 s on Linux, 0.015625 s on Windows."""

log = logging.getLogger(__name__)


def own_identity(chain: Chain, pid: int) -> Holder | None:
    """Process `pid` itself in its chain of ancestors, or None (empty: it cannot be read)."""
    return next((h for h in chain if h.pid == pid), None)


def unlisted_mib(sample: GpuSample) -> int:
    """MiB of `sample`'s used memory that none of its listed processes reports (unknown
    figures count 0): what a process missing from its list may still hold."""
    return max(0, sample.device_used_mib - sum(p.used_mib or 0 for p in sample.processes))


@dataclass(slots=True)
class Listing:
    """What the broker remembers of one pid the driver lists on a GPU.

    `since_proc_s` is the time, on the clock of process start times (`rbroker.base.proctime`), of
    the sample that began the pid's current, unbroken listing and `first_mib` what it showed
    then; `absent_samples` and `absent_since` (monotonic) count a pid missing from the
    latest samples while it is carried forward.
    """

    process: ProcessSample
    chain: Chain
    since_proc_s: float
    first_mib: int | None
    absent_samples: int = 0
    absent_since: float = 0.0

    def identity(self) -> Holder | None:
        """The listed process itself (pid + start time), or None when it cannot be read."""
        return own_identity(self.chain, self.process.pid)

    def attributable(self) -> ProcessSample:
        """The reading with memory that predates the process removed: what a pid's listing
        showed before its current process started was a dead process's (the driver can keep
        listing a dead pid, and pids are reused), never this process's."""
        me = self.identity()
        p = self.process
        if me is None or not me.start_time or not self.since_proc_s:
            return p  # no start time or no sample time to compare: nothing to remove
        if self.since_proc_s >= me.start_time:
            return p
        if p.used_mib is None or self.first_mib is None:
            return ProcessSample(p.pid, None, p.kind)
        return ProcessSample(p.pid, max(0, p.used_mib - self.first_mib), p.kind)


@dataclass(slots=True)
class GpuSlot:
    """What the broker knows about one capacity unit (GPU or MIG slice)."""

    info: GpuInfo
    headroom_override: int | None
    sample: GpuSample | None = None
    telemetry: TelemetryState = TelemetryState.STALE
    telemetry_reason: str = "not sampled yet"
    last_change_at: float = 0.0
    failures: int = 0
    kick: asyncio.Event = field(default_factory=asyncio.Event)
    chains: list[tuple[ProcessSample, Chain]] = field(default_factory=list)
    listings: dict[int, Listing] = field(default_factory=dict)
    last_sample_loop_time: float = -math.inf  # event-loop time the latest attempt began
    soon: asyncio.TimerHandle | None = None  # a coalesced kick, scheduled

    @property
    def uuid(self) -> str:
        return self.info.uuid

    @property
    def total_mib(self) -> int | None:
        return self.sample.total_mib if self.sample else None

    @property
    def headroom_mib(self) -> int:
        if self.headroom_override is not None:
            return self.headroom_override
        return default_headroom_mib(self.sample.total_mib) if self.sample else 0

    def fresh(self, now: float, max_age_s: float) -> bool:
        """Usable for admission now: a good sample at most `max_age_s` old that started
        after the latest simulated change (see the module docstring)."""
        s = self.sample
        return (
            s is not None
            and self.telemetry is TelemetryState.OK
            and s.started_at > self.last_change_at
            and now - s.started_at <= max_age_s
        )

    def sample_soon(self, gap_s: float) -> None:
        """Ask for a sample no sooner than `gap_s` after the latest one began (at once when
        that is past); requests meanwhile share the one scheduled kick. Without a running
        event loop (a broker driven step by step) the kick is set at once."""
        if self.soon is not None or self.kick.is_set():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.kick.set()
            return
        delay = self.last_sample_loop_time + gap_s - loop.time()
        if delay <= 0:
            self.kick.set()
        else:
            # asyncio runs a timer up to one clock resolution early (15.6 ms on Windows,
            # where the loop's clock is GetTickCount64): the gap is a floor, so add it
            self.soon = loop.call_later(delay + _LOOP_CLOCK_RESOLUTION_S, self._kick_now)

    def _kick_now(self) -> None:
        self.soon = None
        self.kick.set()

    def began_sample(self) -> None:
        """A sample of this GPU begins: it answers every kick asked for so far."""
        with contextlib.suppress(RuntimeError):
            self.last_sample_loop_time = asyncio.get_running_loop().time()
        if self.soon is not None:
            self.soon.cancel()
            self.soon = None


#: `(slot, ok)` after every sample attempt; `ok` is False when telemetry failed.
SampleHook = Callable[[GpuSlot, bool], None]


class Sampling:
    """The GPUs (`slots`, keyed by UUID) and the tasks that keep their samples current.

    `on_sample(slot, ok)` runs on the loop after each attempt (the broker attributes memory
    to leases and tells listeners); `after_turn()` runs after each background loop turn (the
    broker's admission pass); `spawn(coro)` starts a background task the broker owns.
    """

    def __init__(
        self,
        gateway: NvmlGateway,
        config: BrokerConfig,
        on_sample: SampleHook,
        after_turn: Callable[[], None],
    ) -> None:
        self.gateway = gateway
        self.config = config
        self.sampler = AsyncSampler(gateway, config.nvml_deadline_s)
        self.slots: dict[str, GpuSlot] = {}
        self._ancestry = Ancestry()
        self._on_sample = on_sample
        self._after_turn = after_turn

    def add_slot(self, info: GpuInfo) -> GpuSlot:
        """A slot for a newly seen GPU, with its configured headroom override."""
        override = self.config.headroom_overrides.get(info.uuid, self.config.headroom_mib)
        slot = GpuSlot(info=info, headroom_override=override)
        self.slots[info.uuid] = slot
        return slot

    async def enumerate(self) -> list[GpuSlot]:
        """Enumerate the GPUs (off the loop) and add a slot for each one not known yet.

        Returns:
            The slots added.

        Raises:
            TelemetryError: NVML cannot enumerate any GPU.
        """
        infos = await asyncio.to_thread(self.gateway.enumerate)
        return [self.add_slot(info) for info in infos if info.uuid not in self.slots]

    async def sample_all(self) -> None:
        """Take one sample of every GPU, concurrently."""
        await asyncio.gather(*(self.sample_once(slot) for slot in self.slots.values()))

    async def sample_once(self, slot: GpuSlot) -> None:
        """Take one sample of `slot` (bounded by the NVML deadline) and record the outcome."""
        slot.began_sample()
        try:
            sample = await self.sampler.sample(slot.uuid)
        except TelemetryError as exc:
            slot.failures += 1
            if slot.telemetry is not exc.state or slot.telemetry_reason != exc.reason:
                log.warning("GPU %s telemetry %s: %s", slot.uuid, exc.state.value, exc)
            slot.telemetry = exc.state
            slot.telemetry_reason = exc.reason
            self._on_sample(slot, False)
            return
        if slot.telemetry is not TelemetryState.OK:
            log.info("GPU %s telemetry ok", slot.uuid)
        slot.failures = 0
        slot.sample = sample
        slot.telemetry = TelemetryState.OK
        slot.telemetry_reason = ""
        self._track(slot, sample)
        self._on_sample(slot, True)

    def _track(self, slot: GpuSlot, sample: GpuSample) -> None:
        """Update `slot.listings` and `slot.chains` from a new sample.

        Evidence that lasts: a pid missing from one sample keeps its last reading (NVML's
        process list is known to omit a running process for a sample or two); it is dropped
        only once its process is gone, the device's own used figure holds none of its
        memory, or it has been missing for `absence_confirm_samples` samples spanning
        `absence_confirm_s`; while the device holds only part of it, it keeps that part
        (the largest missing listings first). Pid reuse: see `Listing.attributable`.
        """
        if not sample.processes_known:
            slot.listings.clear()  # per-process memory unknown: attribute nothing
            slot.chains = []
            return
        listed = {p.pid: p for p in sample.processes}
        for pid, process in listed.items():
            chain = self._ancestry.chain(pid)
            entry = slot.listings.get(pid)
            identity = own_identity(chain, pid)
            if entry is None or (entry.identity() not in (None, identity)):
                # a new listing, or the pid now names another process than before
                since = sample.started_proc_s if entry is None else entry.since_proc_s
                first = process.used_mib if entry is None else entry.process.used_mib
                entry = Listing(process, chain, since, first)
                slot.listings[pid] = entry
            else:
                entry.process, entry.chain = process, chain
                entry.absent_samples = 0
        # What the device holds beyond the listed processes: a missing pid is carried
        # forward only while the device still holds its memory (a process that really
        # freed everything leaves the device's own figure lower: that is evidence too).
        room = unlisted_mib(sample)
        missing = [(pid, e) for pid, e in slot.listings.items() if pid not in listed]
        # the largest first: when the device's memory cannot hold every missing listing, the
        # one whose memory would otherwise count as use elsewhere is the larger one kept
        missing.sort(key=lambda item: -(item[1].process.used_mib or 0))
        for pid, entry in missing:
            if entry.absent_samples == 0:
                entry.absent_since = sample.started_at
            entry.absent_samples += 1
            me = entry.identity()
            lasting = (
                entry.absent_samples >= self.config.absence_confirm_samples
                and sample.started_at - entry.absent_since >= self.config.absence_confirm_s
            )
            held = entry.process.used_mib or 0
            if me is None or lasting or not me.alive() or (held > 0 and room == 0):
                del slot.listings[pid]
            else:
                if held > room:  # the device holds no more than that of it now
                    entry.process = replace(entry.process, used_mib=room)
                room -= min(held, room)
        slot.chains = [(entry.attributable(), entry.chain) for entry in slot.listings.values()]

    async def sample_loop(self, slot: GpuSlot) -> None:
        """Sample `slot` every `sample_interval_s` or at once when kicked; back off (0.2 s
        doubling, at most 5 s) while its telemetry fails."""
        while True:
            interval = self.config.sample_interval_s
            if slot.failures:
                interval = min(5.0, 0.2 * 2 ** min(slot.failures, 5))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(slot.kick.wait(), timeout=interval)
            if slot.failures and self.sampler.busy(slot.uuid):
                await asyncio.sleep(0.2)  # the hung call still holds the GPU's one slot
            slot.kick.clear()
            try:
                await self.sample_once(slot)
                self._after_turn()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one GPU's sampler die
                log.exception("sampling %s failed", slot.uuid)

    async def enumerate_loop(self, spawn: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        """Pick up GPUs that appear later (hot-plug, MIG reconfiguration, a driver that
        came back). GPUs are keyed by UUID, so index shifts change nothing; a GPU that
        disappears turns `lost` through its sampler and keeps its leases. A hung
        enumeration keeps its thread; no second one starts until it returns."""
        running: asyncio.Future[list[GpuInfo]] | None = None
        while True:
            await asyncio.sleep(self.config.enumerate_interval_s)
            if running is None:
                running = asyncio.ensure_future(asyncio.to_thread(self.gateway.enumerate))
            try:
                infos = await asyncio.wait_for(
                    asyncio.shield(running), self.config.nvml_deadline_s * 4
                )
            except TimeoutError:
                log.debug("re-enumeration still running (NVML hangs)")
                continue  # keep waiting for the same call next time
            except TelemetryError as exc:
                running = None
                log.debug("re-enumeration failed: %s", exc)
                continue
            running = None
            for info in infos:
                slot = self.slots.get(info.uuid)
                if slot is not None:
                    slot.info = info  # the index may have shifted: display only
                    continue
                slot = self.add_slot(info)
                log.warning("new GPU %s (%s)", info.uuid, info.name)
                await self.sample_once(slot)
                spawn(self.sample_loop(slot))

    def close(self) -> None:
        """Stop the sampler's worker threads."""
        self.sampler.close()
