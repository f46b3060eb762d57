"""Bookings in the lease ledger (docs/architecture.md §2a): what a thousand future bookings cost.

Measures, in one run on one machine:
- the figure: the lease cycle (`lease.acquire` + `lease.renew` + `lease.release`, the renewal
  pipelined as the SDK sends it) on a broker holding 1 000 future bookings on its GPU, one
  every 10 min from a minute ahead (so about 24 of them lie in the 4 h protection window that
  every acquire without a declared end is checked against);
- the floor: the same cycle on a broker with no booking, interleaved with it round by round;
- `rbroker bookings` (the command, a new process: the table and the 24-hour timeline) at
  1 000 bookings, beside `rbroker status` and a bare `python -c pass` in the same rounds.
Goal (issue 41): the cycle with 1 000 bookings within 1.2× of the cycle without.

    python bench/bookings.py [--quick] [--record] [--cycles 2000] [--repeats 3]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from _common import (
    SINGLE_24G,
    Broker,
    Report,
    fmt_ms,
    fmt_us,
    fmt_x,
    median,
    parser,
    percentile,
    short_tmp,
    timed_lease_cycle,
    verdict,
)

import rbroker

ACQUIRE = {
    "mib": 64,
    "project": "bench",
    "session": "bench",
    "purpose": "booking benchmark",
    "ttl_s": 30.0,
}
BOOKINGS = 1000
SPACING_S = 600.0
TARGET_X = 1.2


def _with_bookings(count: int) -> Broker:
    """A simulated broker whose `[bookings]` lets one user hold `count` bookings, holding
    them: 16 MiB each, one every `SPACING_S` from a minute ahead."""
    root = short_tmp()
    (root / "data").mkdir(mode=0o700)
    (root / "data" / "broker.toml").write_text(f"[bookings]\nmax_per_user = {max(8, count)}\n")
    made: Broker = Broker.start(SINGLE_24G, root)
    now = time.time()
    with rbroker.Client(made.socket) as c:
        for i in range(count):
            start = now + 60.0 + i * SPACING_S
            c.book(
                mib=16,
                start_at=start,
                end_at=start + 60.0,
                project="bench",
                session="bench",
                purpose="a future booking",
            )
    return made


def _cycles(socket: str, n: int) -> list[float]:
    """`n` lease cycles on one connection; each cycle's seconds."""
    out = []
    with rbroker.Client(socket) as c:
        for _ in range(n):
            a, r, rel = timed_lease_cycle(c, ACQUIRE, pipelined=True)
            out.append(a + r + rel)
    return out


def _command(args: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(args, env=env, capture_output=True, check=False)
    took = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{args} exited {done.returncode}: {done.stderr.decode()[-400:]}")
    return took


def main() -> None:
    p = parser(__doc__ or "")
    p.add_argument("--cycles", type=int, default=2000, help="lease cycles per round")
    p.add_argument("--repeats", type=int, default=3, help="rounds (interleaved)")
    p.add_argument("--bookings", type=int, default=BOOKINGS, help="future bookings")
    args = p.parse_args()
    cycles = min(200, args.cycles) if args.quick else args.cycles
    count = args.bookings
    repeats = 2 if args.quick else args.repeats
    report = Report(f"Bookings: the lease cycle beside {count:,} future bookings", args.quick)
    none = _with_bookings(0)
    many = _with_bookings(count)
    try:
        with rbroker.Client(many.socket) as c:
            assert len(c.bookings()["bookings"]) == count
        base: list[float] = []
        booked: list[float] = []
        for _ in range(repeats):  # interleaved: the two brokers see the same machine load
            base += _cycles(none.socket, cycles)
            booked += _cycles(many.socket, cycles)
        b50, k50 = median(base), median(booked)
        report.add(
            f"lease cycle p50, {count:,} future bookings",
            fmt_us(k50),
            f"{fmt_us(b50)} without",
            fmt_x(k50 / b50),
            f"≤ {TARGET_X:g}×",
            verdict(k50 / b50 <= TARGET_X),
        )
        report.add(
            f"lease cycle p99, {count:,} future bookings",
            fmt_us(percentile(booked, 99)),
            f"{fmt_us(percentile(base, 99))} without",
            fmt_x(percentile(booked, 99) / percentile(base, 99)),
        )
        env = {**os.environ, "RBROKER_SOCKET": many.socket}
        listing, status, bare = [], [], []
        for _ in range(3 if args.quick else 10):
            listing.append(_command([sys.executable, "-m", "rbroker", "bookings"], env))
            status.append(_command([sys.executable, "-m", "rbroker", "status"], env))
            bare.append(_command([sys.executable, "-c", "pass"], env))
        report.add(
            f"`rbroker bookings` at {count:,} bookings (a new process)",
            fmt_ms(median(listing)),
            f"{fmt_ms(median(bare))} python -c pass",
            fmt_x(median(listing) / median(bare)),
        )
        report.add(
            "`rbroker status` on the same broker (a new process)",
            fmt_ms(median(status)),
            f"{fmt_ms(median(bare))} python -c pass",
            fmt_x(median(status) / median(bare)),
        )
        report.note(
            f"{cycles} cycles × {repeats} rounds per broker, interleaved; bookings of 16 MiB, "
            f"one every {SPACING_S / 60:g} min from a minute ahead (about 24 inside the 4 h "
            "protection window each acquire is checked against)"
        )
    finally:
        for b in (none, many):
            b.stop()
    report.finish(args.record)


if __name__ == "__main__":
    main()
