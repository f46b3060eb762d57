"""The lessor: the one owner of the broker's leases (etcd's `Lessor`: Grant, Revoke, Renew,
Attach, Lookup). It holds active and recently ended leases and their indexes, memory
attribution, what each holder holds outside its leases (baselines, kept in the store),
booking, token hashes, re-attach, resize of a grant and expiry (the tick loop is
`rbroker.broker.ticks`).

Memory attribution (docs/architecture.md §2): a sample's memory of a holder's process tree
(less descendant holders with their own lease there), less its baseline, is shared among its
leases on that GPU in grant order (a lease granted after the sample began gets only its
claim); what a lease was granted but does not use is *outstanding*; an ended lease's stays
booked (*unconfirmed*) until a sample that started after the end (the release rule). Costs
are flat in the number of leases: indexes and running sums. A sample reads each holder's
tree once (one walk of the listed processes, `_trees`) and keeps a holder's leases' shares
while the same memory is shared among the same leases (`_observe`): with nothing changed it
costs O(listed processes + holders), not O(leases).

Nested holders: a process's memory belongs to exactly one holder per GPU, the nearest in
its own chain (the process itself if it holds a lease there, else its closest ancestor that
does). So a holder's tree on a GPU is its processes that are not inside a descendant holder
with its own lease on that GPU; a descendant holder without a lease there stays in it.

Pre-grant part: what a sample that began before a grant showed a holder holding beyond its
older leases' grants goes to its baseline (`PreGrant`). That part comes down by what later
samples show the holder freed below its lowest use since (never more), so once the overage
is freed its leases' grants are its use again.

Baselines: a holder's baseline changes between grants: a sample shows memory it held before
a grant (§2, "attribution before a grant"), or an ended lease's processes (its own or a
descendant holder's) keep what they allocated. Lease records are written only at grant,
re-attach and resize, so without the stored baselines a broker restarted after such a change
restored the baseline of the grant's time, and the first sample after the restart counted
the memory as lease use: an over-admission. Every change is written at once (one small row
per holder and GPU), and `restore` reads them back after the leases.

Expiry (§3): a lease ends when its deadline (monotonic) passes without a heartbeat, its
holder process exits or its connection closes; after a loop stall or a sleep/resume gap
every lease first gets one TTL of grace (`rbroker.broker.ticks.grace`). The earliest
deadline and re-attach time are recorded, so nothing is walked before one may have passed.
"""

from __future__ import annotations

import collections
import hmac
import logging
import math
import secrets
from collections.abc import Callable, Container, Iterable
from typing import Any, NamedTuple

from rbroker.broker.capacity import Capacity, unbacked_mib
from rbroker.broker.clock import Clock
from rbroker.broker.config import BrokerConfig
from rbroker.broker.holders import Chain, Holder
from rbroker.broker.leases import Lease, LeaseState, Waiter
from rbroker.broker.sampling import GpuSlot, unlisted_mib
from rbroker.broker.store import LeaseStore, token_hash
from rbroker_protocol.errors import ErrorCode, RpcError

log = logging.getLogger(__name__)


class Choice(NamedTuple):
    """A GPU an admission pass chose for a request, with the figures it decided on."""

    gpu_uuid: str
    cap: Capacity
    """The GPU's capacity split the request was checked against."""
    claim_mib: int
    """MiB of the holder's own memory on the GPU the lease takes over (`adopt`; else 0)."""
    extra_mib: int
    """MiB the request needed free there: asked less the claim."""


# -- attribution: whose tree a process's memory counts in ---------------------------------
#: True when a holder holds a lease on the GPU in question.
Leased = Callable[[Holder], bool]


def nearest(chain: Chain, leased: Leased) -> Holder | None:
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
            found = nearest(above, leased)
            if found is not None:
                return found
    return None


def listed_mib(slot: GpuSlot, leased: Leased) -> tuple[int, int]:
    """`(listed, holders_listed)` MiB of the latest sample of `slot`: every listed process,
    and those in the tree of some holder with a lease there (each once; unknown = 0)."""
    listed = of_holders = 0
    for p, chain in slot.chains:
        listed += p.used_mib or 0
        if nearest(chain, leased) is not None:
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


# -- baselines ------------------------------------------------------------------------------
Key = tuple[Holder, str]
"""(holder, GPU UUID)."""


class Baselines(dict[Key, int]):
    """`{(holder, gpu_uuid): mib}` that writes every change to `store` (None: memory only).

    Only `[key] = mib` and `pop` change it (the lessor's only uses); a value of 0 or
    less, or a popped key, deletes the stored row.
    """

    def __init__(self, store: LeaseStore | None) -> None:
        super().__init__()
        self._store = store

    def __setitem__(self, key: Key, mib: int) -> None:
        if self._store is not None and self.get(key) != mib:
            self._store.put_baseline(key[0].pid, key[0].start_time, key[1], mib)
        super().__setitem__(key, mib)

    def pop(self, key: Key, default: int = 0) -> int:  # type: ignore[override]
        if self._store is not None and key in self:
            self._store.put_baseline(key[0].pid, key[0].start_time, key[1], 0)
        return super().pop(key, default)


class Lessor:
    """Active leases (`leases`, by id), the last `ended_history` ended ones (`ended`) and the
    bookkeeping that turns samples into per-lease use: grant, lookup, renew, attach, resize,
    revoke and expiry. Writes through to `store` if given."""

    def __init__(
        self,
        slots: dict[str, GpuSlot],
        clock: Clock,
        config: BrokerConfig,
        store: LeaseStore | None,
    ) -> None:
        self.slots = slots
        self.clock = clock
        self.config = config
        self.store = store
        self.leases: dict[str, Lease] = {}
        self.ended: collections.deque[Lease] = collections.deque(maxlen=config.ended_history)
        self.baselines = Baselines(store)  # written through to the store
        self.pre_grant = PreGrant()  # the part of `baselines` held before a grant
        self.token_sha256: dict[str, str] = {}
        self._ends_since_prune = 0
        # indexes over `leases` (kept by `add` and `_unindex`, the only writers)
        self._on_gpu: dict[str, dict[str, Lease]] = {}
        self._held: dict[tuple[Holder, str], dict[str, Lease]] = {}
        self._seen: dict[tuple[Holder, str], int] = {}  # Σ observed of each `_held` entry
        self._by_holder: dict[Holder, dict[str, Lease]] = {}
        self._by_key: dict[tuple[str, str, Holder], Lease] = {}  # (request key, owner, holder)
        self._owned: dict[str, int] = {}  # active leases per OS user
        self._outstanding: dict[str, int] = {}
        self._granted: dict[str, int] = {}  # per GPU: Σ granted of its active leases
        # holders whose leases on a GPU show use or who hold memory outside them there
        self._touched: dict[str, set[Holder]] = {}
        # per GPU: (monotonic end time, MiB) of ended leases no sample has confirmed yet
        self._unconfirmed: dict[str, collections.deque[tuple[float, int, Holder | None]]] = {}
        self._unconfirmed_mib: dict[str, int] = {}
        self._deadline_floor = math.inf  # no active lease's deadline is earlier
        self._reattach_floor = math.inf  # no restored lease must re-attach earlier
        self._observed_now: dict[str, set[Holder]] = {}  # by `update_observed`, per GPU
        # Made on need, dropped by any change of an entry of `_held` (`add`, `_unindex`,
        # `resize`): each entry's leases in grant order with their latest `granted_at`, and
        # the `(pool, any share > 0)` its memory was last shared out by, with no lease
        # granted after that sample began (the same pool gives the same shares).
        self._order: dict[Key, tuple[list[Lease], float]] = {}
        self._shared: dict[Key, tuple[int, bool]] = {}
        # leases whose observed use passed their grant, until the over-grant watch found
        # them inside it again with their episode closed (`over_watch_on`)
        self._over: dict[str, Lease] = {}
        self.shown: dict[str, int] = {}
        """Per GPU, a count that moves whenever what the views show of its leases may have
        changed: a lease in or out, an observed figure (`Broker._capacity_seen`)."""

    # -- the indexes ---------------------------------------------------------------------------
    def add(self, lease: Lease) -> None:
        """Enter an active lease into the table and its indexes (grant and restore)."""
        self.leases[lease.lease_id] = lease
        self._by_holder.setdefault(lease.holder, {})[lease.lease_id] = lease
        self._owned[lease.owner] = self._owned.get(lease.owner, 0) + 1
        if lease.request_key:
            self._by_key[(lease.request_key, lease.owner, lease.holder)] = lease
        for u in lease.gpu_uuids:
            self._on_gpu.setdefault(u, {})[lease.lease_id] = lease
            key = (lease.holder, u)
            self._held.setdefault(key, {})[lease.lease_id] = lease
            self._order.pop(key, None)
            self._shared.pop(key, None)
            self.shown[u] = self.shown.get(u, 0) + 1
            self._seen[key] = self._seen.get(key, 0) + lease.observed_mib.get(u, 0)
            self._outstanding[u] = self._outstanding.get(u, 0) + _owed(lease, u)
            self._granted[u] = self._granted.get(u, 0) + lease.granted_mib
            self._touched.setdefault(u, set()).add(lease.holder)
        self._deadline_floor = min(self._deadline_floor, lease.deadline)
        if lease.reattach_by is not None:
            self._reattach_floor = min(self._reattach_floor, lease.reattach_by)

    def _unindex(self, lease: Lease) -> None:
        del self.leases[lease.lease_id]
        self._owned[lease.owner] -= 1
        key = (lease.request_key, lease.owner, lease.holder)
        if lease.request_key and self._by_key.get(key) is lease:
            del self._by_key[key]
        mine = self._by_holder.get(lease.holder)
        if mine is not None:
            mine.pop(lease.lease_id, None)
            if not mine:
                del self._by_holder[lease.holder]
        self._over.pop(lease.lease_id, None)
        for u in lease.gpu_uuids:
            self._on_gpu.get(u, {}).pop(lease.lease_id, None)
            hk = (lease.holder, u)
            self._order.pop(hk, None)
            self._shared.pop(hk, None)
            self.shown[u] = self.shown.get(u, 0) + 1
            held = self._held.get(hk)
            if held is not None and held.pop(lease.lease_id, None) is not None:
                self._seen[hk] -= lease.observed_mib.get(u, 0)
                if not held:
                    del self._held[hk], self._seen[hk]
            self._outstanding[u] = self._outstanding.get(u, 0) - _owed(lease, u)
            self._granted[u] = self._granted.get(u, 0) - lease.granted_mib

    def _set_observed(self, lease: Lease, uuid: str, mib: int) -> None:
        before = _owed(lease, uuid)
        was = lease.observed_mib.get(uuid, 0)
        if mib != was:
            self.shown[uuid] = self.shown.get(uuid, 0) + 1
        self._seen[(lease.holder, uuid)] += mib - was
        lease.observed_mib[uuid] = mib
        if mib > lease.granted_mib:
            self._over[lease.lease_id] = lease
        self._outstanding[uuid] = self._outstanding.get(uuid, 0) + _owed(lease, uuid) - before

    # -- attribution and capacity --------------------------------------------------------------
    def on(self, uuid: str) -> list[Lease]:
        """The active leases on GPU `uuid`, in the order they entered the table."""
        return list(self._on_gpu.get(uuid, {}).values())

    def owned_by(self, owner: str) -> int:
        """How many active leases OS user `owner` has."""
        return self._owned.get(owner, 0)

    def granted_by_project(self) -> dict[str, int]:
        """MiB granted to the active leases now, by project, summed over their GPUs (the
        use that shares per project weigh: `rbroker.broker.shares`)."""
        out: dict[str, int] = {}
        for lease in self.leases.values():
            out[lease.project] = out.get(lease.project, 0) + lease.granted_mib * len(
                lease.gpu_uuids
            )
        return out

    def held_on(self, holder: Holder, uuid: str) -> list[Lease]:
        """The active leases of process `holder` on GPU `uuid`."""
        return list(self._held.get((holder, uuid), {}).values())

    def unconfirmed_mib(self, uuid: str) -> int:
        """MiB of ended leases on `uuid` that stay booked until a sample that started after
        their end shows what their holders still use (docs/architecture.md §2)."""
        return self._unconfirmed_mib.get(uuid, 0)

    def update_observed(self, slot: GpuSlot) -> None:
        """Attribute the latest sample's memory to the leases of each holder on `slot`
        whose processes it lists or who showed use there before, and drop the unconfirmed
        MiB of leases that ended before the sample started (see `_keep_outside`)."""
        uuid = slot.uuid
        if slot.sample is not None:
            for holder, mib in self._confirm(uuid, slot.sample.started_at):
                self._keep_outside(slot, holder, mib)
        trees = self._trees(slot)
        holders = set(self._touched.get(uuid, ()))
        holders.update(trees)
        for holder in holders:
            mib, known = trees.get(holder, (0, True))
            self._observe(slot, holder, (mib, known, holder in trees))
        self._observed_now[uuid] = holders

    def _trees(self, slot: GpuSlot) -> dict[Holder, tuple[int, bool]]:
        """`{holder: (MiB, known)}` of the latest sample of `slot`, for each holder with a
        lease there whose tree holds a listed process: `tree_mib` of every such holder in
        one walk of the listed processes (each counts in its nearest holder's tree)."""
        leased = self._leased(slot.uuid)
        out: dict[Holder, tuple[int, bool]] = {}
        for p, chain in slot.chains:
            holder = nearest(chain, leased)
            if holder is not None:
                mib, known = out.get(holder, (0, True))
                out[holder] = (mib + (p.used_mib or 0), known and p.used_mib is not None)
        return out

    def holders_of(self, slot: GpuSlot, pids: Container[int]) -> set[Holder]:
        """The holders with a lease on `slot` in whose trees (as memory is attributed: the
        nearest holder with a lease there in each listed process's chain) any of `pids`
        runs; a pid the latest sample does not list counts for no one."""
        leased = self._leased(slot.uuid)
        found = {nearest(chain, leased) for p, chain in slot.chains if p.pid in pids}
        return {h for h in found if h is not None}

    def _leased(self, uuid: str) -> Callable[[Holder], bool]:
        held = self._held
        return lambda h: (h, uuid) in held

    def over_watch_on(self, uuid: str) -> list[Lease]:
        """The leases on `uuid` the over-grant watch (`rbroker.broker.overgrant.watch`) must
        read after the latest `update_observed` there: those of the holders it attributed
        (who showed memory there before or now) that have a lease over its grant or in an
        open over-grant episode. For any other lease the watch changes nothing (not over,
        no episode), so a sample reads the leases that are over, not every lease."""
        over = self._over
        for lease_id, x in list(over.items()):
            if x.over_since is None and all(v <= x.granted_mib for v in x.observed_mib.values()):
                del over[lease_id]
        if not over:
            return []
        keys = {(x.holder, uuid) for x in over.values() if uuid in x.gpu_uuids}
        held = self._held
        return [
            x
            for h in self._observed_now.get(uuid, ())
            if (h, uuid) in keys
            for x in held.get((h, uuid), {}).values()
        ]

    def _confirm(self, uuid: str, started_at: float) -> list[tuple[Holder, int]]:
        """Drop the unconfirmed MiB of leases that ended (or shrank) before `started_at`;
        returns the ended leases' `(holder, MiB)`."""
        pending = self._unconfirmed.get(uuid)
        done = []
        while pending and pending[0][0] < started_at:
            _, mib, holder = pending.popleft()
            self._unconfirmed_mib[uuid] -= mib
            if holder is not None:
                done.append((holder, mib))
        return done

    def _keep_outside(self, slot: GpuSlot, holder: Holder, mib: int) -> None:
        """The first sample after the end of a lease of `holder` with `mib` unconfirmed MiB:
        the holder's growth since its leases' last figures, up to `mib`, goes to its baseline,
        never to its other leases' use (over-admitting); counted twice if theirs (cautious)."""
        uuid = slot.uuid
        target = keeper(slot, holder, self._leased(uuid))  # its own, or a nearest ancestor's
        leases = self._held.get((target, uuid)) if target is not None else None
        if target is None or not leases:
            return  # its memory is in device_used, nothing else
        holder = target
        baseline = self.baselines.get((holder, uuid), 0)
        seen = baseline + self._seen[(holder, uuid)]  # Σ observed of `leases`: no walk
        growth = tree_mib(slot, holder, self._leased(uuid))[0] - seen
        if growth > 0:
            self.set_baseline(holder, uuid, baseline + min(growth, mib), leases.values())
            self._touched.setdefault(uuid, set()).add(holder)

    def _observe(
        self, slot: GpuSlot, holder: Holder, tree: tuple[int, bool, bool] | None = None
    ) -> None:
        """Share `holder`'s memory on `slot` (less its baseline) among its leases there. A
        sample that began before the holder's latest grant there gives a lease granted
        after it began only its claim and every other lease at most its grant: the rest was
        held before that grant, so it is outside the holder's leases (its baseline, its
        pre-grant part: it comes down by what later samples show the holder freed).
        `tree`: `(MiB, known, listed)` of the holder's tree in the latest sample when the
        caller has it (`_trees`), else read here. The same pool shared among the same leases,
        none granted after the sample began, gives the same shares: then they are kept, not
        figured again (a sample reads the holder, not each of its leases)."""
        uuid = slot.uuid
        key = (holder, uuid)
        held_leases = self._held.get(key)
        if not held_leases:
            self._touched.get(uuid, set()).discard(holder)
            return
        order = self._order.get(key)
        if order is None:
            ordered = sorted(held_leases.values(), key=lambda lease: lease.granted_at_wall)
            order = self._order[key] = (ordered, max(x.granted_at for x in ordered))
        leases, latest_grant = order
        if tree is None:
            leased = self._leased(uuid)
            held, known = tree_mib(slot, holder, leased)
            listed = any(_mine(chain, holder, leased) for _, chain in slot.chains)
        else:
            held, known, listed = tree
        baseline = self.baselines.get(key, 0)
        if not listed and slot.sample is not None:
            # No process of its tree is listed: NVML omits a running process now and then,
            # and when several are missing at once `Sampling._track` keeps some of them, not
            # always the right ones. Such a sample says only that the holder holds no more
            # than the device's memory that no listed process holds; its baseline comes down
            # to that and no further (it came down to 0, and when the holder was listed again
            # the memory it held before its grant counted as its lease's use, and the next
            # grant over-admitted). A sample that lists it with less lowers it further.
            unlisted = unlisted_mib(slot.sample)
            if baseline > unlisted:
                baseline = unlisted
                self.pre_grant.clip(key, baseline)
                self.set_baseline(holder, uuid, baseline, leases)
        elif known:
            # the holder freed memory it held outside its leases: that much is gone
            less = max(baseline - self.pre_grant.freed(key, held), 0)
            if less != baseline or held < baseline:
                baseline = min(less, held)
                self.pre_grant.clip(key, baseline)
                self.set_baseline(holder, uuid, baseline, leases)
        pool = max(0, held - baseline)
        started = slot.sample.started_at if slot.sample is not None else math.inf
        before_grant = latest_grant >= started
        shared = self._shared.get(key)
        if not before_grant and shared is not None and shared[0] == pool:
            self._mark_touched(uuid, holder, baseline > 0 or shared[1])
            return
        self._shared.pop(key, None)
        shared_pool = pool
        in_use = baseline > 0
        any_share = False
        # memory a lease adopted (its claim) is its own before anything is shared out by
        # age: otherwise an older lease of the same holder would absorb it and the adopting
        # lease would book more than its admission checked
        claimed = []
        for lease in leases:
            take = min(pool, lease.claimed_mib.get(uuid, 0), lease.granted_mib)
            claimed.append(take)
            pool -= take
        for i, lease in enumerate(leases):
            if lease.granted_at >= started:
                extra = 0
            elif i == len(leases) - 1 and not before_grant:
                extra = pool
            else:
                extra = min(pool, lease.granted_mib - claimed[i])
            pool -= extra
            share = claimed[i] + extra
            any_share = any_share or share > 0
            self._set_observed(lease, uuid, share)
            lease.over_grant = any(v > lease.granted_mib for v in lease.observed_mib.values())
        in_use = in_use or any_share
        if pool > 0:  # only when `before_grant`: held before the latest grant
            self.pre_grant.add(key, pool, held)
            self.set_baseline(holder, uuid, baseline + pool, leases)
            in_use = True
        if not before_grant:
            self._shared[key] = (shared_pool, any_share)
        self._mark_touched(uuid, holder, in_use)

    def _mark_touched(self, uuid: str, holder: Holder, in_use: bool) -> None:
        """Keep `holder` among the holders whose memory on `uuid` is read at every sample
        while its leases there show use or it holds memory outside them there."""
        touched = self._touched.setdefault(uuid, set())
        if in_use:
            touched.add(holder)
        else:
            touched.discard(holder)

    def set_baseline(self, holder: Holder, uuid: str, mib: int, leases: Iterable[Lease]) -> None:
        """`holder`'s memory on `uuid` outside its leases (`leases`: its leases there)."""
        self.baselines[(holder, uuid)] = mib
        for lease in leases:
            lease.baseline_mib[uuid] = mib

    def held_outside_mib(self, uuid: str) -> int:
        """MiB that the holders of active leases on GPU `uuid` hold there outside their
        leases (the sum of their baselines: memory held before a grant, its pre-grant part
        included, or kept after one of their leases ended), by the latest attribution. Part
        of what `device_used` holds beyond the leases' observed use."""
        held, baselines = self._held, self.baselines
        return sum(
            baselines.get((h, uuid), 0) for h in self._touched.get(uuid, ()) if (h, uuid) in held
        )

    def baseline_now(self, holder: Holder, slot: GpuSlot) -> int:
        """MiB `holder` holds on `slot` outside its leases (its whole use if it has none)."""
        key = (holder, slot.uuid)
        if key in self.baselines:
            return self.baselines[key]
        return tree_mib(slot, holder, self._leased(slot.uuid))[0]

    def capacity(self, uuid: str) -> Capacity | None:
        """The capacity split of GPU `uuid` now, or None before its first good sample."""
        slot = self.slots[uuid]
        if slot.sample is None:
            return None
        outstanding = self._outstanding.get(uuid, 0) + self._unconfirmed_mib.get(uuid, 0)
        outstanding += self._unbacked_mib(slot)
        return Capacity(
            total_mib=slot.sample.total_mib,
            headroom_mib=slot.headroom_mib,
            device_used_mib=slot.sample.device_used_mib,
            outstanding_mib=outstanding,
        )

    def _unbacked_mib(self, slot: GpuSlot) -> int:
        """What the leases' observed use discounts from their grants on `slot` beyond what
        its device_used can hold of their holders' processes (docs/architecture.md §2)."""
        uuid = slot.uuid
        discount = self._granted.get(uuid, 0) - self._outstanding.get(uuid, 0)
        if discount <= 0 or slot.sample is None:
            return 0
        listed, of_holders = listed_mib(slot, self._leased(uuid))
        return unbacked_mib(discount, of_holders, listed, slot.sample.device_used_mib)

    # -- grant, lookup, renew, attach, resize ------------------------------------------------
    def grant(self, waiter: Waiter, chosen: list[Choice], now: float) -> Lease:
        """A new lease for `waiter` on the chosen GPUs (a fresh id and token), booked."""
        lease = Lease.granted(waiter, tuple(c.gpu_uuid for c in chosen), now, self.clock.wall())
        self._book(lease, waiter, chosen)
        return lease

    def _book(self, lease: Lease, waiter: Waiter, chosen: list[Choice]) -> None:
        """Enter a granted lease: its claims on memory the holder already uses (adoption),
        the admission record per GPU, the store. The GPUs' samples stay usable: the lease
        books its grant less its claim, and no sample that began before now shows it using
        more (`_observe`). The store is written first: a write that fails (a full disk,
        `OSError`, raised) books nothing (it used to leave a lease in the books that belonged
        to nobody, and the GPU's room shrank by its grant).

        Raises:
            OSError: the store could not write the lease (nothing is booked).
        """
        for c in chosen:
            u = c.gpu_uuid
            lease.baseline_mib[u] = self.baseline_now(waiter.holder, self.slots[u]) - c.claim_mib
            lease.claimed_mib[u] = c.claim_mib
            lease.admission[u] = {
                **c.cap.as_dict(),
                "requested_mib": waiter.asked_mib,
                "extra_mib": c.extra_mib,
            }
        if self.store is not None:
            self.store.put_lease(lease.lease_id, lease.token, lease.to_record())
        for u, mib in lease.baseline_mib.items():
            self.baselines[(waiter.holder, u)] = mib
            self.pre_grant.clip((waiter.holder, u), mib)
        # a holder showing no memory and holding none outside its leases on a GPU: no walk
        quiet = {
            u
            for u, *_ in chosen
            if lease.holder not in self._touched.get(u, ())
            and self.baselines.get((lease.holder, u), 0) == 0
            and tree_mib(self.slots[u], lease.holder, self._leased(u))[0] == 0
        }
        self.add(lease)
        self.token_sha256[lease.lease_id] = token_hash(lease.token)
        for u, *_ in chosen:
            if u in quiet:
                self._set_observed(lease, u, 0)
                self._touched[u].discard(lease.holder)
            else:
                self._observe(self.slots[u], lease.holder)
            # a holder above it no longer counts its processes there
            above = ancestor(self.slots[u], lease.holder, self._leased(u))
            if above is not None:
                self._observe(self.slots[u], above)
        log.info(
            "lease %s granted: %d MiB on %s to %s/%s (waited %.2f s)",
            lease.lease_id,
            lease.granted_mib,
            ",".join(lease.gpu_uuids),
            lease.owner,
            lease.project,
            lease.waited_s,
        )

    def by_request_key(self, key: str, owner: str, holder: Holder) -> Lease | None:
        """The active lease of `owner`'s `holder` granted under request key `key`, or None."""
        return self._by_key.get((key, owner, holder))

    def lookup(self, lease_id: str, owner: str) -> Lease:
        """The active lease `lease_id` of `owner`.

        Raises:
            RpcError: `lease_not_found`, `lease_expired` (ended other than by release),
                `not_lease_owner`.
        """
        lease = self.leases.get(lease_id)
        if lease is None:
            for old in self.ended:
                if old.lease_id == lease_id:
                    raise RpcError(
                        ErrorCode.LEASE_EXPIRED
                        if old.state is not LeaseState.RELEASED
                        else ErrorCode.LEASE_NOT_FOUND,
                        f"lease {lease_id} ended: {old.state.value} ({old.ended_reason})",
                        lease_id=lease_id,
                        state=old.state.value,
                        ended_reason=old.ended_reason,
                    )
            raise RpcError(ErrorCode.LEASE_NOT_FOUND, f"no lease {lease_id}", lease_id=lease_id)
        if lease.owner != owner:
            raise RpcError(
                ErrorCode.NOT_LEASE_OWNER,
                f"lease {lease_id} belongs to another user",
                lease_id=lease_id,
            )
        return lease

    def renew(self, lease_id: str, owner: str) -> Lease:
        """Extend `owner`'s active lease by its TTL from now (monotonic).

        Raises:
            RpcError: as `lookup`.
        """
        lease = self.lookup(lease_id, owner)
        lease.deadline = self.clock.monotonic() + lease.ttl_s
        lease.renewed_at_wall = self.clock.wall()
        return lease

    def attach(self, lease_id: str, token: str, owner: str, conn_id: int | None) -> Lease:
        """Re-attach lease `lease_id` to a new connection of its holder, proving possession
        with the token from the grant (compared as SHA-256 in constant time).

        Raises:
            RpcError: as `lookup`, and `not_lease_owner` for a wrong token.
        """
        lease = self.lookup(lease_id, owner)
        expected = self.token_sha256.get(lease_id, "")
        if not expected or not hmac.compare_digest(expected, token_hash(token)):
            raise RpcError(
                ErrorCode.NOT_LEASE_OWNER, f"wrong token for lease {lease_id}", lease_id=lease_id
            )
        return self.rebind(lease, conn_id)

    def rebind(self, lease: Lease, conn_id: int | None) -> Lease:
        """Bind a lease to the holder's new connection, renew it, give it a fresh token. The
        fresh token is written first: a write that fails changes nothing (the old token
        still re-attaches).

        Raises:
            OSError: the store could not write the fresh token (the lease is unchanged).
        """
        token = secrets.token_urlsafe(24)
        if self.store is not None:
            self.store.put_lease(lease.lease_id, token, lease.to_record())
        lease.conn_id = conn_id
        lease.reattach_by = None
        lease.deadline = self.clock.monotonic() + lease.ttl_s
        lease.token = token
        self.token_sha256[lease.lease_id] = token_hash(token)
        log.info("lease %s re-attached by its holder", lease.lease_id)
        return lease

    def resize(
        self, lease: Lease, mib: int, records: dict[str, dict[str, Any]] | None = None
    ) -> None:
        """Change an active lease's grant to `mib` (`lease.resize`), keeping the running
        outstanding sums: what a shrink frees of its outstanding MiB stays booked as
        unconfirmed until a sample that started after now, as a release's does (§2), and
        each of its GPUs' samplers is asked for one. A growth's admission `records` (per
        GPU) are kept with the lease; its figures are attributed anew and stored. The new
        size is written first: a write that fails changes nothing.

        Raises:
            OSError: the store could not write the new size (the lease is unchanged).
        """
        old = lease.granted_mib
        admission = dict(lease.admission)
        for uuid, record in (records or {}).items():
            admission[uuid] = {**record, "resized_from_mib": old}
        if self.store is not None:
            resized = {**lease.to_record(), "granted_mib": mib, "admission": admission}
            self.store.put_lease(lease.lease_id, lease.token, resized)
        now = self.clock.monotonic()
        for u in lease.gpu_uuids:
            before, after = _owed(lease, u), max(0, mib - lease.observed_mib.get(u, 0))
            self._outstanding[u] = self._outstanding.get(u, 0) + after - before
            self._granted[u] = self._granted.get(u, 0) + mib - lease.granted_mib
            if after < before:
                pending = self._unconfirmed.setdefault(u, collections.deque())
                pending.append((now, before - after, None))  # the lease's own: not kept
                self._unconfirmed_mib[u] = self._unconfirmed_mib.get(u, 0) + before - after
                slot = self.slots.get(u)
                if slot is not None:
                    slot.sample_soon(self.config.release_sample_gap_s)
        lease.granted_mib = mib
        lease.admission = admission
        for uuid in lease.gpu_uuids:
            self._shared.pop((lease.holder, uuid), None)
            slot = self.slots.get(uuid)
            if slot is not None:
                self.update_observed(slot)
        log.info("lease %s resized: %d → %d MiB", lease.lease_id, old, mib)

    # -- expiry ------------------------------------------------------------------------------
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

    # -- revoke ------------------------------------------------------------------------------
    def revoke(self, lease: Lease, state: LeaseState, reason: str) -> bool:
        """End an active lease (False when it already ended): what it was granted but no
        sample showed in use stays booked as unconfirmed until a sample that started after
        now (docs/architecture.md §2), so admission need not wait for that sample; the
        GPU's sampler is asked for one (coalesced); what the lease's processes still hold
        becomes the holder's baseline; the end is recorded (never refused: an end a full disk
        cannot journal is kept in the store's reserve, `LeaseStore.end_lease_soon`)."""
        if lease.lease_id not in self.leases:
            return False
        self._unindex(lease)
        lease.state = state
        lease.ended_reason = reason
        lease.ended_at_wall = self.clock.wall()
        now = self.clock.monotonic()
        for u in lease.gpu_uuids:
            owed = _owed(lease, u)
            if owed > 0:
                self._unconfirmed.setdefault(u, collections.deque()).append(
                    (now, owed, lease.holder)
                )
                self._unconfirmed_mib[u] = self._unconfirmed_mib.get(u, 0) + owed
            slot = self.slots.get(u)
            if slot is not None:
                slot.sample_soon(self.config.release_sample_gap_s)
            target = lease.holder
            others = self._held.get((target, u), {})  # no copy: flat in their number
            kept = lease.observed_mib.get(u, 0)
            if not others:
                kept += self.baselines.pop((target, u), 0)
                self.pre_grant.drop((target, u))
                # its processes count in a nearest ancestor holder's tree there now
                found = keeper(slot, target, self._leased(u)) if slot is not None else None
                target = found if found is not None else target
                others = self._held.get((target, u), {})
            if others and kept > 0:
                # What the ended lease's processes still hold is outside any lease now, not
                # the use of the holder's (or an ancestor's) other leases: over-admitting.
                # Like memory held before a grant, it comes down by what samples show freed.
                before = self.baselines.get((target, u), 0)
                self.pre_grant.add(
                    (target, u), kept, self._seen.get((target, u), 0) + before + kept
                )
                self.set_baseline(target, u, before + kept, others.values())
        self.ended.append(lease)
        self.token_sha256.pop(lease.lease_id, None)
        if self.store is not None:
            self.store.end_lease_soon(
                lease.lease_id, state.value, lease.ended_at_wall, lease.to_record()
            )
            self.store.flush_soon()
            self._ends_since_prune += 1
            if self._ends_since_prune >= 200:  # in the fold's transaction, not on this path
                self._ends_since_prune = 0
                self.store.prune_ended_soon(self.config.ended_history)
        log.info("lease %s %s: %s", lease.lease_id, state.value, reason)
        return True


def _owed(lease: Lease, uuid: str) -> int:
    """What `lease` books on `uuid` beyond its observed use: max(0, granted − observed)."""
    return max(0, lease.granted_mib - lease.observed_mib.get(uuid, 0))
