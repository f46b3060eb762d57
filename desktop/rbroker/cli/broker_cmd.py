"""`rbroker broker`: the local broker in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sqlite3
import sys
from pathlib import Path

from rich.console import Console

from rbroker.base import eventloop
from rbroker.base.display import fmt_mib
from rbroker.base.startup import os_error_line
from rbroker.client.paths import ENV_SOCKET, default_data_dir, default_socket_path
from rbroker.gpu.nvml import TelemetryError
from rbroker.gpu.scenario import ScenarioError
from rbroker.hosting.machine_lock import lock_name
from rbroker.transport.base import BrokerAlreadyRunning, MachineLockHeld
from rbroker.transport.pipe_windows import pipe_name_problem
from rbroker.transport.system_paths import SYSTEM_DATA_DIR_LINUX, system_socket_path
from rbroker.uplink import quiet_http_client_logs
from rbroker_protocol.startup import (
    EXIT_BROKER_ALREADY_RUNNING,
    EXIT_CANNOT_START,
    EXIT_DATABASE,
    EXIT_INTERNAL,
    EXIT_PERMISSION,
    EXIT_USAGE,
    check_socket_path,
    one_line,
)

log = logging.getLogger(__name__)


def _mib(value: object) -> str:
    """A GPU's MiB as the start-up lines say them (`24 576`), `?` when unknown."""
    return fmt_mib(value) if isinstance(value, int) else "?"


def _fail(code: int, text: str) -> int:
    """Print one line on stderr (never wrapped, whatever the terminal) and return `code`."""
    print(f"rbroker: {one_line(text)}", file=sys.stderr)
    return code


def _group_exists(name: str) -> bool:
    if sys.platform == "win32":
        return False
    import grp

    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def _not_a_member(group: str | None) -> str | None:
    """Why this broker cannot give its socket to `group` (one line), or None: root may give
    it to any group, another account only to a group it is in (chown(2))."""
    if group is None or sys.platform == "win32" or os.geteuid() == 0:
        return None
    import grp

    gid = grp.getgrnam(group).gr_gid
    if gid == os.getegid() or gid in os.getgroups():
        return None
    from rbroker.localapi.access import broker_user

    me = broker_user()
    return (
        f"--allowed-group: this broker's account ({me}) is not a member of the group "
        f"{group!r}, so it cannot give its socket to that group; add it (usermod -aG "
        f"{group} {me}, then restart the broker's session) or choose a group it is in"
    )


def run_broker(args: argparse.Namespace) -> int:
    """Run until SIGINT/SIGTERM. Exit codes: 0 stopped, 1 cannot start (a broker already on
    this socket or data dir, bad scenario, GPUs unreadable), 2 bad arguments, 3 another broker
    holds this computer's broker lock, and the startup codes of
    `rbroker_protocol.startup` (10 socket path too long, 11 permission denied, 13 read-only
    file system, 14 no space, 15 lease database, 19 other OS error, 70 unexpected); every
    failure is one line on stderr with the fix."""
    from rbroker.broker.config import CONFIG_FILE, ConfigFile, HeadroomTooLarge, read_config
    from rbroker.hosting.host import BrokerHost, DataDirLocked, make_config

    # the banner: one line per fact whatever the output (a pipe, the journal), never split
    console = Console(stderr=True, soft_wrap=True)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    quiet_http_client_logs()
    if args.system and not sys.platform.startswith("linux"):
        return _fail(
            EXIT_USAGE, "--system is for Linux (on Windows the system broker is the service)"
        )
    if args.system:
        socket_path = args.socket or system_socket_path()
        data_dir = Path(args.data_dir or SYSTEM_DATA_DIR_LINUX)
    else:
        socket_path = args.socket or default_socket_path()
        data_dir = Path(args.data_dir or default_data_dir())
    if sys.platform == "win32":  # a file path: CreateNamedPipe's bare "invalid name" else
        problem = pipe_name_problem(socket_path)
        if problem is not None:
            given = "--socket" if args.socket else f"${ENV_SOCKET}"
            return _fail(EXIT_USAGE, f"{given}: {problem}")
    try:  # the data dir is checked after the machine lock is taken (`BrokerHost.start`)
        check_socket_path(socket_path)
    except OSError as exc:
        return _fail(*os_error_line(exc, socket_path, data_dir))
    scenario = Path(args.simulate) if args.simulate else None
    overrides: dict[str, int] = {}
    for item in args.capacity_mib:
        uuid, _, mib = item.partition("=")
        if not uuid or not mib.isdigit() or int(mib) <= 0:
            return _fail(EXIT_USAGE, f"--capacity-mib wants UUID=MIB, got {item!r}")
        overrides[uuid] = int(mib)
    try:
        lock_name(args.machine_lock, socket_path, simulated=args.simulate is not None)
    except ValueError as exc:
        return _fail(EXIT_USAGE, f"--machine-lock: {exc}")
    groups = (("--admin-group", args.admin_group), ("--allowed-group", args.allowed_group))
    for option, group in groups:
        if group and not _group_exists(group):
            return _fail(EXIT_USAGE, f"{option}: no OS group named {group!r}")
    outside = _not_a_member(args.allowed_group)
    if outside is not None:
        return _fail(EXIT_PERMISSION, outside)
    config_file = args.config or data_dir / CONFIG_FILE
    settings = ConfigFile()
    if args.config is not None or config_file.is_file():
        try:
            settings = read_config(config_file)
        except ValueError as exc:
            return _fail(EXIT_USAGE, str(exc))
    try:
        config = make_config(
            socket_path,
            data_dir,
            simulate=args.simulate is not None,
            scenario=scenario,
            headroom_mib=args.headroom_mib,
        )
        config = dataclasses.replace(
            config,
            capacity_overrides_mib=overrides,
            admin_group=args.admin_group,
            release_all_on_exit=args.release_all_on_exit,
            machine_lock=args.machine_lock,
            allowed_group=args.allowed_group,
            shared_socket=args.system,
            over_grant_grace_s=args.over_grant_grace,
            max_wait_s=args.max_wait,
            max_waiting_per_user=args.max_waiting_per_user,
            max_leases_per_user=args.max_leases_per_user,
            max_open_jobs_per_user=args.max_jobs_per_user,
            max_finished_jobs_per_user=args.max_finished_jobs_per_user,
            max_chunks_per_user=args.max_chunks_per_user,
            shares=settings.shares,
            members=settings.members,
            bookings=settings.bookings,
            idle_after_s=settings.idle_after_s,
            idle_reclaim=settings.idle_reclaim,
        )
    except ValueError as exc:
        return _fail(EXIT_USAGE, str(exc))
    try:
        eventloop.loop_factory()
    except ValueError as exc:
        return _fail(EXIT_USAGE, str(exc))
    try:
        host = BrokerHost(config)
    except ScenarioError as exc:
        return _fail(EXIT_CANNOT_START, f"bad scenario: {exc}")
    except OSError as exc:  # the scenario file cannot be read
        return _fail(*os_error_line(exc, socket_path, data_dir))
    started = False

    async def main() -> None:
        ready = asyncio.Event()
        task = asyncio.create_task(host.run_forever(ready))
        waiter = asyncio.create_task(ready.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if ready.is_set() and host.broker is not None:
            nonlocal started
            started = True
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
                    f"{_mib(g.get('total_mib'))} MiB total, "
                    f"headroom {_mib(g.get('headroom_mib'))} MiB, telemetry {g['telemetry']}"
                )
            if host.broker.queue_order() != "FIFO":
                console.print(f"  queue order {host.broker.queue_order()}", markup=False)
            if settings.members:
                kept = ", ".join(sorted(settings.members))
                console.print(f"  projects kept to their [members]: {kept}", markup=False)
            if open_exempt := settings.open_exempt():
                console.print(
                    f"  [idle] exempt projects open to every user: {', '.join(open_exempt)} "
                    "(anyone may declare them to keep an idle lease from reclaim; list their "
                    "people in [members])",
                    markup=False,
                )
            if settings.reclaim_before_idle():
                console.print(
                    f"  [idle] reclaim_after_s ({settings.idle_reclaim.reclaim_after_s:g} s) is "
                    f"shorter than idle_after_s ({settings.idle_after_s:g} s): a lease is "
                    "reclaimed as soon as it is idle",
                    markup=False,
                )
            console.print(f"rbroker broker listening on {socket_path}  (Ctrl-C stops)")
        waiter.cancel()
        await task

    try:
        eventloop.run(main())
    except MachineLockHeld as exc:
        tail = "not starting a second one" if exc.holder.answered else "not starting"
        return _fail(EXIT_BROKER_ALREADY_RUNNING, f"{exc}; {tail}")
    except (BrokerAlreadyRunning, DataDirLocked) as exc:
        return _fail(EXIT_CANNOT_START, f"{exc}; not starting a second one")
    except TelemetryError as exc:
        return _fail(EXIT_CANNOT_START, f"cannot read GPUs: {exc}")
    except HeadroomTooLarge as exc:
        return _fail(EXIT_USAGE, str(exc))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        if started:
            raise
        return _fail(*os_error_line(exc, socket_path, data_dir))
    except sqlite3.Error as exc:
        if started:
            raise
        return _fail(
            EXIT_DATABASE,
            f"cannot open the lease database {data_dir / 'broker.sqlite3'}: {exc}; move a "
            "damaged file aside or choose another --data-dir",
        )
    except Exception as exc:
        if started:
            raise
        log.info("startup failed", exc_info=True)  # the traceback, with -v
        return _fail(
            EXIT_INTERNAL,
            f"cannot start: {type(exc).__name__}: {exc} (run with -v for the traceback)",
        )
    return 0
