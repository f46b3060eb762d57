""" "Tell me when N MiB are free" (issue 42): the tray's one watch for room, as `rbroker watch`
does it. The link's room thread asks the broker's `room.check` for the watch set (never the
GUI thread; nothing is taken), every `CHECK_EVERY_S` and at each event; the first answer that
fits is told once as a notice, and the watch ends. One watch at a time: setting another
replaces it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rbroker.base.display import fmt_mib
from rbroker_protocol.results import RoomCheckResult

CHECK_EVERY_S = 1.0
"""Seconds between two checks while a watch is set (an event asks again at once)."""


@dataclass(frozen=True, eq=False)
class RoomWatch:
    """One watch: `mib` MiB on each of `gpus` GPUs. Compared by identity: a watch set again
    with the same figures is a new one."""

    mib: int
    gpus: int = 1

    def describe(self) -> str:
        """`8 000 MiB` or `8 000 MiB on each of 2 GPUs`."""
        each = f" on each of {self.gpus} GPUs" if self.gpus > 1 else ""
        return f"{fmt_mib(self.mib)} MiB{each}"


def room_text(answer: RoomCheckResult, mib: int) -> str:
    """`room now: GPU 0 has 23 347 MiB available for 8 000 MiB asked` (each GPU named), as
    `rbroker watch` says it."""
    where = ", ".join(
        f"GPU {g['index']} has {fmt_mib(g['available_mib'])} MiB available" for g in answer["gpus"]
    )
    return f"room now: {where} for {fmt_mib(mib)} MiB asked"


__all__ = ["CHECK_EVERY_S", "RoomWatch", "room_text"]
