"""The booking promise as a property (docs/architecture.md §2a), on the in-process broker
with a manual clock: whatever mix of bookings, leases (with and without a declared end),
claims, releases and time passing, (1) the bookings overlapping any instant never promise more
than total − headroom (each its whole MiB: a claim that ends gives its booking all of it back),
and (2) every lease granted fits, beside every other live lease, under
the peak of the bookings its horizon overlaps (the one it claims aside). The oracle sweeps the
bookings as `bookings.list` shows them, not with the broker's own index."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from rbroker.broker.holders import Holder
from rbroker.broker.leases import Lease
from rbroker_protocol.errors import RpcError
from rbroker_protocol.localapi import BookParams
from rbroker_protocol.results import BookingView
from tests.conftest import SINGLE_24G
from tests.desktop.inprocess import InProcessBroker, SleeperPool

USABLE = 24576 - 1229
PROTECT_S = 4 * 3600.0
MIB = st.sampled_from([1000, 4000, 8000, 12000, 16000, 23347])


def peak(
    views: list[BookingView],
    t0: float,
    t1: float,
    exclude: str | None = None,
    promised: bool = False,
) -> int:
    """The most MiB the live bookings protect together at any instant of [t0, t1) (their
    whole MiB when `promised`, else less what their claims hold)."""
    spans = [
        (max(v["start_at"], t0), v["end_at"], v["mib"] - (0 if promised else v["claimed_mib"]))
        for v in views
        if v["state"] in ("booked", "held", "claimed")
        and v["booking_id"] != exclude
        and v["start_at"] < t1
        and v["end_at"] > t0
    ]
    instants = {s for s, _, _ in spans}
    return max((sum(m for s, e, m in spans if s <= t < e) for t in instants), default=0)


class BookingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="rbbk-"))
        (self.tmp / "scenario.toml").write_text(SINGLE_24G)
        self.pool = SleeperPool()
        self.holders: list[Holder] = [self.pool.spawn()[1] for _ in range(2)]
        self.h = InProcessBroker(self.tmp / "scenario.toml", self.tmp, persist=False)
        self.leases: list[Lease] = []

    def views(self) -> list[BookingView]:
        return self.h.broker.bookings_list("tester")["bookings"]

    @rule(mib=MIB, start_in_m=st.integers(-1, 12 * 60), for_m=st.integers(1, 8 * 60))
    def book(self, mib: int, start_in_m: int, for_m: int) -> None:
        now = self.h.clock.wall()
        params = BookParams(
            mib=mib,
            start_at=now + start_in_m * 60,
            end_at=now + (start_in_m + for_m) * 60,
            project="p",
            session="s",
            purpose="property",
        )
        with contextlib.suppress(RpcError):  # refused: the invariant checks what is kept
            self.h.broker.book(params, "tester")

    def _granted(self, lease: Lease, expected_s: float | None) -> None:
        now = self.h.clock.wall()
        horizon = now + (expected_s if expected_s is not None else PROTECT_S)
        live = [x for x in self.leases if x.state.value == "active"] + [lease]
        booked = peak(self.views(), now, horizon, exclude=lease.booking_id)
        assert sum(x.granted_mib for x in live) + booked <= USABLE, (lease, booked)
        self.leases.append(lease)

    @rule(
        mib=MIB,
        expected_m=st.none() | st.integers(1, 10 * 60),
        which=st.integers(0, 1),
    )
    def lease(self, mib: int, expected_m: int | None, which: int) -> None:
        expected_s = None if expected_m is None else expected_m * 60.0
        task = self.h.acquire(
            self.holders[which], mib=mib, wait_s=0.0, ttl_s=3600.0, expected_s=expected_s
        )
        self.h.tick(0.0)
        if task.done() and task.exception() is None:
            self._granted(task.result(), expected_s)

    @rule(which=st.integers(0, 1), part=st.sampled_from([1.0, 0.5]))
    def claim(self, which: int, part: float) -> None:
        for v in self.views():
            if v["state"] in ("held", "claimed") and v["mib"] > v["claimed_mib"]:
                mib = max(1, int((v["mib"] - v["claimed_mib"]) * part))
                task = self.h.acquire(
                    self.holders[which],
                    mib=mib,
                    gpus=len(v["gpu_uuids"]),
                    wait_s=0.0,
                    ttl_s=3600.0,
                    booking_id=v["booking_id"],
                )
                self.h.tick(0.0)
                if task.done() and task.exception() is None:
                    lease = task.result()
                    assert lease.booking_id == v["booking_id"]
                    self._granted(lease, None)
                return

    @rule(index=st.integers(0, 20))
    def release(self, index: int) -> None:
        live = [x for x in self.leases if x.state.value == "active"]
        if live:
            self.h.broker.release(live[index % len(live)].lease_id, "tester")
            self.h.sample()

    @rule(minutes=st.sampled_from([1, 10, 20, 50]))
    def advance(self, minutes: int) -> None:
        for lease in self.leases:
            if lease.state.value == "active":
                self.h.broker.renew(lease.lease_id, "tester")
        self.h.clock.advance(minutes * 60.0)
        self.h.tick(0.1)
        self.h.sample()

    @invariant()
    def bookings_never_overlap_beyond_the_usable_memory(self) -> None:
        views = self.views()
        for v in views:
            assert peak(views, v["start_at"], v["start_at"] + 1, promised=True) <= USABLE

    def teardown(self) -> None:
        try:
            self.h.close()
        finally:
            self.pool.close()
            shutil.rmtree(self.tmp, ignore_errors=True)


BookingMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_booking_machine = BookingMachine.TestCase
