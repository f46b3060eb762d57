"""Idle leases told and, only by policy, reclaimed (issue 42, "idle, told and reclaimed";
docs/architecture.md §3 "Idle").

An *idle episode* of a lease runs from the moment it becomes idle (`Idleness`: no
utilization of its holders and no chunk of its job for `idle_after_s`) until it shows
activity again (a busy sample or a chunk report) or its utilization becomes unknown; it is
told by its start, the lease's last activity (`Idleness.last_active`), so a new start is a
new episode. Per episode, each at most once, `IdleWatch.turn` (on the broker's tick) yields:

- `idle`: the lease became idle;
- `reclaim_soon`: it will be reclaimed (`RECLAIM_WARNING_S`, 10 min, before the end);
- `reclaimed`: it was ended, state `revoked`, reason e.g. "reclaimed: idle 4 h while 2
  requests waited". Nothing is killed: memory its processes still use after the end shows
  as over grant, as for any ended lease.

A lease is reclaimable while `IdleReclaim.reclaim_after_s` is set, its project is not in
`exempt_projects` (ignoring case) and, with `only_when_waiting`, a request waits that the
lease's end would let in (`Admission.helped_by_ending`: it does not fit now on enough of its
GPUs and would with what the lease holds unallocated; not its own growth): a request that
could not use the memory — more than the end frees, or GPUs held by others — never ends a
lease. The warning
is given once it is reclaimable and idle for `reclaim_after_s − RECLAIM_WARNING_S` (at once
when that is not positive); the end comes once it is reclaimable, idle for `reclaim_after_s`
and warned at least `min(RECLAIM_WARNING_S, reclaim_after_s)` seconds before. All times are
on the broker's monotonic clock. Costs: a turn walks every live lease only once one may have
become idle since the last walk (`IdleWatch.turn`: a lease's last activity only moves later
while its GPUs stay known, so the walk records the earliest moment any lease may turn idle);
between walks it reads only the reclaimable leases in an idle episode, O(idle leases ×
waiters × GPUs). Before, every turn (the tick's, every 0.1 s) walked every live lease.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rbroker.base.when import fmt_duration
from rbroker.broker.clock import Clock
from rbroker.broker.config import IdleReclaim
from rbroker.broker.idle import Idleness
from rbroker.broker.leases import Lease, Waiter

RECLAIM_WARNING_S = 600.0
"""How long before a reclaim its holder is warned (`reclaim_soon`; issue 42: 10 min)."""


@dataclass(frozen=True, slots=True)
class IdleNotice:
    """One notice of an idle episode: `kind` `idle`, `reclaim_soon` or `reclaimed`,
    `idle_s` the seconds idle so far, `message` the words for its holder."""

    lease: Lease
    kind: str
    idle_s: float
    message: str


@dataclass(slots=True)
class _Episode:
    start: float  # monotonic: the lease's last activity
    warned_at: float | None = None  # monotonic, when `reclaim_soon` was told


def _requests(n: int) -> str:
    return "1 request" if n == 1 else f"{n} requests"


class IdleWatch:
    """Tells idle episodes and finds the leases to reclaim.

    Args:
        clock: the broker's clock (monotonic time only).
        idle: the idleness record (`Idleness`).
        policy: when to reclaim (`IdleReclaim`).
        live: the active leases by id (`Lessor.leases`).
        queue: the waiting requests (`WaitQueue.waiters`).
        helped: `(waiter, lease) → whether ending lease would let waiter in`
            (`Admission.helped_by_ending`).
    """

    def __init__(
        self,
        clock: Clock,
        idle: Idleness,
        policy: IdleReclaim,
        live: Mapping[str, Lease],
        queue: Sequence[Waiter],
        helped: Callable[[Waiter, Lease], bool],
    ) -> None:
        self.clock = clock
        self.idle = idle
        self.policy = policy
        self._live = live
        self._queue = queue
        self._helped = helped
        self._exempt = {p.casefold() for p in policy.exempt_projects}
        # lease id → its idle episode, in the order of `live` (made only by a whole walk)
        self._episodes: dict[str, _Episode] = {}
        self._calm_until = -math.inf  # monotonic: no lease without an episode is idle before

    def waiting_on(self, lease: Lease) -> int:
        """How many waiting requests `lease`'s end would let in (`helped`; its own growth not
        counted): one that could not use the memory never counts."""
        gpus = set(lease.gpu_uuids)
        return sum(
            1
            for w in self._queue
            if not w.future.done()
            and w.resize_of != lease.lease_id
            and not gpus.isdisjoint(w.candidates)
            and self._helped(w, lease)
        )

    def turn(self) -> tuple[list[IdleNotice], list[IdleNotice]]:
        """`(notices, reclaims)`: the `idle` and `reclaim_soon` notices due now, and the
        `reclaimed` notices of the leases to end now (the caller ends them; their
        `message` is the end's reason).

        A lease's last activity only moves later while its GPUs are known, and a lease whose
        GPUs are unknown, or one granted later, turns idle no sooner than `idle_after_s` from
        now: so a turn walks every live lease only once the earliest moment a lease may turn
        idle, recorded by the last walk, has come. Between walks it reads only the episodes'
        leases that the policy may reclaim (the waiting requests change); an episode that
        ended meanwhile (activity, or its GPU's utilization unknown) is told by its start at
        the next walk, where a new start is a new episode."""
        now = self.clock.monotonic()
        notices: list[IdleNotice] = []
        reclaims: list[IdleNotice] = []
        for lease_id in [k for k in self._episodes if k not in self._live]:
            del self._episodes[lease_id]
        episodes: dict[str, _Episode] = {}  # the episodes kept, in the order of `live`
        episode: _Episode | None
        if now >= self._calm_until:
            calm_until = now + self.idle.idle_after_s
            for lease in list(self._live.values()):
                episode, idle_at = self._read(lease, now, notices, reclaims)
                calm_until = min(calm_until, idle_at)
                if episode is not None:
                    episodes[lease.lease_id] = episode
            self._calm_until = calm_until
        else:
            for lease_id, kept in self._episodes.items():
                lease = self._live[lease_id]
                episode = kept
                if self._reclaimable(lease):  # one that turns active turns idle after a walk
                    episode, _ = self._read(lease, now, notices, reclaims)
                if episode is not None:
                    episodes[lease_id] = episode
        self._episodes = episodes
        return notices, reclaims

    def _read(
        self, lease: Lease, now: float, notices: list[IdleNotice], reclaims: list[IdleNotice]
    ) -> tuple[_Episode | None, float]:
        """Read `lease` at `now` (monotonic): `(episode, idle_at)`, its idle episode (None
        when it is not idle) and the monotonic moment it may turn idle (`inf` when it is
        idle, or unknown: it turns idle no sooner than `idle_after_s` after it is known);
        the notices and the reclaim due are added to `notices` and `reclaims`."""
        idle_after_s = self.idle.idle_after_s
        start = self.idle.last_active(lease)  # what `Idleness.state` says, read once
        if start is None:
            return None, math.inf
        if now - start < idle_after_s:
            return None, start + idle_after_s
        idle_s = now - start
        episode = self._episodes.get(lease.lease_id)
        if episode is None or episode.start != start:
            episode = _Episode(start)
            notices.append(IdleNotice(lease, "idle", idle_s, self._idle_words(lease, idle_s)))
        reclaim_after_s = self.policy.reclaim_after_s
        if reclaim_after_s is None or not self._reclaimable(lease):
            return episode, math.inf
        waiting = self.waiting_on(lease)
        if self.policy.only_when_waiting and waiting == 0:
            return episode, math.inf
        if episode.warned_at is None:
            if idle_s < reclaim_after_s - RECLAIM_WARNING_S:
                return episode, math.inf
            episode.warned_at = now
            notices.append(
                IdleNotice(lease, "reclaim_soon", idle_s, self._soon_words(lease, waiting))
            )
        lead_s = min(RECLAIM_WARNING_S, reclaim_after_s)
        if idle_s >= reclaim_after_s and now - episode.warned_at >= lead_s:
            reason = f"reclaimed: idle {fmt_duration(idle_s)}"
            if waiting:
                reason += f" while {_requests(waiting)} waited"
            reclaims.append(IdleNotice(lease, "reclaimed", idle_s, reason))
        return episode, math.inf

    def _reclaimable(self, lease: Lease) -> bool:
        """Whether `[idle]`'s policy may reclaim `lease` (a reclaim time set, its project not
        exempt), waiting requests aside."""
        return (
            self.policy.reclaim_after_s is not None and lease.project.casefold() not in self._exempt
        )

    def _idle_words(self, lease: Lease, idle_s: float) -> str:
        words = (
            f"lease {lease.lease_id} is idle: no GPU use by its processes and no chunk "
            f"reported for {fmt_duration(idle_s)}"
        )
        after = self.policy.reclaim_after_s
        if after is not None and lease.project.casefold() not in self._exempt:
            when = " while others wait for its GPU" if self.policy.only_when_waiting else ""
            words += f"; idle leases are reclaimed after {fmt_duration(after)}{when}"
        return words

    def _soon_words(self, lease: Lease, waiting: int) -> str:
        after = self.policy.reclaim_after_s or 0.0
        lead = fmt_duration(min(RECLAIM_WARNING_S, after))
        why = f" ({_requests(waiting)} waiting for its GPU)" if waiting else ""
        return (
            f"lease {lease.lease_id} will be reclaimed in {lead} unless it uses its GPU{why}; "
            "release it if you are done"
        )
