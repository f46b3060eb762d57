"""`rbroker enroll` and `rbroker fleet`."""

from __future__ import annotations

import argparse
import json
import socket
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from rbroker.cli.views import fleet_view, print_view, room_view
from rbroker.client.paths import default_data_dir
from rbroker_protocol.startup import EXIT_USAGE


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
        console.print(f"[red]rbroker enroll:[/] {escape(str(exc))}", soft_wrap=True)
        return 1
    try:
        where = store_for(config, data_dir).where()
    except KeyStoreError as exc:  # stored a moment ago; the keyring stopped answering since
        where = f"the OS keyring ({exc})"
    who = "" if config.key_backend == "file" else f" running as OS account {os_account()}"
    console.print(
        f"enrolled [bold]{escape(config.name)}[/] as {escape(config.computer_id)} in group "
        f"{escape(config.group)} at {escape(config.url)}; private key kept in {escape(where)}. "
        f"A broker{escape(who)} using {escape(str(data_dir))} starts reporting within seconds.",
        highlight=False,
        soft_wrap=not console.is_terminal,
    )
    for note in notes:
        console.print(note, markup=False, highlight=False, soft_wrap=not console.is_terminal)
    return 0


def run_fleet(args: argparse.Namespace) -> int:
    """Print the fleet, or with `--room N` where in it N MiB fit; exit 0, or 1 with the
    reason (with `--room`: also when no computer has the room, a line saying so); 2
    (`EXIT_USAGE`) for `--gpus` without `--room`."""
    from rbroker.uplink.fleet import FleetError, fetch_fleet, fetch_room
    from rbroker_protocol.fleet import FleetView, RoomView

    if args.gpus is not None and args.room is None:  # else the whole fleet, --gpus unread
        Console(stderr=True).print(
            "[red]rbroker fleet:[/] --gpus K needs --room MIB (the MiB to find on each of K GPUs)",
            soft_wrap=True,
        )
        return EXIT_USAGE
    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    auth = {"url": args.url, "token": args.token, "ca_file": args.ca_file}
    try:
        if args.room is not None:
            answer = fetch_room(data_dir, args.room, args.gpus or 1, **auth)
        else:
            answer = fetch_fleet(data_dir, **auth)
    except FleetError as exc:
        Console(stderr=True).print(f"[red]rbroker fleet:[/] {escape(str(exc))}", soft_wrap=True)
        return 1
    if args.json:
        print(json.dumps(answer, indent=2))
    elif args.room is not None:
        print_view(Console(), room_view(RoomView.model_validate(answer)))
    else:
        print_view(Console(), fleet_view(FleetView.model_validate(answer)))
    return 0 if args.room is None or answer["computers"] else 1
