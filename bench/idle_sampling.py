"""What measuring idleness costs a broker holding 1 000 leases (docs/architecture.md §3
"Idle"; issue 42).

Each sampler turn of the broker reads its GPUs, per-process utilization included
(`nvmlDeviceGetProcessUtilization`), and `Idleness.sampled` walks the leases of a GPU whose
processes showed any; each tick turn then tells idle episodes and applies `[idle]`'s reclaim
policy (`IdleWatch.turn`), and every lease view carries `idle_state`/`idle_s`.

The broker is the in-process one of the tests (tests/desktop/inprocess.py: the production
`Broker` on a simulated NVML library, a manual clock, real sleeping holder processes), so a
turn is timed without a socket or a scheduler in between. Two brokers, alike but for one
thing, each holding `LEASES` leases of 16 MiB on one simulated 80 GiB GPU, held by
`HOLDERS` holder processes (each listed on the GPU, half of them busy):
- the figure: per-process utilization readable; a turn is a sample (`sample`: the GPU read
  and an admission pass) and a tick (`tick`: expiry, holders, idle notices and reclaims);
- the floor: the same broker where the GPU answers per-process utilization with
  NOT_SUPPORTED (as on a MIG slice), so no utilization is read and every lease is
  `idle: unknown`;
interleaved slice by slice. Since the floor's broker still runs the idle bookkeeping (for
leases that are all unknown), the idle work itself is also timed alone on the first broker:
`Idleness.sampled` (per GPU sample) and `IdleWatch.turn` (per tick), beside the whole turn.
Also, with and without: `leases_view()` (what `rbroker status`
asks for), with 1 000 leases.

    python bench/idle_sampling.py [--quick] [--record] [--turns 400]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from _common import REPO, Report, fmt_ms, fmt_x, interleaved, median, parser, verdict

sys.path.insert(0, str(REPO))
from tests.desktop.inprocess import InProcessBroker, SleeperPool
from tests.fakes.gpu_scenarios import GPU0, gpu, scenario

from rbroker.broker.reclaim import IdleReclaim

LEASES = 1000
HOLDERS = 50
LEASE_MIB = 16
TARGET_X = 1.1  # measuring idleness adds at most a tenth to a sampler-and-tick turn
TARGET_SHARE = 0.1  # and its own work is at most a tenth of the turn


def _broker(root: Path, pool: SleeperPool, readable: bool, leases: int) -> InProcessBroker:
    """A broker holding `leases` leases, `HOLDERS` holders (every other one busy at 40 %
    SM); `readable`: per-process utilization can be read, else NOT_SUPPORTED."""
    error = {} if readable else {"utilization_error": "not_supported"}
    (root / "scenario.toml").write_text(
        scenario(gpu(GPU0, name="Simulated 80 GB", total_mib=81920, **error))
    )
    h = InProcessBroker(
        root / "scenario.toml",
        root,
        persist=False,
        headroom_mib=1000,
        idle_after_s=600.0,
        idle_reclaim=IdleReclaim(reclaim_after_s=4 * 3600.0),
    )
    h.broker.gateway.foreign_pids = False  # the simulated driver lists this machine's pids
    holders = [pool.spawn()[1] for _ in range(HOLDERS)]
    for i, holder in enumerate(holders):
        h.fake.allocate(GPU0, holder.pid, 8)
        if i % 2 == 0:
            h.fake.set_utilization(GPU0, holder.pid, 40)
    tasks = [h.acquire(holders[i % HOLDERS], mib=LEASE_MIB, ttl_s=3600) for i in range(leases)]
    h.sample()
    assert all(t.done() and t.exception() is None for t in tasks), "every lease granted"
    return h


def main() -> int:
    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=400, help="timed turns of each broker")
    args = ap.parse_args()
    turns = 40 if args.quick else args.turns
    leases = 200 if args.quick else LEASES
    report = Report(f"Idleness measured, {leases} leases (bench/idle_sampling.py)", args.quick)
    with tempfile.TemporaryDirectory(prefix="rbb-idle-") as tmp:
        pool = SleeperPool()
        made: list[InProcessBroker] = []
        try:
            for kind in ("with", "without"):
                (Path(tmp) / kind).mkdir()
                made.append(_broker(Path(tmp) / kind, pool, kind == "with", leases))
            with_h, without_h = made
            states = {x["idle_state"] for x in with_h.broker.leases_view()["leases"]}
            assert states == {"active"}, states
            states = {x["idle_state"] for x in without_h.broker.leases_view()["leases"]}
            assert states == {"unknown"}, states

            def turn(h: InProcessBroker) -> None:
                h.clock.advance(1.0)
                h.sample()
                h.tick(1.0)

            turns_s = interleaved(
                {"with": lambda: turn(with_h), "without": lambda: turn(without_h)},
                turns,
                warmup=10,
            )
            slot = with_h.broker.slots[GPU0]
            idle = with_h.broker.idle
            parts_s = interleaved(
                {
                    "sampled": lambda: idle.sampled(slot, True),
                    "watch": lambda: with_h.broker.idle_watch.turn(),
                },
                turns,
                warmup=10,
            )
            views_s = interleaved(
                {
                    "with": lambda: with_h.broker.leases_view(),
                    "without": lambda: without_h.broker.leases_view(),
                },
                max(20, turns // 10),
                warmup=3,
            )
        finally:
            for h in made:
                h.close()
            pool.close()
    ratio = median(turns_s["with"]) / median(turns_s["without"])
    report.add(
        f"sampler + tick turn, {leases} leases, utilization read (p50)",
        fmt_ms(median(turns_s["with"])),
        f"{fmt_ms(median(turns_s['without']))} unreadable (NOT_SUPPORTED)",
        fmt_x(ratio),
        f"≤ {TARGET_X}×",
        verdict(ratio <= TARGET_X),
    )
    idle_work_s = median(parts_s["sampled"]) + median(parts_s["watch"])
    share = idle_work_s / median(turns_s["with"])
    report.add(
        f"idleness' own work per turn, {leases} leases: Idleness.sampled + IdleWatch.turn (p50)",
        fmt_ms(idle_work_s),
        f"{fmt_ms(median(turns_s['with']))} the whole turn",
        f"{share:.0%} of it",
        f"≤ {TARGET_SHARE:.0%}",
        verdict(share <= TARGET_SHARE),
    )
    view_ratio = median(views_s["with"]) / median(views_s["without"])
    report.add(
        f"leases_view(), {leases} leases with idle_state/idle_s (p50)",
        fmt_ms(median(views_s["with"])),
        f"{fmt_ms(median(views_s['without']))} all unknown",
        fmt_x(view_ratio),
    )
    report.note(
        f"{HOLDERS} holder processes, every other one at 40 % SM, each listed on the GPU; "
        f"{turns} turns of each broker, interleaved in 10 slices after 10 untimed ones; a "
        "turn moves the manual clock 1 s and runs a sample and a tick as the broker's loops do"
    )
    report.finish(args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
