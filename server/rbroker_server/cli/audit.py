"""`rbroker-server audit`: the coordinator's audit trail, newest first."""

from __future__ import annotations

import argparse
import json

from rbroker_server.cli.common import configured_engine, fmt_time


def cmd_audit(args: argparse.Namespace) -> int:
    from rbroker_server.admin import audit

    engine = configured_engine(args)
    try:
        rows = audit.entries(engine, args.group, args.limit)
    finally:
        engine.dispose()
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "id": e.id,
                        "at": e.at.isoformat(),
                        "actor": e.actor,
                        "action": e.action,
                        "group": e.group,
                        "target": e.target,
                        "detail": e.detail,
                    }
                    for e in rows
                ],
                indent=2,
            )
        )
        return 0
    for e in rows:
        print(
            f"{fmt_time(e.at)}\t{e.actor}\t{e.action}\t{e.group or '-'}\t{e.target}"
            + (f"\t{e.detail}" if e.detail else "")
        )
    return 0
