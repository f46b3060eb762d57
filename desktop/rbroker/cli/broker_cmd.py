"""`rbroker broker`: the local broker in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
from pathlib import Path

from rich.console import Console

from rbroker.gpu.nvml import TelemetryError
from rbroker.gpu.scenario import ScenarioError
from rbroker.localapi.paths import default_data_dir, default_socket_path
from rbroker.localapi.transport import BrokerAlreadyRunning


def _group_exists(name: str) -> bool:
    if sys.platform == "win32":
        return False
    import grp

    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def run_broker(args: argparse.Namespace) -> int:
    """Run until SIGINT/SIGTERM. Exit codes: 0 stopped, 1 cannot start."""
    from rbroker.host import BrokerHost, DataDirLocked, make_config

    console = Console(stderr=True)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    socket_path = args.socket or default_socket_path()
    scenario = Path(args.simulate) if args.simulate else None
    overrides: dict[str, int] = {}
    for item in args.capacity_mib:
        uuid, _, mib = item.partition("=")
        if not uuid or not mib.isdigit() or int(mib) <= 0:
            console.print(f"[red]rbroker: --capacity-mib wants UUID=MIB, got {item!r}[/]")
            return 2
        overrides[uuid] = int(mib)
    if args.admin_group and not _group_exists(args.admin_group):
        console.print(f"[red]rbroker: --admin-group: no OS group named {args.admin_group!r}[/]")
        return 2
    try:
        config = make_config(
            socket_path,
            args.data_dir or default_data_dir(),
            simulate=args.simulate is not None,
            scenario=scenario,
            headroom_mib=args.headroom_mib,
        )
        config = dataclasses.replace(
            config, capacity_overrides_mib=overrides, admin_group=args.admin_group
        )
    except ValueError as exc:
        console.print(f"[red]rbroker: {exc}[/]")
        return 2
    try:
        host = BrokerHost(config)
    except ScenarioError as exc:
        console.print(f"[red]rbroker: bad scenario:[/] {exc}")
        return 1

    async def main() -> None:
        ready = asyncio.Event()
        task = asyncio.create_task(host.run_forever(ready))
        waiter = asyncio.create_task(ready.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if ready.is_set() and host.broker is not None:
            gpus = host.broker.gpus_view()
            if host.simulated:
                source = f"scenario {scenario}" if scenario else "the default scenario"
                console.print(
                    "[bold yellow]SIMULATED GPUs[/] — no NVIDIA driver is used; memory figures "
                    f"come from {source}"
                )
            for g in gpus:
                console.print(
                    f"  GPU {g['index']} {g['uuid']} {g['name']}: "
                    f"{g.get('total_mib', '?')} MiB total, "
                    f"headroom {g.get('headroom_mib', '?')} MiB, telemetry {g['telemetry']}"
                )
            console.print(f"rbroker broker listening on {socket_path}  (Ctrl-C stops)")
        waiter.cancel()
        await task

    try:
        asyncio.run(main())
    except (BrokerAlreadyRunning, DataDirLocked) as exc:
        console.print(f"[red]rbroker:[/] {exc}; not starting a second one")
        return 1
    except TelemetryError as exc:
        console.print(f"[red]rbroker: cannot read GPUs:[/] {exc}")
        return 1
    except KeyboardInterrupt:
        pass
    return 0
