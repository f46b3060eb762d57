"""Lease costs against the number of live leases (architecture.md §10): a grant, renew or
release with 1, 100, 1 000 and 10 000 live leases.

A real simulated broker process (one 24 GiB GPU). A filler connection holds the other
leases (1 MiB each, ttl 1 h, so none needs a heartbeat during the run); a client of the SDK
(`rbroker.Client`) times `lease.acquire`, `lease.renew` and `lease.release` at each level,
and the broker's CPU time (psutil, all threads) per cycle is read over the same cycles.
Every round visits every level, upward in even rounds and downward in odd ones, so that
drift of the machine hits the levels alike; each ratio is taken to the 1-lease figure of
the same round.

    python bench/scaling.py [--quick] [--record] [--cycles 600] [--repeats 3]
"""

from __future__ import annotations

import json
import socket
import sys
import time
from typing import Any

import psutil
from _common import (
    Report,
    fmt_us,
    fmt_x,
    median,
    parser,
    percentile,
    spread,
    start_broker,
    timed_lease_cycle,
    verdict,
)

import rbroker

LEVELS = (1, 100, 1_000, 10_000)
TARGET_RATIO = 1.2  # at 1 000 live leases, each call ≤ 1.2× its cost with 1 (§10)
FILL = {
    "mib": 1,
    "project": "bench",
    "session": "filler",
    "purpose": "live leases",
    "ttl_s": 3600.0,
}
TIMED = {"mib": 64, "project": "bench", "session": "timed", "purpose": "scaling", "ttl_s": 30.0}


class Filler:
    """One raw connection holding background leases; requests are pipelined in batches."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.rfile = self.sock.makefile("rb")
        self.ids: list[str] = []
        self.n = 0

    def _batch(self, requests: list[tuple[str, dict[str, Any]]]) -> list[Any]:
        lines = []
        for method, params in requests:
            self.n += 1
            msg = {"jsonrpc": "2.0", "id": self.n, "method": method, "params": params}
            lines.append(json.dumps(msg).encode() + b"\n")
        self.sock.sendall(b"".join(lines))
        out = []
        for _ in requests:
            answer = json.loads(self.rfile.readline())
            if "error" in answer:
                raise RuntimeError(f"filler request failed: {answer['error']['message']}")
            out.append(answer["result"])
        return out

    def resize(self, count: int) -> None:
        """Hold exactly `count` background leases."""
        while len(self.ids) < count:
            k = min(200, count - len(self.ids))
            got = self._batch([("lease.acquire", FILL)] * k)
            self.ids.extend(r["lease"]["lease_id"] for r in got)
        while len(self.ids) > count:
            k = min(200, len(self.ids) - count)
            drop, self.ids = self.ids[-k:], self.ids[:-k]
            self._batch([("lease.release", {"lease_id": i}) for i in drop])

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()


def timed_cycles(
    client: rbroker.Client, proc: psutil.Process, n: int
) -> tuple[dict[str, float], float]:
    """p50 (s) of each call over `n` cycles after 50 untimed ones, and broker CPU per cycle."""
    for _ in range(50):
        lid = client.call("lease.acquire", **TIMED)["lease"]["lease_id"]
        client.call("lease.renew", lease_id=lid)
        client.call("lease.release", lease_id=lid)
    times: dict[str, list[float]] = {"acquire": [], "renew": [], "release": []}
    cpu0 = sum(proc.cpu_times()[:2])
    for _ in range(n):
        acquire, renew, release = timed_lease_cycle(client, TIMED)
        times["acquire"].append(acquire)
        times["renew"].append(renew)
        times["release"].append(release)
    cpu = (sum(proc.cpu_times()[:2]) - cpu0) / n
    return {k: percentile(v, 50) for k, v in times.items()}, cpu


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--cycles", type=int, help="timed cycles per level and round (600)")
    p.add_argument("--repeats", type=int, help="rounds over every level (3)")
    args = p.parse_args(argv)
    cycles = args.cycles or (100 if args.quick else 600)
    repeats = args.repeats or (1 if args.quick else 3)
    levels = (1, 100, 1_000) if args.quick else LEVELS

    report = Report("Lease costs against the number of live leases", args.quick)
    broker = start_broker()
    proc = psutil.Process(broker.pid)
    # per level: one entry per round, for each call and for the broker CPU per cycle
    p50: dict[int, dict[str, list[float]]] = {
        lv: {"acquire": [], "renew": [], "release": []} for lv in levels
    }
    cpu: dict[int, list[float]] = {lv: [] for lv in levels}
    fill_s: list[float] = []
    try:
        filler = Filler(broker.socket)
        with rbroker.Client(broker.socket, timeout_s=120) as client:
            for r in range(repeats):
                for level in levels if r % 2 == 0 else tuple(reversed(levels)):
                    t0 = time.monotonic()
                    filler.resize(level - 1)  # the timed lease is the level's last one
                    if level == max(levels) and r % 2 == 0:
                        fill_s.append(time.monotonic() - t0)
                    time.sleep(0.5)
                    calls, per_cycle = timed_cycles(client, proc, cycles)
                    for k, v in calls.items():
                        p50[level][k].append(v)
                    cpu[level].append(per_cycle)
                with rbroker.Client(broker.socket) as c:
                    live = len(c.leases()["leases"])
        filler.close()
    finally:
        stopped = broker.stop()
        if stopped:
            report.note(stopped)

    def to_base(level: int, key: str) -> list[float]:
        return [x / b for x, b in zip(p50[level][key], p50[1][key], strict=True)]

    for level in levels:
        ratios = {k: to_base(level, k) for k in ("acquire", "renew", "release")}
        worst = max(median(v) for v in ratios.values())
        is_target = level == 1_000
        report.add(
            f"{level:,} live leases: p50 of acquire · renew · release",
            " · ".join(spread(p50[level][k], fmt_us) for k in ("acquire", "renew", "release")),
            "1 live lease" if level != 1 else "—",
            " · ".join(spread(v, fmt_x) for v in ratios.values()) if level != 1 else "—",
            "each ≤ 1.2× the 1-lease figure" if is_target else "—",
            verdict(worst <= TARGET_RATIO) if is_target else "—",
        )
    for level in levels:
        # the process's CPU times tick at the kernel's clock (10 ms on Linux): a quick run's
        # 100 cycles at one lease can read 0, which has no ratio
        measured = all(b > 0 for b in cpu[1])
        base = [c / b for c, b in zip(cpu[level], cpu[1], strict=True)] if measured else []
        ratio = spread(base, fmt_x) if measured else "— (under the CPU clock's tick)"
        report.add(
            f"{level:,} live leases: broker CPU per cycle",
            spread(cpu[level], fmt_us),
            "1 live lease" if level != 1 else "—",
            ratio if level != 1 else "—",
        )
    if fill_s:
        most = max(levels) - 1
        report.add(
            f"time to grant {most:,} background leases (pipelined, one connection)",
            spread(fill_s, lambda v: f"{v:.2f} s"),
            "—",
            spread([most / v for v in fill_s], lambda v: f"{v:,.0f} grants/s"),
        )
    report.note(
        f"{repeats} rounds × {len(levels)} levels, {cycles} timed cycles each after 50 "
        "untimed; upward in even rounds, downward in odd ones; cells are the median of the "
        "rounds with their range; ratios are to the 1-lease figure of the same round."
    )
    report.note(
        "Background leases: 1 MiB each, ttl 1 h, held by one pipelined raw connection of this "
        f"process; {live:,} leases were live at the end of the last level (its timed lease "
        "released). The timed client is the SDK; each call's latency includes its round trip."
    )
    report.finish(args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
