"""The broker service: lease table, FIFO queue, admission and expiry on one asyncio loop.

Admission and booking happen in one synchronous step on the event loop (`_admit`), so two
requests can never both pass the capacity check (DESIGN §2). NVML is read off the loop by
`AsyncSampler`; the loop only ever uses finished samples.

Freshness rule (DESIGN §2): a GPU takes part in an admission pass only when its latest
sample started after the latest grant or release on that GPU, and is at most
`max_sample_age_s` old. One pass may make several grants from the same sample: each is
booked (as outstanding) before the next is checked.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rbroker._version import __version__
from rbroker.broker.capacity import (
    Capacity,
    default_headroom_mib,
    explain,
    fmt_mib,
    short_uuid,
)
from rbroker.broker.clock import Clock, SystemClock
from rbroker.broker.config import BrokerConfig
from rbroker.broker.holders import Ancestry, Holder
from rbroker.broker.jobs import JobTable
from rbroker.broker.leases import Lease, LeaseState, Waiter
from rbroker.broker.store import LeaseStore, token_hash
from rbroker.gpu.fake_nvml import FakeNvml
from rbroker.gpu.nvml import AsyncSampler, NvmlGateway, TelemetryError
from rbroker.gpu.types import GpuInfo, GpuSample, ProcessSample, TelemetryState
from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.localapi import AcquireParams

log = logging.getLogger(__name__)


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
    chains: list[tuple[ProcessSample, frozenset[Holder]]] = field(default_factory=list)

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
        """Usable for admission now (see the module docstring)."""
        s = self.sample
        return (
            s is not None
            and self.telemetry is TelemetryState.OK
            and s.started_at > self.last_change_at
            and now - s.started_at <= max_age_s
        )

    def holder_mib(self, holder: Holder) -> int:
        """MiB the latest sample attributes to `holder`'s process tree (unknown = 0)."""
        return sum(p.used_mib or 0 for p, chain in self.chains if holder in chain)

    def holder_mib_known(self, holder: Holder) -> bool:
        """True when the latest sample knows the memory of every process of `holder`'s tree."""
        return all(p.used_mib is not None for p, chain in self.chains if holder in chain)


Listener = Callable[[str, dict[str, Any]], None]


class Broker:
    """The local broker. Create, `await start()`, use, `await stop()`.

    All public methods run on the broker's event loop. Errors are `RpcError`s with the
    stable codes of DESIGN §5.
    """

    def __init__(
        self,
        config: BrokerConfig,
        gateway: NvmlGateway,
        fake: FakeNvml | None,
        clock: Clock | None = None,
        store: LeaseStore | None = None,
    ) -> None:
        self.clock: Clock = clock or SystemClock()
        self.store = store
        gateway.clock = self.clock.monotonic
        gateway.capacity_overrides_mib = dict(config.capacity_overrides_mib)
        self.config = config
        self.gateway = gateway
        self.fake = fake
        self.sampler = AsyncSampler(gateway, config.nvml_deadline_s)
        self.slots: dict[str, GpuSlot] = {}
        self.leases: dict[str, Lease] = {}
        self.ended: collections.deque[Lease] = collections.deque(maxlen=config.ended_history)
        self.queue: list[Waiter] = []
        self._baselines: dict[tuple[Holder, str], int] = {}
        self._ancestry = Ancestry()
        self._tasks: list[asyncio.Task[None]] = []
        self._request_seq = 0
        self._started_mono = self.clock.monotonic()
        self._started_wall = self.clock.wall()
        self._listeners: list[Listener] = []
        self.grant_count = 0
        self.paused = False
        self.jobs = JobTable(self.clock, store)
        self.uplink_status: Callable[[], dict[str, Any]] | None = None
        self._token_sha256: dict[str, str] = {}
        self._ends_since_prune = 0
        self.driver_version = "unknown"

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self, background: bool = True) -> None:
        """Enumerate GPUs, take a first sample of each, start the sampler and tick tasks.

        `background=False` (tests that drive the broker step by step) starts no tasks:
        the caller then calls `_sample_once`, `_admit`, `_expire` and the rest itself.

        Raises:
            TelemetryError: NVML cannot enumerate any GPU.
        """
        infos = await asyncio.to_thread(self.gateway.enumerate)
        # read once, off the loop: an NVML call on the loop would block the local API
        # whenever the driver hangs
        self.driver_version = await asyncio.to_thread(self.gateway.driver_version)
        for info in infos:
            override = self.config.headroom_overrides.get(info.uuid, self.config.headroom_mib)
            self.slots[info.uuid] = GpuSlot(info=info, headroom_override=override)
        await asyncio.gather(*(self._sample_once(slot) for slot in self.slots.values()))
        if self.store is not None:
            self._restore(self.store)
        if not background:
            return
        for slot in self.slots.values():
            self._tasks.append(asyncio.create_task(self._sample_loop(slot)))
        self._tasks.append(asyncio.create_task(self._tick_loop()))
        self._tasks.append(asyncio.create_task(self._enumerate_loop()))
        log.info("broker started: %d GPUs, telemetry %s", len(self.slots), self.gateway.source)

    def _restore(self, store: LeaseStore) -> None:
        """Bring back, after a restart, the leases and waiting requests whose holder
        processes are still alive (pid + start time); end the others with the reason."""
        now, wall = self.clock.monotonic(), self.clock.wall()
        for stored in store.active_leases():
            try:
                lease = Lease.from_record(stored.record, now + float(stored.record["ttl_s"]), wall)
            except (KeyError, TypeError, ValueError, AttributeError):
                log.error("lease %s: unreadable record, dropped", stored.lease_id)
                store.end_lease(stored.lease_id, LeaseState.REVOKED.value, wall, stored.record)
                continue
            if not lease.holder.alive():
                lease.state = LeaseState.HOLDER_EXITED
                lease.ended_reason = "holder exited while the broker was down"
                lease.ended_at_wall = wall
                store.end_lease(lease.lease_id, lease.state.value, wall, lease.to_record())
                self.ended.append(lease)
                log.info("lease %s not restored: %s", lease.lease_id, lease.ended_reason)
                continue
            self.leases[lease.lease_id] = lease
            self._token_sha256[lease.lease_id] = stored.token_sha256
            if lease.job_id is not None:
                self.jobs.restore_link(lease.job_id, lease.lease_id)
            for u, baseline in lease.baseline_mib.items():
                self._baselines[(lease.holder, u)] = baseline
            log.info("lease %s restored (holder %d alive)", lease.lease_id, lease.holder.pid)
        for rec in store.waiters():
            key = rec["request_key"]
            try:
                holder = Holder(int(rec["holder_pid"]), float(rec["holder_start"]))
                remaining = float(rec["wait_until_wall"]) - wall
                candidates = tuple(u for u in rec["candidates"] if u in self.slots)
                alive = holder.alive()
            except (KeyError, TypeError, ValueError):
                alive, remaining, candidates = False, 0.0, ()
            if not alive or remaining <= 0 or len(candidates) < int(rec.get("gpus", 1)):
                store.delete_waiter(key)
                continue
            self._request_seq += 1
            self.queue.append(
                Waiter(
                    request_id=self._request_seq,
                    mib=int(rec["mib"]),
                    gpus=int(rec["gpus"]),
                    candidates=candidates,
                    pinned=bool(rec["pinned"]),
                    owner=rec["owner"],
                    project=rec["project"],
                    session=rec["session"],
                    purpose=rec["purpose"],
                    ttl_s=float(rec["ttl_s"]),
                    adopt=bool(rec["adopt"]),
                    placement=rec["placement"],
                    holder=holder,
                    conn_id=None,
                    enqueued_at=now,
                    deadline=now + remaining,
                    wait_s=float(rec["wait_s"]),
                    future=asyncio.get_running_loop().create_future(),
                    request_key=key,
                    wait_until_wall=float(rec["wait_until_wall"]),
                    reattach_by=now + self.config.reattach_grace_s,
                    job_id=rec.get("job_id"),
                )
            )
        for slot in self.slots.values():
            self._update_observed(slot)
        if self.leases or self.queue:
            log.warning(
                "restored %d leases and %d waiting requests", len(self.leases), len(self.queue)
            )

    async def stop(self) -> None:
        """Cancel background tasks and fail every waiter; leases end with the process."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for w in self.queue:  # persisted waiters stay in the store for the next start
            if not w.future.done():
                w.future.set_exception(RpcError(ErrorCode.CANCELLED, "broker stopping"))
                w.future.exception()  # retrieved: nobody may be awaiting a restored waiter
        self.queue.clear()
        self.sampler.close()
        if self.store is not None:
            self.store.close()

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(kind, data)` on lease, queue and capacity changes; returns an
        unsubscribe function. Listeners must not block."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        for listener in list(self._listeners):
            try:
                listener(kind, data)
            except Exception:  # a broken listener never breaks the broker
                log.exception("event listener failed")

    # -- sampling --------------------------------------------------------------------------
    async def _sample_loop(self, slot: GpuSlot) -> None:
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
                await self._sample_once(slot)
                if self.queue:
                    self._admit()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one GPU's sampler die
                log.exception("sampling %s failed", slot.uuid)

    async def _sample_once(self, slot: GpuSlot) -> None:
        try:
            sample = await self.sampler.sample(slot.uuid)
        except TelemetryError as exc:
            slot.failures += 1
            if slot.telemetry is not exc.state or slot.telemetry_reason != exc.reason:
                log.warning("GPU %s telemetry %s: %s", slot.uuid, exc.state.value, exc)
            slot.telemetry = exc.state
            slot.telemetry_reason = exc.reason
            self.emit("capacity", {"gpu_uuid": slot.uuid})
            return
        if slot.telemetry is not TelemetryState.OK:
            log.info("GPU %s telemetry ok", slot.uuid)
        slot.failures = 0
        slot.sample = sample
        slot.telemetry = TelemetryState.OK
        slot.telemetry_reason = ""
        chains = [(p, self._ancestry.chain(p.pid)) for p in sample.processes]
        slot.chains = chains
        self._update_observed(slot)
        self.emit("capacity", {"gpu_uuid": slot.uuid})

    async def _enumerate_loop(self) -> None:
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
                override = self.config.headroom_overrides.get(info.uuid, self.config.headroom_mib)
                slot = GpuSlot(info=info, headroom_override=override)
                self.slots[info.uuid] = slot
                log.warning("new GPU %s (%s)", info.uuid, info.name)
                await self._sample_once(slot)
                self._tasks.append(asyncio.create_task(self._sample_loop(slot)))

    def _leases_on(self, uuid: str) -> list[Lease]:
        return [lease for lease in self.leases.values() if uuid in lease.gpu_uuids]

    def _update_observed(self, slot: GpuSlot) -> None:
        """Attribute the latest sample's memory to the leases of each holder on `slot`."""
        by_holder: dict[Holder, list[Lease]] = {}
        for lease in self._leases_on(slot.uuid):
            by_holder.setdefault(lease.holder, []).append(lease)
        for holder, leases in by_holder.items():
            held = slot.holder_mib(holder)
            baseline = self._baselines.get((holder, slot.uuid), 0)
            if held < baseline and slot.holder_mib_known(holder):
                # the holder freed memory it held outside its leases: that much is gone
                baseline = held
                self._set_baseline(holder, slot.uuid, baseline, leases)
            pool = max(0, held - baseline)
            leases.sort(key=lambda lease: lease.granted_at_wall)
            for i, lease in enumerate(leases):
                share = pool if i == len(leases) - 1 else min(pool, lease.granted_mib)
                pool -= share
                lease.observed_mib[slot.uuid] = share
                lease.over_grant = any(v > lease.granted_mib for v in lease.observed_mib.values())

    def _set_baseline(self, holder: Holder, uuid: str, mib: int, leases: list[Lease]) -> None:
        """`holder`'s memory on `uuid` outside its leases (`leases`: its leases there)."""
        self._baselines[(holder, uuid)] = mib
        for lease in leases:
            lease.baseline_mib[uuid] = mib

    def capacity(self, uuid: str) -> Capacity | None:
        """The capacity split of GPU `uuid` now, or None before its first good sample."""
        slot = self.slots[uuid]
        if slot.sample is None:
            return None
        outstanding = sum(
            max(0, lease.granted_mib - lease.observed_mib.get(uuid, 0))
            for lease in self._leases_on(uuid)
        )
        return Capacity(
            total_mib=slot.sample.total_mib,
            headroom_mib=slot.headroom_mib,
            device_used_mib=slot.sample.device_used_mib,
            outstanding_mib=outstanding,
        )

    # -- acquire ---------------------------------------------------------------------------
    def _candidates(self, params: AcquireParams) -> tuple[str, ...]:
        if params.gpu_uuid is not None:
            if params.gpu_uuid not in self.slots:
                known = ", ".join(self.slots) or "none"
                raise RpcError(
                    ErrorCode.INFEASIBLE,
                    f"infeasible: no GPU {params.gpu_uuid} on this computer (known: {known})",
                    gpu_uuid=params.gpu_uuid,
                    requested_mib=params.mib,
                )
            if params.gpus != 1:
                raise RpcError(
                    ErrorCode.INVALID_PARAMS,
                    f"gpu_uuid pins one GPU, but gpus={params.gpus} were asked for",
                    field="gpus",
                )
            return (params.gpu_uuid,)
        ordered = sorted(self.slots, key=lambda u: self.slots[u].info.index)
        usable = [
            u for u in ordered if self.slots[u].telemetry is not TelemetryState.UNKNOWN_CAPACITY
        ]
        return tuple(usable if len(usable) >= params.gpus else ordered)

    def _never_fits(self, mib: int, gpus: int, candidates: tuple[str, ...]) -> RpcError | None:
        """`infeasible` when fewer than `gpus` candidates could ever hold `mib` (more than
        total − headroom by their latest samples); None when it may fit some day."""
        fit = 0
        worst: tuple[str, int, int, int] | None = None
        for uuid in candidates:
            slot = self.slots[uuid]
            if slot.sample is None:
                fit += 1  # unknown yet: cannot call it infeasible
                continue
            usable = max(0, slot.sample.total_mib - slot.headroom_mib)
            if mib <= usable:
                fit += 1
            else:
                worst = (uuid, slot.sample.total_mib, slot.headroom_mib, usable)
        if fit >= gpus or worst is None:
            return None
        uuid, total, headroom, usable = worst
        return RpcError(
            ErrorCode.INFEASIBLE,
            f"infeasible: {fmt_mib(mib)} MiB requested but {short_uuid(uuid)} can never "
            f"offer more than {fmt_mib(usable)} MiB ({fmt_mib(total)} total − "
            f"{fmt_mib(headroom)} headroom)",
            gpu_uuid=uuid,
            requested_mib=mib,
            total_mib=total,
            headroom_mib=headroom,
            usable_mib=usable,
        )

    def _check_feasible(self, params: AcquireParams, candidates: tuple[str, ...]) -> None:
        if params.gpus > len(candidates):
            raise RpcError(
                ErrorCode.INFEASIBLE,
                f"infeasible: {params.gpus} GPUs requested, this computer has {len(candidates)}",
                requested_gpus=params.gpus,
                gpu_count=len(candidates),
            )
        never = self._never_fits(params.mib, params.gpus, candidates)
        if never is not None:
            raise never
        if params.gpu_uuid is not None:
            slot = self.slots[params.gpu_uuid]
            if slot.telemetry is TelemetryState.LOST:
                raise RpcError(
                    ErrorCode.TELEMETRY_UNAVAILABLE,
                    f"refused: {short_uuid(slot.uuid)} is lost ({slot.telemetry_reason})",
                    gpu_uuid=slot.uuid,
                    reason="gpu_lost",
                    telemetry=slot.telemetry.value,
                )
        known = [
            u for u in candidates if self.slots[u].telemetry is not TelemetryState.UNKNOWN_CAPACITY
        ]
        if len(known) < params.gpus:
            unknown = [u for u in candidates if u not in known]
            raise RpcError(
                ErrorCode.TELEMETRY_UNAVAILABLE,
                f"refused: the memory capacity of {', '.join(short_uuid(u) for u in unknown)} "
                "is unknown (NVML does not support the memory query on it); set a capacity "
                "override for its UUID to lease it",
                gpu_uuid=unknown[0],
                reason="capacity_unknown",
                telemetry=TelemetryState.UNKNOWN_CAPACITY.value,
            )

    async def acquire(
        self, params: AcquireParams, owner: str, holder: Holder, conn_id: int | None
    ) -> Lease:
        """Queue a request and wait (up to `params.wait_s`) until it is granted.

        Description fields must already be validated by the caller (localapi).

        Raises:
            RpcError: `infeasible` at once; `capacity_unavailable` (wait_s=0) or
                `wait_timeout` when not granted in time; `telemetry_unavailable` when the
                pinned GPU is lost or every candidate's telemetry failed and wait_s=0;
                `cancelled` when the connection closes first.
        """
        if params.request_key:
            found = self._find_request(params.request_key, owner, holder)
            if isinstance(found, Lease):
                return self._rebind(found, conn_id)
            if found is not None:
                found.conn_id, found.reattach_by = conn_id, None
                return await self._await_waiter(found)
        if params.job_id is not None:
            self.jobs.get(params.job_id, owner)  # job_not_found / not_lease_owner
        candidates = self._candidates(params)
        self._check_feasible(params, candidates)
        now = self.clock.monotonic()
        self._request_seq += 1
        waiter = Waiter(
            request_id=self._request_seq,
            mib=params.mib,
            gpus=params.gpus,
            candidates=candidates,
            pinned=params.gpu_uuid is not None,
            owner=owner,
            project=params.project,
            session=params.session,
            purpose=params.purpose,
            ttl_s=params.ttl_s,
            adopt=params.adopt,
            placement=params.placement,
            holder=holder,
            conn_id=conn_id,
            enqueued_at=now,
            deadline=now + params.wait_s,
            wait_s=params.wait_s,
            future=asyncio.get_running_loop().create_future(),
            request_key=params.request_key or "",
            wait_until_wall=self.clock.wall() + params.wait_s,
            job_id=params.job_id,
        )
        self.queue.append(waiter)
        self._admit()
        if not waiter.future.done():
            if self.store is not None and waiter.request_key and params.wait_s > 0:
                self.store.put_waiter(waiter.request_key, waiter.request_id, waiter.to_record())
            self.emit("queue", {"request_id": waiter.request_id})
        return await self._await_waiter(waiter)

    async def _await_waiter(self, waiter: Waiter) -> Lease:
        try:
            return await waiter.future
        finally:
            if waiter in self.queue:  # cancelled by the caller (connection gone)
                self._remove_waiter(waiter)
                self._admit()

    def _remove_waiter(self, waiter: Waiter, error: RpcError | None = None) -> None:
        """Take `waiter` off the queue (and the store); fail its future with `error`."""
        if waiter in self.queue:
            self.queue.remove(waiter)
        if self.store is not None and waiter.request_key:
            self.store.delete_waiter(waiter.request_key)
        if error is not None and not waiter.future.done():
            waiter.future.set_exception(error)
            if waiter.reattach_by is not None:  # restored, its client not back: nobody awaits
                waiter.future.exception()

    def _find_request(self, request_key: str, owner: str, holder: Holder) -> Lease | Waiter | None:
        """A lease granted, or a request still queued, under `request_key` for this holder
        (after a broker restart the SDK re-sends its request with the same key)."""
        for lease in self.leases.values():
            if lease.request_key == request_key and lease.owner == owner and lease.holder == holder:
                return lease
        for waiter in self.queue:
            if (
                waiter.request_key == request_key
                and waiter.owner == owner
                and waiter.holder == holder
                and waiter.conn_id is None
            ):
                return waiter
        return None

    def _rebind(self, lease: Lease, conn_id: int | None) -> Lease:
        """Bind a lease to the holder's new connection, renew it, give it a fresh token."""
        lease.conn_id = conn_id
        lease.deadline = self.clock.monotonic() + lease.ttl_s
        lease.token = secrets.token_urlsafe(24)
        self._token_sha256[lease.lease_id] = token_hash(lease.token)
        if self.store is not None:
            self.store.put_lease(lease.lease_id, lease.token, lease.to_record())
        log.info("lease %s re-attached by its holder", lease.lease_id)
        return lease

    def attach(self, lease_id: str, token: str, owner: str, conn_id: int | None) -> Lease:
        """Re-attach a lease to a new connection of its holder (after a broker restart or
        a dropped connection), proving possession with the token from the grant.

        Raises:
            RpcError: `lease_not_found`, `lease_expired`, `not_lease_owner` (also for a
                wrong token: the holder is not the one the lease was granted to).
        """
        lease = self._find(lease_id, owner)
        expected = self._token_sha256.get(lease_id, "")
        if not expected or not hmac.compare_digest(expected, token_hash(token)):
            raise RpcError(
                ErrorCode.NOT_LEASE_OWNER, f"wrong token for lease {lease_id}", lease_id=lease_id
            )
        return self._rebind(lease, conn_id)

    def _claim(self, waiter: Waiter, slot: GpuSlot) -> int:
        """MiB of the holder's existing use that an adopting request takes over on `slot`."""
        if not waiter.adopt:
            return 0
        return min(waiter.mib, self._baseline_now(waiter.holder, slot))

    def _baseline_now(self, holder: Holder, slot: GpuSlot) -> int:
        key = (holder, slot.uuid)
        if key in self._baselines:
            return self._baselines[key]
        return slot.holder_mib(holder)

    def _admit(self) -> None:
        """One atomic admission pass over the queue, in FIFO order (see module docstring)."""
        if not self.queue:
            return
        now = self.clock.monotonic()
        fresh = {u for u, s in self.slots.items() if s.fresh(now, self.config.max_sample_age_s)}
        caps: dict[str, Capacity] = {}
        for u in fresh:
            cap = self.capacity(u)
            if cap is not None:
                caps[u] = cap
        blocked: dict[str, int] = {}
        for waiter in list(self.queue):
            if waiter.future.done():
                self._remove_waiter(waiter)
                continue
            never = self._never_fits(waiter.mib, waiter.gpus, waiter.candidates)
            if never is not None:  # a GPU shrank while it waited: refuse, never wait forever
                self._remove_waiter(waiter, never)
                self.emit("queue", {"request_id": waiter.request_id})
                continue
            pending = [
                u
                for u in waiter.candidates
                if u not in caps and self.slots[u].telemetry is TelemetryState.OK
            ]
            fits: list[tuple[str, Capacity, int]] = []
            for u in waiter.candidates:
                if u in caps and u not in blocked:
                    need = waiter.mib - self._claim(waiter, self.slots[u])
                    if caps[u].fits(need):
                        fits.append((u, caps[u], need))
            reverse = waiter.placement == "spread"
            fits.sort(key=lambda t: self._rank(t[0], t[1]), reverse=reverse)
            if (
                len(fits) >= waiter.gpus
                and not self.paused
                and not self._pending_ranks_better(waiter, pending, blocked, fits[waiter.gpus - 1])
            ):
                self._grant(waiter, fits[: waiter.gpus], now)
                for u, _, _ in fits[: waiter.gpus]:
                    cap = self.capacity(u)
                    if cap is not None:
                        caps[u] = cap
                continue
            self._explain_wait(waiter, caps, blocked, pending)
            for u in waiter.candidates:
                blocked[u] = blocked.get(u, 0) + 1
            for u in pending:
                self.slots[u].kick.set()

    def _rank(self, uuid: str, cap: Capacity) -> tuple[int, int]:
        """Placement order: `pack` takes the smallest, `spread` the largest."""
        return (cap.available_mib, self.slots[uuid].info.index)

    def _pending_ranks_better(
        self,
        waiter: Waiter,
        pending: list[str],
        blocked: dict[str, int],
        last_chosen: tuple[str, Capacity, int],
    ) -> bool:
        """True when a GPU still waiting for its fresh sample would, by its previous sample,
        be placed before one of the GPUs chosen now: the request waits for that sample
        rather than being placed by whichever GPU happened to be sampled last."""
        worst = self._rank(last_chosen[0], last_chosen[1])
        for u in pending:
            cap = self.capacity(u)
            if u in blocked or cap is None:
                continue
            if not cap.fits(waiter.mib - self._claim(waiter, self.slots[u])):
                continue
            key = self._rank(u, cap)
            if (key > worst) if waiter.placement == "spread" else (key < worst):
                return True
        return False

    def _explain_wait(
        self,
        waiter: Waiter,
        caps: dict[str, Capacity],
        blocked: dict[str, int],
        pending: list[str],
    ) -> None:
        ahead = max((blocked.get(u, 0) for u in waiter.candidates), default=0)
        ahead_txt = f"; {ahead} request{'s' if ahead != 1 else ''} ahead" if ahead else ""
        if self.paused:
            waiter.reason, waiter.reason_kind = "waiting: new admissions are paused", "paused"
            waiter.reason_data = {}
            waiter.evaluated = True
            return
        if pending:
            waiter.reason = "waiting for a fresh GPU sample" + ahead_txt
            waiter.reason_kind = "sampling"
            waiter.reason_data = {"ahead": ahead}
            return
        waiter.evaluated = True
        known = [u for u in waiter.candidates if u in caps]
        if known:
            best = max(known, key=lambda u: caps[u].available_mib)
            cap = caps[best]
            waiter.reason = (
                f"waiting: {explain(best, cap)}; {fmt_mib(waiter.mib)} requested" + ahead_txt
            )
            if waiter.gpus > 1:
                waiter.reason += f"; {waiter.gpus} GPUs needed at once"
            waiter.reason_kind = "capacity"
            waiter.reason_data = {
                "gpu_uuid": best,
                "requested_mib": waiter.mib,
                "ahead": ahead,
                **cap.as_dict(),
            }
            return
        states = {u: self.slots[u] for u in waiter.candidates}
        parts = ", ".join(
            f"{short_uuid(u)} {s.telemetry.value} ({s.telemetry_reason})" for u, s in states.items()
        )
        waiter.reason = f"waiting: telemetry unavailable: {parts}" + ahead_txt
        waiter.reason_kind = "telemetry"
        first = next(iter(states.values()))
        waiter.reason_data = {
            "telemetry": first.telemetry.value,
            "reason": first.telemetry_reason,
            "ahead": ahead,
        }

    def _grant(self, waiter: Waiter, chosen: list[tuple[str, Capacity, int]], now: float) -> None:
        wall = self.clock.wall()
        lease = Lease(
            lease_id="lease-" + secrets.token_hex(6),
            token=secrets.token_urlsafe(24),
            gpu_uuids=tuple(u for u, _, _ in chosen),
            granted_mib=waiter.mib,
            owner=waiter.owner,
            project=waiter.project,
            session=waiter.session,
            purpose=waiter.purpose,
            holder=waiter.holder,
            ttl_s=waiter.ttl_s,
            deadline=now + waiter.ttl_s,
            granted_at_wall=wall,
            renewed_at_wall=wall,
            conn_id=waiter.conn_id,
            adopt=waiter.adopt,
            waited_s=now - waiter.enqueued_at,
        )
        lease.request_key = waiter.request_key
        lease.job_id = waiter.job_id
        if waiter.job_id is not None and waiter.job_id in self.jobs.jobs:
            self.jobs.link_lease(waiter.job_id, waiter.owner, lease.lease_id)
        for u, cap, need in chosen:
            slot = self.slots[u]
            claim = waiter.mib - need
            baseline = self._baseline_now(waiter.holder, slot)
            self._baselines[(waiter.holder, u)] = baseline - claim
            lease.baseline_mib[u] = baseline - claim
            lease.claimed_mib[u] = claim
            lease.admission[u] = {**cap.as_dict(), "requested_mib": waiter.mib, "extra_mib": need}
            slot.last_change_at = now
        self.leases[lease.lease_id] = lease
        self._token_sha256[lease.lease_id] = token_hash(lease.token)
        if self.store is not None:
            self.store.put_lease(lease.lease_id, lease.token, lease.to_record())
        for u, _, _ in chosen:
            self._update_observed(self.slots[u])
        self._remove_waiter(waiter)
        self.grant_count += 1
        waiter.future.set_result(lease)
        log.info(
            "lease %s granted: %d MiB on %s to %s/%s (waited %.2f s)",
            lease.lease_id,
            lease.granted_mib,
            ",".join(lease.gpu_uuids),
            lease.owner,
            lease.project,
            lease.waited_s,
        )
        self.emit("lease", {"lease_id": lease.lease_id, "state": lease.state.value})

    # -- renew / release / expiry --------------------------------------------------------------
    def _find(self, lease_id: str, owner: str) -> Lease:
        lease = self.leases.get(lease_id)
        if lease is None:
            for old in self.ended:
                if old.lease_id == lease_id:
                    raise RpcError(
                        ErrorCode.LEASE_EXPIRED
                        if old.state is not LeaseState.RELEASED
                        else ErrorCode.LEASE_NOT_FOUND,
                        f"lease {lease_id} ended: {old.state.value} ({old.ended_reason})",
                        lease_id=lease_id,
                        state=old.state.value,
                        ended_reason=old.ended_reason,
                    )
            raise RpcError(ErrorCode.LEASE_NOT_FOUND, f"no lease {lease_id}", lease_id=lease_id)
        if lease.owner != owner:
            raise RpcError(
                ErrorCode.NOT_LEASE_OWNER,
                f"lease {lease_id} belongs to another user",
                lease_id=lease_id,
            )
        return lease

    def renew(self, lease_id: str, owner: str) -> Lease:
        """Extend an active lease by its TTL from now (monotonic).

        Raises:
            RpcError: `lease_not_found`, `lease_expired` (ended other than by release),
                `not_lease_owner`.
        """
        lease = self._find(lease_id, owner)
        lease.deadline = self.clock.monotonic() + lease.ttl_s
        lease.renewed_at_wall = self.clock.wall()
        return lease

    def release(self, lease_id: str, owner: str, reason: str = "released by holder") -> Lease:
        """End a lease now. Raises like `renew`."""
        lease = self._find(lease_id, owner)
        self._end(lease, LeaseState.RELEASED, reason)
        return lease

    def _end(self, lease: Lease, state: LeaseState, reason: str) -> None:
        if lease.lease_id not in self.leases:
            return
        del self.leases[lease.lease_id]
        lease.state = state
        lease.ended_reason = reason
        lease.ended_at_wall = self.clock.wall()
        now = self.clock.monotonic()
        for u in lease.gpu_uuids:
            slot = self.slots.get(u)
            if slot is not None:
                slot.last_change_at = now
                slot.kick.set()
            others = [
                other
                for other in self.leases.values()
                if other.holder == lease.holder and u in other.gpu_uuids
            ]
            if not others:
                self._baselines.pop((lease.holder, u), None)
            elif lease.observed_mib.get(u, 0) > 0:
                # What the ended lease's processes still hold is outside any lease now, not
                # the use of the holder's other leases (counting it there would over-admit).
                kept = self._baselines.get((lease.holder, u), 0) + lease.observed_mib[u]
                self._set_baseline(lease.holder, u, kept, others)
        self.ended.append(lease)
        self._token_sha256.pop(lease.lease_id, None)
        if self.store is not None:
            self.store.end_lease(
                lease.lease_id, state.value, lease.ended_at_wall, lease.to_record()
            )
            self._ends_since_prune += 1
            if self._ends_since_prune >= 200:
                self._ends_since_prune = 0
                self.store.prune_ended(self.config.ended_history)
        log.info("lease %s %s: %s", lease.lease_id, state.value, reason)
        self.emit("lease", {"lease_id": lease.lease_id, "state": state.value})

    def connection_closed(self, conn_id: int) -> None:
        """Release every lease bound to `conn_id` and drop its waiters (DESIGN §3)."""
        self.jobs.connection_closed(conn_id)
        for lease in [lease for lease in self.leases.values() if lease.conn_id == conn_id]:
            self._end(lease, LeaseState.RELEASED, "holder connection closed")
        for waiter in [w for w in self.queue if w.conn_id == conn_id]:
            self._remove_waiter(
                waiter, RpcError(ErrorCode.CANCELLED, "request cancelled: connection closed")
            )
        self._admit()

    async def _tick_loop(self) -> None:
        last = self.clock.monotonic()
        last_boot = self.clock.boottime()
        last_holder_check = 0.0
        while True:
            await asyncio.sleep(self.config.tick_s)
            now, boot = self.clock.monotonic(), self.clock.boottime()
            gap = max(now - last, boot - last_boot)  # boot time also counts a suspend
            last, last_boot = now, boot
            try:
                if gap > self.config.stall_threshold_s:
                    self._grace(now, gap)
                if now - last_holder_check >= self.config.holder_check_s:
                    last_holder_check = now
                    self._reap_dead_holders()
                    for job in self.jobs.check_stalled(set(self.leases)):
                        self.emit("job", {"job_id": job.job_id, "state": job.state})
                self._expire(now)
            except Exception:
                log.exception("tick failed")

    def _grace(self, now: float, gap: float) -> None:
        """After a loop stall or sleep/resume gap, give every lease one TTL (DESIGN §3)."""
        log.warning("broker loop stalled %.1f s: every lease gets one TTL of grace", gap)
        for lease in self.leases.values():
            lease.deadline = max(lease.deadline, now + lease.ttl_s)

    def _reap_dead_holders(self) -> None:
        # one liveness check per distinct holder (a process often holds many leases)
        alive: dict[Holder, bool] = {}

        def is_alive(holder: Holder) -> bool:
            if holder not in alive:
                alive[holder] = holder.alive()
            return alive[holder]

        for lease in list(self.leases.values()):
            if not is_alive(lease.holder):
                self._end(
                    lease, LeaseState.HOLDER_EXITED, f"holder process {lease.holder.pid} exited"
                )
        for waiter in list(self.queue):
            if not is_alive(waiter.holder):
                self._remove_waiter(
                    waiter, RpcError(ErrorCode.CANCELLED, "request cancelled: holder exited")
                )

    def _expire(self, now: float) -> None:
        for lease in list(self.leases.values()):
            if lease.deadline < now:
                self._end(lease, LeaseState.EXPIRED, f"no heartbeat for {lease.ttl_s:g} s")
        for waiter in list(self.queue):
            if waiter.reattach_by is not None and now >= waiter.reattach_by:
                self._remove_waiter(
                    waiter, RpcError(ErrorCode.CANCELLED, "its client did not come back")
                )
            elif now >= waiter.deadline and waiter.evaluated and not waiter.future.done():
                self._remove_waiter(waiter, self._wait_error(waiter))
                self.emit("queue", {"request_id": waiter.request_id})
        if self.queue:
            self._admit()

    def _wait_error(self, waiter: Waiter) -> RpcError:
        data = dict(waiter.reason_data)
        data["waited_s"] = round(self.clock.monotonic() - waiter.enqueued_at, 3)
        if waiter.wait_s > 0:
            return RpcError(
                ErrorCode.WAIT_TIMEOUT,
                f"not granted within {waiter.wait_s:g} s; last {waiter.reason}",
                **data,
            )
        reason = waiter.reason.removeprefix("waiting: ")
        if waiter.reason_kind == "telemetry":
            return RpcError(ErrorCode.TELEMETRY_UNAVAILABLE, f"refused: {reason}", **data)
        return RpcError(ErrorCode.CAPACITY_UNAVAILABLE, f"no room now: {reason}", **data)

    # -- views --------------------------------------------------------------------------------
    def gpus_view(self) -> list[dict[str, Any]]:
        """Per GPU: identity, telemetry, and the capacity split of DESIGN §2 in MiB."""
        now = self.clock.monotonic()
        out = []
        for slot in sorted(self.slots.values(), key=lambda s: s.info.index):
            cap = self.capacity(slot.uuid)
            leased = sum(
                lease.observed_mib.get(slot.uuid, 0) for lease in self._leases_on(slot.uuid)
            )
            granted = sum(lease.granted_mib for lease in self._leases_on(slot.uuid))
            telemetry = slot.telemetry
            if (
                telemetry is TelemetryState.OK
                and slot.sample is not None
                and now - slot.sample.finished_at > self.config.max_sample_age_s
            ):
                telemetry = TelemetryState.STALE
            entry: dict[str, Any] = {
                "uuid": slot.uuid,
                "index": slot.info.index,
                "name": slot.info.name,
                "telemetry": telemetry.value,
                "telemetry_reason": slot.telemetry_reason,
                "sample_age_s": round(now - slot.sample.finished_at, 3) if slot.sample else None,
                "memory_api": slot.sample.memory_api if slot.sample else None,
                "leases": len(self._leases_on(slot.uuid)),
                "granted_mib": granted,
                "leased_in_use_mib": leased,
                "waiting": sum(1 for w in self.queue if slot.uuid in w.candidates),
            }
            if cap is not None:
                entry.update(cap.as_dict())
                entry["other_in_use_mib"] = max(0, cap.device_used_mib - leased)
            out.append(entry)
        return out

    def leases_view(self, include_ended: bool = False) -> dict[str, Any]:
        """Active leases, the queue (with reasons and position) and optionally ended ones."""
        now = self.clock.monotonic()
        ahead: dict[str, int] = {}
        queued = []
        for w in self.queue:
            n = max((ahead.get(u, 0) for u in w.candidates), default=0)
            queued.append(w.to_wire(now, n))
            for u in w.candidates:
                ahead[u] = ahead.get(u, 0) + 1
        leases = []
        for lease in self.leases.values():
            item = lease.to_wire(now)
            item["gpu_telemetry"] = {
                u: self.slots[u].telemetry.value if u in self.slots else TelemetryState.LOST.value
                for u in lease.gpu_uuids
            }
            item["flags"] = sorted(
                {f"gpu_{state}" for state in item["gpu_telemetry"].values() if state != "ok"}
                | ({"over_grant"} if lease.over_grant else set())
            )
            leases.append(item)
        view: dict[str, Any] = {
            "leases": leases,
            "queue": queued,
        }
        if include_ended:
            view["ended"] = [lease.to_wire(now) for lease in self.ended]
        return view

    def status(self) -> dict[str, Any]:
        """Version, uptime, telemetry source and states, counts, coordinator link."""
        return {
            "version": __version__,
            "uptime_s": round(self.clock.monotonic() - self._started_mono, 3),
            "started_at": self._started_wall,
            "telemetry_source": self.gateway.source,
            "simulated": self.fake is not None,
            "driver_version": self.driver_version,
            "gpus": {u: s.telemetry.value for u, s in self.slots.items()},
            "active_leases": len(self.leases),
            "queued_requests": len(self.queue),
            "leases_granted_total": self.grant_count,
            "paused": self.paused,
            "coordinator": self.uplink_status()
            if self.uplink_status is not None
            else {"link": "not enrolled", "last_report_at": None},
            "socket": str(self.config.socket_path),
        }

    def memory_changed(self, uuid: str) -> None:
        """The broker itself just changed what `uuid` will report (simulated allocate, free
        or state change): like a grant or release, no admission may use an older sample."""
        slot = self.slots[uuid]
        slot.last_change_at = self.clock.monotonic()
        slot.kick.set()

    def set_paused(self, paused: bool) -> None:
        """Pause or resume new admissions (existing leases are untouched)."""
        self.paused = paused
        self._admit()
