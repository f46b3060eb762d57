"""The broker service: the one façade the local API, the uplink, the host and the tray call.

`Broker` wires the parts together on one asyncio loop and owns their lifecycle:
`sampling` (GPUs, the NVML loop, freshness), `lessor` (the one owner of the leases: grant,
renew, attach, resize, revoke, attribution, baselines, expiry), `waiting` (the queue),
`admission` (the FIFO pass, placement, reasons), `jobs`, `resize` (a growth's queueing),
`restore` (after a restart), `simulation` (the `sim.*` methods) and `audit` (the record of
actions on other users' work or the whole computer). Admission and booking
happen in one synchronous step (`_admit` → `_grant`), so two requests can never both pass
the capacity check (docs/architecture.md §2). Nothing outside `rbroker.broker` imports those
parts, and nothing outside it reads them through the broker either: every outside call is a
method of `Broker` (tests/desktop/test_layout.py).

Fail closed, never open: where `nvmlInit` fails no GPU is invented and nothing is admitted;
requests wait or are refused with the NVML error in words; leases restored from the store
stay; NVML is retried with backoff (0.5 s doubling to `nvml_retry_max_s`) and the broker
serves normally once it answers. Where the OS shows no NVIDIA GPU at all, requests are
refused as infeasible with the way to try rbroker (`--simulate`).

Description fields (project, session, purpose, handler, reason) and a request's job are
checked here, once, whoever calls (docs/architecture.md §5).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Coroutine
from typing import Any

from rbroker.base.display import fmt_mib, request_name
from rbroker.base.eventloop import loop_name
from rbroker.base.version import __version__
from rbroker.broker import fairness, overgrant, own_leases, ticks
from rbroker.broker.admission import Admission, NvmlProblem
from rbroker.broker.audit import Audit, Target
from rbroker.broker.bookings import Booking, BookingBase, Bookings, Notice
from rbroker.broker.capacity import Capacity
from rbroker.broker.clock import Clock, SystemClock
from rbroker.broker.config import BrokerConfig, HeadroomTooLarge
from rbroker.broker.eta import Estimate
from rbroker.broker.events import Events, Listener
from rbroker.broker.holders import Holder
from rbroker.broker.idle import Idleness
from rbroker.broker.jobs import Job, JobTable
from rbroker.broker.leases import Lease, LeaseState, Waiter
from rbroker.broker.lessor import Choice, Lessor
from rbroker.broker.lifetimes import LIFETIMES_SAVE_S, STORE_KEY, Lifetimes
from rbroker.broker.members import Members
from rbroker.broker.project_names import ProjectNames
from rbroker.broker.read_model import ESTIMATE_REFRESH_S, ReadModel
from rbroker.broker.reclaim import IdleNotice, IdleWatch
from rbroker.broker.resize import Resizes
from rbroker.broker.restore import restore
from rbroker.broker.sampling import GpuSlot, Sampling
from rbroker.broker.shares import Shares
from rbroker.broker.simulation import Simulation
from rbroker.broker.store import STORAGE_ERRORS, LeaseStore, storage_unavailable
from rbroker.broker.ticks import liveness_memo, tick_loop
from rbroker.broker.waiting import WaitQueue
from rbroker.broker.waiting_news import WaitingNews
from rbroker.gpu.fake_nvml import FakeNvml
from rbroker.gpu.nvml import NvmlGateway, TelemetryError, describe
from rbroker.gpu.presence import nvidia_device_present
from rbroker_protocol.descriptions import DescriptionRejected, check_description
from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.localapi import AcquireParams, BookParams, RoomCheckParams
from rbroker_protocol.results import (
    AuditListResult,
    BookingsListResult,
    BookingView,
    BrokerStatus,
    CoordinatorLink,
    GpuView,
    GrantedGpu,
    JobsListResult,
    JobView,
    LeasesListResult,
    QueuedRequest,
    RoomCheckResult,
    ShareView,
)

__all__ = ["Broker", "GpuSlot", "Listener", "check_descriptions"]

NO_HOLDER = Holder(0, -1.0)
"""The holder of a probe that is never queued (`Broker.check_room`): it adopts nothing."""

log = logging.getLogger(__name__)


def check_descriptions(values: dict[str, str]) -> None:
    """Check free-text description fields (`{field: value}`) against the rules of
    `rbroker_protocol.descriptions`.

    Raises:
        RpcError: `description_rejected` with the field and the rule it broke.
    """
    for field, value in values.items():
        try:
            check_description(field, value)
        except DescriptionRejected as exc:
            raise RpcError(
                ErrorCode.DESCRIPTION_REJECTED, str(exc), field=exc.field, rule=exc.rule
            ) from None


class Broker:
    """The local broker. Create, `await start()`, use, `await stop()`.

    All public methods run on the broker's event loop. Errors are `RpcError`s with the
    stable codes of docs/architecture.md §5. `slots`, `leases`, `ended` and `queue` are the
    parts' live collections, for the broker's own parts and its tests (read them, do not
    replace them); code outside `rbroker.broker` calls methods.
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
        # the audit trail lives beside the store, in the data dir (none without a store)
        self.audit = Audit(config.data_dir if store is not None else None, self.clock.wall)
        gateway.clock = self.clock.monotonic
        gateway.capacity_overrides_mib = dict(config.capacity_overrides_mib)
        self.config = config
        self.gateway = gateway
        self.fake = fake
        self.events = Events()
        self.emit = self.events.emit
        # hooks are looked up on `self` at call time, so a wrapped `_admit` sees every pass
        self.sampling = Sampling(
            gateway, config, lambda slot, ok: self._sampled(slot, ok), lambda: self._turn()
        )
        self.sampler = self.sampling.sampler
        self.slots: dict[str, GpuSlot] = self.sampling.slots
        self.lessor = Lessor(self.slots, self.clock, config, store)
        self.leases: dict[str, Lease] = self.lessor.leases
        self.ended = self.lessor.ended
        self.waiting = WaitQueue(store, self.emit)
        self.queue: list[Waiter] = self.waiting.waiters
        self.shares = Shares(config.shares)
        self.members = Members(config.members)
        self.project_names = ProjectNames(config.members, config.shares)
        for line in self.members.unknown():  # kept out until the name exists: a warning
            log.warning("%s: its requests are refused until it exists", line)
        self.bookings = Bookings(
            self.clock,
            config.bookings,
            self._granted_of,
            self._booking_base,
            None if store is None else self._save_booking,
        )
        self.admission = Admission(
            self.slots, self.lessor, self.clock, config, self.shares, self.bookings
        )
        self.idle = Idleness(
            self.clock,
            config.idle_after_s,
            self.lessor.holders_of,
            self.lessor.on,
            self.leases,
            self.lessor.held_on,
        )
        self.admission.idle_on = self.idle.idle_on
        self.idle_watch = IdleWatch(
            self.clock,
            self.idle,
            config.idle_reclaim,
            self.leases,
            self.queue,
            self.admission.helped_by_ending,
        )
        self._capacity_said: dict[str, tuple[object, ...]] = {}  # GPU → what its last event showed
        # GPU → ((Lessor.shown, Idleness.changes), steady since, its leases as views show them)
        self._leases_said: dict[str, tuple[tuple[int, int], float, tuple[object, ...]]] = {}
        lifetimes = Lifetimes.from_json(store.meta(STORE_KEY) if store is not None else None)
        self._lifetimes_saved = (0, self.clock.monotonic())  # (`recorded`, when) of the last write
        self.views = ReadModel(
            self.slots,
            self.lessor,
            self.waiting,
            self.admission,
            self.shares,
            lifetimes,
            self.clock,
            config,
            lambda: (self.grant_count, self.end_count, self.paused),
            self.idle,
        )
        self.news = WaitingNews(self.views.waiting_entries, self.clock, ESTIMATE_REFRESH_S)
        self.events.subscribe(lambda _kind, _data: self.news.changed())
        self.end_count = 0
        self.jobs = JobTable(
            self.clock,
            store,
            config.max_open_jobs_per_user,
            config.job_abandon_s,
            max_finished_per_user=config.max_finished_jobs_per_user,
            max_chunks_per_user=config.max_chunks_per_user,
        )
        self.resizes = Resizes(
            self.lessor, self.waiting, self.admission, self.clock, self.emit, lambda: self._admit()
        )
        self.simulation = (
            None
            if fake is None
            else Simulation(fake, self.slots, self.leases, lambda uuid: self.memory_changed(uuid))
        )
        self._tasks: list[asyncio.Task[None]] = []
        self.started_mono = self.clock.monotonic()
        self.started_wall = self.clock.wall()
        self.grant_count = 0
        self.paused = False
        self.uplink_status: Callable[[], CoordinatorLink] | None = None
        self.driver_version = "unknown"
        self.nvml_problem: NvmlProblem | None = None
        self.stopping = False
        self.shutting_down = False  # set by the host before it stops the reporter

    @property
    def lifetimes(self) -> Lifetimes:
        """The lease lifetimes kept (`rbroker.broker.lifetimes`): recorded as leases end,
        read by the estimates (one object, the read model's)."""
        return self.views.lifetimes

    @lifetimes.setter
    def lifetimes(self, lifetimes: Lifetimes) -> None:
        self.views.lifetimes = lifetimes

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self, background: bool = True) -> None:
        """Enumerate GPUs, take a first sample of each, restore the store, start the
        sampler and tick tasks; fail closed (no GPUs, retried) where NVML does not
        initialise. `background=False` (tests that drive the broker step by step) starts no
        tasks: the caller then calls `_sample_once`, `_admit`, `_tick` and the rest."""
        try:
            await self.sampling.enumerate()
        except TelemetryError as exc:
            self._nvml_failed(exc)
        else:
            # read once, off the loop: an NVML call on the loop would block the local API
            # whenever the driver hangs
            self.driver_version = await asyncio.to_thread(self.gateway.driver_version)
            await self.sampling.sample_all()
            self._check_headroom()
        if self.store is not None:
            restore(
                self.store,
                self.lessor,
                self.waiting,
                self.jobs,
                self.clock,
                self.config,
                self.members,
            )
            claims = {
                lease.lease_id: lease.booking_id
                for lease in self.leases.values()
                if lease.booking_id is not None
            }
            self.bookings.restore(self.store.bookings(), claims)
        if not background:
            return
        if self.nvml_problem is not None:
            self._spawn(self._retry_nvml())
        for slot in self.slots.values():
            self._spawn(self.sampling.sample_loop(slot))
        self._spawn(
            tick_loop(self.clock, self.config, self._grace, self._check_holders, self._tick)
        )
        if self.nvml_problem is None:
            self._spawn(self.sampling.enumerate_loop(self._spawn))
        log.info("broker started: %d GPUs, telemetry %s", len(self.slots), self.gateway.source)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.create_task(coro))

    def _check_headroom(self) -> None:
        """Refuse a configured headroom (`--headroom-mib`, or one GPU's override) that is not
        below the total of a GPU sampled at start (architecture.md §2: usable = total −
        headroom − …); a GPU whose first sample failed is not judged.

        Raises:
            HeadroomTooLarge: for the first such GPU.
        """
        for slot in self.slots.values():
            total_mib = slot.total_mib
            override = slot.headroom_override
            if override is not None and total_mib is not None and override >= total_mib:
                raise HeadroomTooLarge(
                    f"headroom {fmt_mib(override)} MiB is not below the {fmt_mib(total_mib)} "
                    f"MiB of GPU "
                    f"{slot.info.index} ({slot.uuid}, {slot.info.name}): nothing could ever be "
                    "granted there; give a headroom below the GPU's total (--headroom-mib)"
                )

    def _nvml_failed(self, exc: TelemetryError) -> None:
        """Record why NVML does not initialise and whether a GPU exists at all."""
        present = self.fake is not None or nvidia_device_present()
        self.nvml_problem = NvmlProblem(exc.reason, exc.words or describe(exc.reason), present)
        self.admission.problem = self.nvml_problem
        if present:
            log.error(
                "NVML failed at start: %s; nothing is admitted until it answers (retrying)",
                self.nvml_problem.words,
            )
        else:
            log.warning(
                "no NVIDIA GPU on this computer (%s); to try rbroker without one, run "
                "`rbroker broker --simulate`",
                self.nvml_problem.words,
            )

    async def _retry_nvml(self) -> None:
        """Retry `nvmlInit` and enumeration with backoff until they work; then sample, serve
        and admit normally (waiters get every GPU found)."""
        delay_s = 0.5
        while self.nvml_problem is not None:
            await asyncio.sleep(delay_s)
            delay_s = min(self.config.nvml_retry_max_s, delay_s * 2)
            try:
                await asyncio.wait_for(self.sampling.enumerate(), self.config.nvml_deadline_s * 4)
            except TimeoutError:
                continue
            except TelemetryError as exc:
                if exc.reason != self.nvml_problem.reason:
                    self._nvml_failed(exc)
                continue
            log.warning("NVML answers again: %d GPUs; admitting", len(self.slots))
            self.nvml_problem = None
            self.admission.problem = None
            self.driver_version = await asyncio.to_thread(self.gateway.driver_version)
            await self.sampling.sample_all()
            self._check_headroom()
            for slot in self.slots.values():
                self.lessor.update_observed(slot)
                self._spawn(self.sampling.sample_loop(slot))
            self._spawn(self.sampling.enumerate_loop(self._spawn))
            self.waiting.widen(self.admission.unpinned_candidates)
            self.emit("capacity", {})
            self._admit()

    def begin_stop(self) -> bool:
        """The broker is about to stop. With `release_all_on_exit`, end every lease now;
        otherwise keep every lease and persisted waiter in the store, so that connections
        closing from here on end nothing and the restarted broker restores them exactly as
        after a crash. Returns True when leases are kept."""
        if self.config.release_all_on_exit:
            for lease in list(self.leases.values()):
                self._end(lease, LeaseState.RELEASED, "the broker stopped (release all on exit)")
            return False
        self.stopping = True
        log.info("stopping: %d leases kept for the restarted broker", len(self.leases))
        return True

    async def stop(self) -> None:
        """Cancel background tasks and fail every waiter (persisted waiters stay in the
        store); leases stay in the store unless `begin_stop` ended them."""
        pending = set(self._tasks)
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
        self._tasks.clear()
        for slot in self.slots.values():
            slot.began_sample()  # drop a coalesced kick still scheduled
        self.waiting.fail_all(RpcError(ErrorCode.CANCELLED, "broker stopping"))
        self.sampling.close()
        self.audit.close()
        if self.store is not None:
            # a full or failing disk does not stop the stop: the journal keeps what the
            # database could not take, for the next start to fold
            try:
                self.store.set_meta(STORE_KEY, self.lifetimes.to_json())
            except STORAGE_ERRORS as exc:
                log.warning("lease lifetimes not kept at stop: %s", exc)
            try:
                self.store.close()
            except STORAGE_ERRORS as exc:
                log.warning("the lease journal is kept for the next start: %s", exc)

    def mark_shutting_down(self) -> None:
        """The host is about to stop the reporter: its last report says the broker stops."""
        self.shutting_down = True

    def is_shutting_down(self) -> bool:
        """Whether the host has begun to shut the broker down (`mark_shutting_down`)."""
        return self.shutting_down

    def set_uplink_status(self, status: Callable[[], CoordinatorLink] | None) -> None:
        """Where `status()` reads the coordinator link's state from (the uplink runner)."""
        self.uplink_status = status

    # -- events --------------------------------------------------------------------------------
    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(kind, data)` for every broker event; returns the unsubscribe."""
        return self.events.subscribe(listener)

    def holder_connection(self, lease_id: str, ended_too: bool = False) -> int | None:
        """The connection lease `lease_id` is bound to (None: unknown or unbound); with
        `ended_too`, a lease that just ended is looked for among the ended ones."""
        lease = self.leases.get(lease_id)
        if lease is None and ended_too:
            lease = next((x for x in reversed(self.ended) if x.lease_id == lease_id), None)
        return None if lease is None else lease.conn_id

    # -- sampling hooks ------------------------------------------------------------------------
    async def _sample_once(self, slot: GpuSlot) -> None:
        await self.sampling.sample_once(slot)

    def _sampled(self, slot: GpuSlot, ok: bool) -> None:
        if ok:
            self.lessor.update_observed(slot)
            grace = self.config.over_grant_grace_s
            overgrant.watch(
                self.lessor.over_watch_on(slot.uuid), self.clock.monotonic(), grace, self.emit
            )
        self.idle.sampled(slot, ok)
        seen = self._capacity_seen(slot)
        if self._capacity_said.get(slot.uuid) != seen:  # only what a view would show anew
            self._capacity_said[slot.uuid] = seen
            self.emit("capacity", {"gpu_uuid": slot.uuid})

    def _capacity_seen(self, slot: GpuSlot) -> tuple[object, ...]:
        """What the views show of `slot` that a sample can change: its telemetry and why,
        its capacity figures, and each lease's observed MiB and idle state there (active,
        idle, unknown: not the seconds, which move with the clock). A `capacity` event goes
        out when this changed, not at every sample: an idle broker's subscribers (the tray,
        `rbroker top`) then read nothing (issue 44: an idle tray costs about nothing).

        With `Idleness.changes`: a lease that turned idle by the clock between two samples
        and active again at the second (its holder busy, a chunk of its job) shows the same
        state at both, yet a reader between them was shown it idle; the change count moves
        at that activity, so that reader hears of it (the tray showed `idle 1 s` for good,
        its read after the last event having come later than `idle_after_s`)."""
        cap = self.lessor.capacity(slot.uuid)
        return (
            slot.telemetry,
            slot.telemetry_reason,
            None if cap is None else tuple(cap.as_dict().items()),
            self._leases_seen(slot.uuid),
            self.idle.changes,
        )

    def _leases_seen(self, uuid: str) -> tuple[object, ...]:
        """`(lease_id, observed MiB on uuid, idle state)` of each lease on GPU `uuid`, as the
        last sample left them. Kept from the last time it was read while nothing in it can
        have changed: no lease in or out there and no observed figure changed
        (`Lessor.shown`), nothing that changes a lease's idleness but the clock
        (`Idleness.changes`), and no lease active then turned idle since
        (`Idleness.steady`); so a sample that changes nothing reads no lease."""
        now = self.clock.monotonic()
        key = (self.lessor.shown.get(uuid, 0), self.idle.changes)
        kept = self._leases_said.get(uuid)
        if kept is not None and kept[0] == key and self.idle.steady(kept[1], now):
            return kept[2]
        leases = self.lessor.on(uuid)
        states, steady_since = self.idle.states(leases, now)
        seen = tuple(
            (x.lease_id, x.observed_mib.get(uuid, 0), state)
            for x, state in zip(leases, states, strict=True)
        )
        self._leases_said[uuid] = (key, steady_since, seen)
        return seen

    def _turn(self) -> None:
        if self.queue:
            self._admit()

    def capacity(self, uuid: str) -> Capacity | None:
        """The capacity split of GPU `uuid` now, or None before its first good sample."""
        return self.lessor.capacity(uuid)

    def memory_changed(self, uuid: str) -> None:
        """The broker itself just changed what `uuid` will report (simulated allocate, free
        or state change): like a grant or release, no admission may use an older sample."""
        slot = self.slots[uuid]
        slot.last_change_at = self.clock.monotonic()
        slot.kick.set()

    def simulated(self) -> bool:
        """Whether the broker runs on the simulated NVML (`--simulate`)."""
        return self.fake is not None

    def telemetry_source(self) -> str:
        """Where GPU readings come from (`nvml`, `simulated`, ...)."""
        return self.gateway.source

    def sim(self) -> Simulation:
        """The `sim.*` handler.

        Raises:
            RpcError: `not_simulated` on real GPUs.
        """
        if self.simulation is None:
            raise RpcError(ErrorCode.NOT_SIMULATED, "sim.* methods need a simulated broker")
        return self.simulation

    # -- acquire -------------------------------------------------------------------------------
    async def acquire(
        self,
        params: AcquireParams,
        owner: str,
        holder: Holder,
        conn_id: int | None,
        admin: bool | Callable[[], bool] = False,
        account: str = "",
    ) -> Lease:
        """Queue a request and wait (up to `params.wait_s`) until it is granted.

        Raises:
            RpcError: `description_rejected`, `not_a_member`, `job_not_found`,
                `job_finished` at once;
                `infeasible` at once; `capacity_unavailable` (wait_s=0) or
                `wait_timeout` when not granted in time; `telemetry_unavailable` when the
                pinned GPU is lost or every candidate's telemetry failed and wait_s=0;
                `cancelled` when the connection closes first; the per-user caps and the
                longest wait as `fairness.check_request`.
        """
        started = self.begin_acquire(params, owner, holder, conn_id, admin, account)
        return started if isinstance(started, Lease) else await self.await_waiter(started)

    def begin_acquire(
        self,
        params: AcquireParams,
        owner: str,
        holder: Holder | Callable[[], Holder],
        conn_id: int | None,
        admin: bool | Callable[[], bool] = False,
        account: str = "",
    ) -> Lease | Waiter:
        """`acquire` without waiting: the lease when granted (or re-bound) at once, else its
        queue entry for `await_waiter`. Raises `RpcError` as `acquire` for what is refused.

        A request keyed like one already granted or waiting gets that lease or queue entry
        back; a new one is checked (infeasible, telemetry, the per-user rules of `fairness`),
        queued and given one admission pass at once, so that a request that fits is granted
        without waiting (and the local API answers it without a task of its own); a request
        queued behind others on every GPU it may take only gets its reason (the cost of an
        acquire stays flat in the length of the queue). One that is not granted at once and
        could only fit after its requester's own leases end is refused (`own_leases`).
        `holder` may be given as a function, read once the descriptions passed (the local
        API's peer lookup, whose refusals come after a description's). A project with a
        members list is refused to `owner` unless a member or `admin` (a flag, or a function
        asked only then: `rbroker.broker.members`), re-sent request keys too.
        """
        check_descriptions(
            {"project": params.project, "session": params.session, "purpose": params.purpose}
        )
        params = params.model_copy(
            update={
                "project": self.project_names.canonical(params.project.strip()),
                "session": params.session.strip(),
                "purpose": params.purpose.strip(),
            }
        )
        self._check_member(params.project, owner, admin, "request")
        if not isinstance(holder, Holder):
            holder = holder()
        if params.job_id is not None:
            self.jobs.get_open(params.job_id, owner, account)  # none for a finished job
        if params.request_key:
            lease = self.lessor.by_request_key(params.request_key, owner, holder)
            if lease is not None:
                return self._rebind(lease, conn_id)
            found = self.waiting.find(params.request_key, owner, holder)
            if found is not None:
                found.conn_id, found.reattach_by = conn_id, None
                return found
        if params.booking_id is not None:  # a claim: on the booking's GPUs (§2a)
            booking = self.bookings.check_claim(
                params.booking_id, owner, params.mib, params.gpus, params.gpu_uuid
            )
            candidates = booking.gpu_uuids
        else:
            candidates = self.admission.candidates(params.gpu_uuid, params.gpus, params.mib)
        self.admission.check_feasible(params, candidates)
        fairness.check_request(
            params,
            owner,
            self.config,
            self.lessor.owned_by(owner),
            self.waiting.waiting_of(owner),
        )
        waiter = self.waiting.new_waiter(
            params,
            candidates,
            owner,
            holder,
            conn_id,
            self.clock.monotonic(),
            self.clock.wall(),
            self.clock.boottime(),
        )
        if params.booking_id is not None:
            waiter.booked_at = self.bookings.get(params.booking_id).accepted_at
        behind = (
            not self.shares.enabled  # by shares a newcomer may go first: a pass decides
            and params.booking_id is None  # a claim goes first
            and bool(candidates)
            and all(self.waiting.waiting_on(u) for u in candidates)
        )
        self.waiting.add(waiter)
        if behind:
            # queued behind other requests on every GPU it may take: FIFO, it cannot be
            # granted before them, and every change that could admit them runs a pass of its
            # own (a sample, a cancel, a closed connection, a resume, the tick): no pass
            self.admission.explain_behind(waiter, self.waiting.waiting_on, self.paused)
        else:
            self._admit()
        future = waiter.future
        if future.done() and not future.cancelled() and future.exception() is None:
            return future.result()
        if not future.done():
            try:  # not granted now: refused when it could only fit after its own leases end
                own_leases.check(
                    self.lessor, holder, owner, params.mib, params.gpus, waiter.candidates
                )
            except RpcError:
                self.waiting.remove(waiter)
                raise
            if params.wait_s > 0:
                try:
                    self.waiting.persist(waiter)
                except STORAGE_ERRORS as exc:  # not kept across a restart: not queued at all
                    self.waiting.remove(waiter)
                    raise storage_unavailable(exc) from None
            self.emit("queue", {"request_id": waiter.request_id})
        return waiter

    async def await_waiter(self, waiter: Waiter) -> Lease:
        """The lease a queued request from `begin_acquire` ends with (raises as `acquire`).

        A wait cancelled by its caller (its connection gone) leaves the queue, except while
        the broker is stopping (`begin_stop`): then the request stays in the store, and the
        restarted broker restores it in its place for its client's re-sent request key."""
        try:
            return await waiter.future
        finally:
            if waiter in self.queue and not self.stopping:  # cancelled: connection gone
                self.waiting.leave(waiter)
                self._admit()

    def _admit(self) -> None:
        """One atomic admission pass over the queue (see `admission`); a `queue` event for
        each waiter whose reason the pass changed (what the views show of it: with capacity
        told only on a change, the tray and `rbroker watch` hear of a new reason so).

        A queue of one request (an uncontended acquire, the usual case) that the pass would
        grant is granted by `Admission.grant_at_once`, the pass's own decision read from that
        request's GPUs alone, without the pass's bookkeeping (issue 44: a cycle's acquire
        spent about 15 µs of its 58 µs there); one that waits goes through the pass, which
        gives its reason."""
        queue = self.waiting.waiters
        if len(queue) == 1 and not queue[0].future.done():
            waiter, now = queue[0], self.clock.monotonic()
            chosen = self.admission.grant_at_once(waiter, self.paused, now)
            if chosen:
                self._grant_hook(waiter, chosen, now)
                self.news.changed()
                return
        said = {id(w): w.reason for w in self.waiting.waiters}
        self.admission.run(self.waiting, self.paused, self._grant_hook, self.emit)
        for w in self.waiting.waiters:
            if said.get(id(w), w.reason) != w.reason:
                self.emit("queue", {"request_id": w.request_id})
        self.news.changed()  # reasons are set by the pass

    def _grant_hook(self, waiter: Waiter, chosen: list[Choice], now: float) -> None:
        self._grant(waiter, chosen, now)  # looked up at call time (tests wrap `_grant`)

    def _grant(self, waiter: Waiter, chosen: list[Choice], now: float) -> None:
        if waiter.resize_of is not None:  # a lease's growth, not a new lease
            self.resizes.grant(waiter, chosen, now)
            return
        try:
            lease = self.lessor.grant(waiter, chosen, now)
        except STORAGE_ERRORS as exc:  # the store could not keep it: nothing was booked
            log.warning("lease not granted: the data directory cannot be written: %s", exc)
            self.waiting.remove(waiter, storage_unavailable(exc))
            self.emit("queue", {"request_id": waiter.request_id})
            return
        if waiter.job_id is not None and waiter.job_id in self.jobs.jobs:
            self.jobs.link_lease(waiter.job_id, waiter.owner, lease.lease_id)
        if waiter.booking_id is not None:
            self.bookings.claimed(waiter.booking_id, lease.lease_id)
        self.waiting.remove(waiter)
        self.grant_count += 1
        waiter.future.set_result(lease)
        self.emit("lease", {"lease_id": lease.lease_id, "state": lease.state.value})

    def set_paused(self, paused: bool, actor: str = "") -> bool:
        """Pause or resume new admissions (existing leases are untouched), asked by OS user
        `actor` (recorded in the audit trail); returns whether admissions are paused now."""
        self.paused = paused
        action, words = (
            ("admissions_paused", "paused") if paused else ("admissions_resumed", "resumed")
        )
        self.audit.record(
            actor, action, Target(kind="broker"), f"new admissions {words} by {actor}"
        )
        self._admit()
        return self.paused

    def _check_member(
        self, project: str, user: str, admin: bool | Callable[[], bool], kind: str
    ) -> None:
        """`Members.check`, a refusal recorded in the audit trail (`member_refused`, target
        kind `kind`: `request`, `job`, `booking`; at most one a minute per user,
        `Audit.refused`).

        Raises:
            RpcError: `not_a_member`, as `Members.check`.
        """
        try:
            self.members.check(project, user, admin)
        except RpcError as exc:
            if exc.name == ErrorCode.NOT_A_MEMBER:
                target = Target(user, project, kind)
                self.audit.refused(user, target, exc.message, self.clock.monotonic())
            raise

    def audit_list(self, limit: int = 200, before_seq: int | None = None) -> AuditListResult:
        """`audit.list` (administrators): the audit trail's newest entries and whether it
        verifies (`Audit.listed`)."""
        return self.audit.listed(limit, before_seq)

    def watch_waiting(
        self, waiter: Waiter, tell: Callable[[QueuedRequest], None]
    ) -> Callable[[], None]:
        """Tell `tell` the queue entry of `waiter` (as in `leases_view`, with its place and
        estimate) once admission has given it a reason, and again after each change it may
        rest on (`waiting_news`); returns the function that stops it."""
        return self.news.watch(waiter, tell)

    # -- attach / renew / release / expiry -----------------------------------------------------
    def attach(self, lease_id: str, token: str, owner: str, conn_id: int | None) -> Lease:
        """Re-attach a lease to a new connection of its holder (after a broker restart or
        a dropped connection), proving possession with the token from the grant.

        Raises:
            RpcError: `lease_not_found`, `lease_expired`, `not_lease_owner` (also for a
                wrong token: the holder is not the one the lease was granted to);
                `storage_unavailable` when its fresh token cannot be written (the lease is
                unchanged: its token still re-attaches).
        """
        try:
            return self.lessor.attach(lease_id, token, owner, conn_id)
        except STORAGE_ERRORS as exc:
            raise _not_reattached(exc) from None

    def _rebind(self, lease: Lease, conn_id: int | None) -> Lease:
        """`Lessor.rebind`, refused as `storage_unavailable` when it cannot be written."""
        try:
            return self.lessor.rebind(lease, conn_id)
        except STORAGE_ERRORS as exc:
            raise _not_reattached(exc) from None

    def renew(self, lease_id: str, owner: str) -> Lease:
        """Extend an active lease by its TTL from now (monotonic). Raises `RpcError`:
        `lease_not_found`, `lease_expired` (ended other than by release), `not_lease_owner`."""
        return self.lessor.renew(lease_id, owner)

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
        by the holder); an `admin` may end anyone's (see `fairness`). The reason says who
        (never the pid, §8); when it is not the holder, the holder is told (a `lease_ended`
        event to its connection).

        Raises:
            RpcError: `lease_not_found`, `lease_expired`, `not_lease_owner` (not an admin).
        """
        found = self.leases.get(lease_id)
        by_admin = admin and found is not None and found.owner != owner
        lease = self.lessor.lookup(lease_id, found.owner if by_admin and found else owner)
        state = LeaseState.RELEASED
        if by_admin:
            state, reason = LeaseState.REVOKED, f"released by admin {owner}"
        elif conn_id is None or conn_id == lease.conn_id or pid == lease.holder.pid:
            reason = "released by holder"
        else:
            reason = f"released by another process of {owner}"
        self._end(lease, state, reason)
        if by_admin:
            target = Target(lease.owner, lease.project, "lease", lease_id)
            self.audit.record(owner, "lease_revoked", target, reason)
        if reason != "released by holder":  # tell the holder (its connection, if it has one)
            self.emit(
                "lease_ended", {"lease_id": lease_id, "state": state.value, "ended_reason": reason}
            )
        return lease

    def cancel_request(self, request_id: int, user: str, admin: bool = False) -> Waiter:
        """Cancel waiting request `request_id`: its owner's, or anyone's for an admin. The
        waiting `lease.acquire` (or resize) ends `cancelled` with "request cancelled by admin
        <user>" (or "... by <user>", another process of its owner).

        Raises:
            RpcError: `request_not_found` (not waiting: granted, ended, unknown),
                `not_lease_owner` (another user's, and `user` is no admin).
        """
        waiter = next((w for w in self.queue if w.request_id == request_id), None)
        if waiter is None or waiter.future.done():
            raise RpcError(
                ErrorCode.REQUEST_NOT_FOUND,
                f"no waiting request {request_name(request_id)} (granted, ended or never queued)",
                request_id=request_id,
            )
        if waiter.owner != user and not admin:
            raise RpcError(
                ErrorCode.NOT_LEASE_OWNER,
                f"request {request_name(request_id)} belongs to another user",
                request_id=request_id,
            )
        who = f"admin {user}" if waiter.owner != user else user
        self.waiting.remove(
            waiter,
            RpcError(
                ErrorCode.CANCELLED,
                f"request cancelled by {who}",
                request_id=request_id,
                cancelled_by=user,
            ),
        )
        if waiter.owner != user:
            target = Target(waiter.owner, waiter.project, "request", request_name(request_id))
            self.audit.record(user, "request_cancelled", target, f"request cancelled by {who}")
        self.emit("queue", {"request_id": request_id})
        self._admit()
        return waiter

    def request_view(self, waiter: Waiter) -> QueuedRequest:
        """A request as `leases_view` shows it (position 0: it is no longer queued)."""
        return waiter.to_wire(self.clock.monotonic(), 0)

    def _end(self, lease: Lease, state: LeaseState, reason: str) -> None:
        if self.lessor.revoke(lease, state, reason):
            self.end_count += 1
            if lease.age_from > -math.inf:
                lived_s = self.clock.monotonic() - lease.age_from
                self.lifetimes.record(lease.owner, lease.project, lease.session, lived_s)
            self.resizes.lease_ended(lease.lease_id)
            self.jobs.lease_ended(lease.lease_id, lease.job_id)
            self.emit("lease", {"lease_id": lease.lease_id, "state": state.value})
            if lease.booking_id is not None:
                held = self.bookings.lease_ended(lease.lease_id)
                if held is not None:
                    self._booking_changed(held)

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
        ticks.grace(self.lessor.leases.values(), now, gap, self.config.lease_reattach_grace_s)

    def _check_holders(self) -> None:
        self._reap_dead_holders()
        for job in self.jobs.check_stalled():
            self.emit("job", {"job_id": job.job_id, "state": job.state})

    def _reap_dead_holders(self) -> None:
        is_alive = liveness_memo()
        for lease in self.lessor.held_by_dead(is_alive):
            self._end(lease, LeaseState.HOLDER_EXITED, "the holder process exited")
        self.waiting.reap(is_alive)

    def _tick(self, now: float) -> None:
        """The tick's turn (`ticks.tick_loop`): expiry, the lifetimes kept, then the jobs
        left unattended for `job_abandon_s` ended (`JobTable.check_abandoned`)."""
        self._expire(now)
        moved, told = self.bookings.turn(self.lessor.on)
        for booking in moved:
            self._booking_changed(booking)
        for notice in told:
            self._tell(notice)
        if moved and self.queue:
            self._admit()  # a lapse or an end frees memory; a start protects it
        self._watch_idle()
        if self.store is not None:
            self.store.retry(now)  # what a full disk kept back, once there is room
        self._keep_lifetimes(now)
        self.news.tick(now)
        for job in self.jobs.check_abandoned():
            self.emit("job", {"job_id": job.job_id, "state": job.state})

    def _idle_notice(self, notice: IdleNotice) -> None:
        lease = notice.lease
        self.emit(
            "idle_notice",
            {
                "lease_id": lease.lease_id,
                "owner": lease.owner,
                "project": lease.project,
                "notice": notice.kind,
                "idle_s": notice.idle_s,
                "message": notice.message,
            },
        )

    def _watch_idle(self) -> None:
        """Tell each idle episode and reclaim by `[idle]`'s policy (`rbroker.broker.reclaim`):
        an `idle_notice` event per notice (to subscribers and the lease's connection); a
        reclaimed lease ends `revoked` with the reason, its holder gets `lease_ended` as for
        an admin's revoke, the audit records `lease_reclaimed` by the broker, and the queue
        is admitted again. Nothing is killed."""
        notices, reclaims = self.idle_watch.turn()
        for notice in notices:
            self._idle_notice(notice)
        for notice in reclaims:
            lease, reason = notice.lease, notice.message
            self._idle_notice(notice)  # while its connection is still known
            self._end(lease, LeaseState.REVOKED, reason)
            target = Target(lease.owner, lease.project, "lease", lease.lease_id)
            self.audit.record("broker", "lease_reclaimed", target, reason)
            self.emit(
                "lease_ended",
                {
                    "lease_id": lease.lease_id,
                    "state": LeaseState.REVOKED.value,
                    "ended_reason": reason,
                },
            )
            log.warning("lease %s of %s %s", lease.lease_id, lease.owner, reason)
        if reclaims and self.queue:
            self._admit()

    def _keep_lifetimes(self, now: float) -> None:
        """Write the lease lifetimes to the store when one was recorded since the last write
        and `LIFETIMES_SAVE_S` have passed since it (one statement, off the lease cycle: a
        crash loses at most that much history)."""
        recorded, saved_at = self._lifetimes_saved
        if self.store is None or self.lifetimes.recorded == recorded:
            return
        if now - saved_at < LIFETIMES_SAVE_S:
            return
        try:
            self.store.set_meta(STORE_KEY, self.lifetimes.to_json())
        except STORAGE_ERRORS as exc:  # a full disk: kept in memory, tried again later
            self._lifetimes_saved = (recorded, now)
            log.warning("lease lifetimes not written: %s", exc)
            return
        self._lifetimes_saved = (self.lifetimes.recorded, now)

    def _expire(self, now: float) -> None:
        for lease in self.lessor.overdue(now):
            self._end(lease, LeaseState.EXPIRED, f"no heartbeat for {lease.ttl_s:g} s")
        for lease in self.lessor.not_reattached(now):
            self._end(
                lease,
                LeaseState.EXPIRED,
                f"its holder did not re-attach within {self.config.lease_reattach_grace_s:g} s "
                "after the broker restarted",
            )
        self.waiting.expire(now, self.admission.wait_error)
        if self.queue:
            self._admit()

    def check_room(self, params: RoomCheckParams, owner: str) -> RoomCheckResult:
        """`room.check`: whether a request of these figures by `owner` would be granted now,
        without taking anything (`Admission.probe`: behind the waiting requests, beside the
        bookings, on fresh samples).

        Raises:
            RpcError: what `lease.acquire` refuses at once (`infeasible`, `invalid_params`
                for a pin with `gpus` ≠ 1, `telemetry_unavailable` for a lost pinned GPU).
        """
        request = AcquireParams(
            mib=params.mib,
            gpus=params.gpus,
            gpu_uuid=params.gpu_uuid,
            project="-",
            session="-",
            purpose="room check",
            expected_s=params.expected_s,
            wait_s=1.0,
        )
        candidates = self.admission.candidates(params.gpu_uuid, params.gpus, params.mib)
        self.admission.check_feasible(request, candidates)
        now = self.clock.monotonic()
        probe = self.waiting.new_waiter(
            request, candidates, owner, NO_HOLDER, None, now, self.clock.wall(), now, numbered=False
        )
        chosen = self.admission.probe(probe, self.waiting.waiting_on, self.paused)
        probe.future.cancel()
        return {
            "fits": bool(chosen),
            "gpus": [
                {
                    "uuid": c.gpu_uuid,
                    "index": self.slots[c.gpu_uuid].info.index,
                    "available_mib": c.cap.available_mib,
                }
                for c in chosen
            ],
            "reason": "" if chosen else probe.reason,
            "reason_kind": "" if chosen else probe.reason_kind,
            "reason_data": {} if chosen else dict(probe.reason_data),
        }

    # -- bookings (docs/architecture.md §2a) ---------------------------------------------------
    def _granted_of(self, lease_id: str) -> int:
        lease = self.leases.get(lease_id)
        return lease.granted_mib if lease is not None else 0

    def _booking_base(self, uuid: str) -> BookingBase | None:
        """What GPU `uuid` offers bookings: its total and headroom, and the memory its latest
        sample shows in use beyond its leases' grants (`BookingBase`); None before a sample."""
        slot = self.slots.get(uuid)
        cap = self.lessor.capacity(uuid) if slot is not None else None
        if slot is None or cap is None:
            return None
        granted = sum(lease.granted_mib for lease in self.lessor.on(uuid))
        outside = max(0, cap.device_used_mib + cap.outstanding_mib - granted)
        return BookingBase(slot.info.index, cap.total_mib, cap.headroom_mib, outside)

    def _save_booking(self, booking: Booking) -> None:
        assert self.store is not None
        self.store.put_booking(booking.to_record(), booking.live, self.config.bookings.keep_ended)

    def _booking_changed(self, booking: Booking, **extra: object) -> None:
        self.emit(
            "booking",
            {
                "booking_id": booking.booking_id,
                "owner": booking.owner,
                "state": booking.state,
                "ended_reason": booking.ended_reason,
                **extra,
            },
        )

    def _tell(self, notice: Notice) -> None:
        """A `booking_notice` event (docs/architecture.md §2a) of `notice`."""
        booking = notice.booking
        self.emit(
            "booking_notice",
            {
                "booking_id": booking.booking_id,
                "owner": booking.owner,
                "notice": notice.kind,
                "to": notice.to,
                "lease_id": notice.lease_id,
                "start_at": booking.start_at,
                "end_at": booking.end_at,
                "message": notice.message,
            },
        )

    def book(
        self, params: BookParams, owner: str, admin: bool | Callable[[], bool] = False
    ) -> BookingView:
        """Accept a booking of `owner` (`Bookings.create`); a project with a members list is
        refused to `owner` unless a member or `admin` (as `begin_acquire`).

        Raises:
            RpcError: `description_rejected`, `not_a_member`, `infeasible` (an unknown pinned
                GPU, `gpu_uuid` with `gpus` ≠ 1, as `Bookings.create`), and as
                `Bookings.create`; `storage_unavailable` (nothing kept).
        """
        check_descriptions(
            {"project": params.project, "session": params.session, "purpose": params.purpose}
        )
        project = self.project_names.canonical(params.project.strip())
        self._check_member(project, owner, admin, "booking")
        candidates = self.admission.candidates(params.gpu_uuid, params.gpus, params.mib)
        try:
            booking = self.bookings.create(
                owner,
                project,
                params.session.strip(),
                params.purpose.strip(),
                params.mib,
                params.gpus,
                candidates,
                params.start_at,
                params.end_at,
            )
        except STORAGE_ERRORS as exc:
            raise storage_unavailable(exc, "not booked", "nothing was kept") from None
        self._booking_changed(booking)
        return self.bookings.to_wire(booking)

    def cancel_booking(self, booking_id: str, user: str, admin: bool = False) -> BookingView:
        """Cancel a live booking: its owner's, or anyone's for an `admin` (the owner is told:
        a `booking` event with `cancelled_by`, and a `booking_notice` `cancelled` to it). Its
        claiming leases go on as ordinary leases.

        Raises:
            RpcError: as `Bookings.cancel`.
        """
        booking = self.bookings.cancel(booking_id, user, admin)
        self._booking_changed(booking, cancelled_by=user)
        if booking.owner != user:  # an administrator's: its owner is told, as by a notice
            target = Target(booking.owner, booking.project, "booking", booking.booking_id)
            self.audit.record(user, "booking_cancelled", target, booking.ended_reason)
            message = f"your booking {booking.booking_id} was {booking.ended_reason}"
            self._tell(Notice("cancelled", booking, booking.owner, message))
        self._admit()
        return self.bookings.to_wire(booking)

    def bookings_list(self, asker: str, include_ended: bool = False) -> BookingsListResult:
        """`bookings.list` for OS user `asker` (`Bookings.listed`), with the broker's clock and
        each GPU's total − headroom."""
        usable: dict[str, int] = {}
        for uuid in self.slots:
            cap = self.lessor.capacity(uuid)
            if cap is not None:
                usable[uuid] = cap.usable_mib
        return {
            "bookings": self.bookings.listed(asker, include_ended),
            "now_at": self.clock.wall(),
            "usable_mib": usable,
        }

    # -- jobs (docs/architecture.md §4) --------------------------------------------------------
    def _job_wire(self, job: Job) -> JobView:
        live = self.leases
        return job.to_wire([lid for lid in job.lease_ids if lid in live])

    def declare_job(
        self,
        owner: str,
        project: str,
        purpose: str,
        handler: str,
        total_items: int | None,
        workers: int,
        conn_id: int | None,
        admin: bool | Callable[[], bool] = False,
        account: str = "",
    ) -> JobView:
        """Declare a job of `owner` (see `jobs.JobTable.declare`; `account`: the OS account
        beyond its name, `Job.account`); returns its view. A
        project with a members list is refused to `owner` unless a member or `admin` (as
        `begin_acquire`).

        Raises:
            RpcError: `description_rejected`, `not_a_member`, `too_many_jobs`.
        """
        check_descriptions({"project": project, "purpose": purpose, "handler": handler})
        project = self.project_names.canonical(project.strip())
        self._check_member(project, owner, admin, "job")
        try:
            job = self.jobs.declare(
                owner,
                project,
                purpose.strip(),
                handler.strip(),
                total_items,
                workers,
                conn_id,
                account,
            )
        except STORAGE_ERRORS as exc:
            raise storage_unavailable(exc, "job not declared", "nothing was kept") from None
        self.emit("job", {"job_id": job.job_id, "state": job.state})
        return self._job_wire(job)

    def update_job(
        self,
        job_id: str,
        owner: str,
        state: str | None,
        reason: str | None,
        workers: int | None,
        conn_id: int | None,
        account: str = "",
    ) -> JobView:
        """Move a job of `owner` (see `jobs.JobTable.update`); returns its view.

        Raises:
            RpcError: `description_rejected` (the reason), as `JobTable.update`.
        """
        if reason is not None:
            check_descriptions({"reason": reason})
        try:
            job = self.jobs.update(
                job_id, owner, state, reason and reason.strip(), workers, conn_id, account
            )
        except STORAGE_ERRORS as exc:
            raise storage_unavailable(exc, "job not changed", "it is as it was") from None
        self.emit("job", {"job_id": job.job_id, "state": job.state})
        return self._job_wire(job)

    def report_job(
        self,
        job_id: str,
        owner: str,
        chunk_id: str,
        completed: int,
        failed: int,
        conn_id: int | None,
        account: str = "",
    ) -> tuple[JobView, bool]:
        """A chunk's counts for a job of `owner` (see `jobs.JobTable.report`); returns the
        job's view and whether the chunk was a duplicate (acknowledged, not counted)."""
        try:
            job, duplicate = self.jobs.report(
                job_id, owner, chunk_id, completed, failed, conn_id, account
            )
        except STORAGE_ERRORS as exc:
            raise storage_unavailable(
                exc, f"chunk {chunk_id} not counted", "the job's counts are as they were"
            ) from None
        if not duplicate:
            self.idle.progress(job.job_id)  # a chunk done: its leases are active
            self.emit("job", {"job_id": job.job_id, "state": job.state})
        return self._job_wire(job), duplicate

    def jobs_view(self, include_finished: bool) -> list[JobView]:
        """The jobs (finished ones too when asked), as `jobs.list` answers."""
        return self.jobs.view(include_finished, self.leases)

    def jobs_list(self, include_finished: bool, asker: str) -> JobsListResult:
        """`jobs.list` for OS user `asker`: its jobs and the newest of other users'
        (`JobTable.listed`: `others_left_out` says how many were not), and how many finished
        ones are kept per user and were dropped since the start
        (`BrokerConfig.max_finished_jobs_per_user`)."""
        jobs, left_out = self.jobs.listed(include_finished, self.leases, asker)
        return {
            "jobs": jobs,
            "others_left_out": left_out,
            "finished_kept_per_user": self.jobs.max_finished_per_user,
            "finished_dropped": sum(self.jobs.dropped.values()),
        }

    # -- views (docs/architecture.md §5: `read_model`) ------------------------------------------
    def now_wall(self) -> float:
        """The broker's wall clock (seconds since the epoch)."""
        return self.clock.wall()

    def granted_gpus(self, lease: Lease) -> tuple[list[GrantedGpu], list[int] | None]:
        """What a grant's answer carries of `lease`'s GPUs (`ReadModel.granted_gpus`)."""
        return self.views.granted_gpus(lease)

    def gpus_view(self) -> list[GpuView]:
        """`gpus.list`: each GPU's capacity split and telemetry (`ReadModel.gpus_view`)."""
        return self.views.gpus_view()

    def leases_view(
        self, include_ended: bool = False, asker: str | None = None
    ) -> LeasesListResult:
        """`leases.list`: leases and the queue (`ReadModel.leases_view`)."""
        return self.views.leases_view(include_ended, asker)

    def estimates(self) -> dict[int, Estimate]:
        """Each waiting request's estimate by request id (`ReadModel.estimates`)."""
        return self.views.estimates()

    def queue_order(self) -> str:
        """How admission orders the queue, in words (`ReadModel.queue_order`)."""
        return self.views.queue_order()

    def shares_view(self) -> list[ShareView]:
        """With `[shares]`: each project's weight, share and use (`ReadModel.shares_view`)."""
        return self.views.shares_view()

    def status(self) -> BrokerStatus:
        """Version, uptime, telemetry source and states, counts, coordinator link, socket, and
        the kind of event loop the broker runs on."""
        problem = self.nvml_problem
        status: BrokerStatus = {
            "version": __version__,
            "uptime_s": round(self.clock.monotonic() - self.started_mono, 3),
            "started_at": self.started_wall,
            "telemetry_source": self.gateway.source,
            "simulated": self.fake is not None,
            "driver_version": self.driver_version,
            "nvml_problem": None
            if problem is None
            else {
                "reason": problem.reason,
                "words": problem.words,
                "device_present": problem.device_present,
            },
            "gpus": {u: s.telemetry.value for u, s in self.slots.items()},
            "active_leases": len(self.leases),
            "queued_requests": len(self.queue),
            "leases_granted_total": self.grant_count,
            "paused": self.paused,
            "coordinator": self.uplink_status()
            if self.uplink_status is not None
            else {"link": "not enrolled", "last_report_at": None},
            "socket": str(self.config.socket_path),
            "event_loop": _event_loop(),
        }
        if self.shares.enabled:
            status["shares"] = self.shares_view()
        return status


def _event_loop() -> str | None:
    """`uvloop` or `asyncio` (see `rbroker.base.eventloop`); None outside a running loop."""
    try:
        return loop_name(asyncio.get_running_loop())
    except RuntimeError:
        return None


def _not_reattached(exc: Exception) -> RpcError:
    return storage_unavailable(exc, "not re-attached", "the lease is unchanged")
