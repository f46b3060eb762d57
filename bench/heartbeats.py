"""Heartbeat cost of 1 000 and 10 000 live leases, an idle broker's footprint (architecture.md §10).

A real simulated broker process; its CPU use is read with psutil (user + system time of the
broker's pid, all its threads) over a window, as % of one core. In order:

1. idle: a fresh broker with no client, CPU % and RSS;
2. 1 000 leases held by 10 client processes (100 leases each, one connection each, ttl 30 s),
   no heartbeats during the window: what holding leases costs (expiry ticks, holder checks);
3. the same leases heartbeating as the SDK does, every ttl/3 = 10 s each (100 renewals/s);
4. 1 000 leases at ttl 3 s, renewed every 1 s (1 000 renewals/s), to make the per-renewal
   cost visible; beside it the floor: the same renewal traffic against a bare JSON-line echo
   server process (the echo of bench/lease_cycle.py), its CPU %;
5. 10 000 leases (10 processes × 1 000), held without heartbeats, then heartbeating as the SDK
   does at ttl 30 s (1 000 renewals/s).

Every lease is `LEASE_MIB` (2 MiB), so all 10 000 fit on the simulated GPU at once.

    python bench/heartbeats.py [--quick] [--record]
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import queue
import sys
import time
from typing import Any

import psutil
from _common import Report, fmt_rate, parser, start_broker, verdict, wait_until_monotonic
from lease_cycle import LineClient, start_echo

import rbroker

_ctx = mp.get_context("fork")
TARGET_BEAT_PCT = 5.0
TARGET_BIG_BEAT_PCT = 20.0  # heartbeats of 10 000 leases (architecture.md §10)
TARGET_IDLE_PCT = 1.0
TARGET_RSS_MIB = 80.0
# 2 MiB a lease, so that 10 000 of them fit on the 24 GiB simulated GPU (20 000 of its
# 23 347 MiB usable): at 16 MiB only 1 459 fit, the rest waited until earlier leases
# expired, and the 10 000-lease figures measured a queue, not heartbeats
LEASE_MIB = 2


def _holder(
    kind: str,
    address: str,
    index: int,
    leases: int,
    ttl_s: float,
    ready: Any,
    beat: Any,
    stop: Any,
    counters: Any,
    errors: Any,
) -> None:
    """Hold `leases` leases on one connection; renew them round robin every ttl/3 while
    `beat` is set; count renewals in `counters[index]`, put failures on `errors`."""
    is_ready = False
    try:
        if kind == "broker":
            client: Any = rbroker.Client(address, timeout_s=60)
            ids: list[str] = []
            renewed: dict[str, float] = {}
            while len(ids) < leases:
                lid = client.call(
                    "lease.acquire",
                    mib=LEASE_MIB,
                    project="bench",
                    session=f"holder-{index}",
                    purpose="heartbeat benchmark",
                    ttl_s=ttl_s,
                    wait_s=60.0,
                )["lease"]["lease_id"]
                ids.append(lid)
                renewed[lid] = time.monotonic()
                if beat.is_set():  # keep the first ones alive while the rest are granted
                    for old in ids:
                        if time.monotonic() - renewed[old] >= ttl_s / 3:
                            client.call("lease.renew", lease_id=old)
                            renewed[old] = time.monotonic()
        else:
            client = LineClient(address)
            ids = [f"lease-{index:04d}{k:08d}" for k in range(leases)]
        ready.put(index)
        is_ready = True
        interval = ttl_s / 3 / leases
        due = time.monotonic()
        k = 0
        while not stop.is_set():
            if not beat.is_set():
                time.sleep(0.05)
                due = time.monotonic()
                continue
            now = time.monotonic()
            if now < due:
                time.sleep(min(due - now, 0.05))
                continue
            client.call("lease.renew", lease_id=ids[k % leases])
            counters[index] += 1
            k += 1
            due += interval
        client.close()
    except Exception as exc:  # report, never hang the parent
        errors.put(f"holder {index}: {exc!r}")
        if not is_ready:
            ready.put(-1)


class Holders:
    """`processes` holder processes with `per` leases each, on broker or echo `address`."""

    def __init__(
        self, kind: str, address: str, processes: int, per: int, ttl_s: float, beat: bool
    ) -> None:
        self.ready = _ctx.Queue()
        self.beat = _ctx.Event()
        if beat:
            self.beat.set()
        self.stop_event = _ctx.Event()
        self.counters = _ctx.Array("q", processes, lock=False)
        self.errors = _ctx.Queue()
        self.procs = [
            _ctx.Process(
                target=_holder,
                args=(
                    kind,
                    address,
                    i,
                    per,
                    ttl_s,
                    self.ready,
                    self.beat,
                    self.stop_event,
                    self.counters,
                    self.errors,
                ),
                daemon=True,
            )
            for i in range(processes)
        ]
        t0 = time.monotonic()
        for p in self.procs:
            p.start()
        oks = [self.ready.get(timeout=600) for _ in self.procs]
        self.grant_s = time.monotonic() - t0
        """Seconds from starting the processes until all held their leases."""
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

    def renewals(self) -> int:
        return sum(self.counters)

    def stop(self) -> None:
        self.stop_event.set()
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()


def cpu_window(proc: psutil.Process, seconds: float) -> float:
    """CPU use of `proc` (all threads) over the next `seconds`, as % of one core."""
    t0 = time.monotonic()
    c0 = sum(proc.cpu_times()[:2])
    wait_until_monotonic(t0 + seconds)
    c1 = sum(proc.cpu_times()[:2])
    return (c1 - c0) / (time.monotonic() - t0) * 100


def measure(proc: psutil.Process, holders: Holders, seconds: float) -> tuple[float, float]:
    """(CPU % of `proc`, renewals/s by `holders`) over `seconds`."""
    n0, t0 = holders.renewals(), time.monotonic()
    cpu = cpu_window(proc, seconds)
    return cpu, (holders.renewals() - n0) / (time.monotonic() - t0)


def stopped_holders(report: Report, label: str, holders: Holders) -> None:
    """Note holder processes that stopped during a window (e.g. a lease that expired)."""
    failures = holders.failures()
    if failures:
        report.note(
            f"{label}: {len(failures)} of {len(holders.procs)} holder processes stopped during "
            f"the window, first: {failures[0]}; the figure covers the renewals made."
        )


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, help="window of the idle and ttl-30 s figures (30)")
    args = p.parse_args(argv)
    q = args.quick
    window = args.seconds or (2.0 if q else 30.0)
    short = 1.5 if q else 10.0
    settle = 0.5 if q else 5.0
    processes, per = (4, 25) if q else (10, 100)
    total = processes * per
    big_per = 100 if q else 1000
    big_total = processes * big_per

    report = Report(f"Heartbeats of {total:,} and {big_total:,} live leases, idle broker", q)
    broker = start_broker()
    bproc = psutil.Process(broker.pid)
    try:
        time.sleep(settle)  # first samples, imports, lazily created threads
        idle = cpu_window(bproc, window)
        rss_idle = bproc.memory_info().rss / 2**20

        holders = Holders("broker", broker.socket, processes, per, 30.0, beat=False)
        time.sleep(settle)
        held, _ = measure(bproc, holders, short)
        holders.beat.set()
        time.sleep(1.0)
        beat30, rate30 = measure(bproc, holders, window)
        rss_held = bproc.memory_info().rss / 2**20
        with rbroker.Client(broker.socket) as c:
            live30 = len(c.leases()["leases"])
        stopped_holders(report, "ttl 30 s", holders)
        holders.stop()

        grant_s = holders.grant_s
        nan = float("nan")
        beat3 = rate3 = nan
        live3 = 0
        try:
            holders = Holders("broker", broker.socket, processes, per, 3.0, beat=True)
            time.sleep(settle)
            beat3, rate3 = measure(bproc, holders, short)
            with rbroker.Client(broker.socket) as c:
                live3 = len(c.leases()["leases"])
            stopped_holders(report, "ttl 3 s", holders)
            holders.stop()
        except RuntimeError as exc:
            report.note(f"the ttl-3 s figure failed: {exc}")
        big_held = big_beat = big_rate = nan
        big_live = 0
        big_grant_s = nan
        try:
            holders = Holders("broker", broker.socket, processes, big_per, 30.0, beat=False)
            big_grant_s = holders.grant_s
            time.sleep(settle)
            big_held, _ = measure(bproc, holders, short)
            holders.beat.set()
            time.sleep(1.0)
            big_beat, big_rate = measure(bproc, holders, short)
            with rbroker.Client(broker.socket) as c:
                big_live = len(c.leases()["leases"])
            stopped_holders(report, f"{big_total:,} leases", holders)
            holders.stop()
        except RuntimeError as exc:
            report.note(f"the {big_total:,}-lease figure failed: {exc}")
    finally:
        stopped = broker.stop()
        if stopped:
            report.note(stopped)

    echo_proc, echo_path = start_echo()
    try:
        eproc = psutil.Process(echo_proc.pid)
        holders = Holders("echo", echo_path, processes, per, 3.0, beat=True)
        time.sleep(1.0)
        echo3, erate3 = measure(eproc, holders, short)
        stopped_holders(report, "echo floor", holders)
        holders.stop()
    finally:
        echo_proc.kill()
        echo_proc.join(5)

    report.add(
        "idle broker CPU",
        f"{idle:.2f} % of one core",
        "—",
        "—",
        "< 1 %",
        verdict(idle < TARGET_IDLE_PCT),
    )
    report.add(
        "idle broker RSS", f"{rss_idle:.1f} MiB", "—", "—", "< 80 MiB", verdict(rss_idle < 80)
    )
    report.add(
        f"{total:,} leases held, no heartbeats in the window",
        f"{held:.1f} % of one core",
        f"idle {idle:.2f} %",
    )
    report.add(
        f"{total:,} leases heartbeating, ttl 30 s (renew every 10 s, {fmt_rate(rate30)})",
        f"{beat30:.1f} % of one core",
        f"idle {idle:.2f} % · held {held:.1f} %",
        "—",
        "< 5 %",
        verdict(beat30 < TARGET_BEAT_PCT),
    )
    per_renewal = (beat3 - held) / 100 / rate3 if rate3 else float("nan")
    echo_per = echo3 / 100 / erate3 if erate3 else float("nan")
    report.add(
        f"{total:,} leases heartbeating, ttl 3 s (renew every 1 s, {fmt_rate(rate3)})",
        f"{beat3:.1f} % of one core",
        f"echo server, same traffic ({fmt_rate(erate3)}): {echo3:.1f} %",
        f"{beat3 / echo3:.2f}× echo" if echo3 else "n/a",
    )
    report.add(
        "CPU per renewal (ttl 3 s figure minus the held figure, over the rate)",
        f"{per_renewal * 1e6:,.0f} µs",
        f"echo {echo_per * 1e6:,.0f} µs per request",
        f"{per_renewal / echo_per:.2f}× echo" if echo_per else "n/a",
    )
    report.add(
        f"time to grant {total:,} leases to {processes} processes asking at once",
        f"{grant_s:.2f} s",
        "—",
        f"{total / grant_s:,.0f} grants/s",
    )
    report.add("broker RSS with the leases", f"{rss_held:.1f} MiB", f"idle {rss_idle:.1f} MiB")
    report.add(
        f"{big_total:,} leases held, no heartbeats in the window",
        f"{big_held:.1f} % of one core",
        f"idle {idle:.2f} %",
    )
    report.add(
        f"{big_total:,} leases heartbeating, ttl 30 s (renew every 10 s, {fmt_rate(big_rate)})",
        f"{big_beat:.1f} % of one core",
        f"idle {idle:.2f} % · held {big_held:.1f} %",
        "—",
        "< 20 %",
        verdict(big_beat < TARGET_BIG_BEAT_PCT),
    )
    report.add(
        f"time to grant {big_total:,} leases to {processes} processes asking at once",
        f"{big_grant_s:.2f} s",
        "—",
        f"{big_total / big_grant_s:,.0f} grants/s",
    )
    report.note(
        f"Windows: idle and ttl-30 s {window:g} s, others {short:g} s; CPU = user + system time "
        "of the broker's pid (all threads) over the wall time of the window, from psutil."
    )
    report.note(
        f"{processes} holder processes × {per} leases, one connection each, renewing round "
        f"robin; leases live at the end of the ttl-30 s window: {live30:,}, of the ttl-3 s "
        f"window: {live3:,}; {processes} × {big_per:,} for the {big_total:,}-lease figures "
        f"({short:g} s windows), live at the end: {big_live:,}."
    )
    report.note(
        "The holder processes share the machine's cores with the broker; only the broker's "
        "own CPU time is counted."
    )
    report.finish(args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
