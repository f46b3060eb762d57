"""The broker process's own CPU while nothing happens, with 0 and 1 000 live leases (issue 44).

A real simulated broker process (`rbroker broker --simulate`) on two simulated 24 GiB GPUs,
each sampled every second (the scenario's `[timers] sample_interval_s = 1`, the broker's
default, written out so the figure says what it measured; docs/architecture.md §6); its CPU
is read with psutil (user + system time of the broker's pid, all its threads) over a window,
as % of one core. In each round, one fresh broker:

1. the floor: no client, no lease (the broker's own timers: the samplers, the tick every
   0.1 s, the holder checks every 0.25 s);
2. 1 000 leases of 16 MiB held by 10 holder processes (100 each, one connection each, half
   on each GPU, ttl 3 600 s so no heartbeat falls in the window), each holder listed on both
   GPUs with memory allocated after its grants (`sim.allocate`: about half of its leases
   show use, so memory is attributed at every sample) and every other holder busy (40 % SM,
   `sim.set process_utilization`: its leases active, idleness measured at every sample);
   no lease traffic during the window.

Goals (issue 44): ≤ 0.3 % of one core idle with 0 leases, ≤ 2 % with 1 000 leases, over
5-minute windows.

    python bench/broker_idle.py [--quick] [--record] [--seconds 300] [--repeats 3]
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import sys
import time
from typing import Any

import psutil
from _common import Report, median, parser, spread, start_broker, verdict
from heartbeats import cpu_window

import rbroker

_ctx = mp.get_context("fork")
GPUS = (
    "GPU-5a1e0000-0000-0000-0000-000000000001",
    "GPU-5a1e0000-0000-0000-0000-000000000002",
)
SCENARIO = f"""
[timers]
sample_interval_s = 1.0

[[gpu]]
uuid = "{GPUS[0]}"
name = "Simulated RTX 4090"
total_mib = 24576

[[gpu]]
uuid = "{GPUS[1]}"
name = "Simulated RTX 4090"
total_mib = 24576
"""
"""Two empty simulated 24 576 MiB GPUs, sampled every second."""
LEASE_MIB = 16
TTL_S = 3600.0  # the longest ttl (architecture.md §3): no heartbeat within a 5-minute window
BUSY_PERCENT = 40
TARGET_IDLE_PCT = 0.3  # issue 44: an idle broker, 0 leases
TARGET_LEASES_PCT = 2.0  # issue 44: the same broker holding 1 000 leases


def _holder(address: str, index: int, leases: int, ready: Any, stop: Any, errors: Any) -> None:
    """Hold `leases` leases (alternating between the two GPUs) on one connection, then
    allocate half of what they were granted on each GPU and, for an even `index`, show
    `BUSY_PERCENT` % utilization there; wait for `stop` (no heartbeats: ttl `TTL_S`)."""
    is_ready = False
    try:
        client = rbroker.Client(address, timeout_s=60)
        for k in range(leases):
            client.call(
                "lease.acquire",
                mib=LEASE_MIB,
                gpu_uuid=GPUS[k % len(GPUS)],
                project="bench",
                session=f"holder-{index}",
                purpose="idle broker benchmark",
                ttl_s=TTL_S,
                wait_s=60.0,
            )
        per_gpu = (leases + len(GPUS) - 1) // len(GPUS)
        for uuid in GPUS:
            client.call("sim.allocate", mib=max(1, per_gpu * LEASE_MIB // 2), gpu_uuid=uuid)
            if index % 2 == 0:
                client.call(
                    "sim.set", gpu_uuid=uuid, process_utilization={str(os.getpid()): BUSY_PERCENT}
                )
        ready.put(index)
        is_ready = True
        stop.wait()
        client.close()
    except Exception as exc:  # report, never hang the parent
        errors.put(f"holder {index}: {exc!r}")
        if not is_ready:
            ready.put(-1)


class Holders:
    """`processes` holder processes with `per` leases each on the broker at `address`."""

    def __init__(self, address: str, processes: int, per: int) -> None:
        self.ready = _ctx.Queue()
        self.stop_event = _ctx.Event()
        self.errors = _ctx.Queue()
        self.procs = [
            _ctx.Process(
                target=_holder,
                args=(address, i, per, self.ready, self.stop_event, self.errors),
                daemon=True,
            )
            for i in range(processes)
        ]
        for p in self.procs:
            p.start()
        oks = [self.ready.get(timeout=600) for _ in self.procs]
        if -1 in oks:
            self.stop()
            raise RuntimeError("a holder process failed: " + "; ".join(self.failures()))

    def failures(self) -> list[str]:
        """What made holder processes stop so far."""
        out = []
        with contextlib.suppress(queue.Empty):
            while True:
                out.append(self.errors.get(timeout=0.2))
        return out

    def stop(self) -> None:
        self.stop_event.set()
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()


def scenario_with_tick(tick_s: float | None) -> str:
    """`SCENARIO`, with the broker's tick set to `tick_s` (`[timers] tick_s`) when given."""
    if tick_s is None:
        return SCENARIO
    return SCENARIO.replace("[timers]\n", f"[timers]\ntick_s = {tick_s!r}\n", 1)


def one_round(
    window_s: float, settle_s: float, processes: int, per: int, scenario: str = SCENARIO
) -> tuple[float, float, dict[str, int]]:
    """One fresh broker on `scenario`: `(CPU % with no lease, CPU % with processes × per
    leases, facts)`; `facts`: leases live at the end, of them with observed use, active (not
    idle) by idleness, and the broker's RSS (MiB) at the end."""
    broker = start_broker(scenario)
    proc = psutil.Process(broker.pid)
    holders: Holders | None = None
    try:
        time.sleep(settle_s)  # first samples, imports, lazily created threads
        idle = cpu_window(proc, window_s)
        holders = Holders(broker.socket, processes, per)
        time.sleep(settle_s)  # the samples that show the allocations
        held = cpu_window(proc, window_s)
        with rbroker.Client(broker.socket) as c:
            views = c.leases()["leases"]
        failures = holders.failures()
        if failures:
            raise RuntimeError(f"{len(failures)} holder processes stopped: {failures[0]}")
        facts = {
            "live": len(views),
            "observed": sum(1 for x in views if any(x["observed_mib"].values())),
            "active": sum(1 for x in views if x.get("idle_state") == "active"),
            "rss_mib": round(proc.memory_info().rss / 2**20),
        }
    finally:
        if holders is not None:
            holders.stop()
        stopped = broker.stop()
        if stopped:
            print(stopped, file=sys.stderr)
    return idle, held, facts


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, help="each window, s (300; --quick 2)")
    p.add_argument("--repeats", type=int, help="rounds, each a fresh broker (3)")
    p.add_argument(
        "--tick-s",
        type=float,
        help="the broker's tick ([timers] tick_s; 0.1 by docs/architecture.md §3): another "
        "value is an experiment on what the tick costs, and the table's title says so",
    )
    args = p.parse_args(argv)
    q = args.quick
    window = args.seconds or (2.0 if q else 300.0)
    repeats = args.repeats or (1 if q else 3)
    settle = 1.0 if q else 5.0
    processes, per = (4, 25) if q else (10, 100)
    total = processes * per

    title = f"Idle broker process CPU, 0 and {total:,} leases (bench/broker_idle.py)"
    if args.tick_s is not None:
        title += f", EXPERIMENT: the tick every {args.tick_s:g} s (the rule's is 0.1 s)"
    report = Report(title, q)
    scenario = scenario_with_tick(args.tick_s)
    idles: list[float] = []
    helds: list[float] = []
    facts: list[dict[str, int]] = []
    for _ in range(repeats):
        idle, held, fact = one_round(window, settle, processes, per, scenario)
        idles.append(idle)
        helds.append(held)
        facts.append(fact)

    def pct(v: float) -> str:
        return f"{v:.2f} %"

    def cell(values: list[float]) -> str:
        """The median, with the range and count when there are several rounds."""
        return f"{spread(values, pct)} of one core"

    report.add(
        "idle broker CPU, no lease (floor)",
        cell(idles),
        "—",
        "—",
        f"≤ {TARGET_IDLE_PCT} %",
        verdict(median(idles) <= TARGET_IDLE_PCT),
    )
    report.add(
        f"broker CPU, {total:,} leases held, no lease traffic",
        cell(helds),
        f"no lease {pct(median(idles))}",
        f"+{median(helds) - median(idles):.2f} points",
        f"≤ {TARGET_LEASES_PCT} %",
        verdict(median(helds) <= TARGET_LEASES_PCT),
    )
    last = facts[-1]
    report.add(
        f"broker RSS with {total:,} leases (end of the last round)",
        f"{last['rss_mib']} MiB",
    )
    report.note(
        f"{repeats} round(s), each a fresh broker: a {window:g} s window with no lease, then one "
        f"with the leases, each {settle:g} s after the change before it; cells: median "
        "(min–max, n). CPU is user + system time of the broker's pid (all threads) over the "
        "window's wall time, from psutil."
    )
    report.note(
        f"Two simulated 24 GiB GPUs sampled every 1 s ([timers] sample_interval_s); "
        f"{processes} holder processes × {per} leases of {LEASE_MIB} MiB (ttl {TTL_S:g} s, "
        "no heartbeats), half on each GPU; each holder allocated half its grant on each GPU "
        f"after its grants, every other one at {BUSY_PERCENT} % SM. At the end of the last "
        f"window: {last['live']:,} leases live, {last['observed']:,} with observed use, "
        f"{last['active']:,} active by idleness."
    )
    report.note(
        "The holder processes only wait, on the same machine; only the broker's own CPU time "
        "is counted."
    )
    report.finish(args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
