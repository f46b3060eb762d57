"""Idle, told and (only by policy) reclaimed (issue 42; docs/architecture.md §3 "Idle"), on
an in-process broker with a manual clock and the simulated NVML's per-process utilization:

- the holder is told once per idle episode (`idle_notice` `idle`); a busy sample ends it;
- with `[idle] reclaim_after_s`, a lease is warned 10 min before (`reclaim_soon`), then
  ended `revoked`, "reclaimed: idle 4 h while 2 requests waited", its holder told
  (`lease_ended`), the audit records `lease_reclaimed` by the broker, and a waiter is
  granted once a sample shows the memory free;
- only while a request waits for its GPU (`only_when_waiting`, the default), never for an
  exempt project;
- the `[idle]` keys are read from broker.toml, a wrong one refused in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rbroker.broker.config import IdleReclaim, read_config
from rbroker.broker.holders import Holder
from rbroker.broker.leases import Lease
from tests.conftest import GPU0, GPU1
from tests.desktop.inprocess import InProcessBroker, SleeperPool
from tests.fakes.gpu_scenarios import gpu, scenario

pytestmark = pytest.mark.contract  # it starts processes of its own

IDLE_AFTER_S = 600.0
RECLAIM_AFTER_S = 4 * 3600.0
ONE_GPU = scenario(gpu(GPU0, name="Simulated 20 GB", total_mib=20000))
TWO_GPUS = scenario(
    gpu(GPU0, name="Simulated 20 GB", total_mib=20000),
    gpu(GPU1, name="Simulated 20 GB", total_mib=20000),
)

Events = list[tuple[str, dict[str, Any]]]


def _broker(
    make_inprocess: Callable[..., InProcessBroker], gpus: str = ONE_GPU, **policy: Any
) -> tuple[InProcessBroker, Events]:
    made = make_inprocess(
        gpus, headroom_mib=1000, idle_after_s=IDLE_AFTER_S, idle_reclaim=IdleReclaim(**policy)
    )
    made.broker.gateway.foreign_pids = False  # the simulated driver lists this machine's pids
    events: Events = []
    made.broker.subscribe(lambda kind, data: events.append((kind, dict(data))))
    return made, events


def _lease(h: InProcessBroker, holder: Holder, mib: int = 15000, on: str = GPU0) -> Lease:
    lease = h.acquire(holder, mib=mib, ttl_s=3600, gpu_uuid=on).result()
    h.fake.allocate(on, holder.pid, mib // 2)  # its process is listed on the GPU
    h.sample()
    return lease


def _notices(events: Events, lease: Lease) -> list[str]:
    return [
        d["notice"] for k, d in events if k == "idle_notice" and d["lease_id"] == lease.lease_id
    ]


def _to(h: InProcessBroker, lease: Lease, idle_s: float) -> None:
    """Move the clock to `idle_s` after the lease's last measured activity, renewing the
    leases (a heartbeat is no activity), sampling and running a tick at least every 30 min."""
    (entry,) = [x for x in h.broker.leases_view()["leases"] if x["lease_id"] == lease.lease_id]
    assert entry["idle_s"] is not None
    left = idle_s - entry["idle_s"]
    while True:
        step = min(left, 1800.0)
        h.clock.advance(step)
        left -= step
        for live in h.broker.leases_view()["leases"]:  # every holder's heartbeat
            h.broker.renew(live["lease_id"], "tester")
        h.sample()  # as the broker's sampler does every second: the figures stay fresh
        h.tick(0.1)
        if left <= 0:
            return


def test_told_once_per_idle_episode(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h, events = _broker(make_inprocess)
    _, holder = pool.spawn()
    lease = _lease(h, holder)
    _to(h, lease, IDLE_AFTER_S - 1)
    assert _notices(events, lease) == []
    _to(h, lease, IDLE_AFTER_S)
    assert _notices(events, lease) == ["idle"]
    (data,) = [d for k, d in events if k == "idle_notice"]
    assert data["owner"] == "tester" and data["idle_s"] == pytest.approx(IDLE_AFTER_S, abs=0.01)
    assert data["message"].startswith(f"lease {lease.lease_id} is idle"), data["message"]
    _to(h, lease, 3 * IDLE_AFTER_S)
    assert _notices(events, lease) == ["idle"]  # once per episode
    h.fake.set_utilization(GPU0, holder.pid, 30)  # busy: the episode ends
    h.sample()
    h.tick(0.1)
    h.fake.set_utilization(GPU0, holder.pid, 0)
    h.clock.advance(IDLE_AFTER_S)
    h.sample()
    h.tick(0.1)
    assert _notices(events, lease) == ["idle", "idle"]  # a new episode, told again
    assert h.broker.leases_view()["leases"], "nothing is reclaimed without a policy"


@pytest.mark.parametrize(
    "policy", [{}, {"reclaim_after_s": RECLAIM_AFTER_S, "only_when_waiting": False}]
)
def test_each_lease_is_told_idle_at_the_tick_it_turns_idle(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool, policy: dict[str, Any]
) -> None:
    """The watch walks every lease only once one may have turned idle (`IdleWatch.turn`);
    the `idle` notice still comes at the first tick at which the lease's own state
    (`Idleness.state`) is idle, through activity, a GPU's utilization turning unknown and
    known again, and a lease granted later, with and without a reclaim policy."""
    h, events = _broker(make_inprocess, TWO_GPUS, **policy)
    holders = [pool.spawn()[1] for _ in range(3)]
    leases = [_lease(h, holders[0], 4000, GPU0), _lease(h, holders[1], 4000, GPU1)]
    idle = h.broker.idle
    was_idle: set[str] = set()
    told: dict[str, int] = {}
    for step in range(1, 61):  # a tick a minute for an hour; idle after 10 minutes
        h.clock.advance(60.0)
        for live in h.broker.leases_view()["leases"]:
            h.broker.renew(live["lease_id"], "tester")
        busy = {5: holders[0], 30: holders[1], 31: holders[1], 44: holders[2]}.get(step)
        for holder in holders:
            for uuid in (GPU0, GPU1):
                h.fake.set_utilization(uuid, holder.pid, 30 if holder is busy else 0)
        if step == 15:
            h.fake.set_gpu(GPU1, utilization_error="not_supported")
        if step == 18:
            h.fake.set_gpu(GPU1, utilization_error="")
        if step == 20:
            h.sample()  # a fresh sample to grant on
            leases.append(_lease(h, holders[2], 4000, GPU0))
        h.sample()
        now_idle = {x.lease_id for x in leases if idle.state(x)[0].value == "idle"}
        before = len(events)
        h.tick(0.1)
        notices = [d["lease_id"] for k, d in events[before:] if k == "idle_notice"]
        assert sorted(notices) == sorted(now_idle - was_idle), step
        for lease_id in notices:
            told[lease_id] = told.get(lease_id, 0) + 1
        was_idle = now_idle
    assert told.keys() == {x.lease_id for x in leases}, told
    assert told[leases[1].lease_id] >= 3, told  # idle, unknown, idle, busy, idle


def test_reclaimed_while_two_requests_wait_warned_before_and_the_waiter_granted(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h, events = _broker(make_inprocess, reclaim_after_s=RECLAIM_AFTER_S)
    _, holder = pool.spawn()
    lease = _lease(h, holder)
    first = h.acquire(pool.spawn()[1], mib=8000, wait_s=6 * 3600)
    second = h.acquire(pool.spawn()[1], mib=8000, wait_s=6 * 3600)
    h.sample()
    assert not first.done() and not second.done()
    _to(h, lease, IDLE_AFTER_S)
    assert _notices(events, lease) == ["idle"]
    _to(h, lease, RECLAIM_AFTER_S - 601)
    assert _notices(events, lease) == ["idle"]
    _to(h, lease, RECLAIM_AFTER_S - 600)
    assert _notices(events, lease) == ["idle", "reclaim_soon"]
    soon = [d for k, d in events if k == "idle_notice"][-1]
    assert "reclaimed in 10 min" in soon["message"], soon["message"]
    _to(h, lease, RECLAIM_AFTER_S - 1)
    assert lease.lease_id in {x["lease_id"] for x in h.broker.leases_view()["leases"]}
    _to(h, lease, RECLAIM_AFTER_S)
    reason = "reclaimed: idle 4 h while 2 requests waited"
    assert _notices(events, lease) == ["idle", "reclaim_soon", "reclaimed"]
    assert lease.lease_id not in {x["lease_id"] for x in h.broker.leases_view()["leases"]}
    assert lease.state.value == "revoked" and lease.ended_reason == reason
    ended = [d for k, d in events if k == "lease_ended" and d["lease_id"] == lease.lease_id]
    assert ended == [{"lease_id": lease.lease_id, "state": "revoked", "ended_reason": reason}]
    (entry,) = [e for e in h.broker.audit_list()["entries"] if e["action"] == "lease_reclaimed"]
    assert entry["actor"] == "broker" and entry["reason"] == reason
    assert entry["target"]["id"] == lease.lease_id and entry["target"]["owner"] == "tester"
    # nothing was killed: the 7 500 MiB its process still uses count against the GPU, so a
    # sample grants the first waiter (8 000 MiB), not the second
    assert holder.alive()
    h.sample()
    assert first.done() and first.result().granted_mib == 8000
    assert not second.done()


def test_reclaimed_only_while_a_request_waits(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h, events = _broker(make_inprocess, reclaim_after_s=RECLAIM_AFTER_S)
    _, holder = pool.spawn()
    lease = _lease(h, holder)
    _to(h, lease, 3 * RECLAIM_AFTER_S)
    assert _notices(events, lease) == ["idle"]
    assert h.broker.leases_view()["leases"]
    # a request waits: warned now, ended 10 min later (not at once)
    waiter = h.acquire(pool.spawn()[1], mib=8000, wait_s=3600)
    h.sample()
    assert not waiter.done()
    h.tick(0.1)
    assert _notices(events, lease) == ["idle", "reclaim_soon"]
    h.clock.advance(599)
    h.sample()
    h.tick(0.1)
    assert h.broker.leases_view()["leases"]
    h.clock.advance(1)
    h.sample()
    h.tick(0.1)
    assert _notices(events, lease)[-1] == "reclaimed"
    assert lease.ended_reason.endswith("while 1 request waited"), lease.ended_reason


def test_a_request_the_end_would_not_let_in_never_reclaims(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    """Before: any request waiting with the lease's GPU among its candidates counted, so a
    request that could not use the memory (more than the end frees) ended an idle lease for
    nothing. The lease holds 15 000 MiB of which its process uses 7 500 (an end kills
    nothing): its end frees 7 500, leaving 11 500 of the 19 000 usable."""
    h, events = _broker(make_inprocess, reclaim_after_s=RECLAIM_AFTER_S)
    _, holder = pool.spawn()
    lease = _lease(h, holder)
    too_big = h.acquire(pool.spawn()[1], mib=12000, wait_s=6 * 3600)
    h.sample()
    _to(h, lease, RECLAIM_AFTER_S + 3600)  # an hour past the reclaim, within the wait
    assert not too_big.done()
    assert _notices(events, lease) == ["idle"]  # never warned, never ended
    fits_after = h.acquire(pool.spawn()[1], mib=11500, wait_s=6 * 3600)
    h.sample()
    h.tick(0.1)
    assert _notices(events, lease) == ["idle", "reclaim_soon"]
    h.clock.advance(600)
    h.sample()
    h.tick(0.1)
    assert lease.ended_reason.endswith("while 1 request waited"), lease.ended_reason
    h.sample()  # FIFO: the bigger request first, still short; the one behind it waits too
    assert not fits_after.done() or fits_after.result().granted_mib == 11500


def test_a_request_blocked_on_another_gpu_never_reclaims(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    """Before: mallory, busy on GPU 1, asked for two GPUs; alice's idle lease on GPU 0 was
    reclaimed although mallory's own lease kept the request from fitting, and the request,
    head of the queue, then held GPU 0 from everyone."""
    h, events = _broker(make_inprocess, TWO_GPUS, reclaim_after_s=RECLAIM_AFTER_S)
    _, alice = pool.spawn()
    _, mallory = pool.spawn()
    idle = _lease(h, alice, on=GPU0)
    busy = _lease(h, mallory, on=GPU1)
    h.fake.set_utilization(GPU1, mallory.pid, 80)
    both = h.acquire(pool.spawn()[1], mib=8000, gpus=2, wait_s=6 * 3600)  # another process
    h.sample()
    _to(h, idle, RECLAIM_AFTER_S + 3600)  # an hour past the reclaim, within the wait
    assert not both.done(), both.exception() if both.done() else ""
    assert _notices(events, idle) == ["idle"]
    assert _notices(events, busy) == []
    assert {x["lease_id"] for x in h.broker.leases_view()["leases"]} == {
        idle.lease_id,
        busy.lease_id,
    }


def test_without_only_when_waiting_an_idle_lease_is_reclaimed_alone(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h, events = _broker(make_inprocess, reclaim_after_s=RECLAIM_AFTER_S, only_when_waiting=False)
    _, holder = pool.spawn()
    lease = _lease(h, holder)
    _to(h, lease, RECLAIM_AFTER_S - 600)
    _to(h, lease, RECLAIM_AFTER_S)
    assert _notices(events, lease) == ["idle", "reclaim_soon", "reclaimed"]
    assert lease.ended_reason == "reclaimed: idle 4 h"


def test_busy_after_the_warning_is_not_reclaimed(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h, events = _broker(make_inprocess, reclaim_after_s=RECLAIM_AFTER_S, only_when_waiting=False)
    _, holder = pool.spawn()
    lease = _lease(h, holder)
    _to(h, lease, RECLAIM_AFTER_S - 600)
    assert _notices(events, lease) == ["idle", "reclaim_soon"]
    h.fake.set_utilization(GPU0, holder.pid, 10)
    h.sample()
    h.clock.advance(599)  # past the reclaim, not idle again yet
    h.tick(0.1)
    assert _notices(events, lease) == ["idle", "reclaim_soon"]
    assert h.broker.leases_view()["leases"]


def test_an_exempt_project_is_never_reclaimed(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h, events = _broker(
        make_inprocess,
        reclaim_after_s=RECLAIM_AFTER_S,
        only_when_waiting=False,
        exempt_projects=("Tests",),
    )
    _, holder = pool.spawn()
    lease = _lease(h, holder)  # project "tests"
    _to(h, lease, 3 * RECLAIM_AFTER_S)
    assert _notices(events, lease) == ["idle"]
    assert h.broker.leases_view()["leases"]
    assert not [e for e in h.broker.audit_list()["entries"] if e["action"] == "lease_reclaimed"]


def test_an_exempt_project_no_members_list_keeps_is_named_as_open_to_everyone(
    tmp_path: Path,
) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(
        '[idle]\nreclaim_after_s = 14400\nexempt_projects = ["Demo", "nlp"]\n'
        '[members]\ndemo = ["alice"]\n'
    )
    assert read_config(path).open_exempt() == ["nlp"]  # demo is kept to alice, whatever case
    path.write_text('[idle]\nexempt_projects = ["nlp"]\n')
    assert read_config(path).open_exempt() == []  # nothing is reclaimed: nothing to escape


def test_a_reclaim_shorter_than_idle_is_named(tmp_path: Path) -> None:
    """Before: accepted silently; the reclaim then came as soon as the lease was idle."""
    path = tmp_path / "broker.toml"
    path.write_text("[idle]\nidle_after_s = 1800\nreclaim_after_s = 600\n")
    assert read_config(path).reclaim_before_idle()
    path.write_text("[idle]\nidle_after_s = 1800\nreclaim_after_s = 1800\n")
    assert not read_config(path).reclaim_before_idle()
    path.write_text("[idle]\nidle_after_s = 60\n")  # no reclaim at all
    assert not read_config(path).reclaim_before_idle()


def test_the_idle_policy_comes_from_the_config_files_idle_table(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text("")
    assert read_config(path).idle_reclaim == IdleReclaim(None, True, ())
    path.write_text(
        "[idle]\nreclaim_after_s = 14400\nonly_when_waiting = false\n"
        'exempt_projects = ["demo", "nlp"]\n'
    )
    assert read_config(path).idle_reclaim == IdleReclaim(14400.0, False, ("demo", "nlp"))
    for text, words in (
        ("[idle]\nreclaim_after_s = 0\n", "[idle] reclaim_after_s must be a number of seconds"),
        ('[idle]\nreclaim_after_s = "4 h"\n', "reclaim_after_s must be a number of seconds"),
        ('[idle]\nonly_when_waiting = "yes"\n', "only_when_waiting must be true or false"),
        ('[idle]\nexempt_projects = "demo"\n', "exempt_projects must be a list of project"),
        ("[idle]\nexempt_projects = [1]\n", "exempt_projects must be a list of project"),
        ("[idle]\nreclaim_after = 60\n", "[idle] has no setting 'reclaim_after'"),
    ):
        path.write_text(text)
        with pytest.raises(ValueError) as exc:
            read_config(path)
        assert words in str(exc.value) and str(path) in str(exc.value), exc.value
        assert "\n" not in str(exc.value)
