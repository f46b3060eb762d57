"""`rbroker audit`'s table (`rbroker.cli.audit`): names, projects and reasons reach the
terminal as plain text, without control codes or rich markup; a record that does not verify
is said above the table. The broker side: tests/desktop/broker/audit/."""

from __future__ import annotations

import io

from rich.console import Console

from rbroker.cli.audit import audit_table, target_words
from rbroker.cli.views import View, print_view
from rbroker_protocol.results import AuditEntry

HOSTILE = "\x1b[31mred\x1b[0m [bold]loud[/bold]\x07"


def _entry(**kw: object) -> AuditEntry:
    entry = {
        "seq": 7,
        "at": 1_800_000_000.0,
        "actor": "root",
        "action": "lease_revoked",
        "target": {"owner": "ann", "project": HOSTILE, "kind": "lease", "id": "lease-3f2a"},
        "reason": HOSTILE,
        "prev": "0" * 64,
        **kw,
    }
    return entry  # type: ignore[return-value]


def test_user_text_reaches_the_terminal_as_plain_text() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200, color_system=None)
    print_view(console, View(audit_table([_entry()])))
    text = out.getvalue()
    assert "\x1b[31m" not in text and "\x07" not in text
    assert "[bold]loud[/bold]" in text  # shown as typed, not taken as markup
    assert "lease_revoked" in text and "root" in text


def test_the_target_in_words() -> None:
    target = _entry()["target"]
    assert target_words({**target, "project": "vision"}) == "lease lease-3f2a of ann (vision)"
    assert target_words({"owner": "", "project": "", "kind": "broker", "id": ""}) == "broker"
