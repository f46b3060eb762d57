"""Which active leases are due to end (docs/architecture.md §3): past their heartbeat
deadline, restored and not re-attached within the grace, or held by a process that exited.
A part of the lease table (`rbroker.broker.table.LeaseTable`), which keeps the floors.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from rbroker.broker.holders import Holder
from rbroker.broker.leases import Lease


class DueLeases:
    """The lease table's expiry queries, over its `leases` and `_by_holder` index, with the
    earliest deadline (`_deadline_floor`) and re-attach time (`_reattach_floor`) recorded
    (both monotonic seconds), so nothing is walked before one may have passed."""

    leases: dict[str, Lease]
    _by_holder: dict[Holder, dict[str, Lease]]
    _deadline_floor: float
    _reattach_floor: float

    def overdue(self, now: float) -> list[Lease]:
        """Active leases whose heartbeat deadline has passed. Deadlines only move later
        (renew, re-attach, grace), so nothing is walked until the earliest one recorded
        may have passed."""
        if now <= self._deadline_floor:
            return []
        self._deadline_floor = min((x.deadline for x in self.leases.values()), default=math.inf)
        return [lease for lease in self.leases.values() if lease.deadline < now]

    def not_reattached(self, now: float) -> list[Lease]:
        """Restored leases whose holder did not re-attach within the grace."""
        if now <= self._reattach_floor:
            return []
        waiting = [x for x in self.leases.values() if x.reattach_by is not None]
        self._reattach_floor = min((x.reattach_by or 0.0 for x in waiting), default=math.inf)
        return [x for x in waiting if x.reattach_by is not None and x.reattach_by < now]

    def held_by_dead(self, is_alive: Callable[[Holder], bool]) -> list[Lease]:
        """Active leases whose holder process is gone (one check per distinct holder)."""
        dead = [h for h in self._by_holder if not is_alive(h)]
        return [lease for h in dead for lease in self._by_holder.get(h, {}).values()]
