"""Idle, measured (issue 42; docs/architecture.md §3 "Idle"), on an in-process broker with a
manual clock and the simulated NVML's per-process utilization:

- a lease whose holder's processes show utilization is active; one with none for
  `idle_after_s` is idle, with `idle_s` since its last activity;
- a chunk report of its job is activity;
- where utilization cannot be read the lease is `unknown`, never idle;
- a holder's child process busy counts for the holder (the tree as memory is attributed);
- a request waiting behind a GPU says when a lease on it is idle;
- a lease restored after a restart counts as active from the restart;
- `idle_after_s` is the config file's `[idle]` setting.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rbroker.broker.config import read_config
from rbroker.broker.holders import Holder
from rbroker.broker.leases import Lease
from tests.conftest import GPU0
from tests.desktop.inprocess import InProcessBroker, SleeperPool
from tests.fakes.gpu_scenarios import gpu, scenario

pytestmark = pytest.mark.contract  # it starts processes of its own

IDLE_AFTER_S = 600.0
ONE_GPU = scenario(gpu(GPU0, name="Simulated 20 GB", total_mib=20000))


@pytest.fixture
def h(make_inprocess: Callable[..., InProcessBroker]) -> InProcessBroker:
    made = make_inprocess(ONE_GPU, persist=False, headroom_mib=1000, idle_after_s=IDLE_AFTER_S)
    made.broker.gateway.foreign_pids = False  # the simulated driver lists this machine's pids
    return made


def _listed(h: InProcessBroker, lease: Lease) -> dict[str, Any]:
    entries = h.broker.leases_view()["leases"]
    return dict(next(x for x in entries if x["lease_id"] == lease.lease_id))


def _idle(h: InProcessBroker, lease: Lease) -> tuple[str, float | None]:
    entry = _listed(h, lease)
    return entry["idle_state"], entry["idle_s"]


def _lease(h: InProcessBroker, holder: Holder, mib: int = 4000, **params: Any) -> Lease:
    lease = h.acquire(holder, mib=mib, **params).result()
    h.fake.allocate(GPU0, holder.pid, mib // 2)  # its process is listed on the GPU
    h.sample()
    return lease


def test_busy_is_active_and_quiet_for_idle_after_s_is_idle(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    _, holder = pool.spawn()
    lease = _lease(h, holder)
    h.fake.set_utilization(GPU0, holder.pid, 40)
    h.sample()
    assert _idle(h, lease) == ("active", 0.0)
    h.fake.set_utilization(GPU0, holder.pid, 0)
    h.clock.advance(IDLE_AFTER_S / 2)
    h.sample()
    assert _idle(h, lease)[0] == "active"
    h.clock.advance(IDLE_AFTER_S / 2)
    h.sample()
    state, idle_s = _idle(h, lease)
    assert state == "idle"
    assert idle_s is not None and IDLE_AFTER_S <= idle_s < IDLE_AFTER_S + 1
    h.fake.set_utilization(GPU0, holder.pid, 3)  # a kernel again
    h.sample()
    assert _idle(h, lease) == ("active", 0.0)


def test_a_lease_never_busy_is_idle_from_its_grant(h: InProcessBroker, pool: SleeperPool) -> None:
    _, holder = pool.spawn()
    lease = _lease(h, holder)
    h.clock.advance(IDLE_AFTER_S + 60)
    h.sample()
    state, idle_s = _idle(h, lease)
    assert state == "idle"
    assert idle_s is not None and idle_s >= IDLE_AFTER_S + 60


def test_another_holders_utilization_does_not_count(h: InProcessBroker, pool: SleeperPool) -> None:
    _, quiet = pool.spawn()
    _, busy = pool.spawn()
    quiet_lease = _lease(h, quiet)
    busy_lease = _lease(h, busy)
    h.clock.advance(IDLE_AFTER_S)
    h.fake.set_utilization(GPU0, busy.pid, 90)
    h.sample()
    assert _idle(h, quiet_lease)[0] == "idle"
    assert _idle(h, busy_lease)[0] == "active"


def test_a_chunk_report_of_its_job_is_activity(h: InProcessBroker, pool: SleeperPool) -> None:
    job = h.broker.declare_job("tester", "tests", "embed", "tests.embed", 100, 1, 1)
    _, holder = pool.spawn()
    lease = _lease(h, holder, job_id=job["job_id"])
    h.clock.advance(IDLE_AFTER_S)
    h.sample()
    assert _idle(h, lease)[0] == "idle"
    h.broker.report_job(job["job_id"], "tester", "c-0", 10, 0, 1)
    assert _idle(h, lease) == ("active", 0.0)
    h.clock.advance(IDLE_AFTER_S)
    assert _idle(h, lease)[0] == "idle"


@pytest.mark.parametrize("error", ["not_supported", "no_permission"])
def test_unreadable_utilization_is_unknown_never_idle(
    h: InProcessBroker, pool: SleeperPool, error: str
) -> None:
    _, holder = pool.spawn()
    lease = _lease(h, holder)
    h.fake.set_gpu(GPU0, utilization_error=error)
    h.clock.advance(IDLE_AFTER_S * 3)
    h.sample()
    assert _idle(h, lease) == ("unknown", None)
    # readable again: idleness counts from then, not from before the gap
    h.fake.set_gpu(GPU0, utilization_error="")
    h.sample()
    assert _idle(h, lease)[0] == "active"
    h.clock.advance(IDLE_AFTER_S)
    h.sample()
    assert _idle(h, lease)[0] == "idle"


def test_a_failed_sample_makes_it_unknown(h: InProcessBroker, pool: SleeperPool) -> None:
    _, holder = pool.spawn()
    lease = _lease(h, holder)
    h.clock.advance(IDLE_AFTER_S)
    h.sample()
    assert _idle(h, lease)[0] == "idle"
    h.fake.set_gpu(GPU0, error="unknown")
    h.sample()
    assert _idle(h, lease) == ("unknown", None)


def test_a_holders_child_busy_counts_for_the_holder(h: InProcessBroker, pool: SleeperPool) -> None:
    holder = Holder.of(os.getpid())  # this test process; the sleeper is its child
    _, child = pool.spawn()
    lease = h.acquire(holder, mib=4000).result()
    h.fake.allocate(GPU0, child.pid, 2000)
    h.sample()
    h.clock.advance(IDLE_AFTER_S)
    h.fake.set_utilization(GPU0, child.pid, 25)
    h.sample()
    assert _idle(h, lease) == ("active", 0.0)


def test_a_waiting_request_says_a_lease_on_its_gpu_is_idle(
    h: InProcessBroker, pool: SleeperPool
) -> None:
    _, holder = pool.spawn()
    _lease(h, holder, mib=15000)
    h.clock.advance(2 * 3600 + 10 * 60)
    h.sample()
    waiting = h.acquire(pool.spawn()[1], mib=8000, wait_s=60)
    h.sample()
    assert not waiting.done()
    (entry,) = h.broker.leases_view()["queue"]
    assert entry["reason"].endswith("; 1 lease on it idle 2 h 10 min"), entry["reason"]
    assert entry["reason_data"]["idle_leases"] == 1
    h.fake.set_utilization(GPU0, holder.pid, 50)
    h.sample()
    (entry,) = h.broker.leases_view()["queue"]
    assert "idle" not in entry["reason"]


def test_a_restored_lease_is_active_from_the_restart(
    make_inprocess: Callable[..., InProcessBroker], pool: SleeperPool
) -> None:
    h = make_inprocess(ONE_GPU, headroom_mib=1000, idle_after_s=IDLE_AFTER_S)
    h.broker.gateway.foreign_pids = False
    _, holder = pool.spawn()
    lease = _lease(h, holder)
    h.clock.advance(IDLE_AFTER_S)
    h.sample()
    assert _idle(h, lease)[0] == "idle"
    h.restart()
    h.broker.gateway.foreign_pids = False
    h.sample()
    assert _idle(h, lease)[0] == "active"
    h.clock.advance(IDLE_AFTER_S)
    h.sample()
    assert _idle(h, lease)[0] == "idle"


def test_idle_after_s_comes_from_the_config_files_idle_table(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text("")
    assert read_config(path).idle_after_s == 1800.0
    path.write_text("[idle]\nidle_after_s = 3600\n")
    assert read_config(path).idle_after_s == 3600.0
    for text, words in (
        ("[idle]\nidle_after = 60\n", "[idle] has no setting 'idle_after' (known: idle_after_s,"),
        ("[idle]\nidle_after_s = 0\n", "idle_after_s must be a number of seconds over 0"),
        ('[idle]\nidle_after_s = "1 h"\n', "idle_after_s must be a number of seconds over 0"),
        ("idle = 5\n", "[idle] must be a table"),
    ):
        path.write_text(text)
        with pytest.raises(ValueError) as exc:
            read_config(path)
        assert words in str(exc.value) and str(path) in str(exc.value), exc.value
