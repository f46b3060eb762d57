"""`rbroker-server computer`: list or revoke enrolled computers."""

from __future__ import annotations

import argparse

from rbroker_server.cli.common import CliError, configured_engine, fmt_time


def cmd_computer(args: argparse.Namespace) -> int:
    from rbroker_server.admin import operations as admin

    engine = configured_engine(args)
    try:
        if args.action == "revoke":
            if not admin.revoke_computer(engine, args.computer_id):
                raise CliError(f"no computer {args.computer_id}")
            print(f"computer {args.computer_id} revoked")
        else:
            for c in admin.list_computers(engine, args.group):
                marks = ",".join(
                    m for m, on in (("revoked", c.revoked), ("flagged", c.flagged)) if on
                )
                print(
                    f"{c.id}\t{c.group}\t{c.name}\tlast seen {fmt_time(c.last_seen_at)}"
                    f"\t{marks or 'ok'}"
                )
    finally:
        engine.dispose()
    return 0
