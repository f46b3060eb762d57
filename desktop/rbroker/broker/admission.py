"""Admission: which GPUs a request may use, whether it can ever fit, the FIFO admission
pass (or by shares per project, `rbroker.broker.shares`) with placement, and the reasons
(with their numbers) a request waits or is refused.

One pass is synchronous on the event loop, so two requests can never both pass the capacity
check (docs/architecture.md §2). It reads the GPUs' samples and the lessor's books and decides;
every grant goes through the `grant` callback, which books it before the next waiter is
checked, so one pass may make several grants from the same sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from rbroker.base.display import ahead_words, explain, fmt_mib, short_uuid
from rbroker.base.when import fmt_duration
from rbroker.broker.bookings import Bookings
from rbroker.broker.capacity import Capacity
from rbroker.broker.clock import Clock
from rbroker.broker.config import BrokerConfig
from rbroker.broker.leases import Lease, Waiter
from rbroker.broker.lessor import Choice, Lessor
from rbroker.broker.sampling import GpuSlot
from rbroker.broker.shares import Shares, turns_bypassing
from rbroker.broker.waiting import WaitQueue
from rbroker.gpu.nvml import describe
from rbroker.gpu.types import TelemetryState
from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.localapi import AcquireParams


@dataclass(frozen=True, slots=True)
class NvmlProblem:
    """NVML could not be initialised: `reason` (e.g. `version_mismatch`), the same in
    `words`, and whether the OS shows an NVIDIA GPU at all (`device_present`)."""

    reason: str
    words: str
    device_present: bool


Grant = Callable[[Waiter, list[Choice], float], None]
Emit = Callable[[str, dict[str, object]], None]


class Admission:
    """Admission decisions over `slots` (by UUID) and the `lessor`'s leases."""

    def __init__(
        self,
        slots: dict[str, GpuSlot],
        lessor: Lessor,
        clock: Clock,
        config: BrokerConfig,
        shares: Shares | None = None,
        bookings: Bookings | None = None,
    ) -> None:
        self.slots = slots
        self.lessor = lessor
        self.clock = clock
        self.config = config
        self.shares = shares or Shares()
        self.bookings = bookings
        self.problem: NvmlProblem | None = None
        # `uuid → idle_s` of the idle leases there, longest first (`Idleness.idle_on`); read
        # only when a capacity reason is written
        self.idle_on: Callable[[str], list[float]] | None = None

    def order(self, waiters: list[Waiter]) -> list[Waiter]:
        """`waiters` (arrival order) in the order a pass takes them now, nothing granted:
        FIFO, or by shares (`rbroker.broker.shares`) after those waiting past the bypass
        bound (`_turns`), each claim of a booking ahead of the requests that came after its
        booking was accepted (§2a)."""
        if not self.shares.enabled:
            return _claims_first(waiters)
        return list(self._turns(waiters, dict(self.lessor.granted_by_project())))

    def beside_bookings(self, waiter: Waiter, caps: dict[str, Capacity]) -> dict[str, Capacity]:
        """`caps` as `waiter` sees them beside the bookings (§2a): on each of its GPUs with
        live bookings, `booked_mib` is the peak of those its horizon overlaps
        (`Bookings.horizon`), less the booking it claims; `caps` itself when none do."""
        bookings = self.bookings
        if bookings is None:
            return caps
        seen = caps
        t0 = t1 = 0.0
        for u in waiter.candidates:
            cap = caps.get(u)
            if cap is None or not bookings.any_on(u):
                continue
            if seen is caps:
                seen = dict(caps)
                t0, t1 = bookings.horizon(waiter.expected_s)
            booked = bookings.peak_mib(
                u, t0, t1, exclude=waiter.booking_id, accepted_by=waiter.enqueued_at
            )
            if booked:
                seen[u] = replace(cap, booked_mib=booked)
        return seen

    def _turns(self, waiters: list[Waiter], use: dict[str, int]) -> Iterator[Waiter]:
        """A pass's order with `[shares]`: first, in arrival order, each project's first
        request when it has waited longer than `BrokerConfig.max_share_bypass_s`, so that it
        holds its GPUs for itself (a request that does not fit blocks its GPUs for those
        after it); then the rest by shares (`Shares.turns`, reading `use` as grants add to
        it). Without the bound a stream of small requests of a project using less than its
        share passed a large request of another for ever (27 s where FIFO took 3 s). Only the
        head of each project's line goes first, so requests queued early do not turn the
        whole queue into FIFO: the shares still order everything else."""
        claims = [w for w in waiters if _claims(w)]
        if claims:
            waiters = [w for w in waiters if not _claims(w)]
        cutoff = self.clock.monotonic() - self.config.max_share_bypass_s
        turns = turns_bypassing(self.shares, waiters, use, lambda w: w.enqueued_at <= cutoff)
        if not claims:
            return turns
        return iter(_with_claims(claims, list(turns)))

    # -- at request time -----------------------------------------------------------------------
    def candidates(self, gpu_uuid: str | None, gpus: int, mib: int) -> tuple[str, ...]:
        """The GPUs a request (or a booking) of `mib` on `gpus` GPUs, pinned to `gpu_uuid` or
        not, may be placed on, by index: the pinned one, or every GPU whose capacity is known
        (all of them when too few are).

        Raises:
            RpcError: `infeasible` for an unknown pinned GPU, `invalid_params` for a pin
                with `gpus` ≠ 1.
        """
        if gpu_uuid is not None:
            if gpu_uuid not in self.slots:
                known = ", ".join(self.slots) or "none"
                raise RpcError(
                    ErrorCode.INFEASIBLE,
                    f"infeasible: no GPU {gpu_uuid} on this computer (known: {known})",
                    gpu_uuid=gpu_uuid,
                    requested_mib=mib,
                )
            if gpus != 1:
                raise RpcError(
                    ErrorCode.INVALID_PARAMS,
                    f"gpu_uuid pins one GPU, but gpus={gpus} were asked for",
                    field="gpus",
                )
            return (gpu_uuid,)
        return self.unpinned_candidates(gpus)

    def unpinned_candidates(self, gpus: int) -> tuple[str, ...]:
        """Every GPU whose capacity is known, by index (all of them when fewer than `gpus`)."""
        ordered = sorted(self.slots, key=lambda u: self.slots[u].info.index)
        usable = [
            u for u in ordered if self.slots[u].telemetry is not TelemetryState.UNKNOWN_CAPACITY
        ]
        return tuple(usable if len(usable) >= gpus else ordered)

    def never_fits(self, mib: int, gpus: int, candidates: tuple[str, ...]) -> RpcError | None:
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

    def check_feasible(self, params: AcquireParams, candidates: tuple[str, ...]) -> None:
        """Refuse at once what can never be granted.

        Raises:
            RpcError: `infeasible` (too few GPUs, more than total − headroom);
                `telemetry_unavailable` (the pinned GPU is lost, or the capacity of too
                many candidates is unknown).
        """
        if not candidates and self.problem is not None:
            self._check_nvml_problem(params)
            return  # a GPU exists but NVML fails: the request waits, fail-closed
        if params.gpus > len(candidates):
            raise RpcError(
                ErrorCode.INFEASIBLE,
                f"infeasible: {params.gpus} GPUs requested, this computer has {len(candidates)}",
                requested_gpus=params.gpus,
                gpu_count=len(candidates),
            )
        never = self.never_fits(params.mib, params.gpus, candidates)
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
            names = ", ".join(short_uuid(u) for u in unknown)
            if self.slots[unknown[0]].telemetry_reason == "used_unknown":
                raise RpcError(
                    ErrorCode.TELEMETRY_UNAVAILABLE,
                    f"refused: the memory in use on {names} is unknown: {describe('used_unknown')}",
                    gpu_uuid=unknown[0],
                    reason="used_unknown",
                    telemetry=TelemetryState.UNKNOWN_CAPACITY.value,
                )
            raise RpcError(
                ErrorCode.TELEMETRY_UNAVAILABLE,
                f"refused: the memory capacity of {names} "
                "is unknown (NVML does not support the memory query on it); set a capacity "
                "override for its UUID to lease it",
                gpu_uuid=unknown[0],
                reason="capacity_unknown",
                telemetry=TelemetryState.UNKNOWN_CAPACITY.value,
            )

    def _check_nvml_problem(self, params: AcquireParams) -> None:
        """Refuse at once while NVML does not initialise: `infeasible` where no NVIDIA GPU
        exists, `telemetry_unavailable` where one exists but may not be waited for.

        Raises:
            RpcError: as above; nothing when the request may wait for NVML.
        """
        problem = self.problem
        assert problem is not None
        if not problem.device_present:
            raise RpcError(
                ErrorCode.INFEASIBLE,
                f"infeasible: this computer has no NVIDIA GPU ({problem.words}); to try "
                "rbroker without one, run the broker with --simulate",
                reason=problem.reason,
                gpu_count=0,
            )
        if params.wait_s <= 0:
            raise RpcError(
                ErrorCode.TELEMETRY_UNAVAILABLE,
                f"refused: telemetry unavailable: {problem.words}",
                reason=problem.reason,
                telemetry=TelemetryState.UNAVAILABLE.value,
            )

    # -- the pass ------------------------------------------------------------------------------
    def run(self, waiting: WaitQueue, paused: bool, grant: Grant, emit: Emit) -> None:
        """One atomic admission pass over the queue, in FIFO order (see module docstring),
        or with `[shares]` in the order of `rbroker.broker.shares` (each grant of the pass
        counted in its project's use as it is made).

        A waiter is granted when enough of its candidates are fresh and fit, unless
        admissions are `paused` or a GPU still waiting for its fresh sample would be placed
        first; otherwise it gets its reason and blocks its GPUs for the waiters behind it.
        """
        if not waiting.waiters:
            return
        now = self.clock.monotonic()
        max_age = self.config.max_sample_age_s
        fresh = {u for u, s in self.slots.items() if s.fresh(now, max_age)}
        caps: dict[str, Capacity] = {}
        for u in fresh:
            cap = self.lessor.capacity(u)
            if cap is not None:
                caps[u] = cap
        blocked: dict[str, int] = {}
        use = self.lessor.granted_by_project() if self.shares.enabled else {}
        for waiter in self._turns(list(waiting.waiters), use):
            if waiter.future.done():
                waiting.remove(waiter)
                continue
            never = self.never_fits(waiter.asked_mib, waiter.gpus, waiter.candidates)
            if never is not None:  # a GPU shrank while it waited: refuse, never wait forever
                waiting.remove(waiter, never)
                emit("queue", {"request_id": waiter.request_id})
                continue
            chosen, pending, seen, fits = self._choose(waiter, caps, blocked, paused)
            if chosen:
                grant(waiter, chosen, now)
                if self.shares.enabled:
                    use[waiter.project] = (
                        use.get(waiter.project, 0) + waiter.asked_mib * waiter.gpus
                    )
                for u, *_ in fits[: waiter.gpus]:
                    cap = self.lessor.capacity(u)
                    if cap is not None:
                        caps[u] = cap
                continue
            confirming = [] if paused else self._awaits_release_sample(waiter, seen, blocked, fits)
            if confirming:
                self._explain_release_wait(waiter, confirming, blocked, now)
            else:
                self._explain_wait(waiter, seen, blocked, pending, paused)
            for u in waiter.candidates:
                blocked[u] = blocked.get(u, 0) + 1
            for u in pending:
                self.slots[u].kick.set()

    def _choose(
        self, waiter: Waiter, caps: dict[str, Capacity], blocked: dict[str, int], paused: bool
    ) -> tuple[list[Choice], list[str], dict[str, Capacity], list[Choice]]:
        """A pass's decision for `waiter`, in its turn: `(chosen, pending, seen, fits)`.

        `caps` holds the capacity of the GPUs with a fresh sample (at least those among the
        waiter's candidates: no other is read), `blocked` the GPUs that waiters before it in
        this pass did not get (with how many). `chosen` is the `waiter.gpus` GPUs it is
        granted, in placement order, or [] when it waits: too few of its unblocked GPUs fit
        it beside the bookings, admissions are `paused`, or a GPU whose fresh sample is still
        `pending` would rank before one chosen. `seen` is `caps` beside the bookings and
        `fits` every GPU that fits, ranked (for the reason of a wait)."""
        slots = self.slots
        pending = [
            u
            for u in waiter.candidates
            if u not in caps and slots[u].telemetry is TelemetryState.OK
        ]
        seen = self.beside_bookings(waiter, caps)
        fits: list[Choice] = []
        for u in waiter.candidates:
            if u in seen and u not in blocked:
                claim_mib = self.claim(waiter, slots[u])
                extra_mib = waiter.asked_mib - claim_mib
                if seen[u].fits(extra_mib):
                    fits.append(Choice(u, seen[u], claim_mib, extra_mib))
        if len(fits) > 1:
            reverse = waiter.placement == "spread"
            fits.sort(key=lambda c: self.rank(c.gpu_uuid, c.cap), reverse=reverse)
        if (
            len(fits) >= waiter.gpus
            and not paused
            and not self._pending_ranks_better(waiter, pending, blocked, fits[waiter.gpus - 1])
        ):
            return fits[: waiter.gpus], pending, seen, fits
        return [], pending, seen, fits

    def grant_at_once(self, waiter: Waiter, paused: bool, now: float) -> list[Choice]:
        """The GPUs that `run` over a queue holding `waiter` alone would grant it at `now`
        (monotonic), or [] when that pass would not grant it (it refuses it, or the waiter
        waits: the pass then gives the reason). Nothing is booked, set or kicked.

        The uncontended acquire's fast path (issue 44): with nobody else waiting, the pass
        takes `waiter` first with no GPU blocked and reads no sample but its candidates', so
        this reads just those (not every GPU's capacity) and decides by the same `_choose`.
        tests/desktop/broker/admission/test_fast_path.py checks the two agree over random
        states."""
        if self.never_fits(waiter.asked_mib, waiter.gpus, waiter.candidates) is not None:
            return []  # the pass refuses it
        max_age = self.config.max_sample_age_s
        caps: dict[str, Capacity] = {}
        for u in waiter.candidates:
            if self.slots[u].fresh(now, max_age):
                cap = self.lessor.capacity(u)
                if cap is not None:
                    caps[u] = cap
        return self._choose(waiter, caps, {}, paused)[0]

    def _awaits_release_sample(
        self, waiter: Waiter, caps: dict[str, Capacity], blocked: dict[str, int], fits: list[Choice]
    ) -> list[str]:
        """The GPUs on which `waiter` would fit once a sample confirms the memory released
        there (the release rule keeps a released lease's unconfirmed MiB booked until a
        sample that started after the release), when with them enough of its GPUs would fit:
        it then waits for that sample instead of being refused or told there is no room,
        also with `wait_s` 0 — once: a sample that started after it began waiting decides.
        Empty otherwise."""
        chosen = {c.gpu_uuid for c in fits}
        since = waiter.release_wait_since
        confirming = []
        for u in waiter.candidates:
            cap = caps.get(u)
            unconfirmed = self.lessor.unconfirmed_mib(u)
            if cap is None or u in blocked or u in chosen or unconfirmed <= 0:
                continue
            sample = self.slots[u].sample
            if since is not None and sample is not None and sample.started_at > since:
                continue  # the sample it waited for came: it decides
            extra_mib = waiter.asked_mib - self.claim(waiter, self.slots[u])
            if replace(cap, outstanding_mib=max(0, cap.outstanding_mib - unconfirmed)).fits(
                extra_mib
            ):
                confirming.append(u)
        return confirming if len(fits) + len(confirming) >= waiter.gpus else []

    def _explain_release_wait(
        self, waiter: Waiter, confirming: list[str], blocked: dict[str, int], now: float
    ) -> None:
        """Make `waiter` wait for the sample that confirms memory released on `confirming`
        (asked for at once, coalesced as every release's sample is), with its reason."""
        if waiter.release_wait_since is None:
            waiter.release_wait_since = now
        ahead = max((blocked.get(u, 0) for u in waiter.candidates), default=0)
        released = sum(self.lessor.unconfirmed_mib(u) for u in confirming)
        waiter.reason = (
            f"waiting for a GPU sample to confirm {fmt_mib(released)} released on "
            f"{', '.join(short_uuid(u) for u in confirming)}"
            + (f"; {ahead_words(ahead)}" if ahead else "")
        )
        waiter.reason_kind = "sampling"
        waiter.reason_data = {"ahead": ahead, "released_unconfirmed_mib": released}
        for u in confirming:
            self.slots[u].sample_soon(self.config.release_sample_gap_s)

    def explain_behind(self, waiter: Waiter, ahead_on: Callable[[str], int], paused: bool) -> None:
        """Give a new waiter queued behind `ahead_on(u)` > 0 others on each of its GPUs the
        reason an admission pass would give it, without the pass (it cannot be granted
        before them); a GPU whose fresh sample is pending is kicked."""
        now = self.clock.monotonic()
        caps: dict[str, Capacity] = {}
        for u in waiter.candidates:
            cap = self.lessor.capacity(u)
            if cap is not None and self.slots[u].fresh(now, self.config.max_sample_age_s):
                caps[u] = cap
        pending = [
            u
            for u in waiter.candidates
            if u not in caps and self.slots[u].telemetry is TelemetryState.OK
        ]
        blocked = {u: ahead_on(u) - 1 for u in waiter.candidates}  # less the waiter itself
        self._explain_wait(waiter, self.beside_bookings(waiter, caps), blocked, pending, paused)
        for u in pending:
            self.slots[u].kick.set()

    def probe(self, waiter: Waiter, ahead_on: Callable[[str], int], paused: bool) -> list[Choice]:
        """The GPUs a pass would grant `waiter` now (a request not queued: `rbroker watch`),
        or [] with its reason set as a pass would set it: behind the `ahead_on(u)` requests
        waiting on each GPU (FIFO: none of a GPU with a waiter is free for it), beside the
        bookings, on fresh samples only; paused, nothing. Nothing is booked."""
        now = self.clock.monotonic()
        caps: dict[str, Capacity] = {}
        for u in waiter.candidates:
            cap = self.lessor.capacity(u)
            if cap is not None and self.slots[u].fresh(now, self.config.max_sample_age_s):
                caps[u] = cap
        seen = self.beside_bookings(waiter, caps)
        blocked = {u: n for u in waiter.candidates if (n := ahead_on(u)) > 0}
        fits = [
            Choice(u, seen[u], 0, waiter.asked_mib)
            for u in waiter.candidates
            if u in seen and u not in blocked and seen[u].fits(waiter.asked_mib)
        ]
        fits.sort(key=lambda c: self.rank(c.gpu_uuid, c.cap), reverse=waiter.placement == "spread")
        if len(fits) >= waiter.gpus and not paused:
            return fits[: waiter.gpus]
        pending = [
            u
            for u in waiter.candidates
            if u not in caps and self.slots[u].telemetry is TelemetryState.OK
        ]
        self._explain_wait(waiter, seen, blocked, pending, paused)
        for u in pending:
            self.slots[u].kick.set()
        return []

    def helped_by_ending(self, waiter: Waiter, lease: Lease) -> bool:
        """Whether ending `lease` would let `waiter` in: it does not fit on `waiter.gpus` of
        its candidates now, and does once what `lease` holds unallocated there (its grant
        less the use observed of it: an end kills nothing, so that use stays) comes free;
        fresh samples only, beside the bookings. The queue's order is not weighed (any
        waiter the end would let in counts). Source of the rule: issue 42's "reclaim only
        while someone waits for that memory" — a request that could not use the memory
        (more than the end frees, or GPUs held by others) never ends a lease."""
        now = self.clock.monotonic()
        caps: dict[str, Capacity] = {}
        for u in waiter.candidates:
            cap = self.lessor.capacity(u)
            if cap is not None and self.slots[u].fresh(now, self.config.max_sample_age_s):
                caps[u] = cap
        seen = self.beside_bookings(waiter, caps)
        freed = {
            u: max(0, lease.granted_mib - lease.observed_mib.get(u, 0)) for u in lease.gpu_uuids
        }
        fit_now = fit_after = 0
        for u, cap in seen.items():
            extra_mib = waiter.asked_mib - self.claim(waiter, self.slots[u])
            if cap.fits(extra_mib):
                fit_now += 1
                fit_after += 1
            elif freed.get(u, 0) > 0:
                after = replace(cap, outstanding_mib=max(0, cap.outstanding_mib - freed[u]))
                fit_after += after.fits(extra_mib)
        return fit_now < waiter.gpus <= fit_after

    def claim(self, waiter: Waiter, slot: GpuSlot) -> int:
        """MiB of the holder's existing use that an adopting request takes over on `slot`."""
        if not waiter.adopt:
            return 0
        return min(waiter.asked_mib, self.lessor.baseline_now(waiter.holder, slot))

    def rank(self, uuid: str, cap: Capacity) -> tuple[int, int]:
        """Placement order: `pack` takes the smallest, `spread` the largest."""
        return (cap.available_mib, self.slots[uuid].info.index)

    def _pending_ranks_better(
        self, waiter: Waiter, pending: list[str], blocked: dict[str, int], last_chosen: Choice
    ) -> bool:
        """True when a GPU still waiting for its fresh sample would, by its previous sample,
        be placed before one of the GPUs chosen now: the request waits for that sample
        rather than being placed by whichever GPU happened to be sampled last."""
        worst = self.rank(last_chosen[0], last_chosen[1])
        for u in pending:
            cap = self.lessor.capacity(u)
            if u in blocked or cap is None:
                continue
            if not cap.fits(waiter.asked_mib - self.claim(waiter, self.slots[u])):
                continue
            key = self.rank(u, cap)
            if (key > worst) if waiter.placement == "spread" else (key < worst):
                return True
        return False

    # -- reasons -------------------------------------------------------------------------------
    def _explain_wait(
        self,
        waiter: Waiter,
        caps: dict[str, Capacity],
        blocked: dict[str, int],
        pending: list[str],
        paused: bool,
    ) -> None:
        """Set the waiter's reason (text, kind and numbers) for this pass."""
        ahead = max((blocked.get(u, 0) for u in waiter.candidates), default=0)
        ahead_txt = f"; {ahead_words(ahead)}" if ahead else ""
        if paused:
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
        if not waiter.candidates:  # no GPU enumerated: NVML does not initialise
            words = self.problem.words if self.problem is not None else "no GPU enumerated yet"
            waiter.reason = f"waiting: telemetry unavailable: {words}" + ahead_txt
            waiter.reason_kind = "telemetry"
            waiter.reason_data = {
                "telemetry": TelemetryState.UNAVAILABLE.value,
                "reason": self.problem.reason if self.problem is not None else "not_enumerated",
                "ahead": ahead,
            }
            return
        known = [u for u in waiter.candidates if u in caps]
        if len(known) >= waiter.gpus:
            # the GPU that blocks: the K-th roomiest of the K needed at once (the roomiest
            # alone named, for a 2-GPU request, the GPU that had room)
            by_room = sorted(known, key=lambda u: caps[u].available_mib, reverse=True)
            blocking = by_room[waiter.gpus - 1]
            cap = caps[blocking]
            waiter.reason = (
                f"waiting: {explain(blocking, cap)}; {fmt_mib(waiter.asked_mib)} requested"
                + ahead_txt
            )
            if waiter.gpus > 1:
                room = sum(1 for u in known if caps[u].available_mib >= waiter.asked_mib)
                waiter.reason += f"; {waiter.gpus} GPUs needed at once, {room} with room"
            idle = self.idle_on(blocking) if self.idle_on is not None else []
            if idle:
                longest = fmt_duration(idle[0])
                waiter.reason += (
                    f"; 1 lease on it idle {longest}"
                    if len(idle) == 1
                    else f"; {len(idle)} leases on it idle (longest {longest})"
                )
            waiter.reason_kind = "capacity"
            waiter.reason_data = {
                "gpu_uuid": blocking,
                "requested_mib": waiter.asked_mib,
                "ahead": ahead,
                **cap.as_dict(),
            }
            if idle:
                waiter.reason_data["idle_leases"] = len(idle)
                waiter.reason_data["idle_s"] = round(idle[0], 1)
            if cap.booked_mib and self.bookings is not None:
                self._explain_bookings(waiter, blocking)
            return
        # fewer GPUs with known capacity than the request needs: the unknown ones block
        states = {u: self.slots[u] for u in waiter.candidates if u not in caps} or {
            u: self.slots[u] for u in waiter.candidates
        }
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

    def _explain_bookings(self, waiter: Waiter, uuid: str) -> None:
        """Add to a capacity reason the bookings that take part on `uuid`: when the first
        starts (`booked_from_at`, wall clock) and their ids, so a request says it waits for
        a booking (and for how long: until they end, `booked_until_at`)."""
        assert self.bookings is not None
        t0, t1 = self.bookings.horizon(waiter.expected_s)
        _, by = self.bookings.peak(
            uuid, t0, t1, exclude=waiter.booking_id, accepted_by=waiter.enqueued_at
        )
        if not by:
            return
        first = min(b.start_at for b in by)
        # a held booking nobody claims is over at its lapse, if that comes before its end
        until = max(min(b.end_at, self.bookings.claim_until(b) or b.end_at) for b in by)
        owners = sorted({b.owner for b in by})
        when = "now" if first <= t0 else f"in {max(1, round((first - t0) / 60))} min"
        waiter.reason += (
            f"; {fmt_mib(sum(self.bookings.protected_mib(b) for b in by))} MiB booked "
            f"from {when} by {', '.join(owners)}"
        )
        waiter.reason_data["booked_from_at"] = first
        waiter.reason_data["booked_until_at"] = until
        waiter.reason_data["booking_ids"] = [b.booking_id for b in by]

    def wait_error(self, waiter: Waiter) -> RpcError:
        """The error a wait ends with: `wait_timeout` after a `wait_s` > 0, else
        `telemetry_unavailable` or `capacity_unavailable`, with the last reason's numbers."""
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


def _claims(waiter: Waiter) -> bool:
    """A new lease claiming a booking (not a growth of one)."""
    return waiter.booking_id is not None and waiter.resize_of is None


def _claims_first(waiters: list[Waiter]) -> list[Waiter]:
    """`waiters` (arrival order) with each claim of a booking moved ahead of the requests
    that started waiting after its booking was accepted (`_with_claims`)."""
    if not any(_claims(w) for w in waiters):
        return waiters
    return _with_claims([w for w in waiters if _claims(w)], [w for w in waiters if not _claims(w)])


def _with_claims(claims: list[Waiter], turns: list[Waiter]) -> list[Waiter]:
    """`turns` (the order of the other requests) with each claim placed before the first of
    them that started waiting after the claim's booking was accepted: a booking goes ahead
    of the requests that came after it, never of those already waiting when it was made
    (booking "now" is no way past the queue; §2a)."""
    pending = sorted(claims, key=_claim_key)
    placed: list[Waiter] = []
    for waiter in turns:
        while pending and _claim_key(pending[0]) <= waiter.enqueued_at:
            placed.append(pending.pop(0))
        placed.append(waiter)
    return placed + pending


def _claim_key(waiter: Waiter) -> float:
    """Where a claim stands in the queue: when its booking was accepted (its own arrival when
    that is not known, e.g. restored after a restart)."""
    return waiter.booked_at if waiter.booked_at is not None else waiter.enqueued_at
