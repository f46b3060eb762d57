"""Run every benchmark of architecture.md §10 in turn, one process each, and print their tables.

With `--record`, each benchmark appends its table to bench/RESULTS.md, between a run header
(machine, date, load average before) and a run footer (load average after, duration).

    python bench/run_all.py [--quick] [--record] [--only lease_cycle,heartbeats]
"""

from __future__ import annotations

import subprocess
import sys
import time

from _common import BENCH_DIR, append_results, loadavg, machine_line, now_utc, parser

BENCHMARKS = (
    "lease_cycle",
    "scaling",
    "heartbeats",
    "broker_idle",
    "crash_release",
    "coordinator",
    "abuse",
)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--only", help="comma-separated subset of: " + ", ".join(BENCHMARKS))
    args = p.parse_args(argv)
    names = [n.strip() for n in args.only.split(",")] if args.only else list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        p.error(f"unknown benchmarks: {', '.join(unknown)}")
    flags = (["--quick"] if args.quick else []) + (["--record"] if args.record else [])
    mode = "quick mode (smoke check, small counts)" if args.quick else "full mode"
    before, started, t0 = loadavg(), now_utc(), time.monotonic()
    if args.record:
        append_results(
            f"## Run of {started}, {mode}: {', '.join(names)}\n\n"
            f"Machine: {machine_line()}.  \n"
            f"Load average (1/5/15 min) before the run: {before}.\n"
        )
    failed = []
    for name in names:
        print(f"== {name} ({now_utc()}, load {loadavg()})", flush=True)
        code = subprocess.call([sys.executable, str(BENCH_DIR / f"{name}.py"), *flags])
        if code != 0:
            failed.append(f"{name} (exit {code})")
    after, took = loadavg(), time.monotonic() - t0
    summary = (
        f"End of the run of {started}: load average (1/5/15 min) {before} before, {after} "
        f"after; {took:.0f} s in all" + (f"; failed: {', '.join(failed)}" if failed else "") + ".\n"
    )
    print(summary, flush=True)
    if args.record:
        append_results(summary)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
