"""`rbroker audit [--json] [--limit N]`: the broker's audit trail (architecture.md §3, "Audit
trail"), for its administrators: a table (time in the local zone, actor, action, target,
reason), oldest first, under a line saying when the record does not verify.

Every refusal is one line on stderr: exit 2 for bad input or a broker that says no (not an
administrator: `not_allowed`), 69 when no broker answers (`rbroker.cli.exits`). Names,
projects and reasons reach the terminal as plain text (`clean`, no rich markup).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from rich.console import Console
from rich.text import Text

import rbroker
from rbroker.base.display import fmt_count
from rbroker.base.when import local_time, zone_name
from rbroker.cli.bookings import clean
from rbroker.cli.exits import EX_REFUSED, unusable_exit
from rbroker.cli.sheet import Column, Sheet
from rbroker.cli.views import View, print_view
from rbroker_protocol.results import AuditEntry, AuditTarget

MAX_LIMIT = 10_000
"""The most entries one `audit.list` answers."""


EX_BROKEN_RECORD = 1
"""`rbroker audit`'s exit code when the record does not verify (edited, cut or broken)."""


def _say(message: str) -> None:
    """One line on stderr, printed as it is (no rich markup)."""
    Console(stderr=True, highlight=False).print(
        f"rbroker audit: {clean(message)}", markup=False, soft_wrap=True
    )


def target_words(target: AuditTarget) -> str:
    """`lease lease-3f2a… of nobody (vision)`, `broker`, `request req-7 of ann`: what an
    entry touched, its parts left out where empty."""
    words = " ".join(x for x in (target["kind"], target["id"]) if x)
    if target["owner"]:
        words += f" of {target['owner']}"
    if target["project"]:
        words += f" ({target['project']})"
    return clean(words.strip())


def audit_table(entries: Sequence[AuditEntry]) -> Sheet:
    """The entries as given (oldest first): seq, time (local zone), actor, action, target,
    reason."""
    sheet = Sheet(
        f"Audit trail ({fmt_count(len(entries))}), times in {zone_name()}",
        [
            Column("seq", "right"),
            Column("time"),
            Column("actor", free_text=True, min_free=5),
            Column("action"),
            Column("target", free_text=True, min_free=10),
            Column("reason", free_text=True, min_free=12),
        ],
        empty="no entries",
    )
    for e in entries:
        sheet.add(
            str(e["seq"]),
            local_time(e["at"]).strftime("%Y-%m-%d %H:%M:%S"),
            clean(e["actor"]),
            clean(e["action"]),
            target_words(e["target"]),
            clean(e["reason"]),
        )
    return sheet


def run_audit(args: argparse.Namespace) -> int:
    """`rbroker audit`: returns the exit code."""
    if not 1 <= args.limit <= MAX_LIMIT:
        _say(f"--limit must be between 1 and {fmt_count(MAX_LIMIT)}, not {args.limit}")
        return EX_REFUSED
    try:
        with rbroker.Client(args.socket, timeout_s=30) as client:
            answer = client.audit(args.limit)
    except (rbroker.BrokerUnavailable, rbroker.NotAllowed) as exc:
        _say(str(exc))
        return unusable_exit(exc)
    except rbroker.RBrokerError as exc:
        _say(str(exc))
        return EX_REFUSED
    # a record that does not verify exits EX_BROKEN_RECORD, so that a script notices
    broken = EX_BROKEN_RECORD if not answer["verified"] else 0
    if args.json:
        print(json.dumps(answer, indent=2))
        return broken
    parts: list[Sheet | Text] = []
    if not answer["verified"]:
        problem = clean(answer["problem"] or "it does not verify")
        parts.append(Text(f"the audit record does not verify: {problem}", style="bold red"))
    parts.append(audit_table(answer["entries"]))
    print_view(Console(highlight=False), View(*parts))
    return broken


__all__ = ["audit_table", "run_audit", "target_words"]
