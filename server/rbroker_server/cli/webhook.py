"""`rbroker-server webhook`: add, list or remove a group's webhooks."""

from __future__ import annotations

import argparse
import json
import sys

from rbroker_server.cli.common import CliError, configured_engine, fmt_time, load_settings


def cmd_webhook(args: argparse.Namespace) -> int:
    from rbroker_server.webhooks import admin

    if args.action == "add":  # checked before the database is opened
        admin.check_url(args.url)
        admin.check_events(args.events)
    settings = load_settings(args) if args.action == "add" else None
    engine = configured_engine(args)
    try:
        if args.action == "add":
            assert settings is not None
            hook = admin.add_webhook(
                engine,
                settings,
                args.group,
                args.url,
                args.events,
                args.waiting_after,
                args.idle_after,
            )
            print(f"{hook.id}\t{hook.secret}")
            print(
                f"webhook {hook.id} for group {hook.group} ({','.join(hook.events)}); its "
                "signing secret is shown once",
                file=sys.stderr,
            )
        elif args.action == "remove":
            if not admin.remove_webhook(engine, args.id):
                raise CliError(f"no webhook {args.id}")
            print(f"webhook {args.id} removed")
        else:
            hooks = admin.list_webhooks(engine, args.group)
            if args.json:
                rows = [
                    {
                        "id": h.id,
                        "group": h.group,
                        "url": _shown(h.url),
                        "events": list(h.events),
                        "waiting_after_s": h.waiting_after_s,
                        "idle_after_s": h.idle_after_s,
                        "created_at": h.created_at.isoformat(),
                        "queued": h.queued,
                        "delivered": h.delivered,
                        "failed": h.failed,
                    }
                    for h in hooks
                ]
                print(json.dumps(rows, indent=2))
            for h in [] if args.json else hooks:
                print(
                    f"{h.id}\t{h.group}\t{_shown(h.url)}\t{','.join(h.events)}"
                    f"\twaiting>{h.waiting_after_s:g}s\tidle>{h.idle_after_s:g}s"
                    f"\tqueued={h.queued}"
                    f"\tdelivered={h.delivered}\tfailed={h.failed}\t{fmt_time(h.created_at)}"
                )
    finally:
        engine.dispose()
    return 0


def _shown(url: str) -> str:
    """What `webhook list` shows of a URL: its origin, then "/…" where it has more (a chat's
    incoming-webhook URL carries its credential in the path; user:password@ is dropped)."""
    from rbroker_server.admin.audit import url_origin

    origin = url_origin(url)
    return origin if url.rstrip("/") == origin else origin + "/…"
