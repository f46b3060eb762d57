"""The capacity model of architecture.md §2, as pure arithmetic on MiB figures.

device_used = total - free
outstanding = Σ over active leases on the GPU of max(0, granted_mib - observed_mib)
available   = max(0, total - headroom - device_used - outstanding - booked)
admit(r)   ⇔ r.mib ≤ available  and no earlier waiter on this GPU is still waiting

`booked` is 0 but for one request: the peak of the bookings its horizon overlaps (§2a,
`rbroker.broker.bookings`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

HEADROOM_MIN_MIB = 512
HEADROOM_FRACTION = 0.05


def default_headroom_mib(total_mib: int) -> int:
    """architecture.md §2 default headroom: max(512 MiB, 5 % of total), rounded up to a whole
    MiB."""
    return max(HEADROOM_MIN_MIB, math.ceil(total_mib * HEADROOM_FRACTION))


def outstanding_mib(grants: Iterable[tuple[int, int]]) -> int:
    """Σ max(0, granted − observed) over `(granted_mib, observed_mib)` pairs."""
    return sum(max(0, granted - observed) for granted, observed in grants)


def unbacked_mib(discount_mib: int, holders_listed_mib: int, listed_mib: int, used_mib: int) -> int:
    """MiB of `discount_mib` (Σ min(granted, observed) of a GPU's active leases) that the
    sample's device_used cannot hold: the leases' holders' listed processes (each counted
    once, `holders_listed_mib`) less what all listed processes (`listed_mib`) show beyond
    device_used (`used_mib`) back at most that much; the rest stays outstanding.

    `unbacked_mib(4096, 4096, 4096, 1000)` → 3096; 0 whenever the listing fits device_used
    and the holders' processes hold the discount.
    """
    backed = max(0, holders_listed_mib - max(0, listed_mib - used_mib))
    return max(0, discount_mib - backed)


@dataclass(frozen=True, slots=True)
class Capacity:
    """One GPU's capacity split, all in MiB, from one sample and the lessor's books."""

    total_mib: int
    headroom_mib: int
    device_used_mib: int
    outstanding_mib: int
    booked_mib: int = 0
    """What bookings protect beside one request (its horizon's peak); 0 for the GPU alone."""

    @property
    def available_mib(self) -> int:
        """max(0, total − headroom − device_used − outstanding − booked)."""
        return max(
            0,
            self.total_mib
            - self.headroom_mib
            - self.device_used_mib
            - self.outstanding_mib
            - self.booked_mib,
        )

    @property
    def usable_mib(self) -> int:
        """total − headroom: the most any single request can ever get on this GPU."""
        return max(0, self.total_mib - self.headroom_mib)

    def fits(self, mib: int) -> bool:
        """True when `mib` ≤ available."""
        return mib <= self.available_mib

    def as_dict(self) -> dict[str, int]:
        """The figures as a JSON object (used in reasons, admission records and reports);
        `booked_mib` only where bookings take part."""
        figures = {
            "total_mib": self.total_mib,
            "headroom_mib": self.headroom_mib,
            "device_used_mib": self.device_used_mib,
            "outstanding_mib": self.outstanding_mib,
            "available_mib": self.available_mib,
        }
        if self.booked_mib:
            figures["booked_mib"] = self.booked_mib
        return figures
