"""`rbroker-server group`: create or list groups."""

from __future__ import annotations

import argparse

from rbroker_server.cli.common import configured_engine


def cmd_group(args: argparse.Namespace) -> int:
    from rbroker_server.admin import operations as admin

    engine = configured_engine(args)
    try:
        if args.action == "create":
            group = admin.create_group(engine, args.name)
            print(f"group {group.name} created")
        else:
            for g in admin.list_groups(engine):
                print(f"{g.name}\tcomputers={g.computers}\ttokens={g.tokens}")
    finally:
        engine.dispose()
    return 0
