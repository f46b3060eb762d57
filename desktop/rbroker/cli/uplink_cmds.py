"""`rbroker enroll` and `rbroker fleet`."""

from __future__ import annotations

import argparse
import json
import socket
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from rbroker.broker.capacity import fmt_mib, short_uuid
from rbroker.localapi.paths import default_data_dir


def run_enroll(args: argparse.Namespace) -> int:
    """Enroll; exit 0, or 1 with the reason."""
    from rbroker.uplink.enroll import EnrollError, enroll, store_for
    from rbroker.uplink.keys import KeyStoreError, os_account

    console = Console(stderr=True)
    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    name = args.name or socket.gethostname()
    notes: list[str] = []
    try:
        config = enroll(
            args.url,
            args.code,
            name,
            data_dir,
            ca_file=args.ca_file,
            key_file=args.key_file,
            new_identity=args.new_identity,
            notes=notes,
        )
    except EnrollError as exc:
        console.print(f"[red]rbroker enroll:[/] {exc}")
        return 1
    try:
        where = store_for(config, data_dir).where()
    except KeyStoreError as exc:  # stored a moment ago; the keyring stopped answering since
        where = f"the OS keyring ({exc})"
    who = "" if config.key_backend == "file" else f" running as OS account {os_account()}"
    console.print(
        f"enrolled [bold]{config.name}[/] as {config.computer_id} in group {config.group} at "
        f"{config.url}; private key kept in {where}. A broker{who} using {data_dir} starts "
        "reporting within seconds.",
        highlight=False,
    )
    for note in notes:
        console.print(note, highlight=False)
    return 0


_FRESH_STYLE = {"online": "green", "stale": "yellow", "offline": "red"}


def fleet_view(fleet: dict[str, Any]) -> Group:
    """The fleet as rich tables: computers with freshness, then their GPUs and leases."""
    computers = Table(title=f"Fleet of group {fleet.get('group', '?')}", title_justify="left")
    for col in ("computer", "freshness", "GPUs", "leases", "queue", "jobs", "telemetry"):
        computers.add_column(col)
    gpus = Table(title="GPUs", title_justify="left")
    for col in ("computer", "GPU", "state", "total", "available", "leases"):
        gpus.add_column(col, justify="right" if col in ("total", "available", "leases") else "left")
    leases = Table(title="Leases", title_justify="left")
    for col in ("computer", "owner", "project", "session", "purpose", "MiB", "GPU"):
        leases.add_column(col, justify="right" if col == "MiB" else "left")
    for c in fleet.get("computers", []):
        fresh = c.get("freshness", {})
        computers.add_row(
            c.get("name", "?"),
            Text(
                fresh.get("text") or fresh.get("state", "?"),
                style=_FRESH_STYLE.get(fresh.get("state", ""), ""),
            ),
            str(len(c.get("gpus", []))),
            str(len(c.get("leases", []))),
            str(len(c.get("queue", []))),
            str(len(c.get("jobs", []))),
            c.get("telemetry_source") or "?",
        )
        for g in c.get("gpus", []):
            gpus.add_row(
                c.get("name", "?"),
                f"{g.get('index', '?')} {short_uuid(g['uuid'])}",
                str(g.get("state", "?")),
                fmt_mib(g.get("total_mib") or 0),
                fmt_mib(g.get("available_mib") or 0),
                str(g.get("leases", 0)),
            )
        for lease in c.get("leases", []):
            leases.add_row(
                c.get("name", "?"),
                lease.get("owner", ""),
                lease.get("project", ""),
                lease.get("session", ""),
                lease.get("purpose", ""),
                fmt_mib(lease.get("granted_mib", 0)),
                ",".join(short_uuid(u) for u in lease.get("gpu_uuids", [])),
            )
    return Group(computers, gpus, leases)


def run_fleet(args: argparse.Namespace) -> int:
    """Print the fleet; exit 0, or 1 with the reason."""
    from rbroker.uplink.fleet import FleetError, fetch_fleet

    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    try:
        fleet = fetch_fleet(data_dir, url=args.url, token=args.token, ca_file=args.ca_file)
    except FleetError as exc:
        Console(stderr=True).print(f"[red]rbroker fleet:[/] {exc}")
        return 1
    if args.json:
        print(json.dumps(fleet, indent=2))
    else:
        Console().print(fleet_view(fleet))
    return 0
