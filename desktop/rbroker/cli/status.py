"""`rbroker status`: which broker answered and how it was found, its GPUs (capacity split),
leases and queue, each GPU's next bookings, the coordinator link, where the private key is,
and a warning when the enrollment needs fixing."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping

import rbroker
from rbroker.cli.exits import unusable_exit

TYPE_CHECKING = False  # typing.TYPE_CHECKING's idiom (PEP 484): no `typing` at run time
if TYPE_CHECKING:
    import argparse

    from rbroker_protocol.results import BrokerStatus


def run_status(args: argparse.Namespace) -> int:
    """Print the status once. Exit 0, 69 when no broker answers, 2 when the broker refuses
    this user (`rbroker.cli.exits`)."""
    try:
        with rbroker.Client(args.socket, timeout_s=5) as client:
            status = client.status()
            gpus = client.gpus()
            leases = client.leases()
            bookings = client.live_bookings()
            found = {"address": client.address, "found_by": client.found_by}
    except (rbroker.BrokerUnavailable, rbroker.NotAllowed) as exc:
        # a broker that refuses this user (its socket's permissions or allowed group, its
        # per-user connection cap) is there: a refusal (2), not "no broker" (69)
        from rich.console import Console

        Console(stderr=True).print(f"rbroker status: {exc}", markup=False, soft_wrap=True)
        return unusable_exit(exc)
    if args.json:  # no rich and no tables: a script's call starts as fast as it can
        print(
            json.dumps(
                {"broker": found, "status": status, "gpus": gpus, **leases, "bookings": bookings},
                indent=2,
            )
        )
        return 0
    from rich.console import Console
    from rich.text import Text

    from rbroker.cli.bookings import next_bookings_table
    from rbroker.cli.views import broker_view, print_view, shares_table

    console = Console()
    print_view(console, broker_view(gpus, leases, status_header(status, found)))
    booked = next_bookings_table(bookings, gpus, time.time())
    if booked is not None:
        print_view(console, booked)
    if status.get("shares"):
        print_view(console, shares_table(status["shares"]))
    link = status["coordinator"]
    if link.get("warning"):
        console.print(Text(f"warning: {link['warning']}", style="bold yellow"), soft_wrap=True)
    return 0


def status_header(status: BrokerStatus, found: Mapping[str, str]) -> str:
    """The lines above the tables: version, uptime, telemetry (SIMULATED, or NVML with the
    driver), the coordinator link, the broker's address and how it was found (`found`:
    `{"address", "found_by"}`), why NVML does not initialise, and where the private key is."""
    source = status["telemetry_source"]
    header = (
        f"rbroker {status['version']} — up {status['uptime_s']:.0f} s — telemetry: "
        + ("SIMULATED" if status["simulated"] else f"NVML (driver {status['driver_version']})")
        + f" — coordinator: {status['coordinator']['link']}"
    )
    if source == "simulated":
        header += "  [no real GPU is read]"
    header += f"\nbroker: {found['address']} ({found['found_by']})"
    problem = status.get("nvml_problem")
    if problem:  # NVML does not initialise: why, in words (on Windows: where it looked)
        header += f"\nGPU telemetry: {problem['words']}"
    link = status["coordinator"]
    if link.get("key"):
        header += f"\nprivate key: {link['key']}"
    return header
