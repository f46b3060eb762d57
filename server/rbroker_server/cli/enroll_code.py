"""`rbroker-server enroll-code`: make, list or revoke one-time enrollment codes."""

from __future__ import annotations

import argparse
import sys

from rbroker_server.cli.common import CliError, configured_engine, fmt_time, load_settings


def cmd_enroll_code(args: argparse.Namespace) -> int:
    from rbroker_server.admin import operations as admin

    engine = configured_engine(args)
    try:
        if args.action == "list":
            codes = admin.list_enroll_codes(engine, args.group, include_done=args.all)
            if not codes:
                print(f"no {'' if args.all else 'unused '}enrollment codes in group {args.group}")
            for c in codes:
                done = (
                    f"used {fmt_time(c.used_at)} by {c.computer_id}"
                    if c.state == "used"
                    else f"expires {fmt_time(c.expires_at)}"
                    if c.state == "unused"
                    else f"expired {fmt_time(c.expires_at)}"
                )
                print(f"{c.id}\t{c.state}\tcreated {fmt_time(c.created_at)}\t{done}")
            return 0
        if args.action == "revoke":
            if not admin.revoke_enroll_code(engine, args.group, args.code):
                raise CliError(f"no enrollment code {args.code} in group {args.group}")
            code_id = args.code.split("_")[1] if "_" in args.code else args.code
            print(f"enrollment code {code_id} revoked")
            return 0
        ttl = args.ttl if args.ttl is not None else load_settings(args).enroll_code_ttl_s
        code = admin.create_enroll_code(engine, args.group, ttl)
    finally:
        engine.dispose()
    print(code.text)
    print(f"one use, group {code.group}, expires {fmt_time(code.expires_at)}", file=sys.stderr)
    return 0
