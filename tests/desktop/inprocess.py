"""An in-process `Broker` driven step by step, for tests that need to control time.

The broker runs the production code on the simulated NVML library (`FakeNvml` behind the
real `NvmlGateway`), but no background task: the test calls the steps the tick and sampler
loops would (`sample`, `tick`) and moves a `ManualClock`. Holders are real processes, so
pid + start-time liveness is the real check.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from rbroker.broker.config import BrokerConfig
from rbroker.broker.holders import Holder
from rbroker.broker.leases import Lease
from rbroker.broker.service import Broker
from rbroker.broker.store import LeaseStore
from rbroker.gpu.fake_nvml import FakeNvml
from rbroker.gpu.nvml import NvmlGateway
from rbroker_protocol.localapi import AcquireParams
from tests.conftest import PROP_PROCESSES

T = TypeVar("T")

DESCRIPTION = {"project": "tests", "session": "in-process", "purpose": "step by step"}


class ManualClock:
    """A `Clock` the test moves: monotonic, wall and boot time are independent."""

    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall_s = 1_800_000_000.0
        self.boot = 5000.0
        self.boot_name = "since-boot 00000000-test-boot-0001"  # a reboot: set another

    def monotonic(self) -> float:
        return self.mono

    def wall(self) -> float:
        return self.wall_s

    def boottime(self) -> float:
        return self.boot

    def boot_id(self) -> str:
        return self.boot_name

    def advance(self, seconds: float) -> None:
        """Monotonic and boot time move together (no sleep); wall time too."""
        self.mono += seconds
        self.boot += seconds
        self.wall_s += seconds


#: A process that only sleeps: `sleep` where it exists, else this Python (Windows has none).
SLEEPER = (
    ["sleep", "600"]
    if shutil.which("sleep")
    else [sys.executable, "-c", "import time; time.sleep(600)"]
)
PROP_PROCESSES.add(tuple(SLEEPER))  # a prop of a unit test, not its subject


#: Windows' ERROR_INTERNAL_ERROR: under Wine, CreateProcess of the next sleeper fails with it
#: now and then after a state machine has started and killed hundreds of them (a Wine gap,
#: seen in `test_resize_state_machine`); real Windows is not known to answer it.
_WINE_INTERNAL_ERROR = 1359


def _popen_sleeper() -> subprocess.Popen[bytes]:
    """A new `SLEEPER`; a Wine CreateProcess internal error is tried again (5 tries, 0.2 s
    apart) so the state machines' examples see a holder, not Wine's gap.

    Raises:
        OSError: the process cannot be started (Wine's error after the last try).
    """
    for attempt in range(5):
        try:
            return subprocess.Popen(SLEEPER)
        except OSError as exc:
            if getattr(exc, "winerror", None) != _WINE_INTERNAL_ERROR or attempt == 4:
                raise
            time.sleep(0.2)
    raise AssertionError("unreachable")


class SleeperPool:
    """Real holder processes (`SLEEPER`) that tests can kill."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self) -> tuple[subprocess.Popen[bytes], Holder]:
        proc = _popen_sleeper()
        self.procs.append(proc)
        return proc, Holder.of(proc.pid)

    def close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(OSError):
                proc.kill()
            proc.wait(10)
        self.procs.clear()


class InProcessBroker:
    """A `Broker` on its own event loop, with a manual clock and an optional store.

    `restart()` drops the broker as a crash would (nothing more is written) and starts a new
    one on the same store file and the same simulated GPUs.
    """

    def __init__(self, scenario: Path, data_dir: Path, persist: bool = True, **config: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock()
        self.fake = FakeNvml(scenario)
        self.data_dir = data_dir
        self.persist = persist
        # a generous NVML deadline: a loaded test machine must not turn samples stale
        self.config = BrokerConfig(
            socket_path=data_dir / "unused.sock",
            data_dir=data_dir,
            **{"nvml_deadline_s": 30.0, **config},
        )
        self.broker = self._new_broker()
        self.run(self.broker.start(background=False))

    def _new_broker(self) -> Broker:
        gateway = NvmlGateway(self.fake, source="simulated")
        store = LeaseStore(self.data_dir / "broker.sqlite3") if self.persist else None
        return Broker(self.config, gateway, self.fake, clock=self.clock, store=store)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def spin(self) -> None:
        """Let ready tasks run (queued acquires reach the broker, answers arrive)."""
        for _ in range(3):
            self.loop.run_until_complete(asyncio.sleep(0))

    def sample(self, uuid: str | None = None) -> None:
        """What a sampler loop turn does: a fresh sample (strictly after the last change,
        so the clock moves a millisecond first), then an admission pass."""
        self.clock.advance(0.001)
        for u in [uuid] if uuid else list(self.broker.slots):
            self.run(self.broker._sample_once(self.broker.slots[u]))
        self.broker._admit()
        self.spin()

    def tick(self, gap_s: float) -> None:
        """What a tick loop turn does after `gap_s` seconds: grace after a stall, reap
        dead holders, expire, keep the lease lifetimes."""
        now = self.clock.monotonic()
        if gap_s > self.config.stall_threshold_s:
            self.broker._grace(now, gap_s)
        self.broker._reap_dead_holders()
        self.broker._tick(now)
        self.spin()

    def acquire(
        self, holder: Holder, conn_id: int | None = 1, **params: Any
    ) -> asyncio.Task[Lease]:
        """Start a `lease.acquire` as the local API would; the task ends with the lease or
        the RpcError."""
        p = AcquireParams.model_validate({**DESCRIPTION, **params})
        task = self.loop.create_task(self.broker.acquire(p, "tester", holder, conn_id))
        self.spin()
        return task

    def restart(self) -> None:
        """Crash (no stop, no more writes) and start again on the same store."""
        old = self.broker
        old.sampler.close()
        if old.store is not None:
            with contextlib.suppress(sqlite3.Error):  # a full disk: the journal stays
                old.store.close()
        abandoned, old.queue[:] = list(old.queue), []
        for w in abandoned:  # their clients' connections broke with the old broker
            if not w.future.done():
                w.future.cancel()
        self.spin()
        self.broker = self._new_broker()
        self.run(self.broker.start(background=False))

    def close(self) -> None:
        """Stop the broker and close its loop (again: nothing)."""
        if self.loop.is_closed():
            return
        self.run(self.broker.stop())
        for task in asyncio.all_tasks(self.loop):
            task.cancel()
        with contextlib.suppress(Exception):
            self.spin()
        self.loop.close()
