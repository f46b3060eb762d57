"""The uncontended acquire's fast path (`Admission.grant_at_once`, taken by `Broker._admit`
when the queue holds one request) decides as the full admission pass does: over random
states of three GPUs (leases granted and released, memory allocated outside and inside the
holders' trees, samples fresh, stale, pending or lost, bookings, pauses), a request is granted
by the fast path exactly when a pass over a queue holding it alone would grant it, on the
same GPUs in the same order with the same figures. And a request that fits is granted without
a pass; one that does not goes through the pass, which gives its reason.

In-process brokers with a manual clock; the holders are sleeping processes."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from rbroker.broker.leases import Lease, Waiter
from rbroker_protocol.errors import RpcError
from rbroker_protocol.localapi import AcquireParams, BookParams
from tests.desktop.inprocess import DESCRIPTION, InProcessBroker, SleeperPool
from tests.fakes.gpu_scenarios import GPU0, GPU1, gpu, scenario

GPU2 = "GPU-5a1e0000-0000-0000-0000-000000000003"
GPUS = (GPU0, GPU1, GPU2)
THREE = scenario(gpu(GPU0), gpu(GPU1, total_mib=16384), gpu(GPU2, total_mib=8192))
MIB = st.sampled_from([1, 500, 2000, 6000, 7000, 12000, 15000, 23000, 30000])
PIN = st.none() | st.sampled_from(GPUS)
#: (mib, gpus, pinned GPU, spread, adopt, which holder, expected minutes, claim a booking)
Request = tuple[int, int, str | None, bool, bool, int, int | None, bool]
REQUEST = st.tuples(
    MIB,
    st.integers(1, 3),
    PIN,
    st.booleans(),
    st.booleans(),
    st.integers(0, 1),
    st.none() | st.integers(1, 600),
    st.booleans(),
)


class FastPathMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="rbfp-"))
        (self.tmp / "scenario.toml").write_text(THREE)
        self.pool = SleeperPool()
        self.holders = [self.pool.spawn()[1] for _ in range(2)]
        self.h = InProcessBroker(self.tmp / "scenario.toml", self.tmp, persist=False)
        self.leases: list[Lease] = []

    def _settle(self) -> None:
        """Leave nobody waiting: the next request is the only one, as on the fast path."""
        broker = self.h.broker
        for _ in range(3):
            if not broker.queue:
                return
            self.h.sample()
            self.h.tick(0.0)
        for waiter in list(broker.queue):
            with contextlib.suppress(RpcError):
                broker.cancel_request(waiter.request_id, "tester")
        self.h.spin()

    @rule(request=REQUEST)
    def lease(self, request: Request) -> None:
        """Check the request's decision, then make it (granted through the fast path)."""
        self._agree(request)
        mib, gpus, pin, spread, adopt, which, _, _ = request
        task = self.h.acquire(
            self.holders[which],
            mib=mib,
            gpus=1 if pin else gpus,
            gpu_uuid=pin,
            placement="spread" if spread else "pack",
            adopt=adopt,
            wait_s=0.0,
            ttl_s=3600.0,
        )
        self._settle()
        if task.done() and not task.cancelled() and task.exception() is None:
            self.leases.append(task.result())

    @rule(index=st.integers(0, 20), sample=st.booleans())
    def release(self, index: int, sample: bool) -> None:
        live = [x for x in self.leases if x.lease_id in self.h.broker.leases]
        if live:
            self.h.broker.release(live[index % len(live)].lease_id, "tester")
        if sample:  # else its MiB stay unconfirmed
            self.h.sample()

    @rule(which=st.none() | st.sampled_from(GPUS))
    def sample(self, which: str | None) -> None:
        self.h.sample(which)

    @rule(seconds=st.sampled_from([0.5, 1.5, 2.5]))
    def advance(self, seconds: float) -> None:  # samples go stale past max_sample_age_s
        self.h.clock.advance(seconds)

    @rule(uuid=st.sampled_from(GPUS), mib=st.sampled_from([0, 3000, 9000, 20000]))
    def outside_use(self, uuid: str, mib: int) -> None:  # a pending sample until the next
        self.h.broker.sim().set(uuid, 1, 0, used_mib=mib)

    @rule(uuid=st.sampled_from(GPUS), which=st.integers(0, 1), mib=st.sampled_from([500, 4000]))
    def holder_use(self, uuid: str, which: int, mib: int) -> None:
        self.h.broker.sim().allocate(uuid, 1, self.holders[which].pid, mib)

    @rule(uuid=st.sampled_from(GPUS), error=st.sampled_from(["", "gpu_lost", "unknown"]))
    def telemetry(self, uuid: str, error: str) -> None:
        self.h.broker.sim().set(uuid, 1, 0, error=error)
        self.h.sample(uuid)

    @rule(mib=MIB, pin=PIN, start_in_m=st.integers(-1, 300), for_m=st.integers(1, 600))
    def book(self, mib: int, pin: str | None, start_in_m: int, for_m: int) -> None:
        now = self.h.clock.wall()
        params = BookParams(
            mib=mib,
            gpu_uuid=pin,
            start_at=now + start_in_m * 60,
            end_at=now + (start_in_m + for_m) * 60,
            project="tests",
            session="s",
            purpose="fast path",
        )
        with contextlib.suppress(RpcError):
            self.h.broker.book(params, "tester")

    @rule(paused=st.sampled_from([False, False, False, True]))
    def pause(self, paused: bool) -> None:
        self.h.broker.set_paused(paused)
        self._settle()

    @rule(requests=st.lists(REQUEST, min_size=1, max_size=4))
    def fast_path_agrees_with_the_pass(self, requests: list[Request]) -> None:
        for request in requests:
            self._agree(request)

    def _agree(self, request: Request) -> None:
        """The fast path's decision on `request` (nobody else waiting) is the pass's."""
        mib, gpus, pin, spread, adopt, which, expected_m, claim = request
        broker = self.h.broker
        assert not broker.queue
        params = AcquireParams.model_validate(
            {
                **DESCRIPTION,
                "mib": mib,
                "gpus": 1 if pin else gpus,
                "gpu_uuid": pin,
                "placement": "spread" if spread else "pack",
                "adopt": adopt,
                "expected_s": None if expected_m is None else expected_m * 60.0,
                "wait_s": 0.0,
            }
        )
        booked = [
            v
            for v in broker.bookings_list("tester")["bookings"]
            if v["state"] in ("held", "claimed")
        ]
        if claim and booked:
            params = params.model_copy(update={"booking_id": booked[0]["booking_id"]})
            try:
                candidates = broker.bookings.check_claim(
                    booked[0]["booking_id"], "tester", mib, params.gpus, pin
                ).gpu_uuids
            except RpcError:
                return
        else:
            candidates = broker.admission.candidates(pin, params.gpus, mib)

        async def decide() -> tuple[list[Any], list[Any] | None, Waiter]:
            clock = self.h.clock
            now = clock.monotonic()
            waiter = broker.waiting.new_waiter(
                params,
                candidates,
                "tester",
                self.holders[which],
                1,
                now,
                clock.wall(),
                clock.boottime(),
                numbered=False,
            )
            if params.booking_id is not None:
                waiter.booked_at = broker.bookings.get(params.booking_id).accepted_at
            fast = broker.admission.grant_at_once(waiter, broker.paused, now)
            alone = type(broker.waiting)(None, lambda kind, data: None)  # a queue of its own
            alone.add(waiter)
            passed: list[list[Any]] = []

            def grant(w: Waiter, chosen: list[Any], at: float) -> None:
                assert at == now
                passed.append(chosen)
                alone.remove(w)

            broker.admission.run(alone, broker.paused, grant, lambda kind, data: None)
            if waiter.future.done():  # refused by the pass (never fits): nobody awaits it
                waiter.reason_kind = f"refused: {waiter.future.exception()}"
            return fast, passed[0] if passed else None, waiter

        fast, full, waiter = self.h.run(decide())
        event("granted" if full else waiter.reason_kind.split(":")[0])
        if full is None:
            assert fast == [], f"the fast path granted what the pass makes wait: {waiter.reason}"
        else:
            assert fast == full, (fast, full)

    def teardown(self) -> None:
        try:
            self.h.close()
        finally:
            self.pool.close()
            shutil.rmtree(self.tmp, ignore_errors=True)


FastPathMachine.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_fast_path_machine = FastPathMachine.TestCase


def _counting_passes(h: InProcessBroker) -> list[int]:
    passes: list[int] = []
    run = h.broker.admission.run

    def counted(*args: object, **kwargs: object) -> None:
        passes.append(1)
        run(*args, **kwargs)  # type: ignore[arg-type]

    h.broker.admission.run = counted  # type: ignore[method-assign]
    return passes


def test_an_uncontended_request_that_fits_is_granted_without_a_pass(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    _, holder = pool.spawn()
    passes = _counting_passes(h)
    lease = h.acquire(holder, mib=4000).result()
    assert passes == [] and lease.granted_mib == 4000 and not h.broker.queue
    assert lease.admission[lease.gpu_uuid]["available_mib"] == 24576 - 1229


def test_an_uncontended_request_that_waits_goes_through_the_pass_for_its_reason(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    _, holder = pool.spawn()
    h.acquire(pool.spawn()[1], mib=20000).result()
    passes = _counting_passes(h)
    task = h.acquire(holder, mib=8000, wait_s=60.0)
    assert passes == [1] and not task.done()
    (waiter,) = h.broker.queue
    assert waiter.reason_kind == "capacity" and "8 000 requested" in waiter.reason
    h.clock.advance(3.0)  # stale: nothing granted until a fresh sample
    h.broker.set_paused(False)
    assert passes == [1, 1] and not task.done() and waiter.reason_kind == "sampling"
    task.cancel()
    h.spin()
    with contextlib.suppress(asyncio.CancelledError):
        task.result()
