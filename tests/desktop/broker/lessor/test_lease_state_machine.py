"""Stateful property test of the broker (issue 3): random sequences of acquire, renew,
release, cancel, connection close, holder crash, NVML change, NVML fault, clock jump,
sleep gap and broker crash-restart, on an in-process `Broker` with a manual clock.

Checked at every grant (by wrapping `Broker._grant`): the GPU's sample was fresh when the
admission pass began (taken after the latest grant or simulated change on it, at most
`max_sample_age_s` old, telemetry ok); device_used + outstanding + extra needed + headroom
≤ total, with outstanding recomputed from the lease table plus, by the release rule, what
every lease that ended after the sample began had been granted but not shown using at its
end (an adoption that needs no extra books nothing, so it may be admitted even on a full
GPU); and the new lease books no more outstanding memory than was checked. Checked at
every step: the store's active leases are the broker's, no two active leases answer one
request key, every answer is a lease or a stable RPC error. Checked at the end: every
lease ever granted ended in exactly one terminal state.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rbroker.broker.capacity import Capacity, unbacked_mib
from rbroker.broker.leases import TERMINAL_STATES, Lease, LeaseState, Waiter
from rbroker.broker.service import Broker
from rbroker_protocol.errors import RpcError
from tests.conftest import GPU0, GPU1
from tests.desktop.inprocess import InProcessBroker, SleeperPool
from tests.fakes.gpu_scenarios import gpu, scenario

SCENARIO = scenario(gpu(GPU0), gpu(GPU1, total_mib=8192))

HOLDERS = 3
CONNS = 3


class LeaseMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="rbsm-"))
        (self.tmp / "scenario.toml").write_text(textwrap.dedent(SCENARIO))
        self.pool = SleeperPool()
        self.holders = [self.pool.spawn() for _ in range(HOLDERS)]
        self.h = InProcessBroker(self.tmp / "scenario.toml", self.tmp)
        self.pending: list[tuple[asyncio.Task[Lease], dict[str, Any]]] = []
        self.abandoned: list[dict[str, Any]] = []
        self.latest: dict[str, Lease] = {}
        self.ends: dict[str, list[LeaseState]] = {}
        self.grants = 0
        self.ended_unconfirmed: list[tuple[str, float, int]] = []
        self.next_key = 0
        self.next_conn = CONNS + 1
        self._wrap(self.h.broker)

    # -- instrumentation -------------------------------------------------------------------
    def _wrap(self, broker: Broker) -> None:
        grant: Callable[[Waiter, list[tuple[str, Capacity, int]], float], None] = broker._grant
        end: Callable[[Lease, LeaseState, str], None] = broker._end
        admit: Callable[[], None] = broker._admit
        fresh_at_pass_start: set[str] = set()
        # (GPU, monotonic end time, MiB granted but not observed) of every lease that ended
        ended_unconfirmed = self.ended_unconfirmed = []

        def recorded_admit() -> None:
            # One pass may grant several requests from one sample, each booked before the
            # next is checked: freshness holds at the start of the pass.
            now = broker.clock.monotonic()
            fresh_at_pass_start.clear()
            fresh_at_pass_start.update(
                u for u, s in broker.slots.items() if s.fresh(now, broker.config.max_sample_age_s)
            )
            admit()

        def checked_grant(waiter: Waiter, chosen: list[Any], now: float) -> None:
            assert len({c.gpu_uuid for c in chosen}) == len(chosen) == waiter.gpus
            for u, cap, claim, need in chosen:
                assert u in waiter.candidates
                slot = broker.slots[u]
                assert u in fresh_at_pass_start, (u, slot)
                assert slot.sample is not None
                outstanding = sum(
                    max(0, lease.granted_mib - lease.observed_mib.get(u, 0))
                    for lease in broker.leases.values()
                    if u in lease.gpu_uuids
                )
                # the release rule: an ended lease's unconfirmed MiB stay booked until a
                # sample that started after its end
                outstanding += sum(
                    mib
                    for g, at, mib in ended_unconfirmed
                    if g == u and at >= slot.sample.started_at
                )
                total, used = slot.sample.total_mib, slot.sample.device_used_mib
                # the unbacked rule (docs/architecture.md §2): what the leases' observed use
                # discounts that device_used cannot hold of their holders' listed processes
                # stays outstanding (two holders each listed at 6 000 MiB on an 8 192 MiB GPU)
                on_u = [lease for lease in broker.leases.values() if u in lease.gpu_uuids]
                holders = {lease.holder for lease in on_u}
                discount = sum(min(x.granted_mib, x.observed_mib.get(u, 0)) for x in on_u)
                # every listed process, and those in a lease holder's process tree (once)
                listed = sum(proc.used_mib or 0 for proc, _ in slot.chains)
                of_holders = sum(
                    proc.used_mib or 0
                    for proc, chain in slot.chains
                    if any(h in holders for h in chain)
                )
                outstanding += unbacked_mib(discount, of_holders, listed, used)
                assert cap == Capacity(total, slot.headroom_mib, used, outstanding), cap
                if need > 0:  # need 0: a pure adoption of memory in use, it books nothing new
                    assert used + outstanding + need + slot.headroom_mib <= total, (u, cap, need)
                assert (
                    need == waiter.asked_mib if not waiter.adopt else 0 <= need <= waiter.asked_mib
                )
                assert claim + need == waiter.asked_mib  # the two parts of what was asked
            if waiter.request_key:
                assert not any(
                    lease.request_key == waiter.request_key for lease in broker.leases.values()
                ), f"request {waiter.request_key} granted twice"
            before = set(broker.leases)
            grant(waiter, chosen, now)
            (new_id,) = set(broker.leases) - before
            lease = broker.leases[new_id]
            for u, _, _, need in chosen:  # what the grant books is what was checked, no more
                assert max(0, lease.granted_mib - lease.observed_mib.get(u, 0)) <= need
            assert new_id not in self.latest, f"lease id {new_id} reused"
            self.latest[new_id] = broker.leases[new_id]
            self.ends[new_id] = []
            self.grants += 1

        def recorded_end(lease: Lease, state: LeaseState, reason: str) -> None:
            if lease.lease_id in broker.leases:
                assert state in TERMINAL_STATES
                self.ends.setdefault(lease.lease_id, []).append(state)
                now = broker.clock.monotonic()
                for u in lease.gpu_uuids:
                    owed = max(0, lease.granted_mib - lease.observed_mib.get(u, 0))
                    ended_unconfirmed.append((u, now, owed))
            end(lease, state, reason)

        broker._admit = recorded_admit  # type: ignore[method-assign]
        broker._grant = checked_grant  # type: ignore[method-assign]
        broker._end = recorded_end  # type: ignore[method-assign]

    def _harvest(self) -> None:
        self.h.spin()
        still = []
        for task, params in self.pending:
            if not task.done():
                still.append((task, params))
                continue
            if task.cancelled():
                continue
            exc = task.exception()
            if exc is not None:
                assert isinstance(exc, RpcError), repr(exc)
                continue
            lease = task.result()
            assert lease.lease_id in self.latest
            assert lease.granted_mib == params["mib"]
        self.pending = still

    # Lease ids are random: rules draw leases in grant order (dict order), never sorted by
    # id, so that hypothesis replays the same choices (and the same preconditions).

    @property
    def broker(self) -> Broker:
        return self.h.broker

    # -- rules ---------------------------------------------------------------------------
    @rule(
        holder=st.integers(0, HOLDERS - 1),
        mib=st.sampled_from([512, 1024, 2048, 4096, 8192, 16384, 30000]),
        gpu=st.sampled_from([None, None, GPU0, GPU1]),
        gpus=st.sampled_from([1, 1, 1, 2]),
        adopt=st.booleans(),
        wait_s=st.sampled_from([0.0, 0.0, 20.0]),
        keyed=st.booleans(),
        conn=st.integers(1, CONNS),
        placement=st.sampled_from(["pack", "spread"]),
        kicked=st.booleans(),
    )
    def acquire(
        self,
        holder: int,
        mib: int,
        gpu: str | None,
        gpus: int,
        adopt: bool,
        wait_s: float,
        keyed: bool,
        conn: int,
        placement: str,
        kicked: bool,
    ) -> None:
        """`kicked`: the sampler answers the kick a waiting request gives it before any
        other step (in the broker, a waiter asks for a fresh sample at once)."""
        params: dict[str, Any] = {
            "mib": mib,
            "gpus": 1 if gpu else gpus,
            "adopt": adopt,
            "wait_s": wait_s,
            "ttl_s": 30.0,
            "placement": placement,
        }
        if gpu:
            params["gpu_uuid"] = gpu
        if keyed:
            self.next_key += 1
            params["request_key"] = f"key{self.next_key}"
        _, identity = self.holders[holder]
        task = self.h.acquire(identity, conn_id=conn, **params)
        self.pending.append((task, {**params, "holder": identity, "conn": conn}))
        if kicked and self.broker.queue:
            self.h.sample()
        self._harvest()

    @precondition(lambda self: bool(self.abandoned))
    @rule(data=st.data())
    def resend_after_restart(self, data: st.DataObject) -> None:
        """The SDK reconnects after a broker restart and sends its request again."""
        params = data.draw(st.sampled_from(self.abandoned))
        self.abandoned.remove(params)
        args = {k: v for k, v in params.items() if k not in ("holder", "conn")}
        self.next_conn += 1
        task = self.h.acquire(params["holder"], conn_id=self.next_conn, **args)
        self.pending.append((task, {**params, "conn": self.next_conn}))
        self._harvest()

    @precondition(lambda self: bool(self.h.broker.leases))
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        lease_id = data.draw(st.sampled_from(list(self.broker.leases)))
        lease = self.broker.renew(lease_id, "tester")
        assert lease.deadline == self.h.clock.monotonic() + lease.ttl_s

    @precondition(lambda self: bool(self.h.broker.leases))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lease_id = data.draw(st.sampled_from(list(self.broker.leases)))
        assert self.broker.release(lease_id, "tester").state is LeaseState.RELEASED
        self._harvest()

    @precondition(lambda self: bool(self.ends))
    @rule(data=st.data())
    def renew_ended(self, data: st.DataObject) -> None:
        ended = [i for i in self.ends if i not in self.broker.leases]
        if not ended:
            return
        lease_id = data.draw(st.sampled_from(ended))
        try:
            self.broker.renew(lease_id, "tester")
        except RpcError as err:
            assert err.name.value in ("lease_not_found", "lease_expired")
        else:
            raise AssertionError(f"ended lease {lease_id} renewed")

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        waiting = [t for t, _ in self.pending if not t.done()]
        if not waiting:
            return
        data.draw(st.sampled_from(waiting)).cancel()
        self._harvest()

    @rule(conn=st.integers(1, CONNS))
    def connection_closed(self, conn: int) -> None:
        for task, params in self.pending:
            if not task.done() and params["conn"] == conn:
                task.cancel()  # the local API cancels a closed connection's requests
        self.broker.connection_closed(conn)
        self._harvest()
        assert not any(lease.conn_id == conn for lease in self.broker.leases.values())
        assert not any(w.conn_id == conn for w in self.broker.queue)

    @rule(holder=st.integers(0, HOLDERS - 1), reap=st.booleans())
    def holder_crash(self, holder: int, reap: bool) -> None:
        proc, _ = self.holders[holder]
        proc.kill()
        proc.wait(10)
        self.holders[holder] = self.pool.spawn()
        if reap:
            self.h.tick(0.25)
            self._harvest()

    @rule(
        holder=st.integers(0, HOLDERS - 1),
        gpu=st.sampled_from([GPU0, GPU1]),
        mib=st.sampled_from([256, 2048, 6000]),
    )
    def holder_allocates(self, holder: int, gpu: str, mib: int) -> None:
        proc, _ = self.holders[holder]
        self.h.fake.allocate(gpu, proc.pid, mib)

    @rule(gpu=st.sampled_from([GPU0, GPU1]), used=st.sampled_from([0, 0, 1000, 6000, 20000]))
    def others_use_memory(self, gpu: str, used: int) -> None:
        self.h.fake.set_gpu(gpu, used_mib=used)

    @rule(
        gpu=st.sampled_from([GPU0, GPU1]),
        error=st.sampled_from(["", "", "gpu_lost", "unknown", "version_mismatch"]),
    )
    def nvml_fault(self, gpu: str, error: str) -> None:
        self.h.fake.set_gpu(gpu, error=error)

    @rule(gpu=st.sampled_from([None, GPU0, GPU1]))
    def sample(self, gpu: str | None) -> None:
        self.h.sample(gpu)
        self._harvest()

    @rule(
        seconds=st.sampled_from([0.1, 1.0, 2.5, 10.0, 29.0, 31.0, 45.0]),
        wall_jump=st.sampled_from([0.0, 0.0, 3600.0, -3600.0]),
        stalled=st.booleans(),
    )
    def time_passes(self, seconds: float, wall_jump: float, stalled: bool) -> None:
        """`seconds` of monotonic time; the wall clock may jump; `stalled`: the loop did
        not run meanwhile (the tick loop sees one gap) rather than ticking all along."""
        self.h.clock.advance(seconds)
        self.h.clock.wall_s += wall_jump
        self.h.tick(seconds if stalled else 0.1)
        self._harvest()

    @rule()
    def sleep_resume(self) -> None:
        """A 10-minute suspend: boot time moves, monotonic barely (Linux)."""
        self.h.clock.mono += 0.1
        self.h.clock.boot += 600.0
        self.h.clock.wall_s += 600.0
        self.h.tick(600.0)
        for lease in self.broker.leases.values():
            assert lease.deadline >= self.h.clock.monotonic() + lease.ttl_s - 1e-6
        self._harvest()

    @rule()
    def broker_crash_and_restart(self) -> None:
        active = {i for i, lease in self.broker.leases.items() if lease.holder.alive()}
        keyed_waiting = [
            p for t, p in self.pending if not t.done() and p.get("request_key") and p["wait_s"]
        ]
        self.h.restart()
        self._wrap(self.broker)
        for lease in self.broker.ended:  # ended at restore: their holders died meanwhile
            self.ends.setdefault(lease.lease_id, []).append(lease.state)
            self.latest[lease.lease_id] = lease
        assert set(self.broker.leases) == active
        for lease_id, lease in self.broker.leases.items():
            assert lease.restored
            self.latest[lease_id] = lease
        self._harvest()
        self.pending = []
        self.abandoned = keyed_waiting

    # -- invariants ----------------------------------------------------------------------
    @invariant()
    def store_matches_the_lease_table(self) -> None:
        store = self.broker.store
        assert store is not None
        assert {s.lease_id for s in store.active_leases()} == set(self.broker.leases)

    @invariant()
    def one_lease_per_request_key(self) -> None:
        keys = [x.request_key for x in self.broker.leases.values() if x.request_key]
        assert len(keys) == len(set(keys))

    @invariant()
    def active_leases_never_ended(self) -> None:
        for lease_id, lease in self.broker.leases.items():
            assert lease.state is LeaseState.ACTIVE
            assert self.ends.get(lease_id, []) == []

    def teardown(self) -> None:
        try:
            for proc, _ in self.holders:
                proc.kill()
                proc.wait(10)
            self.h.clock.advance(10_000)
            self.h.tick(0.1)
            self._harvest()
            assert self.broker.leases == {}
            for lease_id, states in self.ends.items():
                assert len(states) == 1, (lease_id, states)
                assert states[0] in TERMINAL_STATES
                assert self.latest[lease_id].state is states[0], (lease_id, states)
            assert set(self.latest) <= set(self.ends)
        finally:
            self.h.close()
            self.pool.close()
            shutil.rmtree(self.tmp, ignore_errors=True)


LeaseMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_lease_state_machine = LeaseMachine.TestCase


def test_adoption_beside_an_older_lease_books_only_what_was_checked() -> None:
    """The sequence the machine once found, replayed: holder 1 uses 256 MiB, takes a 512 MiB
    lease (not adopting), then adopts 512 MiB on the same GPU. The 256 MiB it already used
    belong to the adopting lease (its claim), so that lease books 256 MiB, as checked;
    before, the older lease absorbed them and the new one booked 512."""
    m = LeaseMachine()
    try:
        m.holder_allocates(holder=1, gpu=GPU0, mib=256)
        m.holder_allocates(holder=0, gpu=GPU0, mib=256)
        m.sample(gpu=None)
        m.acquire(
            adopt=False, conn=1, gpu=None, gpus=1, holder=1, keyed=False, kicked=False,
            mib=512, placement="spread", wait_s=0.0,
        )  # fmt: skip
        m.sample(gpu=None)
        m.holder_allocates(holder=0, gpu=GPU0, mib=256)
        m.acquire(
            adopt=True, conn=1, gpu=GPU0, gpus=1, holder=1, keyed=False, kicked=False,
            mib=512, placement="pack", wait_s=0.0,
        )  # fmt: skip
        m.sample(gpu=None)
        adopted = [lease for lease in m.broker.lessor.leases.values() if lease.adopt]
        assert len(adopted) == 1
        assert adopted[0].observed_mib[GPU0] == 256
        m.store_matches_the_lease_table()
        m.active_leases_never_ended()
    finally:
        m.teardown()
