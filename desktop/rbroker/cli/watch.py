"""`rbroker watch --mib N [--gpus K] [--gpu UUID] [--expected S] [--timeout S]`: wait until
that much could be granted to this user now, and say where, without taking it (the local
API's `room.check`: behind the requests already waiting, beside the bookings, on fresh GPU
samples; docs/architecture.md §5).

It asks again every `CHECK_EVERY_S` (a check costs the broker one admission check, no
pass, nothing booked). Exit 0 with one line (`room now: GPU 0 has 20 480 MiB available for
16 000 MiB asked`); 75 when `--timeout` passes first, with the last reason; 2 for what the
broker refuses at once (infeasible, bad input) or a broker that refuses this user; 69 when
none answers.
"""

from __future__ import annotations

import argparse
import json
import time

from rich.console import Console

import rbroker
from rbroker.base.display import fmt_mib
from rbroker.cli.bookings import clean
from rbroker.cli.exits import EX_REFUSED, unusable_exit
from rbroker_protocol.results import RoomCheckResult

CHECK_EVERY_S = 0.5
"""Seconds between two checks."""
EX_TEMPFAIL = 75
"""sysexits.h EX_TEMPFAIL: no room within --timeout (as `rbroker run --wait`)."""


def room_line(answer: RoomCheckResult, mib: int) -> str:
    """`room now: GPU 0 has 20 480 MiB available for 16 000 MiB asked` (each GPU named)."""
    where = ", ".join(
        f"GPU {g['index']} has {fmt_mib(g['available_mib'])} MiB available" for g in answer["gpus"]
    )
    return f"room now: {where} for {fmt_mib(mib)} MiB asked"


def _say(text: str) -> None:
    Console(stderr=True, highlight=False).print(
        f"rbroker watch: {clean(text)}", markup=False, soft_wrap=True
    )


def run_watch(args: argparse.Namespace) -> int:
    """Check until there is room or `--timeout` passes; returns the exit code (module doc)."""
    # `not >= 0` also refuses NaN, which compares false both ways and would wait for ever
    if args.mib < 1 or args.gpus < 1 or (args.timeout is not None and not args.timeout >= 0):
        _say("--mib and --gpus must be 1 or more, --timeout 0 or more")
        return EX_REFUSED
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    console = Console(stderr=True, highlight=False)
    said = ""
    try:
        with rbroker.Client(args.socket, timeout_s=5) as client:
            while True:
                answer = client.check_room(
                    args.mib, args.gpus, args.gpu_uuid, getattr(args, "expected", None)
                )
                if answer["fits"]:
                    if args.json:
                        print(json.dumps(answer, indent=2))
                    else:
                        print(room_line(answer, args.mib), flush=True)
                    return 0
                if answer["reason"] != said:  # what it waits for, once each time it changes
                    said = answer["reason"]
                    console.print(f"watching: {clean(said)}", markup=False, soft_wrap=True)
                if deadline is not None and time.monotonic() >= deadline:
                    _say(f"no room within {args.timeout:g} s; last {said}")
                    return EX_TEMPFAIL
                time.sleep(
                    CHECK_EVERY_S
                    if deadline is None
                    else max(0.0, min(CHECK_EVERY_S, deadline - time.monotonic()))
                )
    except (rbroker.BrokerUnavailable, rbroker.NotAllowed) as exc:
        _say(str(exc))
        return unusable_exit(exc)
    except rbroker.RBrokerError as exc:
        _say(str(exc))
        return EX_REFUSED


__all__ = ["room_line", "run_watch"]
