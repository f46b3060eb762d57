"""`rbroker-server token`: create, list or revoke viewer tokens."""

from __future__ import annotations

import argparse
import sys

from rbroker_server.cli.common import CliError, configured_engine, fmt_time


def cmd_token(args: argparse.Namespace) -> int:
    from rbroker_server.admin import operations as admin

    engine = configured_engine(args)
    try:
        if args.action == "create":
            token = admin.create_token(engine, args.group, args.name or "")
            print(token.text)
            print(f"viewer token {token.id} for group {token.group} (shown once)", file=sys.stderr)
        elif args.action == "revoke":
            if not admin.revoke_token(engine, args.group, args.token):
                raise CliError(f"no token {args.token} in group {args.group}")
            print(f"token {args.token.split('_')[1] if '_' in args.token else args.token} revoked")
        else:
            for t in admin.list_tokens(engine, args.group):
                state = "revoked" if t.revoked else "active"
                print(f"{t.id}\t{state}\t{fmt_time(t.created_at)}\t{t.name}")
    finally:
        engine.dispose()
    return 0
