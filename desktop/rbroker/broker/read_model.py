"""What the broker shows (docs/architecture.md §5): its GPUs with the capacity split, its
leases and its queue with each request's place, reason and estimate, the shares, and what a
grant's answer carries. Read-only: it is fed the parts it reads (the GPU slots, the lessor,
the queue, admission's order, the shares, the lifetimes, the clock and configuration) and
changes none of them; the `Broker` façade answers its view methods through it.

The queue's estimates (`rbroker.broker.eta`) are played once per change of the leases, the
queue or the pause, or after `ESTIMATE_REFRESH_S`, and counted down in between: one play
serves every view and every waiting request told its entry (`waiting_news`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterator

from rbroker.base.cuda import cuda_indices
from rbroker.base.when import fmt_duration
from rbroker.broker import listing
from rbroker.broker.admission import Admission
from rbroker.broker.clock import Clock
from rbroker.broker.config import BrokerConfig
from rbroker.broker.eta import Asking, Estimate, Holding, estimate, history_of
from rbroker.broker.idle import Idleness
from rbroker.broker.leases import Lease, Waiter
from rbroker.broker.lessor import Lessor
from rbroker.broker.lifetimes import Lifetimes
from rbroker.broker.sampling import GpuSlot
from rbroker.broker.shares import Shares
from rbroker.broker.waiting import WaitQueue
from rbroker.gpu.types import TelemetryState
from rbroker_protocol.results import (
    GpuView,
    GrantedGpu,
    LeasesListResult,
    ListedLease,
    QueuedRequest,
    ShareView,
)

ESTIMATE_REFRESH_S = 1.0
"""The longest the queue's estimates are reused while nothing changed (seconds)."""

Counts = Callable[[], tuple[int, int, bool]]
"""The broker's leases granted and ended so far and whether admissions are paused: what the
estimates are played again on."""


class ReadModel:
    """The broker's views, read from its parts (see the module docstring).

    Args:
        slots, lessor, waiting, admission, shares, lifetimes: the broker's parts (live).
        clock, config: the broker's.
        counts: `Counts`.
        idle: the broker's `Idleness`, which fills the listed leases' `idle_state` and
            `idle_s` (None: left out).
    """

    def __init__(
        self,
        slots: dict[str, GpuSlot],
        lessor: Lessor,
        waiting: WaitQueue,
        admission: Admission,
        shares: Shares,
        lifetimes: Lifetimes,
        clock: Clock,
        config: BrokerConfig,
        counts: Counts,
        idle: Idleness | None = None,
    ) -> None:
        self.slots = slots
        self.lessor = lessor
        self.waiting = waiting
        self.admission = admission
        self.shares = shares
        self.lifetimes = lifetimes
        self.clock = clock
        self.config = config
        self._counts = counts
        self.idle = idle
        self._estimates: dict[int, Estimate] = {}
        self._estimated_at = -math.inf
        self._estimated_for: tuple[object, ...] = ()

    def granted_gpus(self, lease: Lease) -> tuple[list[GrantedGpu], list[int] | None]:
        """The GPUs of `lease` in its order (`GrantedGpu`: index, NVML total, memory API) and
        their CUDA indices (`rbroker.base.cuda.cuda_indices` over every GPU of this broker, None
        when they may not name the same GPUs to CUDA): what a grant's answer carries."""
        gpus: list[GrantedGpu] = []
        for uuid in lease.gpu_uuids:
            slot = self.slots.get(uuid)
            cap = self.lessor.capacity(uuid)
            sample = slot.sample if slot is not None else None
            gpus.append(
                {
                    "uuid": uuid,
                    "index": slot.info.index if slot is not None else -1,
                    "total_mib": cap.total_mib if cap is not None else None,
                    "memory_api": sample.memory_api if sample is not None else None,
                }
            )
        every = [{"uuid": s.uuid, "index": s.info.index} for s in self.slots.values()]
        return gpus, cuda_indices(lease.gpu_uuids, every)

    def gpus_view(self) -> list[GpuView]:
        """Per GPU, by index: identity, telemetry (`stale` when the latest sample is older
        than `max_sample_age_s`), lease and queue counts, the capacity split of
        docs/architecture.md §2 in MiB, and what bookings hold back from a request that
        declares no end (§2a)."""
        now = self.clock.monotonic()
        lessor = self.lessor
        out = []
        for slot in sorted(self.slots.values(), key=lambda s: s.info.index):
            cap = lessor.capacity(slot.uuid)
            on = lessor.on(slot.uuid)
            leased = sum(lease.observed_mib.get(slot.uuid, 0) for lease in on)
            granted = sum(lease.granted_mib for lease in on)
            telemetry = slot.telemetry
            if (
                telemetry is TelemetryState.OK
                and slot.sample is not None
                and now - slot.sample.finished_at > self.config.max_sample_age_s
            ):
                telemetry = TelemetryState.STALE
            entry: GpuView = {
                "uuid": slot.uuid,
                "index": slot.info.index,
                "name": slot.info.name,
                "telemetry": telemetry.value,
                "telemetry_reason": slot.telemetry_reason,
                "sample_age_s": round(now - slot.sample.finished_at, 3) if slot.sample else None,
                "memory_api": slot.sample.memory_api if slot.sample else None,
                "leases": len(on),
                "granted_mib": granted,
                "leased_in_use_mib": leased,
                "waiting": sum(1 for w in self.waiting.waiters if slot.uuid in w.candidates),
            }
            if cap is not None:  # the figures of `cap.as_dict()`, in its order
                entry["total_mib"] = cap.total_mib
                entry["headroom_mib"] = cap.headroom_mib
                entry["device_used_mib"] = cap.device_used_mib
                entry["outstanding_mib"] = cap.outstanding_mib
                entry["available_mib"] = cap.available_mib
                entry["other_in_use_mib"] = max(0, cap.device_used_mib - leased)
                entry["held_outside_mib"] = lessor.held_outside_mib(slot.uuid)
                bookings = self.admission.bookings
                if bookings is not None:
                    t0, t1 = bookings.horizon(None)
                    entry["booked_mib"] = bookings.peak_mib(slot.uuid, t0, t1)
                    entry["booked_within_s"] = bookings.settings.protect_s
            out.append(entry)
        return out

    def leases_view(
        self, include_ended: bool = False, asker: str | None = None
    ) -> LeasesListResult:
        """`{"leases": [...], "queue": [...]}` (plus `"ended"` when asked): active leases with
        the telemetry of their GPUs and flags, the queue with reasons and positions. For an
        `asker` (the OS user of a `leases.list`) each list holds its own entries and at most
        `listing.MAX_LISTED_OTHERS` of other users' (the largest leases, the head of the
        queue), `leases_left_out` and `queue_left_out` counting the rest; without one
        (the uplink's report, which trims by its own rules), everything."""
        now = self.clock.monotonic()
        played, gone_s = self._played()
        queued = [
            _with_estimate(w.to_wire(now, ahead), played.get(w.request_id), gone_s)
            for w, ahead in self.waiting.ahead(self.admission.order(self.waiting.waiters))
        ]
        leases: list[ListedLease] = []
        for lease in self.lessor.leases.values():
            telemetry = {
                u: self.slots[u].telemetry.value if u in self.slots else TelemetryState.LOST.value
                for u in lease.gpu_uuids
            }
            flags = sorted(
                {f"gpu_{state}" for state in telemetry.values() if state != "ok"}
                | ({"over_grant"} if lease.over_grant else set())
            )
            entry: ListedLease = {**lease.to_wire(now), "gpu_telemetry": telemetry, "flags": flags}
            if self.idle is not None:
                idle_state, idle_s = self.idle.state(lease, now)
                entry["idle_state"] = idle_state.value
                entry["idle_s"] = None if idle_s is None else round(idle_s, 1)
            leases.append(entry)
        view: LeasesListResult = {
            "leases": leases,
            "queue": queued,
        }
        if asker is not None:
            view["leases"], leases_left_out = listing.for_asker(
                leases,
                asker,
                lambda x: x["owner"],
                keep_first=lambda x: -x["granted_mib"] * len(x["gpu_uuids"]),
                max_others=listing.MAX_LISTED_OTHERS,
            )
            view["queue"], queue_left_out = listing.for_asker(
                queued, asker, lambda x: x["owner"], max_others=listing.MAX_LISTED_OTHERS
            )
            if leases_left_out:
                view["leases_left_out"] = leases_left_out
            if queue_left_out:
                view["queue_left_out"] = queue_left_out
        if include_ended:
            view["ended"] = [lease.to_wire(now) for lease in self.lessor.ended]
        return view

    # -- when will it fit (docs/architecture.md §3) ------------------------------------------
    def estimates(self) -> dict[int, Estimate]:
        """Each waiting request's estimate (`rbroker.broker.eta`), by request id, with
        `eta_s` from now. Played again when a lease or the queue changed, or after
        `ESTIMATE_REFRESH_S`; in between the last estimates count down."""
        played, gone_s = self._played()
        return {k: _count_down(e, gone_s) for k, e in played.items()}

    def _played(self) -> tuple[dict[int, Estimate], float]:
        """The estimates last played (played again when a lease or the queue changed, or
        after `ESTIMATE_REFRESH_S`) and the seconds since: one play serves every read of a
        view, each entry counted down on its own (`_with_estimate`)."""
        now = self.clock.monotonic()
        key = (*self._counts(), self.waiting.version)
        if key != self._estimated_for or now - self._estimated_at >= ESTIMATE_REFRESH_S:
            self._estimates = self._estimate(now)
            self._estimated_at, self._estimated_for = now, key
        return self._estimates, now - self._estimated_at

    def _estimate(self, now: float) -> dict[int, Estimate]:
        """The estimates of every waiting request, played from what the broker holds now."""
        paused = self._counts()[2]
        available: dict[str, int] = {}
        for uuid in self.slots:
            cap = self.lessor.capacity(uuid)
            if cap is not None:
                available[uuid] = cap.available_mib
        wall = self.clock.wall()
        holdings = [
            Holding(
                lease.gpu_uuids,
                {u: max(lease.granted_mib, lease.observed_mib.get(u, 0)) for u in lease.gpu_uuids},
                lease.project,
                lease.session,
                None if lease.age_from == -math.inf else now - lease.age_from,
                _declared_left_s(lease, now, wall),
                lease.owner,
            )
            for lease in self.lessor.leases.values()
        ]
        queue = [
            Asking(
                w.request_id,
                w.asked_mib,
                w.gpus,
                w.candidates,
                w.project,
                w.session,
                "admissions are paused"
                if paused
                else ("GPU telemetry is unavailable" if w.reason_kind == "telemetry" else ""),
                w.expected_s,
                w.owner,
                now - w.enqueued_at,
            )
            for w in self.waiting.waiters
        ]
        use = self.lessor.granted_by_project() if self.shares.enabled else None
        played = estimate(
            available,
            holdings,
            queue,
            history_of(self.lifetimes),
            self.shares,
            use,
            bypass_s=self.config.max_share_bypass_s,
        )
        for w in self.waiting.waiters:
            until = w.reason_data.get("booked_until_at")
            if isinstance(until, float | int) and w.request_id in played:
                played[w.request_id] = _after_bookings(played[w.request_id], until, wall)
        return played

    def queue_order(self) -> str:
        """How admission orders the queue, in words: "FIFO", or "by [shares]: vision 2,
        others 1" (the weights, `Shares.words`)."""
        return f"by [shares]: {self.shares.words()}" if self.shares.enabled else "FIFO"

    def shares_view(self) -> list[ShareView]:
        """With `[shares]`: each project's weight, share and use now (`Shares.view`); [] without."""
        if not self.shares.enabled:
            return []
        waiting: dict[str, int] = {}
        for w in self.waiting.waiters:
            waiting[w.project] = waiting.get(w.project, 0) + 1
        return [
            {
                "project": p,
                "weight": weight,
                "share": round(share, 3),
                "granted_mib": mib,
                "waiting": n,
            }
            for p, weight, share, mib, n in self.shares.view(
                self.lessor.granted_by_project(), waiting
            )
        ]

    def waiting_entries(self, watched: Container[Waiter]) -> Iterator[tuple[Waiter, QueuedRequest]]:
        """The queue entries of the `watched` waiters that admission has evaluated, in one
        pass over the queue in admission's order."""
        now = self.clock.monotonic()
        played, gone_s = self._played()
        for waiter, ahead in self.waiting.ahead(self.admission.order(self.waiting.waiters)):
            if waiter in watched and waiter.evaluated:
                found = played.get(waiter.request_id)
                yield waiter, _with_estimate(waiter.to_wire(now, ahead), found, gone_s)


def _count_down(found: Estimate, gone_s: float) -> Estimate:
    """`found`, played `gone_s` seconds ago, as of now."""
    if found.eta_s is None:
        return found
    return Estimate(max(0.0, found.eta_s - gone_s), found.reason)


def _with_estimate(entry: QueuedRequest, found: Estimate | None, gone_s: float) -> QueuedRequest:
    """`entry` with its request's estimate `found` (None: not estimated yet), played
    `gone_s` seconds ago, as `eta_s` and `eta_reason`."""
    if found is None:
        entry["eta_s"], entry["eta_reason"] = None, "not estimated yet"
    else:
        found = _count_down(found, gone_s)
        eta_s = None if found.eta_s is None else round(found.eta_s, 1)
        entry["eta_s"], entry["eta_reason"] = eta_s, found.reason
    return entry


def _declared_left_s(lease: Lease, now: float, wall: float) -> float | None:
    """Seconds until `lease`'s declared end (`Lease.expected_s` after its grant), from `now`
    on the monotonic clock; for a lease restored after a restart, whose monotonic grant time
    is unknown, from `wall` and its grant's wall time. None when no duration was declared."""
    if lease.expected_s is None:
        return None
    if lease.granted_at > -math.inf:
        return lease.granted_at + lease.expected_s - now
    return lease.granted_at_wall + lease.expected_s - wall


def _after_bookings(played: Estimate, until_wall: float, wall: float) -> Estimate:
    """A waiting request's estimate when bookings take part in its wait (its reason's
    `booked_until_at`, wall clock): not before those bookings end, and saying so (the play
    of `rbroker.broker.eta` knows only leases). With no estimate it stays without one, the
    booking's end named."""
    until_s = max(0.0, until_wall - wall)
    words = f"bookings hold its memory for another {fmt_duration(max(60.0, until_s))}"
    if played.eta_s is None:
        return Estimate(None, f"{played.reason}; {words}" if played.reason else words)
    if played.eta_s >= until_s:
        return played
    return Estimate(until_s, words)
