"""When will it fit (docs/architecture.md §3): the estimate of `rbroker.broker.eta` as pure
arithmetic, the lifetimes history it reads, and the broker's queue entries carrying it, on
the in-process broker with a manual clock (the lifetimes are measured on that clock)."""

from __future__ import annotations

import time

import pytest

from rbroker.broker.eta import (
    ESTIMATED_REQUESTS,
    TOO_FAR,
    Asking,
    Holding,
    estimate,
    remaining_s,
    retell,
)
from rbroker.broker.holders import Holder
from rbroker.broker.leases import Lease
from rbroker.broker.lifetimes import LIFETIMES_SAVE_S, Lifetimes
from rbroker.broker.shares import Shares
from rbroker_protocol.localapi import AcquireParams
from tests.conftest import GPU0, SINGLE_24G
from tests.desktop.inprocess import DESCRIPTION, InProcessBroker, SleeperPool

A, B = "GPU-a", "GPU-b"


def lease(project: str, mib: int, age_s: float | None, *gpus: str) -> Holding:
    uuids = gpus or (A,)
    return Holding(uuids, {u: mib for u in uuids}, project, "s", age_s)


def ask(key: int, mib: int, project: str = "p", gpus: int = 1, *cands: str) -> Asking:
    return Asking(key, mib, gpus, cands or (A,), project, "s")


def history(table: dict[str, list[float]]):  # type: ignore[no-untyped-def]
    return lambda owner, project, session: table.get(project, [])


def test_remaining_is_the_median_of_what_the_lifetimes_leave_past_the_age() -> None:
    assert remaining_s([10, 20, 30, 40], 0) == 25
    assert remaining_s([10, 20, 30, 40], 25) == 10  # 30 and 40 are left: 5 and 15
    assert remaining_s([10, 20], 25) is None  # older than every lifetime seen
    assert remaining_s([], 0) is None
    assert remaining_s([10, 30], None) == 20  # a restored lease: its age is unknown


def test_a_request_waits_for_the_ends_that_free_enough_memory_in_queue_order() -> None:
    # 8 000 free; a lease of 6 000 ends in ~100 s, one of 10 000 in ~300 s
    got = estimate(
        {A: 8000},
        [lease("short", 6000, 0.0), lease("long", 10000, 0.0)],
        [ask(1, 12000), ask(2, 2000), ask(3, 9000)],
        history({"short": [100.0], "long": [300.0], "p": [50.0]}),
    )
    # 1 needs 12 000: at 100 s 14 000 are free; 2 fits now but FIFO holds it behind 1
    assert got[1].eta_s == 100.0 and "1 lease of short likely ends by then" in got[1].reason
    assert got[2].eta_s == 100.0
    # 3: after 1 and 2 took 14 000 at 100 s, 0 left; 1 and 2 end at 150 s (their project's
    # lifetime, 50 s): 14 000 back
    assert got[3].eta_s == 150.0


def test_no_estimate_says_why() -> None:
    got = estimate(
        {A: 1000, B: 1000},
        [lease("new", 4000, 5.0), lease("old", 4000, 500.0, B)],
        [ask(1, 3000), ask(2, 3000, "p", 1, B), ask(3, 30000, "p", 1, B)],
        history({"old": [100.0]}),
    )
    assert got[1].eta_s is None
    assert got[1].reason == "1 lease of new has no declared or observed duration yet"
    assert got[2].eta_s is None  # its lease outlived the lifetimes seen: its own reason
    assert got[2].reason == "1 lease of old has outlived every lifetime seen for it"
    stuck = Asking(4, 10, 1, (A,), "p", "s", stuck="admissions are paused")
    out = estimate({A: 0}, [], [stuck, ask(5, 10**6)], history({}))
    assert out[4].reason == "admissions are paused"
    assert "memory used outside rbroker's leases" in out[5].reason
    assert estimate({}, [], [ask(6, 1)], history({}))[6].reason.startswith("no GPU")


def test_a_declared_end_is_used_until_it_passes_and_the_reason_says_which() -> None:
    declared = Holding((A,), {A: 6000}, "search", "s", 10.0, declared_left_s=20.0)
    judged = Holding((A,), {A: 6000}, "vision", "s", 10.0)
    table = history({"search": [300.0], "vision": [50.0], "p": [1000.0]})
    got = estimate({A: 0}, [declared], [ask(1, 6000)], table)
    assert got[1].eta_s == 20.0  # not the 290 s its history would leave
    assert got[1].reason == "1 lease of search declared to end by then"
    passed = Holding((A,), {A: 6000}, "search", "s", 100.0, declared_left_s=-5.0)
    got = estimate({A: 0}, [passed], [ask(1, 6000)], table)
    assert got[1].eta_s == 200.0 and got[1].reason == "1 lease of search likely ends by then"
    both = estimate({A: 0}, [declared, judged], [ask(1, 12000)], table)
    assert both[1].eta_s == 40.0
    assert both[1].reason == (
        "1 lease of search declared to end and 1 lease of vision likely ends by then"
    )
    # a request granted on the way holds its grant for its own declared duration
    queue = [Asking(1, 6000, 1, (A,), "p", "s", expected_s=15.0), ask(2, 6000)]
    got = estimate({A: 0}, [declared], queue, table)
    assert (got[1].eta_s, got[2].eta_s) == (20.0, 35.0)
    assert got[2].reason == "2 leases of p, search declared to end by then"


def test_a_waiter_is_told_again_when_its_estimate_moves_not_as_it_counts_down() -> None:
    def entry(
        wait_s: float, eta_s: float | None, reason: str = "waiting", why: str = "x"
    ) -> dict[str, object]:
        return {"reason": reason, "waiting_s": wait_s, "eta_s": eta_s, "eta_reason": why}

    told = entry(0.0, 100.0)
    assert retell(None, told)
    assert not retell(told, entry(10.0, 90.0))  # counting down: the same grant time
    assert not retell(told, entry(10.0, 105.0))  # 15 s later: within 20 % of 100 s
    assert retell(told, entry(10.0, 111.0))  # 21 s later
    assert not retell(told, entry(0.5, 300.0))  # within a second of the last: not yet
    assert retell(told, entry(0.5, 100.0, reason="paused"))  # a new reason: at once
    assert retell(entry(0.0, 3600.0), entry(10.0, 3621.0))  # 31 s: over 30 s
    assert not retell(entry(0.0, 3.0), entry(1.0, 2.5))  # 0.5 s: under a second
    assert retell(told, entry(2.0, None)) and retell(entry(0.0, None), entry(2.0, 50.0))
    assert retell(told, entry(2.0, 98.0, why="declared"))


def test_a_multi_gpu_request_waits_for_room_on_enough_gpus() -> None:
    got = estimate(
        {A: 0, B: 5000},
        [lease("x", 5000, 0.0, A)],
        [Asking(1, 5000, 2, (A, B), "p", "s")],
        history({"x": [60.0]}),
    )
    assert got[1].eta_s == 60.0


def test_by_shares_the_project_using_less_is_estimated_first() -> None:
    queue = [ask(1, 6000, "heavy"), ask(2, 6000, "light")]
    table = history({"x": [10.0], "heavy": [100.0], "light": [100.0]})
    holding = [lease("x", 6000, 0.0)]
    fifo = estimate({A: 0}, holding, queue, table)
    assert (fifo[1].eta_s, fifo[2].eta_s) == (10.0, 110.0)
    shared = estimate(
        {A: 0}, holding, queue, table, Shares({"heavy": 1, "light": 1}), {"heavy": 9000}
    )
    assert (shared[2].eta_s, shared[1].eta_s) == (10.0, 110.0)


def test_by_shares_a_request_past_the_bypass_bound_is_estimated_first() -> None:
    """As admission: `heavy` uses more of its share, but its request has waited 8 s of a
    10 s bypass bound, so by the time the lease ahead ends (10 s) it goes first."""
    table = history({"x": [10.0], "heavy": [100.0], "light": [100.0]})
    holding = [lease("x", 6000, 0.0)]
    shares = Shares({"heavy": 1, "light": 1})
    queue = [
        Asking(1, 6000, 1, (A,), "heavy", "s", waited_s=8.0),
        Asking(2, 6000, 1, (A,), "light", "s", waited_s=1.0),
    ]
    bypassed = estimate({A: 0}, holding, queue, table, shares, {"heavy": 9000}, bypass_s=10.0)
    assert (bypassed[1].eta_s, bypassed[2].eta_s) == (10.0, 110.0)
    # a bound not reached by then leaves the order by shares
    later = estimate({A: 0}, holding, queue, table, shares, {"heavy": 9000}, bypass_s=60.0)
    assert (later[2].eta_s, later[1].eta_s) == (10.0, 110.0)


def test_lifetimes_are_bounded_and_survive_json() -> None:
    lt = Lifetimes(per_project=3, per_session=2, projects=2, sessions=2)
    for i in range(5):
        lt.record("u", "a", "s1", float(i))
    got = lt.of("u", "a", "s1")
    assert list(got[0]) == [2.0, 3.0, 4.0] and got[1] == "project"
    assert lt.of("other", "a", "s1") == ((), "")  # each user's own history
    lt.record("u", "b", "s", 1.0)
    lt.record("u", "c", "s", 1.0)  # the user's third project: its least recently ended goes
    assert lt.of("u", "a", "s1") == ((), "")
    for v in (1.0, 2.0, 3.0):
        lt.record("u", "c", "own", v)
    again = Lifetimes.from_json(lt.to_json())
    # the session kept its last 2 (< 3: its project's are used); the project its last 3
    assert list(again.of("u", "c", "own")[0]) == [1.0, 2.0, 3.0]
    assert again.of("u", "c", "own")[1] == "project"
    again.record("u", "c", "own", 4.0)  # a fresh history's bounds: 16 per session
    assert list(again.of("u", "c", "own")[0]) == [2.0, 3.0, 4.0]
    assert again.of("u", "c", "own")[1] == "session"
    assert Lifetimes.from_json("not json").of("u", "c", "own") == ((), "")
    earlier = '{"projects": {"c": [1.0]}, "sessions": []}'  # the form without users: dropped
    assert Lifetimes.from_json(earlier).of("u", "c", "own") == ((), "")
    lt.record("u", "d", "s", float("nan"))
    assert lt.of("u", "d", "s") == ((), "")
    few = Lifetimes(users=2)
    for user in ("x", "y", "z"):  # the third user: the one whose lease ended longest ago goes
        few.record(user, "p", "s", 1.0)
    assert [bool(few.of(u, "p", "s")[0]) for u in ("x", "y", "z")] == [False, True, True]


@pytest.fixture
def hs(make_inprocess) -> InProcessBroker:  # type: ignore[no-untyped-def]
    return make_inprocess(SINGLE_24G)  # with a store: the history is kept across restarts


def hold(h: InProcessBroker, pool: SleeperPool, mib: int, **kw: object) -> str:
    lease = h.acquire(pool.spawn()[1], mib=mib, **kw).result()
    return lease.lease_id


def lived(
    h: InProcessBroker, pool: SleeperPool, project: str, lifetime_s: float, times: int
) -> None:
    """`times` leases of `project` (20 000 MiB each) held for `lifetime_s` each, one after
    another, then released: the history the broker's estimates read."""
    for _ in range(times):
        lid = hold(h, pool, 20000, project=project)
        h.clock.advance(lifetime_s)
        h.broker.release(lid, "tester")
        h.sample()


def test_the_queue_tells_when_from_the_lifetimes_seen(
    hs: InProcessBroker, pool: SleeperPool
) -> None:
    h = hs
    lived(h, pool, "vision", 600.0, times=3)  # three leases of vision lived 600 s each
    hold(h, pool, 20000, project="vision")
    h.clock.advance(100)
    waiting = h.acquire(pool.spawn()[1], mib=8000, wait_s=3600, project="nlp")
    entry = h.broker.leases_view()["queue"][0]
    assert entry["eta_s"] == pytest.approx(500, abs=1)
    assert "1 lease of vision likely ends by then" in entry["eta_reason"]
    h.clock.advance(0.5)  # nothing changed: the estimate counts down
    assert h.broker.leases_view()["queue"][0]["eta_s"] == pytest.approx(499.5, abs=1)
    h.run(h.broker.stop())  # the history is written to the store when the broker stops
    assert waiting.done()
    h.broker = h._new_broker()
    h.run(h.broker.start(background=False))
    kept = h.broker.lifetimes.of("tester", "vision", "in-process")[0]
    assert list(kept) == pytest.approx([600.0] * 3)
    h.restart()  # a crash keeps what the last stop wrote
    assert len(h.broker.lifetimes.of("tester", "vision", "in-process")[0]) == 3


def test_the_queue_tells_when_from_a_declared_duration_then_from_history(
    hs: InProcessBroker, pool: SleeperPool
) -> None:
    h = hs
    lived(h, pool, "vision", 600.0, times=3)  # three leases of vision lived 600 s each
    hold(h, pool, 20000, project="vision", expected_s=120, ttl_s=3600)
    assert h.broker.leases_view()["leases"][0]["expected_s"] == 120
    h.clock.advance(100)
    h.acquire(pool.spawn()[1], mib=8000, wait_s=3600, project="nlp", request_key="k1")
    entry = h.broker.leases_view()["queue"][0]
    assert entry["eta_s"] == pytest.approx(20, abs=1)
    assert entry["eta_reason"] == "1 lease of vision declared to end by then"
    h.clock.advance(10)
    h.tick(0.5)  # the tick keeps the lifetimes seen
    h.restart()  # a crash: the restored lease keeps its declaration (its end by wall time)
    assert [x["expected_s"] for x in h.broker.leases_view()["leases"]] == [120]
    entry = h.broker.leases_view()["queue"][0]
    assert entry["eta_s"] == pytest.approx(10, abs=1)
    assert entry["eta_reason"] == "1 lease of vision declared to end by then"
    h.clock.advance(50)  # past its declared end: what vision's leases lived decides
    entry = h.broker.leases_view()["queue"][0]
    # restored: its age (160 s) counts from its grant's wall time, not from the restart
    assert entry["eta_s"] == pytest.approx(440, abs=1)
    assert entry["eta_reason"] == "1 lease of vision likely ends by then"
    lease_id = h.broker.leases_view()["leases"][0]["lease_id"]
    h.clock.advance(40)
    h.broker.release(lease_id, "tester")  # its lifetime is recorded: 200 s since its grant
    kept = h.broker.lifetimes.of("tester", "vision", "in-process")[0]
    assert list(kept) == pytest.approx([600.0, 600.0, 600.0, 200.0])


def test_the_lifetimes_are_kept_by_the_tick_without_a_clean_stop(
    hs: InProcessBroker, pool: SleeperPool
) -> None:
    h = hs
    lid = hold(h, pool, 1000, project="vision")
    h.clock.advance(LIFETIMES_SAVE_S + 1)
    h.broker.release(lid, "tester")
    h.sample()
    h.tick(0.5)  # a lifetime recorded, LIFETIMES_SAVE_S since the start: written
    lid = hold(h, pool, 1000, project="vision")
    h.clock.advance(5)
    h.broker.release(lid, "tester")
    h.tick(0.5)  # within LIFETIMES_SAVE_S of the last write: not yet
    h.restart()  # a crash: no stop wrote anything
    kept = h.broker.lifetimes.of("tester", "vision", "in-process")[0]
    assert list(kept) == pytest.approx([LIFETIMES_SAVE_S + 1])


def test_a_request_behind_leases_of_an_unseen_project_says_so(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    hold(h, pool, 20000, project="fresh")
    h.acquire(pool.spawn()[1], mib=8000, wait_s=60)
    entry = h.broker.leases_view()["queue"][0]
    assert entry["eta_s"] is None
    assert entry["eta_reason"] == "1 lease of fresh has no declared or observed duration yet"
    assert h.broker.status().get("shares") is None  # no [shares]: nothing shown
    assert h.broker.queue_order() == "FIFO"
    assert GPU0 in h.broker.slots


def test_only_the_first_requests_are_played_however_long_the_queue() -> None:
    placed: list[str] = []

    def counting(owner: str, project: str, session: str) -> list[float]:
        placed.append(project)  # once per lease judged: those held and those granted on the way
        return [10.0]

    queue = [ask(k, 1000, f"p{k % 8}") for k in range(2048)]
    holding = [lease("x", 64000, 0.0)]
    started = time.perf_counter()
    got = estimate({A: 0}, holding, queue, counting)
    took_s = time.perf_counter() - started
    played = [k for k, e in got.items() if e.reason != TOO_FAR]
    assert played == list(range(ESTIMATED_REQUESTS))  # the first in the queue's order
    assert got[0].eta_s == 10.0 and got[2047].eta_s is None
    # every request played once cost 2 048 placements (0.24 s, 0.55 s by shares)
    assert len(placed) <= 1 + ESTIMATED_REQUESTS
    assert took_s < 0.2  # generous: about 2 ms
    shares = Shares({f"p{i}": 1 + i % 3 for i in range(8)})
    by_shares = estimate({A: 0}, holding, queue, counting, shares, {"p0": 5000})
    assert sum(e.reason != TOO_FAR for e in by_shares.values()) == ESTIMATED_REQUESTS
    assert by_shares[0].reason == TOO_FAR  # p0 uses the most: its requests come last


def acquire_as(h: InProcessBroker, owner: str, holder: Holder, **params: object) -> Lease:
    """A lease of OS user `owner` (the harness's `acquire` is always "tester"'s)."""
    p = AcquireParams.model_validate({**DESCRIPTION, **params})
    task = h.loop.create_task(h.broker.acquire(p, owner, holder, 1))
    h.spin()
    return task.result()


def test_one_users_churn_evicts_only_that_users_history(
    hs: InProcessBroker, pool: SleeperPool
) -> None:
    h = hs
    h.broker.lifetimes = Lifetimes(projects=4, sessions=8)  # the caps, per user, made small
    alice, bob = pool.spawn()[1], pool.spawn()[1]
    for _ in range(3):  # alice's leases of vision lived 8 s each
        lid = acquire_as(h, "alice", alice, mib=20000, project="vision").lease_id
        h.clock.advance(8)
        h.broker.release(lid, "alice")
        h.sample()
    for i in range(20):  # then bob: tiny leases, each of a new project and session
        lid = acquire_as(h, "bob", bob, mib=1, project=f"churn-{i}", session=f"s-{i}").lease_id
        h.clock.advance(0.001)
        h.broker.release(lid, "bob")
    assert h.broker.lifetimes.of("bob", "churn-0", "s-0") == ((), "")  # bob's own oldest went
    assert h.broker.lifetimes.of("bob", "churn-19", "s-19")[1] == "project"
    acquire_as(h, "alice", alice, mib=20000, project="vision")
    h.acquire(pool.spawn()[1], mib=8000, wait_s=3600, project="nlp")
    entry = h.broker.leases_view()["queue"][0]
    assert entry["eta_s"] == pytest.approx(8, abs=0.5)  # alice's history is whole
    assert entry["eta_reason"] == "1 lease of vision likely ends by then"
