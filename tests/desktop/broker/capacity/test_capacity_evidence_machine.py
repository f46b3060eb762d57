"""Stateful property test of attribution against ground truth: random sequences of grants,
allocations inside leases, memory held outside leases, releases, samples in which NVML omits
a holder, listings of dead pids and time passing, on an in-process `Broker` whose simulated
driver reports exactly what the test says is true.

Checked at every grant (by wrapping `Broker._grant`), against the truth the sample used:
    headroom + memory outside any lease + Σ over active leases of max(granted, used) ≤ total
(the new grant included): the broker never admits past what the GPU really holds, whatever
the process list got wrong. Before attribution needed evidence, one sample that omitted a
holder moved its outside memory into its lease and the next grant over-admitted. A lease may
use more than its grant (`use_beyond_the_grant`, 1.5×): before a grant kept what its holder already
held out of the new lease, the next sample shared an older lease's use beyond its grant into
the new lease, and the grant after that over-admitted.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rbroker.broker.leases import Lease, Waiter
from rbroker.gpu.scenario import SimProcess
from rbroker_protocol.errors import RpcError
from tests.conftest import GPU0
from tests.desktop.inprocess import InProcessBroker, SleeperPool
from tests.fakes.gpu_scenarios import gpu, scenario

TOTAL, HEADROOM = 24576, 1024
HOLDERS = 3
SCENARIO = scenario(gpu(GPU0, total_mib=TOTAL))


@dataclass
class Truth:
    """What really holds memory on the GPU (MiB)."""

    others_mib: int = 0  # processes that hold no lease and are not listed
    dead_listings: dict[int, int] = field(default_factory=dict)  # dead pid -> MiB still held
    outside_mib: list[int] = field(default_factory=lambda: [0] * HOLDERS)  # per holder
    lease_used: dict[str, int] = field(default_factory=dict)  # lease id -> MiB it uses

    def outside_any_lease(self) -> int:
        return self.others_mib + sum(self.dead_listings.values()) + sum(self.outside_mib)

    def device_used(self) -> int:
        return self.outside_any_lease() + sum(self.lease_used.values())


class EvidenceMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="rbev-"))
        (self.tmp / "scenario.toml").write_text(textwrap.dedent(SCENARIO))
        self.pool = SleeperPool()
        self.holders = [self.pool.spawn() for _ in range(HOLDERS)]
        self.h = InProcessBroker(
            self.tmp / "scenario.toml", self.tmp, persist=False, headroom_mib=HEADROOM
        )
        self.truth = Truth()
        self.truth_at_sample = Truth()
        self.hidden: set[int] = set()  # holders the next sample's process list omits
        self.lease_holder: dict[str, int] = {}
        self.grants = 0
        self._wrap()
        self._push_and_sample()

    # -- the simulated driver reports the truth ------------------------------------------
    def _push_and_sample(self) -> None:
        procs = [SimProcess(pid, mib) for pid, mib in self.truth.dead_listings.items()]
        for i, (proc, _) in enumerate(self.holders):
            if i in self.hidden:
                continue
            held = self.truth.outside_mib[i] + sum(
                used for lid, used in self.truth.lease_used.items() if self.lease_holder[lid] == i
            )
            if held:
                procs.append(SimProcess(proc.pid, held))
        device_used = self.truth.outside_any_lease() + sum(self.truth.lease_used.values())
        self.h.fake.set_gpu(GPU0, device_used_mib=device_used, processes=tuple(procs))
        self.truth_at_sample = Truth(
            self.truth.others_mib,
            dict(self.truth.dead_listings),
            list(self.truth.outside_mib),
            dict(self.truth.lease_used),
        )
        self.hidden.clear()
        self.h.sample()

    def _wrap(self) -> None:
        broker = self.h.broker
        grant = broker._grant

        def checked_grant(waiter: Waiter, chosen: list[Any], now: float) -> None:
            truth = self.truth_at_sample
            leases = [lease for lease in broker.leases.values() if GPU0 in lease.gpu_uuids]
            booked = sum(
                max(lease.granted_mib, truth.lease_used.get(lease.lease_id, 0)) for lease in leases
            )
            assert HEADROOM + truth.outside_any_lease() + booked + waiter.asked_mib <= TOTAL, (
                truth,
                booked,
                waiter.asked_mib,
                chosen,
            )
            before = set(broker.leases)
            grant(waiter, chosen, now)
            (new_id,) = set(broker.leases) - before
            self.lease_holder[new_id] = self.holders.index(
                next(h for h in self.holders if h[1] == waiter.holder)
            )
            self.truth.lease_used[new_id] = 0
            self.grants += 1

        broker._grant = checked_grant  # type: ignore[method-assign]

    def _allocate(self, change: Callable[[Truth], None]) -> None:
        """Apply `change` to the truth unless the GPU cannot hold it: memory taken outside
        leases after the broker's latest sample can leave less than a lease was granted,
        and then an allocation fails (CUDA out of memory) rather than the GPU overfilling."""
        trial = copy.deepcopy(self.truth)
        change(trial)
        if trial.device_used() <= TOTAL:
            self.truth = trial

    def _active(self) -> list[Lease]:
        return list(self.h.broker.leases.values())

    # -- rules -----------------------------------------------------------------------------
    @rule(
        holder=st.integers(0, HOLDERS - 1),
        mib=st.sampled_from([1024, 2048, 4096, 6144, 12288, 16384]),
    )
    def acquire(self, holder: int, mib: int) -> None:
        task = self.h.acquire(self.holders[holder][1], conn_id=holder + 1, mib=mib)
        self.h.spin()
        if task.done() and task.exception() is not None:
            assert isinstance(task.exception(), RpcError)

    @precondition(lambda self: bool(self.h.broker.leases))
    @rule(data=st.data(), fraction=st.sampled_from([0.25, 0.5, 1.0]))
    def use_lease(self, data: st.DataObject, fraction: float) -> None:
        lease = data.draw(st.sampled_from(self._active()))
        used = int(lease.granted_mib * fraction)
        self._allocate(lambda t: t.lease_used.__setitem__(lease.lease_id, used))

    @precondition(lambda self: bool(self.h.broker.leases))
    @rule(data=st.data())
    def use_beyond_the_grant(self, data: st.DataObject) -> None:
        # Only the one lease of its holder, and seen before the holder's next grant: the
        # driver lists memory per process, not per lease, so use beyond one lease's grant
        # is told apart from a newer lease's use of the same process only by a sample
        # before that lease was granted (after it, the holder's leases share it).
        lease = data.draw(st.sampled_from(self._active()))
        holder = self.lease_holder[lease.lease_id]
        if sum(self.lease_holder[x.lease_id] == holder for x in self._active()) > 1:
            return
        used = lease.granted_mib * 3 // 2
        self._allocate(lambda t: t.lease_used.__setitem__(lease.lease_id, used))
        self.hidden.discard(holder)
        self._push_and_sample()

    @rule(holder=st.integers(0, HOLDERS - 1), mib=st.sampled_from([0, 1000, 3000, 5000]))
    def hold_outside_leases(self, holder: int, mib: int) -> None:
        # Only a holder without a lease: once it holds one, whatever its processes allocate
        # beyond what they held at the grant is the lease's use (that is the contract), so
        # "outside" growth would be indistinguishable from lease use to any observer.
        # And seen before its next grant: memory that no sample showed before a grant is, to
        # any observer, the lease's use (allocated just before the grant or just after it),
        # so the holder's memory outside leases is sampled (listing it) before it asks.
        if any(self.lease_holder[lease.lease_id] == holder for lease in self._active()):
            return
        self._allocate(lambda t: t.outside_mib.__setitem__(holder, mib))
        self.hidden.discard(holder)
        self._push_and_sample()

    @precondition(lambda self: bool(self.h.broker.leases))
    @rule(data=st.data(), keep=st.booleans())
    def release(self, data: st.DataObject, keep: bool) -> None:
        lease = data.draw(st.sampled_from(self._active()))
        self.h.broker.release(lease.lease_id, lease.owner)
        used = self.truth.lease_used.pop(lease.lease_id, 0)
        if keep:  # the process keeps what it allocated: now outside any lease
            self.truth.outside_mib[self.lease_holder[lease.lease_id]] += used
        self.h.spin()

    @rule(holder=st.integers(0, HOLDERS - 1))
    def nvml_omits_a_holder(self, holder: int) -> None:
        self.hidden.add(holder)

    @rule(mib=st.sampled_from([0, 2048, 6144]))
    def a_dead_pid_stays_listed(self, mib: int) -> None:
        self._allocate(lambda t: setattr(t, "dead_listings", {4_000_000: mib} if mib else {}))

    @rule(mib=st.sampled_from([0, 1000, 4000]))
    def others_use_memory(self, mib: int) -> None:
        self._allocate(lambda t: setattr(t, "others_mib", mib))

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.0]))
    def sample(self, seconds: float) -> None:
        self.h.clock.advance(seconds)  # no tick runs: nothing expires here
        self._push_and_sample()

    @invariant()
    def holders_running_observed_sums_match_their_leases(self) -> None:
        # the lessor keeps Σ observed per (holder, GPU) instead of walking the holder's leases
        lessor = self.h.broker.lessor
        walked = {
            key: sum(x.observed_mib.get(key[1], 0) for x in held.values())
            for key, held in lessor._held.items()
        }
        assert lessor._seen == walked

    def teardown(self) -> None:
        try:
            self.h.close()
        finally:
            self.pool.close()
            shutil.rmtree(self.tmp, ignore_errors=True)


EvidenceMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_capacity_evidence_machine = EvidenceMachine.TestCase


def test_an_older_lease_s_use_beyond_its_grant_never_discounts_a_newer_lease() -> None:
    """Holder 0 uses 6 144 MiB under a 4 096 MiB lease, then gets a 6 144 MiB lease: the
    2 048 MiB beyond the first grant were held before the second grant, so they are never the
    second lease's use; the grant after that must still leave room for all of it."""
    m = EvidenceMachine()
    try:
        m.acquire(holder=0, mib=4096)
        (first,) = m._active()
        m.truth.lease_used[first.lease_id] = 6144
        m.sample(0.5)
        m.acquire(holder=0, mib=6144)
        assert len(m._active()) == 2  # granted on the same sample: no wait after a grant
        m.sample(0.5)
        m.acquire(holder=1, mib=12288)  # 1 024 more than the GPU holds (checked in the grant)
        assert len(m._active()) == 2
        outstanding = m.h.broker.capacity(GPU0)
        assert outstanding is not None and outstanding.outstanding_mib == 6144
    finally:
        m.teardown()


def test_a_holder_missing_from_a_sample_keeps_what_it_held_before_its_grant() -> None:
    """Holder 2 holds 5 000 MiB outside leases, is granted 2 048, and one sample omits it
    while another process without a lease freed its 1 000: the device's figure then fits
    either missing listing, and the stale one was kept. Its baseline must not come down on
    that sample (nothing listed says it freed anything): when it is listed again with its
    5 000, they are still held before its grant, not its lease's use, and a request for
    16 384 MiB still does not fit (1 024 + 5 000 + 2 048 + 1 024 + 16 384 > 24 576)."""
    m = EvidenceMachine()
    try:
        m.hold_outside_leases(holder=1, mib=1000)
        m.hold_outside_leases(holder=2, mib=5000)
        m.acquire(holder=2, mib=2048)
        m.nvml_omits_a_holder(holder=2)
        m.acquire(holder=0, mib=1024)
        m.acquire(holder=0, mib=16384)  # waits: 14 480 MiB available
        m.nvml_omits_a_holder(holder=0)
        m.hold_outside_leases(holder=1, mib=0)  # sampled: holder 2 is not listed
        m.sample(0.5)  # listed again with its 5 000 (checked_grant asserts any grant)
        assert len(m._active()) == 2
        cap = m.h.broker.capacity(GPU0)
        assert cap is not None and cap.outstanding_mib == 2048 + 1024
    finally:
        m.teardown()


def test_a_holder_missing_when_granted_keeps_what_the_device_still_holds_of_it() -> None:
    """Holder 0 holds 3 000 MiB outside leases (listed at 3 256 while a lease of it used 256),
    and the sample before its next grant omits it while a dead pid's 6 144 and two other
    holders are listed: the device then holds 3 000 that no listed process does, less than
    its last reading. Its listing is kept at what the device still holds (it was dropped,
    and the grant took a baseline of 0: when it was listed again its 3 000 counted as the
    new lease's use and the next request was granted past the GPU)."""
    m = EvidenceMachine()
    try:
        m.hold_outside_leases(holder=0, mib=3000)
        m.acquire(holder=0, mib=1024)
        (first,) = m._active()
        m.truth.lease_used[first.lease_id] = 256
        m.hold_outside_leases(holder=1, mib=3000)  # sampled: holder 0 at 3 256
        m.h.broker.release(first.lease_id, first.owner)
        m.truth.lease_used.pop(first.lease_id)
        m.truth.dead_listings = {4_000_000: 6144}
        m.nvml_omits_a_holder(holder=0)
        m.hold_outside_leases(holder=2, mib=5000)  # sampled without holder 0
        m.acquire(holder=0, mib=6144)
        assert len(m._active()) == 1
        m.sample(0.5)  # holder 0 listed again at 3 000: not the new lease's use
        m.acquire(holder=0, mib=1024)  # 264 MiB available: waits (checked_grant asserts)
        assert len(m._active()) == 1
        cap = m.h.broker.capacity(GPU0)
        assert cap is not None and cap.outstanding_mib == 6144
    finally:
        m.teardown()
