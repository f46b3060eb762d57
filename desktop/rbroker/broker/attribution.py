"""Which holder a GPU process's memory belongs to, and the part of a holder's baseline that
was held before a grant (docs/architecture.md §2).

Nested holders: a process's memory belongs to exactly one holder per GPU, the nearest in
its own chain (the process itself if it holds a lease there, else its closest ancestor that
does). So a holder's tree on a GPU is its processes that are not inside a descendant holder
with its own lease on that GPU; a descendant holder without a lease there stays in it.

Pre-grant part: what a sample that began before a grant showed a holder holding beyond its
older leases' grants goes to its baseline (`PreGrant`). That part comes down by what later
samples show the holder freed below its lowest use since (never more), so once the overage
is freed its leases' grants are its use again.
"""

from __future__ import annotations

from collections.abc import Callable

from rbroker.broker.holders import Chain, Holder
from rbroker.broker.sampling import GpuSlot

#: True when a holder holds a lease on the GPU in question.
Leased = Callable[[Holder], bool]


def owner(chain: Chain, leased: Leased) -> Holder | None:
    """The nearest holder in `chain` (nearest first) that holds a lease, or None."""
    return next((h for h in chain if leased(h)), None)


def _mine(chain: Chain, holder: Holder, leased: Leased) -> bool:
    """True when `holder` is in `chain` and no holder nearer the process holds a lease."""
    for h in chain:
        if h == holder:
            return True
        if leased(h):
            return False
    return False


def tree_mib(slot: GpuSlot, holder: Holder, leased: Leased) -> tuple[int, bool]:
    """`(MiB, known)`: the memory the latest sample of `slot` shows in `holder`'s tree less
    the trees of its descendant holders with a lease there (unknown = 0), and whether every
    such process's memory is known."""
    mib, known = 0, True
    for p, chain in slot.chains:
        if _mine(chain, holder, leased):
            mib += p.used_mib or 0
            known = known and p.used_mib is not None
    return mib, known


def owners(slot: GpuSlot, leased: Leased) -> set[Holder]:
    """The holders with a lease on `slot` that own some listed process there."""
    found = {owner(chain, leased) for _, chain in slot.chains}
    found.discard(None)
    return {h for h in found if h is not None}


def keeper(slot: GpuSlot, holder: Holder, leased: Leased) -> Holder | None:
    """Whose tree `holder`'s processes on `slot` count in: `holder` itself when it holds a
    lease there, else its nearest ancestor that does (from the listed chains), else None."""
    if leased(holder):
        return holder
    return ancestor(slot, holder, leased)


def ancestor(slot: GpuSlot, holder: Holder, leased: Leased) -> Holder | None:
    """The nearest ancestor of `holder` holding a lease on `slot`, by any listed chain that
    passes through `holder`, or None."""
    for _, chain in slot.chains:
        if holder in chain:
            above = chain[chain.index(holder) + 1 :]
            found = owner(above, leased)
            if found is not None:
                return found
    return None


def listed_mib(slot: GpuSlot, leased: Leased) -> tuple[int, int]:
    """`(listed, holders_listed)` MiB of the latest sample of `slot`: every listed process,
    and those in the tree of some holder with a lease there (each once; unknown = 0)."""
    listed = of_holders = 0
    for p, chain in slot.chains:
        listed += p.used_mib or 0
        if owner(chain, leased) is not None:
            of_holders += p.used_mib or 0
    return listed, of_holders


class PreGrant:
    """Per `(holder, gpu_uuid)`: the MiB of the holder's baseline that a sample begun before
    a grant showed beyond its older leases' grants, and the holder's lowest use since."""

    def __init__(self) -> None:
        self._parts: dict[tuple[Holder, str], tuple[int, int]] = {}

    def mib(self, key: tuple[Holder, str]) -> int:
        """The pre-grant part of the baseline of `key` (0 when none)."""
        return self._parts.get(key, (0, 0))[0]

    def add(self, key: tuple[Holder, str], mib: int, held_mib: int) -> None:
        """`mib` more went to the baseline while the holder held `held_mib`."""
        part, low = self._parts.get(key, (0, held_mib))
        self._parts[key] = (part + mib, min(low, held_mib))

    def freed(self, key: tuple[Holder, str], held_mib: int) -> int:
        """A sample whose memory of the holder is known shows `held_mib`: the part comes
        down by what that is below the holder's lowest use since it was added. Returns the
        MiB it came down by (the baseline comes down as much)."""
        entry = self._parts.get(key)
        if entry is None:
            return 0
        part, low = entry
        drop = min(part, max(0, low - held_mib))
        self.clip(key, part - drop, min(low, held_mib))
        return drop

    def clip(self, key: tuple[Holder, str], baseline_mib: int, low_mib: int | None = None) -> None:
        """Keep the part at most `baseline_mib` (the whole baseline)."""
        entry = self._parts.get(key)
        if entry is None:
            return
        part = min(entry[0], max(0, baseline_mib))
        low = entry[1] if low_mib is None else low_mib
        if part > 0:
            self._parts[key] = (part, low)
        else:
            del self._parts[key]

    def drop(self, key: tuple[Holder, str]) -> None:
        """The holder has no lease left there: forget the part."""
        self._parts.pop(key, None)
