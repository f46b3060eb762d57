"""Start-up of what people run most often (issue 44; docs/architecture.md §10, start-up).

Each figure is the wall time of a new process, the median of `--runs` runs, the kinds taking
turns round by round so that load elsewhere hits them alike; beside them, in the same run:
- the floor: a bare `python -I -c pass` of the same interpreter (and, for `rbroker run`, that
  plus one lease cycle of an open connection: what the command must do at the least);
- `rbroker run --mib 100 -- /bin/true` against a simulated broker (goal ≤ 3× its floor);
- `rbroker status --json` (goal ≤ 3× the bare start);
- `python -c "import rbroker"` (goal ≤ 2× the bare start).

Beside the wall times, each command's CPU time (user + system, its own process and what it
waited for): on a machine shared with other work, load stretches wall times unevenly, CPU
times much less, so the notes give their medians and ratios too.

    python bench/startup.py [--quick] [--record] [--runs 20]
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

from _common import Report, fmt_ms, fmt_x, median, parser, start_broker, timed_lease_cycle, verdict

import rbroker

ACQUIRE = {"mib": 100, "project": "bench", "session": "bench", "purpose": "start-up"}


def _wall_s(cmd: list[str], env: dict[str, str], cpu: list[float] | None = None) -> float:
    """Run `cmd`; its wall time in seconds, and its CPU time (user + system of the finished
    child and what it waited for, `RUSAGE_CHILDREN`) appended to `cpu`.

    Raises:
        RuntimeError: it exited with another status than 0.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    took = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{cmd} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    if cpu is not None:
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return took


def main() -> int:
    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="runs of each command")
    args = ap.parse_args()
    runs = 5 if args.quick else args.runs
    report = Report("Start-up (bench/startup.py)", args.quick)
    broker = start_broker()
    try:
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        env["RBROKER_SOCKET"] = broker.socket
        py = sys.executable
        kinds = {
            "bare": [py, "-I", "-c", "pass"],
            "import": [py, "-c", "import rbroker"],
            "status": [py, "-m", "rbroker", "status", "--json"],
            "run": [py, "-m", "rbroker", "run", "--mib", "100", "--", "/bin/true"],
        }
        walls: dict[str, list[float]] = {k: [] for k in kinds}
        cpus: dict[str, list[float]] = {k: [] for k in kinds}
        for cmd in kinds.values():  # warm the file cache once
            _wall_s(cmd, env)
        for _ in range(runs):
            for kind, cmd in kinds.items():
                walls[kind].append(_wall_s(cmd, env, cpus[kind]))
        with rbroker.Client(broker.socket) as c:
            cycles = [sum(timed_lease_cycle(c, ACQUIRE)) for _ in range(max(20, runs))]
    finally:
        note = broker.stop()
    bare, cycle = median(walls["bare"]), median(cycles)
    run_floor = bare + cycle
    for kind, words, floor, floor_words, target in (
        ("run", "rbroker run --mib 100 -- /bin/true", run_floor, "bare start + one cycle", 3.0),
        ("status", "rbroker status --json", bare, "python -I -c pass", 3.0),
        ("import", 'python -c "import rbroker"', bare, "python -I -c pass", 2.0),
    ):
        value = median(walls[kind])
        report.add(
            f"{words}, wall (p50 of {runs})",
            fmt_ms(value),
            f"{fmt_ms(floor)} {floor_words}",
            fmt_x(value / floor),
            f"≤ {target:g}×",
            verdict(value / floor <= target),
        )
    report.note(
        f"one lease cycle (acquire + renew + release on an open connection): {fmt_ms(cycle)} "
        f"p50; the bare start {fmt_ms(bare)}; each figure a new process, the kinds in turns"
    )
    cpu_bare = median(cpus["bare"])
    report.note(
        "CPU time (user + system), medians: "
        + ", ".join(
            f"{kind} {fmt_ms(median(cpus[kind]))} ({fmt_x(median(cpus[kind]) / cpu_bare)})"
            for kind in ("run", "status", "import")
        )
        + f"; python -I -c pass {fmt_ms(cpu_bare)} (the ratios' floor; `rbroker run`'s "
        "includes /bin/true's)"
    )
    if note:
        report.note(note)
    report.finish(args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
