"""Time as real machines have it (issue 3, cases 4–6; architecture.md §3).

- Case 4: the wall clock jumps ±1 h while expiry runs on the monotonic clock: once on an
  in-process broker with a manual clock (exact numbers), once on a broker process whose
  wall clock libfaketime moves (slow; skipped where libfaketime is not installed).
- Case 5: the broker's event loop stalls 45 s (`sim.stall`) while five clients keep
  sending heartbeats every 5 s, and an SDK holder keeps its lease (slow; run at a third of
  that time scale, every ratio kept).
- Case 6: a client's main thread is CPU-bound for 60 s; the SDK's heartbeat thread keeps
  the lease alive (slow; run at half that time scale, still ten TTLs).
- A job that leaves its lease while the broker stalls is not held up (slow).

Cases 3 (from test_gpu_faults), 5, 6 and the stalled exit each take 15 to 30 s of real time
on their own brokers: `test_long_cases_run_together` runs them at the same time.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import glob
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import rbroker
from rbroker.broker.holders import Holder
from rbroker.broker.leases import Lease
from tests.conftest import SINGLE_24G, BrokerProcess, wait_until
from tests.desktop.conftest import RawConnection, WorkerProcess
from tests.desktop.gpu.test_gpu_faults import case3_hung_memory_query_for_60_s
from tests.desktop.inprocess import InProcessBroker

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

PARAMS = {"project": "tests", "session": "clocks", "purpose": "time jumps"}


def _ended(c: rbroker.Client, lease_id: str) -> dict[str, Any] | None:
    for lease in c.leases(include_ended=True)["ended"]:
        if lease["lease_id"] == lease_id:
            return dict(lease)
    return None


def _active(c: rbroker.Client) -> dict[str, dict[str, Any]]:
    return {x["lease_id"]: x for x in c.leases()["leases"]}


# -- case 4, in-process -----------------------------------------------------------------------
@pytest.fixture
def inproc(tmp_path: Path) -> Iterator[InProcessBroker]:
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(SINGLE_24G)
    h = InProcessBroker(scenario, tmp_path, persist=False)
    yield h
    h.close()


def _grant(h: InProcessBroker, **params: Any) -> Lease:
    task = h.acquire(Holder.of(os.getpid()), **params)
    assert task.done(), h.broker.queue
    return task.result()


@pytest.mark.unit  # in-process (the module also starts processes)
def test_case4_wall_clock_jumps_in_process(inproc: InProcessBroker) -> None:
    h = inproc
    lease = _grant(h, mib=4096, ttl_s=30)

    # +1 h on the wall clock while the monotonic clock moves 5 s: about 25 s left.
    h.clock.wall_s += 3600
    for _ in range(50):
        h.clock.advance(0.1)
        h.tick(0.1)
    assert lease.lease_id in h.broker.leases
    left = h.broker.leases[lease.lease_id].to_wire(h.clock.monotonic())["expires_in_s"]
    assert left == pytest.approx(25.0, abs=1e-6)

    # −1 h, then 31 monotonic seconds without a heartbeat: expired (at 30 s, not 1 h later).
    h.broker.renew(lease.lease_id, "tester")
    h.clock.wall_s -= 3600
    for step in range(310):
        h.clock.advance(0.1)
        h.tick(0.1)
        if step == 295:  # 29.6 s after the renewal
            assert lease.lease_id in h.broker.leases
    assert lease.lease_id not in h.broker.leases
    assert lease.state.value == "expired"


@pytest.mark.unit  # in-process (the module also starts processes)
def test_sleep_resume_gap_gives_one_ttl_of_grace(inproc: InProcessBroker) -> None:
    """A 10-minute suspend: CLOCK_BOOTTIME moves, CLOCK_MONOTONIC barely (Linux): every
    lease gets one TTL from the resume instead of mass expiry."""
    h = inproc
    lease = _grant(h, mib=4096, ttl_s=30)
    h.clock.advance(20)  # 10 s left
    h.clock.boot += 600
    h.clock.wall_s += 600
    h.tick(600)
    assert h.broker.leases[lease.lease_id].deadline == h.clock.monotonic() + 30
    h.clock.advance(29)
    h.tick(0.1)
    assert lease.lease_id in h.broker.leases
    h.clock.advance(2)
    h.tick(0.1)
    assert lease.state.value == "expired"


@pytest.mark.unit  # in-process (the module also starts processes)
def test_case5_a_45_s_loop_stall_under_ttl_30_in_process(inproc: InProcessBroker) -> None:
    """Case 5 with its own numbers on the production broker (the process test runs them at
    a third of the time scale): five leases of TTL 30 s renewed every 5 s, then the loop
    stalls 45 s (1.5 TTLs, every renewal sent meanwhile still waiting): none expires, each
    has one TTL from the end of the stall, and the renewals waiting behind the stall renew
    them as usual."""
    h = inproc
    leases = [_grant(h, mib=1024, ttl_s=30) for _ in range(5)]
    for _ in range(2):  # renewed every 5 s before the stall
        h.clock.advance(5.0)
        h.tick(0.1)  # the loop turned all along (its ticks are 0.1 s apart)
        for lease in leases:
            h.broker.renew(lease.lease_id, "tester")
    h.clock.advance(2.0)
    h.tick(0.1)
    h.clock.advance(45.0)  # the loop is blocked: no tick, no renewal is served
    h.tick(45.0)  # the first turn after the stall: one TTL of grace, then expiry
    now = h.clock.monotonic()
    for lease in leases:
        assert lease.lease_id in h.broker.leases and lease.state.value == "active"
        assert lease.to_wire(now)["expires_in_s"] == pytest.approx(30.0, abs=1e-6)
    for lease in leases:  # the renewals that waited behind the stall
        h.broker.renew(lease.lease_id, "tester")
    h.clock.advance(29.9)
    h.tick(0.1)
    assert all(x.lease_id in h.broker.leases for x in leases)
    h.clock.advance(0.2)
    h.tick(0.1)
    assert all(x.state.value == "expired" for x in leases)


# -- case 4, a broker process under libfaketime -------------------------------------------------
def _libfaketime() -> str | None:
    patterns = [
        "/usr/lib/*/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
        "/usr/local/lib/faketime/libfaketime.so.1",
    ]
    for pattern in patterns:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


TTL_UNDER_FAKETIME = 6
"""The lease's TTL in the libfaketime test: 6 s instead of 30, so the wall-clock jumps (±1 h)
are still hundreds of TTLs; the timing slack of each check (the monotonic seconds around
each figure) stays what it was with 30 s. The exact figures of a 30 s TTL under ±1 h
are asserted by `test_case4_wall_clock_jumps_in_process`."""


@pytest.mark.slow
@pytest.mark.skipif(
    _libfaketime() is None, reason="libfaketime not installed (Debian/Ubuntu package faketime)"
)
def test_case4_wall_clock_jumps_under_libfaketime(
    broker_factory: Callable[..., BrokerProcess], short_dir: Path
) -> None:
    """The broker process's wall clock (CLOCK_REALTIME) jumps, its monotonic clock does not
    (FAKETIME_DONT_FAKE_MONOTONIC): expiry follows the monotonic clock."""
    ttl = TTL_UNDER_FAKETIME
    root = short_dir
    offset = root / "faketime"
    offset.write_text("+0\n")
    env = {
        "LD_PRELOAD": str(_libfaketime()),
        "FAKETIME_TIMESTAMP_FILE": str(offset),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    broker = broker_factory(root=root, env=env)

    def broker_wall() -> float:
        probe = c.call("lease.acquire", mib=512, ttl_s=5, **PARAMS)["lease"]
        c.call("lease.release", lease_id=probe["lease_id"])
        return float(probe["granted_at"])

    with broker.client() as c:
        assert abs(broker_wall() - time.time()) < 5
        lease = c.call("lease.acquire", mib=4096, ttl_s=ttl, **PARAMS)["lease"]
        granted = time.monotonic()

        offset.write_text("+3600\n")  # +1 h
        assert broker_wall() - time.time() == pytest.approx(3600, abs=5)
        time.sleep(max(0.0, 2.0 - (time.monotonic() - granted)))
        left = _active(c)[lease["lease_id"]]["expires_in_s"]
        assert ttl - 3.0 <= left <= ttl - 1.8, left  # 2 s (and a little) after the grant

        renewed = c.call("lease.renew", lease_id=lease["lease_id"])["lease"]
        renewed_at = time.monotonic()
        stalls = broker.log().count("stalled")
        offset.write_text("-3600\n")  # −1 h from the true time (−2 h from the broker's)
        assert broker_wall() - time.time() == pytest.approx(-3600, abs=5)
        assert renewed["expires_in_s"] > ttl - 1

        time.sleep(ttl - 1.5 - (time.monotonic() - renewed_at))
        assert lease["lease_id"] in _active(c)  # not expired early
        ended = wait_until(lambda: _ended(c, lease["lease_id"]), timeout_s=ttl + 10)
        expired_after = time.monotonic() - renewed_at
        assert isinstance(ended, dict)
        assert ended["state"] == "expired"
        # one TTL after the renewal, not an hour later; one TTL more only if the broker's
        # loop really stalled meanwhile (a loaded test machine), as architecture.md §3 wants
        assert ttl - 0.5 <= expired_after <= ttl + 1.5 or broker.log().count("stalled") > stalls, (
            expired_after
        )
    assert broker.proc.poll() is None


# -- case 5 ----------------------------------------------------------------------------------------
CASE5_SCALE = 1 / 3
"""Issue 3's case 5 stalls the loop 45 s under TTL 30 s and heartbeats every 5 s; the test
runs it at a third of that time scale (15 s under TTL 10 s, heartbeats every 5/3 s): the
stall is still 1.5 TTLs and 7.5 stall thresholds (2 s), and every figure keeps its ratio."""


def case5_broker_loop_stalls_45_s(
    broker_factory: Callable[..., BrokerProcess],
    raw_connect: Callable[[str], RawConnection],
    worker: Callable[..., WorkerProcess],
) -> None:
    """Five clients send heartbeats every 5 s (TTL 30 s) while the broker's event loop is
    blocked for 45 s: no lease expires. An SDK holder (TTL 30 s, heartbeats every 10 s)
    keeps its lease through the stall too. (All times × `CASE5_SCALE`.)"""
    k = CASE5_SCALE
    ttl, stall_s = 30 * k, 45 * k
    broker = broker_factory()
    clients = [raw_connect(broker.socket) for _ in range(5)]
    lease_ids = []
    for i, conn in enumerate(clients):
        answer = conn.request("lease.acquire", {"mib": 1024, "ttl_s": ttl, **PARAMS})
        lease_ids.append(answer["result"]["lease"]["lease_id"])
        assert answer["result"]["lease"]["ttl_s"] == ttl, i
    sdk = worker("hold_lease", broker.socket, "2048", "sdk-through-stall", "0", str(ttl))
    sdk_line = sdk.read_line()
    assert sdk_line.startswith("granted"), sdk_line
    sdk_lease = sdk_line.split()[1]

    sent: list[list[int]] = [[] for _ in clients]
    stop = threading.Event()

    def heartbeats(i: int) -> None:
        while not stop.wait(5.0 * k):
            sent[i].append(clients[i].send_request("lease.renew", {"lease_id": lease_ids[i]}))

    threads = [threading.Thread(target=heartbeats, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    try:
        time.sleep(2.0 * k)
        staller = raw_connect(broker.socket)
        stall_id = staller.send_request("sim.stall", {"seconds": stall_s})
        stalled_at = time.monotonic()
        staller.sock.settimeout(60)
        assert staller.read_answer(stall_id)["result"] == {"stalled_s": stall_s}
        assert time.monotonic() - stalled_at >= stall_s - 0.5
        time.sleep(7.0 * k)  # every client has sent again since the stall
    finally:
        stop.set()
        for t in threads:
            t.join(10)

    with broker.client() as c:
        active = _active(c)
        assert set(lease_ids) | {sdk_lease} == set(active), c.leases(include_ended=True)
        assert c.leases(include_ended=True)["ended"] == []
        assert all(x["expires_in_s"] > 20 * k for x in active.values())
    for i, conn in enumerate(clients):
        assert len(sent[i]) >= 10
        for request_id in sent[i]:
            answer = conn.read_answer(request_id)
            assert answer.get("result", {}).get("lease", {}).get("state") == "active", answer
    assert sdk.proc.poll() is None  # its heartbeat thread never gave the lease up
    assert "stalled" in broker.log()


# -- case 6 --------------------------------------------------------------------------------------
CASE6_SCALE = 0.5
"""Issue 3's case 6 keeps the main thread busy 60 s under TTL 6 s; the test runs it at half
that time scale (30 s under TTL 3 s: still ten TTLs, heartbeats every 1 s)."""


def case6_cpu_bound_main_thread_keeps_its_lease(
    broker_factory: Callable[..., BrokerProcess], worker: Callable[..., WorkerProcess]
) -> None:
    """A holder whose main thread runs a pure-Python CPU loop for 60 s: the SDK heartbeats
    from its own thread (TTL 6 s, so ten TTLs pass), and the lease is never lost. (All
    times × `CASE6_SCALE`.)"""
    k = CASE6_SCALE
    busy_s = 60 * k
    broker = broker_factory()
    holder = worker("cpu_bound_holder", broker.socket, "4096", str(6 * k), str(busy_s))
    line = holder.read_line()
    assert line.startswith("granted"), line
    lease_id = line.split()[1]
    busy_from = time.monotonic()
    seen = 0
    with broker.client() as c:
        while time.monotonic() - busy_from < busy_s - 2:
            active = _active(c)
            assert lease_id in active, c.leases(include_ended=True)
            assert active[lease_id]["expires_in_s"] > 1.0 * k
            seen += 1
            time.sleep(1.0)
        done = holder.read_line()
        assert done.startswith("done lost=False"), done
        cpu_s = float(done.split("cpu_s=")[1])
        # the main thread never slept; on a loaded machine it gets less than a core
        assert cpu_s > 5 * k, f"the loop was not CPU-bound: {cpu_s} s of CPU in {busy_s:g} s"
        print(f"\nCPU-bound holder: {cpu_s:.1f} s of CPU in {busy_s:g} s, lease seen {seen} times")
        ended = wait_until(lambda: _ended(c, lease_id), timeout_s=10)
        assert isinstance(ended, dict)
        assert ended["state"] == "released"
    assert seen >= 50 * k - 1  # 50 of 58 one-second looks at full scale: 24 of 28 here
    with contextlib.suppress(Exception):
        holder.proc.wait(10)
    assert holder.proc.returncode == 0


RELEASE_ON_LINE = """
import sys, time
import rbroker

with rbroker.lease(2048, ttl_s=3, project="tests", session="exit-in-stall",
                   purpose="leave while the broker stalls", socket=sys.argv[1]) as lease:
    print(f"granted {lease.lease_id}", flush=True)
    sys.stdin.readline()
    started = time.monotonic()
print(f"left {time.monotonic() - started:.2f}", flush=True)
"""


def leaving_a_lease_while_the_broker_stalls_does_not_hang(
    broker_factory: Callable[..., BrokerProcess], raw_connect: Callable[[str], RawConnection]
) -> None:
    """A job that ends while the broker's loop is stalled leaves its `with` block at once
    (its heartbeat waits on the broker; the SDK closes the connection instead of queueing
    behind it) and the lease is released when the broker runs again."""
    broker = broker_factory()
    job = subprocess.Popen(
        [sys.executable, "-c", RELEASE_ON_LINE, broker.socket],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert job.stdin is not None and job.stdout is not None
    try:
        line = job.stdout.readline()
        assert line.startswith("granted"), line
        lease_id = line.split()[1]
        staller = raw_connect(broker.socket)
        stall_id = staller.send_request("sim.stall", {"seconds": 15})
        time.sleep(2.5)  # a heartbeat (every 1 s) is now waiting on the stalled broker
        job.stdin.write("done\n")
        job.stdin.flush()
        left = job.stdout.readline()
        assert left.startswith("left"), left
        assert float(left.split()[1]) < 5.0, left
        assert job.wait(10) == 0
        staller.sock.settimeout(30)
        assert "result" in staller.read_answer(stall_id)
        with broker.client() as c:
            ended = wait_until(lambda: _ended(c, lease_id), timeout_s=5)
            assert isinstance(ended, dict)
            # its connection closed and its process exited while the loop was blocked:
            # whichever the broker notices first ends it
            assert ended["state"] in ("released", "holder_exited")
    finally:
        job.kill()
        job.wait(10)
        job.stdin.close()
        job.stdout.close()


# -- the long cases, side by side ----------------------------------------------------------------
@pytest.mark.slow
def test_long_cases_run_together(
    broker_factory: Callable[..., BrokerProcess],
    raw_connect: Callable[[str], RawConnection],
    worker: Callable[..., WorkerProcess],
) -> None:
    """Cases 3 (60 s NVML hang), 5 (45 s loop stall), 6 (60 s CPU-bound holder), each at a
    shorter time scale with its ratios kept, and the stalled-exit check (15 s) wait on real
    time; they use separate brokers, so they run at the same time, in threads, and this test
    fails with every failure."""
    cases: dict[str, Callable[[], None]] = {
        "case 3: NVML hung 60 s": lambda: case3_hung_memory_query_for_60_s(
            broker_factory, raw_connect
        ),
        "case 5: loop stalled 45 s": lambda: case5_broker_loop_stalls_45_s(
            broker_factory, raw_connect, worker
        ),
        "case 6: CPU-bound holder 60 s": lambda: case6_cpu_bound_main_thread_keeps_its_lease(
            broker_factory, worker
        ),
        "leaving during a stall": lambda: leaving_a_lease_while_the_broker_stalls_does_not_hang(
            broker_factory, raw_connect
        ),
    }
    failures: list[Exception] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(cases)) as pool:
        running = {pool.submit(case): name for name, case in cases.items()}
        for done in concurrent.futures.as_completed(running):
            exc = done.exception()
            if exc is not None:
                assert isinstance(exc, Exception), exc
                exc.add_note(f"in {running[done]}")
                failures.append(exc)
    if failures:
        raise ExceptionGroup(f"{len(failures)} of {len(cases)} long cases failed", failures)
