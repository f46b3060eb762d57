"""One broker, many users (architecture.md §3, §5): administrators may end any lease and
cancel any waiting request; the longest wait and the per-user caps are refused by name,
never hung.

Before: a request for 2 GPUs × (total − headroom) waiting 7 days made every other user's
request on every GPU wait behind it (1 024 MiB asked with 19 251 MiB free ended
`wait_timeout`), and nobody, root included, could cancel it; one user queued 102 400
waiting requests in 0.7 s. These run on the in-process broker with a manual clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from rbroker.broker.leases import Lease
from rbroker_protocol.errors import RpcError
from rbroker_protocol.localapi import AcquireParams
from tests.conftest import GPU0, GPU1, SINGLE_24G
from tests.desktop.inprocess import DESCRIPTION, InProcessBroker, SleeperPool
from tests.fakes.gpu_scenarios import gpu, scenario

TWO_24G = scenario(gpu(GPU0, name="Simulated 24G"), gpu(GPU1, name="Simulated 24G"))
USABLE = 24576 - 1229  # default headroom: max(512, 5 %) = 1 229 MiB


def _acquire(h: InProcessBroker, owner: str, holder: Any, **params: Any) -> asyncio.Task[Lease]:
    p = AcquireParams.model_validate({**DESCRIPTION, **params})
    task = h.loop.create_task(h.broker.acquire(p, owner, holder, None))
    h.spin()
    return task


def _error(h: InProcessBroker, task: asyncio.Task[Lease]) -> RpcError:
    h.spin()
    assert task.done()
    err = task.exception()
    assert isinstance(err, RpcError), err
    return err


def _begin(h: InProcessBroker, p: AcquireParams, owner: str, holder: Any, conn: int) -> Any:
    """`begin_acquire` on the broker's loop (a waiter needs a running loop)."""

    async def begin() -> Any:
        return h.broker.begin_acquire(p, owner, holder, conn)

    return h.run(begin())


def _refused(fn: Callable[[], Any]) -> RpcError:
    with pytest.raises(RpcError) as caught:
        fn()
    return caught.value


def test_an_admin_cancels_the_request_that_blocks_everyone(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h = make_inprocess(TWO_24G, persist=False)
    h.sample()
    _, alice = pool.spawn()
    _, bob = pool.spawn()
    _acquire(h, "alice", pool.spawn()[1], mib=4096)  # so the big request cannot fit now
    h.sample()
    big = _acquire(h, "alice", alice, mib=USABLE, gpus=2, wait_s=86400)
    small = _acquire(h, "bob", bob, mib=1024, wait_s=600)
    h.sample()
    assert not big.done() and not small.done()  # 1 024 MiB with 19 251 free: behind it
    assert [w.owner for w in h.broker.queue] == ["alice", "bob"]
    request_id = h.broker.queue[0].request_id

    not_admin = _refused(lambda: h.broker.cancel_request(request_id, "bob"))
    assert not_admin.name == "not_lease_owner"
    # named as the queue shows it (`req-N`), not by its bare number
    assert not_admin.message == f"request req-{request_id} belongs to another user"
    unknown = _refused(lambda: h.broker.cancel_request(999, "ops", admin=True))
    assert (unknown.name, unknown.data["request_id"]) == ("request_not_found", 999)
    assert unknown.message == "no waiting request req-999 (granted, ended or never queued)"

    cancelled = h.broker.cancel_request(request_id, "ops", admin=True)
    assert cancelled.owner == "alice"
    err = _error(h, big)
    assert err.name == "cancelled" and err.message == "request cancelled by admin ops"
    assert small.done() and small.result().granted_mib == 1024  # granted at once
    assert h.broker.queue == []


def test_an_admin_ends_another_users_lease_and_its_holder_is_told(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    h.sample()
    lease = h.run(
        h.broker.acquire(AcquireParams(mib=20000, **DESCRIPTION), "alice", pool.spawn()[1], 7)
    )
    events: list[tuple[str, dict[str, Any]]] = []
    h.broker.subscribe(lambda kind, data: events.append((kind, data)))

    other = _refused(lambda: h.broker.release(lease.lease_id, "bob", 8, 1))
    assert other.name == "not_lease_owner" and "belongs to another user" in other.message

    ended = h.broker.release(lease.lease_id, "ops", 9, 1, admin=True)
    assert ended.state.value == "revoked"
    assert ended.ended_reason == "released by admin ops"
    told = [data for kind, data in events if kind == "lease_ended"]
    assert told == [
        {"lease_id": lease.lease_id, "state": "revoked", "ended_reason": "released by admin ops"}
    ]
    # its heartbeat learns it too, with the reason
    beat = _refused(lambda: h.broker.renew(lease.lease_id, "alice"))
    assert beat.name == "lease_expired"
    assert beat.message == f"lease {lease.lease_id} ended: revoked (released by admin ops)"
    h.sample()
    assert h.broker.capacity(GPU0).available_mib == USABLE  # its memory is free again


def test_an_admin_releasing_their_own_lease_is_a_plain_release(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    h.sample()
    lease = h.run(
        h.broker.acquire(AcquireParams(mib=1024, **DESCRIPTION), "ops", pool.spawn()[1], 7)
    )
    ended = h.broker.release(lease.lease_id, "ops", 8, 1, admin=True)
    assert (ended.state.value, ended.ended_reason) == (
        "released",
        "released by another process of ops",
    )


def test_a_wait_past_the_longest_is_refused_by_name(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h = make_inprocess(SINGLE_24G, persist=False)  # the default: 24 h
    h.sample()
    _, holder = pool.spawn()
    err = _refused(
        lambda: _begin(h, AcquireParams(mib=1024, wait_s=86401, **DESCRIPTION), "alice", holder, 1)
    )
    assert (err.name, err.data) == ("wait_too_long", {"wait_s": 86401, "max_wait_s": 86400})
    assert "longer than this broker's longest wait, 86400 s (24 h)" in err.message
    assert _begin(h, AcquireParams(mib=1024, wait_s=86400, **DESCRIPTION), "alice", holder, 1)

    short = make_inprocess(SINGLE_24G, persist=False, max_wait_s=60.0)
    short.sample()
    lease = short.run(short.broker.acquire(AcquireParams(mib=1024, **DESCRIPTION), "a", holder, 1))
    grow = _refused(lambda: short.run(short.broker.resize(lease.lease_id, "a", 2048, 61.0, 1)))
    assert grow.name == "wait_too_long" and grow.data["max_wait_s"] == 60.0
    assert lease.granted_mib == 1024  # a refused resize leaves the lease as it was


def test_one_user_at_the_waiting_cap_is_refused_and_others_still_queue(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    h.sample()
    h.run(h.broker.acquire(AcquireParams(mib=USABLE, **DESCRIPTION), "root", pool.spawn()[1], 1))
    _, holder = pool.spawn()
    wait = AcquireParams(mib=1024, wait_s=600, **DESCRIPTION)
    for _ in range(1024):  # the default cap
        _begin(h, wait, "alice", holder, 2)
    err = _refused(lambda: _begin(h, wait, "alice", holder, 2))
    assert (err.name, err.data) == ("too_many_waiting", {"limit": 1024, "count": 1024})
    assert err.message.startswith(
        "user alice already has 1 024 waiting requests on this broker (1 024 at most)"
    )
    _begin(h, wait, "bob", pool.spawn()[1], 3)  # another user is not held back
    assert len(h.broker.queue) == 1025
    # counts of a thousand or more are grouped as MiB are, in the reasons too
    assert h.broker.queue[-1].reason.endswith("1 024 requested; 1 024 requests ahead")
    # a request that does not wait is not held to the cap (the next pass ends it)
    assert _begin(h, AcquireParams(mib=1024, **DESCRIPTION), "alice", holder, 2).wait_s == 0
    h.broker.waiting.connection_closed(2)  # alice's connection goes: her count with it
    assert h.broker.waiting.waiting_of("alice") == 0
    _begin(h, wait, "alice", holder, 4)


def test_live_leases_and_open_jobs_per_user_are_capped(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h = make_inprocess(SINGLE_24G, persist=False, max_leases_per_user=2, max_open_jobs_per_user=2)
    h.sample()
    small = AcquireParams(mib=100, **DESCRIPTION)
    leases = [h.run(h.broker.acquire(small, "alice", pool.spawn()[1], i)) for i in (1, 2)]
    err = _refused(lambda: h.run(h.broker.acquire(small, "alice", pool.spawn()[1], 3)))
    assert (err.name, err.data) == ("too_many_leases", {"limit": 2, "count": 2})
    assert h.run(h.broker.acquire(small, "bob", pool.spawn()[1], 4))  # bob has his own cap
    h.broker.release(leases[0].lease_id, "alice")
    assert h.run(h.broker.acquire(small, "alice", pool.spawn()[1], 5))

    jobs = h.broker.jobs
    first = jobs.declare("alice", "p", "purpose", "m.f", None, 1, 1)
    jobs.declare("alice", "p", "purpose", "m.f", None, 1, 1)
    job_err = _refused(lambda: jobs.declare("alice", "p", "purpose", "m.f", None, 1, 1))
    assert (job_err.name, job_err.data) == ("too_many_jobs", {"limit": 2, "count": 2})
    assert "finish or cancel some" in job_err.message
    jobs.declare("bob", "p", "purpose", "m.f", None, 1, 1)
    jobs.update(first.job_id, "alice", "succeeded", None, None, 1)  # finished: not counted
    jobs.declare("alice", "p", "purpose", "m.f", None, 1, 1)
