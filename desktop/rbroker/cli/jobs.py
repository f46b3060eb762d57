"""`rbroker jobs`: parallel jobs with progress bars, items per second and ETA."""

from __future__ import annotations

import argparse
import json
import signal
import time

from rich.console import Console
from rich.live import Live

import rbroker
from rbroker.cli.views import jobs_table, print_view


def run_jobs(args: argparse.Namespace) -> int:
    """Print the jobs once (or live with --watch). Exit 0, or 69 when no broker answers."""
    console = Console()
    try:
        with rbroker.Client(args.socket, timeout_s=5) as client:

            def fetch() -> list[dict[str, object]]:
                return list(client.call("jobs.list", include_finished=not args.active)["jobs"])

            if args.json:
                print(json.dumps(fetch(), indent=2))
                return 0
            if not args.watch:
                print_view(console, jobs_table(fetch()))
                return 0
            # "until Ctrl-C" also where the shell started it with SIGINT ignored (a
            # background job of a script), as `rbroker demo` does
            signal.signal(signal.SIGINT, signal.default_int_handler)
            if not console.is_terminal:  # a pipe or file: plain tables, one every 2 s
                try:
                    while True:
                        print_view(console, jobs_table(fetch()))
                        time.sleep(2.0)
                except KeyboardInterrupt:
                    return 0
            with Live(jobs_table(fetch()), console=console, refresh_per_second=4) as live:
                try:
                    while True:
                        time.sleep(0.5)
                        live.update(jobs_table(fetch()))
                except KeyboardInterrupt:
                    pass
    except (rbroker.BrokerUnavailable, rbroker.NotAllowed) as exc:
        # NotAllowed: the broker refused this connection (a per-user connection cap, a group
        # not allowed): for this user no broker answers
        Console(stderr=True).print(f"rbroker jobs: {exc}", markup=False, soft_wrap=True)
        return 69
    return 0
