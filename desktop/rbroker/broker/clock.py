"""The broker's clocks: monotonic for expiry, wall for display, boot time for sleep gaps.

Expiry always uses the monotonic clock, so wall-clock jumps (NTP, a user changing the time)
never expire or extend a lease. On Linux the monotonic clock stops while the machine
sleeps; `CLOCK_BOOTTIME` does not, so a difference between the two reveals a sleep/resume
gap (architecture.md §3: one TTL of grace instead of mass expiry).
"""

from __future__ import annotations

import sys
import time
from typing import Protocol

from rbroker.base.proctime import holder_clock


class Clock(Protocol):
    """What the broker reads time from (tests may pass their own)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps (expiry, ages)."""

    def wall(self) -> float:
        """Unix seconds, for display only."""

    def boottime(self) -> float:
        """Seconds since boot including suspend (monotonic where unavailable)."""

    def boot_id(self) -> str:
        """What `boottime` readings mean: two readings compare, across processes and broker
        restarts, only under the same non-empty id (`since-boot <the kernel's boot id>` on
        Linux, new at every boot); `""` where no reading is known to outlive the process."""


class SystemClock:
    """The real clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def boottime(self) -> float:
        if sys.platform != "win32":  # Windows has no clock_gettime
            clock = getattr(time, "CLOCK_BOOTTIME", None)
            if clock is not None:
                return time.clock_gettime(clock)
        return time.monotonic()

    def boot_id(self) -> str:
        # Linux's CLOCK_BOOTTIME with the boot's id; elsewhere boottime is the process's
        # monotonic clock as far as this knows (Windows' is since boot too, but no boot id is
        # read there): "" keeps every count that has to outlive a restart from the start
        if sys.platform.startswith("linux") and hasattr(time, "CLOCK_BOOTTIME"):
            return holder_clock()
        return ""
