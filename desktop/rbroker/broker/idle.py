"""Idleness of leases, measured (issue 42, "idle, measured"; docs/architecture.md §3).

A lease is *active* while its holders showed GPU utilization or its job showed progress
within `idle_after_s` (`BrokerConfig`, default 30 min), *idle* once neither did for that
long, and *unknown* while the utilization of one of its GPUs cannot be read: it is then
never idle (fail closed: missing telemetry is no evidence of idleness).

Evidence of activity, each stamped with the broker's monotonic clock, never the wall clock:
- a sample of a GPU whose `utilization` (`GpuSample.utilization`, NVML's per-process
  utilization since the previous sample) shows a pid above 0 % in the tree of a lease's
  holder, as memory is attributed (the nearest holder with a lease on that GPU in the
  process's chain: a holder's child process counts for it; a descendant holder with a lease
  of its own there counts for itself) — `holders_of`, passed in by the broker;
- a chunk report of the lease's job (`progress`, from `Broker.report_job`).

A GPU's utilization is *known* from the first sample that read it after a sample that did
not (a failed sample, not supported, the process list unknown, another pid namespace);
idleness is measured only over known time, so a lease's `idle_s` counts from the latest of
its last activity, its grant and the moment all its GPUs became known. A lease restored
after a restart counts as active at the restart (what happened before it is not kept).
Costs: a sample walks the leases of the holders it shows busy (`held_on`); a view is O(GPUs
of the lease); the tables are pruned of ended leases and jobs when they grow past twice the
live ones. `changes` counts what may change a lease's state other than the clock, so that a
reader of many leases' states can keep them while it does not move (`states`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterable, Mapping
from enum import StrEnum

from rbroker.broker.clock import Clock
from rbroker.broker.holders import Holder
from rbroker.broker.leases import Lease
from rbroker.broker.sampling import GpuSlot


class IdleState(StrEnum):
    """A lease's idleness (`LeaseView.idle_state`)."""

    ACTIVE = "active"
    IDLE = "idle"
    UNKNOWN = "unknown"


class Idleness:
    """The broker's record of when each lease last showed activity.

    Args:
        clock: the broker's clock (monotonic time only).
        idle_after_s: seconds without activity after which a lease is idle (> 0).
        holders_of: `(slot, pids) → holders` whose trees on `slot` hold any of `pids`
            (`Lessor.holders_of`).
        on: `uuid → active leases on that GPU` (`Lessor.on`).
        live: the active leases by id (`Lessor.leases`), for pruning.
        held_on: `(holder, uuid) → its active leases on that GPU` (`Lessor.held_on`).
    """

    def __init__(
        self,
        clock: Clock,
        idle_after_s: float,
        holders_of: Callable[[GpuSlot, Container[int]], set[Holder]],
        on: Callable[[str], list[Lease]],
        live: Mapping[str, Lease],
        held_on: Callable[[Holder, str], list[Lease]],
    ) -> None:
        self.clock = clock
        self.idle_after_s = idle_after_s
        self._holders_of = holders_of
        self._on = on
        self._live = live
        self._held_on = held_on
        self.started = clock.monotonic()
        self._active_at: dict[str, float] = {}  # lease id → last utilization seen (monotonic)
        self._job_at: dict[str, float] = {}  # job id → last chunk report (monotonic)
        self._known_since: dict[str, float] = {}  # GPU uuid → start of its known readings
        self.changes = 0
        """Moves whenever a lease's state may have changed other than by the clock: a GPU's
        utilization turned known or unknown, or activity of a lease (or its job) that may
        have been idle. While it stays, a lease active at some moment stays active until
        `idle_after_s` after its last activity (`states`)."""

    def sampled(self, slot: GpuSlot, ok: bool) -> None:
        """Take a sample attempt of `slot` (`ok`: it succeeded and `slot.sample` is it)."""
        uuid = slot.uuid
        sample = slot.sample if ok else None
        utilization = sample.utilization if sample is not None else None
        if utilization is None:
            if self._known_since.pop(uuid, None) is not None:
                self.changes += 1
            return
        now = self.clock.monotonic()
        if uuid not in self._known_since:
            self._known_since[uuid] = now
            self.changes += 1
        busy = {pid for pid, percent in utilization.items() if percent > 0}
        if not busy:
            return
        holders = self._holders_of(slot, busy)
        if not holders:
            return
        active_at = self._active_at
        for holder in holders:
            for lease in self._held_on(holder, uuid):
                before = active_at.get(lease.lease_id)
                if before is None or now - before >= self.idle_after_s:
                    self.changes += 1  # it may have been idle: it is active now
                active_at[lease.lease_id] = now
        _prune(self._active_at, self._live, len(self._live))

    def progress(self, job_id: str) -> None:
        """A chunk of job `job_id` was reported: its leases are active now."""
        now = self.clock.monotonic()
        before = self._job_at.get(job_id)
        if before is None or now - before >= self.idle_after_s:
            self.changes += 1  # a lease of the job may have been idle: it is active now
        self._job_at[job_id] = now
        if len(self._job_at) > 2 * len(self._live) + 16:  # a job's leases are live leases
            jobs = {lease.job_id for lease in self._live.values() if lease.job_id is not None}
            _prune(self._job_at, jobs, len(jobs))

    def last_active(self, lease: Lease) -> float | None:
        """The monotonic moment `lease` was last measured active (its activity, its grant,
        the restart, or all its GPUs becoming known, whichever is latest); None while the
        utilization of one of its GPUs is unknown. An idle episode is told by it: a new
        moment is a new episode (`rbroker.broker.reclaim`)."""
        latest = max(lease.granted_at, self.started)
        for uuid in lease.gpu_uuids:  # lean: every tick asks this of every live lease
            since = self._known_since.get(uuid)
            if since is None:
                return None
            if since > latest:
                latest = since
        active = self._active_at.get(lease.lease_id)
        if active is not None and active > latest:
            latest = active
        if lease.job_id is not None:
            progress = self._job_at.get(lease.job_id)
            if progress is not None and progress > latest:
                latest = progress
        return latest

    def state(self, lease: Lease, now: float | None = None) -> tuple[IdleState, float | None]:
        """`(state, idle_s)` of `lease`: `idle_s` the seconds since its last activity as far
        as it was measured (None when unknown)."""
        now = self.clock.monotonic() if now is None else now
        return self._state_at(self.last_active(lease), now)

    def _state_at(self, last: float | None, now: float) -> tuple[IdleState, float | None]:
        """`state` of a lease last active at `last` (monotonic; None: unknown) at `now`."""
        if last is None:
            return IdleState.UNKNOWN, None
        idle_s = max(0.0, now - last)
        return (IdleState.IDLE if idle_s >= self.idle_after_s else IdleState.ACTIVE), idle_s

    def states(self, leases: Iterable[Lease], now: float) -> tuple[list[IdleState], float]:
        """`(states, steady_since)`: the state of each of `leases` at `now` (monotonic), and
        the earliest last activity of those active (`inf` when none is). While `changes`
        does not move, none of these states changes before `steady(steady_since, now)` turns
        False (a later activity only moves a lease's last activity later)."""
        states = []
        steady_since = math.inf
        for lease in leases:
            last = self.last_active(lease)
            state = self._state_at(last, now)[0]
            if state is IdleState.ACTIVE and last is not None and last < steady_since:
                steady_since = last
            states.append(state)
        return states, steady_since

    def steady(self, steady_since: float, now: float) -> bool:
        """Whether a lease last active at `steady_since` (monotonic) is still active at `now`,
        by the same test as `state`: so are all the leases `states` read, while `changes`
        has not moved."""
        return max(0.0, now - steady_since) < self.idle_after_s

    def idle_on(self, uuid: str) -> list[float]:
        """The `idle_s` of the idle leases on GPU `uuid`, longest first."""
        now = self.clock.monotonic()
        found = []
        for lease in self._on(uuid):
            state, idle_s = self.state(lease, now)
            if state is IdleState.IDLE and idle_s is not None:
                found.append(idle_s)
        return sorted(found, reverse=True)


def _prune(table: dict[str, float], keep: Container[str], kept: int) -> None:
    """Drop the keys of `table` not in `keep` once it holds more than twice `kept` + 16."""
    if len(table) > 2 * kept + 16:
        for key in [k for k in table if k not in keep]:
            del table[key]
