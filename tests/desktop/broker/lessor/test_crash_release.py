"""A killed holder's lease is freed within 1 s and the next waiter admitted (architecture.md §3,
§10).

Holders and waiters are real processes (tests/workers/hold_lease.py) using the SDK.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import rbroker
from tests.conftest import GPU0, BrokerProcess, wait_until
from tests.desktop.conftest import WorkerProcess

MIB = 16384  # two of these never fit on 24 576 − 1 024 MiB


def _lease_of(c: rbroker.Client, session: str) -> dict[str, Any] | None:
    for lease in c.leases()["leases"]:
        if lease["session"] == session:
            return dict(lease)
    return None


def _queued(c: rbroker.Client, session: str) -> bool:
    return any(q["session"] == session for q in c.leases()["queue"])


def test_sigkill_right_after_grant_frees_the_lease_within_one_second(
    broker_factory: Callable[..., BrokerProcess], worker: Callable[..., WorkerProcess]
) -> None:
    broker = broker_factory(headroom_mib=1024)
    with broker.client() as c:
        # A blocker holds the GPU so that the holder and the waiter queue in that order; a
        # process of its own (not a parent of theirs: what fits only once the requester's
        # own leases end is refused at once, architecture.md §3).
        blocked_by = worker("hold_lease", broker.socket, str(MIB), "blocker", "0").read_line()
        assert blocked_by.startswith("granted "), blocked_by
        holder = worker("hold_lease", broker.socket, str(MIB), "holder", "60")
        wait_until(lambda: _queued(c, "holder"))
        waiter = worker("hold_lease", broker.socket, str(MIB), "waiter", "60")
        wait_until(lambda: _queued(c, "waiter"))

        c.call("lease.release", lease_id=blocked_by.split()[1])
        line = holder.read_line()
        assert line.startswith("granted "), line
        holder_lease = line.split()[1]
        time.sleep(0.05)
        os.kill(holder.pid, signal.SIGKILL)
        killed_at = time.monotonic()

        def waiter_admitted() -> dict[str, Any] | None:
            return _lease_of(c, "waiter")

        admitted = wait_until(waiter_admitted, timeout_s=5, interval_s=0.005)
        freed_after = time.monotonic() - killed_at
        assert freed_after < 1.0, f"lease freed and waiter admitted {freed_after:.3f} s after kill"
        assert isinstance(admitted, dict) and admitted["gpu_uuid"] == GPU0

        assert waiter.read_line().startswith("granted ")
        ended = {x["lease_id"]: x for x in c.leases(include_ended=True)["ended"]}
        assert ended[holder_lease]["state"] in ("released", "holder_exited")
        assert holder.proc.wait(5) == -signal.SIGKILL
        assert [x["session"] for x in c.leases()["leases"]] == ["waiter"]


def test_holder_whose_connection_outlives_it_is_freed_by_process_exit(
    broker_factory: Callable[..., BrokerProcess], worker: Callable[..., WorkerProcess]
) -> None:
    """The holder forks a child that inherits the lease's socket and outlives it: the
    connection stays open, so only the holder-process check (pid + start time) frees it."""
    broker = broker_factory(headroom_mib=1024)
    with broker.client() as c:
        holder = worker("fork_and_hold", broker.socket, str(MIB))
        line = holder.read_line()
        assert line.startswith("granted "), line
        child_pid = int(holder.read_line().split()[1])
        try:
            os.kill(holder.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            # Not reaped yet: the holder is a zombie, which counts as exited.
            wait_until(lambda: c.leases()["leases"] == [], timeout_s=5, interval_s=0.005)
            freed_after = time.monotonic() - killed_at
            assert freed_after < 1.0, f"freed {freed_after:.3f} s after the holder was killed"
            assert holder.proc.wait(5) == -signal.SIGKILL
            (ended,) = c.leases(include_ended=True)["ended"]
            assert ended["state"] == "holder_exited"
            granted = c.call(
                "lease.acquire", mib=MIB, project="tests", session="next", purpose="after"
            )
            assert granted["lease"]["granted_mib"] == MIB
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child_pid, signal.SIGKILL)
