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


class Clock(Protocol):
    """What the broker reads time from (tests may pass their own)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps (expiry, ages)."""

    def wall(self) -> float:
        """Unix seconds, for display only."""

    def boottime(self) -> float:
        """Seconds since boot including suspend (monotonic where unavailable)."""


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
