"""Server-side description rules (architecture.md §8): a rejected field is redacted, not stored."""

from __future__ import annotations

from typing import Any, Final

from rbroker_protocol.descriptions import DescriptionRejected, check_description
from rbroker_protocol.reports import DESCRIPTION_FIELDS, ReportPayload

REDACTED: Final = "[redacted]"


def redacted_state(report: ReportPayload) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """The report's state as JSON with rejected descriptions replaced by `REDACTED`, and
    the flags `{field, rule}` for each (paths like `leases[0].purpose`)."""
    state: dict[str, Any] = report.model_dump(mode="json", include={"gpus", *DESCRIPTION_FIELDS})
    if report.stopping:
        state["stopping"] = True
    flags: list[dict[str, str]] = []
    for list_name, fields in DESCRIPTION_FIELDS.items():
        for i, item in enumerate(state[list_name]):
            for field in fields:
                value = item.get(field)
                if not value:
                    continue
                try:
                    item[field] = check_description(field, value)
                except DescriptionRejected as exc:
                    item[field] = REDACTED
                    flags.append({"field": f"{list_name}[{i}].{field}", "rule": exc.rule})
    return state, flags


def checked_name(name: str) -> tuple[str, dict[str, str] | None]:
    """The reported computer name, or `REDACTED` with a flag."""
    try:
        return check_description("computer_name", name), None
    except DescriptionRejected as exc:
        return REDACTED, {"field": "computer_name", "rule": exc.rule}
