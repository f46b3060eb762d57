"""The broker service: the one façade the local API, the uplink and the tray call.

`Broker` wires the parts together on one asyncio loop and owns their lifecycle:
`sampling` (GPUs, the NVML loop, freshness), `table` (leases, attribution, expiry),
`waiting` (the queue), `admission` (the FIFO pass, placement, reasons), `restore` (after a
restart) and `views` (what the read methods return). Admission and booking happen in one
synchronous step (`_admit` → `_grant`), so two requests can never both pass the capacity
check (docs/architecture.md §2). Nothing outside `rbroker.broker` imports those parts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from rbroker.broker import acquiring, fairness, lifecycle, overgrant, ticks, views
from rbroker.broker.admission import Admission, NvmlProblem
from rbroker.broker.capacity import Capacity
from rbroker.broker.clock import Clock, SystemClock
from rbroker.broker.config import BrokerConfig
from rbroker.broker.events import Events, Listener
from rbroker.broker.holders import Holder
from rbroker.broker.jobs import JobTable
from rbroker.broker.leases import Lease, LeaseState, Waiter
from rbroker.broker.resize import Resizes
from rbroker.broker.sampling import GpuSlot, Sampling
from rbroker.broker.store import LeaseStore
from rbroker.broker.table import Choice, LeaseTable
from rbroker.broker.ticks import liveness_memo
from rbroker.broker.waiting import WaitQueue
from rbroker.gpu.fake_nvml import FakeNvml
from rbroker.gpu.nvml import NvmlGateway
from rbroker_protocol.localapi import AcquireParams

__all__ = ["Broker", "GpuSlot", "Listener"]

log = logging.getLogger(__name__)


class Broker:
    """The local broker. Create, `await start()`, use, `await stop()`.

    All public methods run on the broker's event loop. Errors are `RpcError`s with the
    stable codes of docs/architecture.md §5. `slots`, `leases`, `ended` and `queue` are the
    parts' live collections (read them, do not replace them).
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
        self.events = Events()
        self.subscribe = self.events.subscribe
        self.emit = self.events.emit
        # hooks are looked up on `self` at call time, so a wrapped `_admit` sees every pass
        self.sampling = Sampling(
            gateway, config, lambda slot, ok: self._sampled(slot, ok), lambda: self._turn()
        )
        self.sampler = self.sampling.sampler
        self.slots: dict[str, GpuSlot] = self.sampling.slots
        self.table = LeaseTable(self.slots, self.clock, config, store)
        self.leases: dict[str, Lease] = self.table.leases
        self.ended = self.table.ended
        self.waiting = WaitQueue(store, self.emit)
        self.queue: list[Waiter] = self.waiting.waiters
        self.admission = Admission(self.slots, self.table, self.clock, config)
        self.jobs = JobTable(self.clock, store, config.max_open_jobs_per_user)
        self.resizes = Resizes(
            self.table, self.waiting, self.admission, self.clock, self.emit, lambda: self._admit()
        )
        self._tasks: list[asyncio.Task[None]] = []
        self.started_mono = self.clock.monotonic()
        self.started_wall = self.clock.wall()
        self.grant_count = 0
        self.paused = False
        self.uplink_status: Callable[[], dict[str, Any]] | None = None
        self.driver_version = "unknown"
        self.nvml_problem: NvmlProblem | None = None
        self.stopping = False
        self.shutting_down = False  # set by the host before it stops the reporter

    # -- lifecycle (see `lifecycle`) --------------------------------------------------------
    async def start(self, background: bool = True) -> None:
        """Enumerate GPUs, take a first sample of each, restore the store, start the
        sampler and tick tasks; fail closed (no GPUs, retried) where NVML does not
        initialise. `background=False` (tests that drive the broker step by step) starts no
        tasks: the caller then calls `_sample_once`, `_admit`, `_expire` and the rest."""
        await lifecycle.start(self, background)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.create_task(coro))

    def begin_stop(self) -> bool:
        """About to stop: True when leases are kept for the restart (see `lifecycle`)."""
        return lifecycle.begin_stop(self)

    async def stop(self) -> None:
        """Cancel background tasks, fail waiters; leases stay unless `begin_stop` ended them."""
        await lifecycle.stop(self)

    # -- sampling hooks ------------------------------------------------------------------------
    async def _sample_once(self, slot: GpuSlot) -> None:
        await self.sampling.sample_once(slot)

    def _sampled(self, slot: GpuSlot, ok: bool) -> None:
        if ok:
            self.table.update_observed(slot)
            grace = self.config.over_grant_grace_s
            overgrant.watch(
                self.table.observed_on(slot.uuid), self.clock.monotonic(), grace, self.emit
            )
        self.emit("capacity", {"gpu_uuid": slot.uuid})

    def _turn(self) -> None:
        if self.queue:
            self._admit()

    def capacity(self, uuid: str) -> Capacity | None:
        """The capacity split of GPU `uuid` now, or None before its first good sample."""
        return self.table.capacity(uuid)

    def memory_changed(self, uuid: str) -> None:
        """The broker itself just changed what `uuid` will report (simulated allocate, free
        or state change): like a grant or release, no admission may use an older sample."""
        slot = self.slots[uuid]
        slot.last_change_at = self.clock.monotonic()
        slot.kick.set()

    # -- acquire -------------------------------------------------------------------------------
    async def acquire(
        self, params: AcquireParams, owner: str, holder: Holder, conn_id: int | None
    ) -> Lease:
        """Queue a request and wait (up to `params.wait_s`) until it is granted.

        Description fields must already be validated by the caller (localapi).

        Raises:
            RpcError: `infeasible` at once; `capacity_unavailable` (wait_s=0) or
                `wait_timeout` when not granted in time; `telemetry_unavailable` when the
                pinned GPU is lost or every candidate's telemetry failed and wait_s=0;
                `cancelled` when the connection closes first; the per-user caps and the
                longest wait as `fairness.check_request`.
        """
        started = self.begin_acquire(params, owner, holder, conn_id)
        return started if isinstance(started, Lease) else await self.await_waiter(started)

    def begin_acquire(
        self, params: AcquireParams, owner: str, holder: Holder, conn_id: int | None
    ) -> Lease | Waiter:
        """`acquire` without waiting: the lease when granted (or re-bound) at once, else its
        queue entry for `await_waiter`. Raises `RpcError` as `acquire` for what is refused."""
        return acquiring.begin(self, params, owner, holder, conn_id)

    async def await_waiter(self, waiter: Waiter) -> Lease:
        """The lease a queued request from `begin_acquire` ends with (raises as `acquire`)."""
        try:
            return await waiter.future
        finally:
            if waiter in self.queue:  # cancelled by the caller (connection gone)
                self.waiting.remove(waiter)
                self._admit()

    def _admit(self) -> None:
        """One atomic admission pass over the queue (see `admission`)."""
        self.admission.run(self.waiting, self.paused, self._grant_hook, self.emit)

    def _grant_hook(self, waiter: Waiter, chosen: list[Choice], now: float) -> None:
        self._grant(waiter, chosen, now)  # looked up at call time (tests wrap `_grant`)

    def _grant(self, waiter: Waiter, chosen: list[Choice], now: float) -> None:
        if waiter.resize_of is not None:  # a lease's growth, not a new lease
            self.resizes.grant(waiter, chosen, now)
            return
        lease = self.table.new_lease(waiter, chosen, now)
        if waiter.job_id is not None and waiter.job_id in self.jobs.jobs:
            self.jobs.link_lease(waiter.job_id, waiter.owner, lease.lease_id)
        self.table.book(lease, waiter, chosen, now)
        self.waiting.remove(waiter)
        self.grant_count += 1
        waiter.future.set_result(lease)
        self.emit("lease", {"lease_id": lease.lease_id, "state": lease.state.value})

    def set_paused(self, paused: bool) -> None:
        """Pause or resume new admissions (existing leases are untouched)."""
        self.paused = paused
        self._admit()

    # -- attach / renew / release / expiry -----------------------------------------------------
    def attach(self, lease_id: str, token: str, owner: str, conn_id: int | None) -> Lease:
        """Re-attach a lease to a new connection of its holder (after a broker restart or
        a dropped connection), proving possession with the token from the grant.

        Raises:
            RpcError: `lease_not_found`, `lease_expired`, `not_lease_owner` (also for a
                wrong token: the holder is not the one the lease was granted to).
        """
        return self.table.attach(lease_id, token, owner, conn_id)

    def renew(self, lease_id: str, owner: str) -> Lease:
        """Extend an active lease by its TTL from now (monotonic). Raises `RpcError`:
        `lease_not_found`, `lease_expired` (ended other than by release), `not_lease_owner`."""
        lease = self.table.find(lease_id, owner)
        lease.deadline = self.clock.monotonic() + lease.ttl_s
        lease.renewed_at_wall = self.clock.wall()
        return lease

    async def resize(
        self, lease_id: str, owner: str, mib: int, wait_s: float, conn_id: int | None
    ) -> Lease:
        """Change a lease's grant to `mib` MiB. Raises as `resize.Resizes.resize`."""
        return await self.resizes.resize(lease_id, owner, mib, wait_s, conn_id)

    def release(
        self,
        lease_id: str,
        owner: str,
        conn_id: int | None = None,
        pid: int | None = None,
        admin: bool = False,
    ) -> Lease:
        """End a lease now, asked by `owner` on connection `conn_id` from process `pid` (None:
        by the holder); an `admin` may end anyone's. The reason says who (never the pid, §8):
        see `fairness.release`. Raises like `renew` (`not_lease_owner`: not for admins)."""
        return fairness.release(self, lease_id, owner, conn_id, pid, admin)

    def cancel_request(self, request_id: int, user: str, admin: bool = False) -> Waiter:
        """Cancel a waiting request of `user` (anyone's for an `admin`): see `fairness.cancel`."""
        return fairness.cancel(self, request_id, user, admin)

    def _end(self, lease: Lease, state: LeaseState, reason: str) -> None:
        if self.table.end(lease, state, reason):
            self.resizes.lease_ended(lease.lease_id)
            self.jobs.lease_ended(lease.lease_id, lease.job_id)
            self.emit("lease", {"lease_id": lease.lease_id, "state": state.value})

    def connection_closed(self, conn_id: int) -> None:
        """Release every lease bound to `conn_id` and drop its waiters (docs/architecture.md §3);
        nothing while the broker is stopping (`begin_stop`): the holders come back."""
        if self.stopping:
            return
        self.jobs.connection_closed(conn_id)
        for lease in [lease for lease in self.leases.values() if lease.conn_id == conn_id]:
            self._end(lease, LeaseState.RELEASED, "holder connection closed")
        self.waiting.connection_closed(conn_id)
        self._admit()

    def _grace(self, now: float, gap: float) -> None:
        ticks.grace(self.table.leases.values(), now, gap, self.config.lease_reattach_grace_s)

    def _check_holders(self) -> None:
        self._reap_dead_holders()
        for job in self.jobs.check_stalled():
            self.emit("job", {"job_id": job.job_id, "state": job.state})

    def _reap_dead_holders(self) -> None:
        is_alive = liveness_memo()
        for lease in self.table.held_by_dead(is_alive):
            self._end(lease, LeaseState.HOLDER_EXITED, "the holder process exited")
        self.waiting.reap(is_alive)

    def _expire(self, now: float) -> None:
        for lease in self.table.overdue(now):
            self._end(lease, LeaseState.EXPIRED, f"no heartbeat for {lease.ttl_s:g} s")
        for lease in self.table.not_reattached(now):
            self._end(
                lease,
                LeaseState.EXPIRED,
                f"its holder did not re-attach within {self.config.lease_reattach_grace_s:g} s "
                "after the broker restarted",
            )
        self.waiting.expire(now, self.admission.wait_error)
        if self.queue:
            self._admit()

    # -- views (docs/architecture.md §5) -------------------------------------------------------
    def gpus_view(self) -> list[dict[str, Any]]:
        """Per GPU: identity, telemetry, and the capacity split in MiB (see `views`)."""
        return views.gpus_view(self)

    def leases_view(self, include_ended: bool = False) -> dict[str, Any]:
        """Active leases, the queue (with reasons and position) and optionally ended ones."""
        return views.leases_view(self, include_ended)

    def status(self) -> dict[str, Any]:
        """Version, uptime, telemetry source and states, counts, coordinator link."""
        return views.status(self)
