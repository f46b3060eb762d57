"""When will it fit: how close the queue's estimate (`eta_s`, docs/architecture.md §3) comes
to the wait that followed, on a synthetic workload.

The broker is the in-process one of the tests (tests/desktop/inprocess.py: the production
`Broker` on a simulated NVML library, a manual clock, real sleeping holder processes). Two
simulated 24 GiB GPUs; requests of three projects arrive at random (Poisson), each asking
for memory and, once granted, holding it for a lifetime drawn from its project's
distribution (lognormal or exponential), then releasing. The clock jumps from event to
event, with a GPU sample after each, so a run of hours of the broker's time takes seconds.
A request that waits has its estimate read from the broker when it starts waiting; when it
is granted, its actual wait is known. Figures: the absolute error as a fraction of the
actual wait (median and p90), over the requests that had an estimate, and the share that
had one; the floors, in the same run: "estimate = the mean lifetime of the leases ended so
far" and "estimate = the mean wait of the requests granted so far".

    python bench/eta.py [--quick] [--record] [--requests 800] [--seed 1]
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _common import REPO, Report, parser, percentile

sys.path.insert(0, str(REPO))
from tests.desktop.inprocess import InProcessBroker, SleeperPool
from tests.fakes.gpu_scenarios import GPU0, GPU1, gpu, scenario

SCENARIO = scenario(gpu(GPU0, name="Simulated RTX 4090"), gpu(GPU1, name="Simulated RTX 4090"))
"""Two simulated, empty 24 576 MiB GPUs."""


@dataclass(frozen=True)
class Project:
    """A project's requests: MiB drawn in [low, high], lifetimes by `kind` around `median_s`
    (lognormal with `sigma`, or exponential of that median), and its share of arrivals."""

    name: str
    low_mib: int
    high_mib: int
    kind: str
    median_s: float
    sigma: float
    weight: float

    def lifetime_s(self, rng: random.Random) -> float:
        if self.kind == "exponential":
            return rng.expovariate(math.log(2) / self.median_s)
        return rng.lognormvariate(math.log(self.median_s), self.sigma)


PROJECTS = (
    Project("train", 8000, 14000, "lognormal", 900.0, 0.4, 0.3),
    Project("eval", 2000, 4000, "lognormal", 120.0, 0.3, 0.4),
    Project("notebook", 3000, 6000, "exponential", 300.0, 0.0, 0.3),
)
WARMUP = 60
"""Requests before the figures start: the broker's lifetimes history fills up."""


def run(requests: int, seed: int, load: float) -> dict[str, list[float] | int]:
    rng = random.Random(seed)
    mean_load = sum(p.weight * (p.low_mib + p.high_mib) / 2 * p.median_s for p in PROJECTS)
    gap_s = mean_load / (2 * 23347 * load)  # offered MiB·s per second over what 2 GPUs hold
    with tempfile.TemporaryDirectory(prefix="rbb-eta-") as tmp:
        root = Path(tmp)
        (root / "scenario.toml").write_text(SCENARIO)
        h = InProcessBroker(root / "scenario.toml", root, persist=False)
        pool = SleeperPool()
        try:
            return _drive(h, pool, rng, requests, gap_s)
        finally:
            h.close()
            pool.close()


def _drive(
    h: InProcessBroker, pool: SleeperPool, rng: random.Random, requests: int, gap_s: float
) -> dict[str, list[float] | int]:
    broker = h.broker
    t0 = h.clock.monotonic()
    arrivals = []
    at = t0
    for _ in range(requests):
        at += rng.expovariate(1 / gap_s)
        arrivals.append((at, rng.choices(PROJECTS, [p.weight for p in PROJECTS])[0]))
    idle = [pool.spawn()[1] for _ in range(8)]
    ends: list[tuple[float, str, object]] = []  # (monotonic, lease id, holder)
    waiting: dict[object, tuple[float, float | None, float, float, bool]] = {}
    lifetimes_seen: list[float] = []
    waits_seen: list[float] = []
    err: dict[str, list[float]] = {"eta": [], "mean_lifetime": [], "mean_wait": []}
    no_estimate = waited = 0
    granted_at: dict[str, float] = {}
    plans: dict[object, float] = {}  # task → its lifetime once granted
    n = 0
    while arrivals or ends or waiting:
        next_end = min((e[0] for e in ends), default=math.inf)
        next_arrival = arrivals[0][0] if arrivals else math.inf
        now = min(next_end, next_arrival)
        if now == math.inf:
            break  # only requests that can never be served are left
        h.clock.advance(max(0.0, now - h.clock.monotonic()))
        if next_end <= next_arrival:
            done = [e for e in ends if e[0] <= now]
            ends = [e for e in ends if e[0] > now]
            for _, lease_id, holder in done:
                lease = broker.leases[lease_id]
                lifetimes_seen.append(now - granted_at.pop(lease_id))
                broker.release(lease.lease_id, lease.owner)
                idle.append(holder)
        else:
            _, project = arrivals.pop(0)
            n += 1
            holder = idle.pop() if idle else pool.spawn()[1]
            mib = rng.randint(project.low_mib, project.high_mib) // 100 * 100
            task = h.acquire(
                holder, mib=mib, wait_s=24 * 3600.0, project=project.name, session="bench"
            )
            plans[task] = project.lifetime_s(rng)
            if not task.done():
                rid = broker.queue[-1].request_id
                eta = broker.estimates().get(rid)
                waiting[task] = (
                    h.clock.monotonic(),
                    None if eta is None else eta.eta_s,
                    statistics.fmean(lifetimes_seen) if lifetimes_seen else math.nan,
                    statistics.fmean(waits_seen) if waits_seen else math.nan,
                    n > WARMUP,
                )
            else:
                _granted(task, plans, ends, granted_at, holder, h.clock.monotonic())
        h.sample()  # a sample confirms what was released; a pass grants what fits
        for task in [t for t in waiting if t.done()]:
            started, eta, floor_life, floor_wait, counted = waiting.pop(task)
            lease = task.result()
            actual = h.clock.monotonic() - started
            waits_seen.append(actual)
            _granted(task, plans, ends, granted_at, lease.holder, h.clock.monotonic())
            if not counted or actual < 1.0:
                continue
            waited += 1
            if eta is None:
                no_estimate += 1
            else:
                err["eta"].append(abs(eta - actual) / actual)
            for name, guess in (("mean_lifetime", floor_life), ("mean_wait", floor_wait)):
                if not math.isnan(guess):
                    err[name].append(abs(guess - actual) / actual)
    return {**err, "waited": waited, "no_estimate": no_estimate, "requests": requests}


def _granted(task, plans, ends, granted_at, holder, now):  # type: ignore[no-untyped-def]
    lease = task.result()
    granted_at[lease.lease_id] = now
    ends.append((now + plans.pop(task), lease.lease_id, holder))


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=None, help="requests (default 800, quick 150)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--load", type=float, default=0.8, help="offered load, of both GPUs' memory (0.8)"
    )
    args = p.parse_args()
    requests = args.requests or (150 if args.quick else 800)
    started = time.process_time()
    out = run(requests, args.seed, args.load)
    cpu_s = time.process_time() - started
    report = Report("When will it fit: the queue's estimate against the actual wait", args.quick)
    eta, life, wait = out["eta"], out["mean_lifetime"], out["mean_wait"]
    assert isinstance(eta, list) and isinstance(life, list) and isinstance(wait, list)

    def frac(values: list[float], p: float) -> str:
        return f"{percentile(values, p):.2f}" if values else "—"

    report.add(
        "absolute error / actual wait, median",
        frac(eta, 50),
        f"mean lifetime {frac(life, 50)} · mean wait {frac(wait, 50)}",
    )
    report.add(
        "absolute error / actual wait, p90",
        frac(eta, 90),
        f"mean lifetime {frac(life, 90)} · mean wait {frac(wait, 90)}",
    )
    waited, none = int(out["waited"]), int(out["no_estimate"])  # type: ignore[call-overload]
    report.add(
        "requests that waited ≥ 1 s with an estimate",
        f"{waited - none} of {waited}",
        "the floors always guess",
    )
    report.note(
        f"{requests} requests (the first {WARMUP} fill the lifetimes history and are not "
        f"counted), seed {args.seed}, two simulated 24 GiB GPUs, offered load "
        f"{args.load:.0%} of their memory (by median lifetimes); "
        + "; ".join(
            f"{p.name}: {p.low_mib}–{p.high_mib} MiB, {p.kind} lifetimes of median "
            f"{p.median_s:g} s, {p.weight:.0%} of arrivals"
            for p in PROJECTS
        )
        + "."
    )
    report.note(
        "Estimate read when the request starts waiting; error = |estimate − actual wait| / "
        "actual wait, over the requests that waited at least 1 s and had an estimate. "
        f"The run took {cpu_s:.1f} CPU-s (the broker's clock is a manual one)."
    )
    report.finish(args.record)


if __name__ == "__main__":
    main()
