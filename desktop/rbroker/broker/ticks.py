"""The broker's tick: the loop that runs expiry, holder checks and stall grace
(docs/architecture.md §3), and the once-per-holder liveness check it uses."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from rbroker.broker.clock import Clock
from rbroker.broker.config import BrokerConfig
from rbroker.broker.holders import Holder
from rbroker.broker.leases import Lease

log = logging.getLogger(__name__)


def liveness_memo() -> Callable[[Holder], bool]:
    """`holder.alive()`, checked once per distinct holder (a process often holds many leases)."""
    alive: dict[Holder, bool] = {}

    def is_alive(holder: Holder) -> bool:
        if holder not in alive:
            alive[holder] = holder.alive()
        return alive[holder]

    return is_alive


def grace(leases: Iterable[Lease], now: float, gap: float, reattach_grace_s: float) -> None:
    """After a loop stall or sleep/resume gap of `gap` s, give each of `leases` one TTL and
    each restored one still to re-attach `reattach_grace_s` from `now` (monotonic, s)
    (docs/architecture.md §3)."""
    log.warning("broker loop stalled %.1f s: every lease gets one TTL of grace", gap)
    for lease in leases:
        lease.deadline = max(lease.deadline, now + lease.ttl_s)
        if lease.reattach_by is not None:
            lease.reattach_by = max(lease.reattach_by, now + reattach_grace_s)


async def tick_loop(
    clock: Clock,
    config: BrokerConfig,
    on_stall: Callable[[float, float], None],
    on_holder_check: Callable[[], None],
    on_tick: Callable[[float], None],
) -> None:
    """Every `tick_s`: after a gap over `stall_threshold_s` (monotonic or boot time, which
    also counts a suspend) call `on_stall(now, gap)`; every `holder_check_s` call
    `on_holder_check()`; then `on_tick(now)` (expiry). A failing turn is logged, never fatal."""
    last = clock.monotonic()
    last_boot = clock.boottime()
    last_holder_check = 0.0
    while True:
        await asyncio.sleep(config.tick_s)
        now, boot = clock.monotonic(), clock.boottime()
        gap = max(now - last, boot - last_boot)  # boot time also counts a suspend
        last, last_boot = now, boot
        try:
            if gap > config.stall_threshold_s:
                on_stall(now, gap)
            if now - last_holder_check >= config.holder_check_s:
                last_holder_check = now
                on_holder_check()
            on_tick(now)
        except Exception:
            log.exception("tick failed")
