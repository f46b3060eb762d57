"""Server-side description rules (architecture.md §8) on every text a report carries: a
value that breaks one is stored redacted (`REDACTED`) and flagged, never verbatim.

The rules run on the declared descriptions (`DESCRIPTION_FIELDS`: those of leases, waiting
requests, bookings and jobs alike), the other free text and the identifiers (`TEXT_FIELDS`,
`TOP_TEXT_FIELDS`, a lease's or booking's `gpu_uuids` and the keys of a lease's
`observed_mib`). Accepted values are cached by `check_description`, so the ids and
names that come with every report cost a dictionary look-up each.
"""

from __future__ import annotations

from typing import Any, Final

from rbroker_protocol.descriptions import DescriptionRejected, check_description
from rbroker_protocol.reports import (
    DESCRIPTION_FIELDS,
    TEXT_FIELDS,
    TOP_TEXT_FIELDS,
    ReportPayload,
)
from rbroker_server.reports.payload import Payload

REDACTED: Final = "[redacted]"

_CHECKED: Final[dict[str, tuple[str, ...]]] = {
    name: DESCRIPTION_FIELDS.get(name, ()) + TEXT_FIELDS.get(name, ())
    for name in ("gpus", *DESCRIPTION_FIELDS)
}


def _checked(field: str, path: str, value: str, flags: list[dict[str, str]]) -> str:
    """`value` as the rules accept it, or `REDACTED` with a flag `{field: path, rule}`."""
    try:
        return check_description(field, value)
    except DescriptionRejected as exc:
        flags.append({"field": path, "rule": exc.rule})
        return REDACTED


def redacted_state(report: ReportPayload) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """The report's state as JSON with rejected text replaced by `REDACTED`, and the flags
    `{field, rule}` for each (paths like `leases[0].purpose`, `gpus[1].name`,
    `leases[0].gpu_uuids[0]`, `bookings[0].owner`; `leases[0].observed_mib.key[0]` for the
    first key of a lease's `observed_mib`, whose MiB then count under `REDACTED`). Empty
    optional text is left as it is. A report without bookings (an older broker) is stored
    without the `bookings` key, as before."""
    lists: dict[str, Any] = report.model_dump(mode="json", include={"gpus", *DESCRIPTION_FIELDS})
    return redacted_lists(report, lists)


def redacted_lists(
    report: ReportPayload | Payload, lists: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """`redacted_state` of a report whose lists (`payload.STATE_LISTS`) are already JSON
    dicts: `lists`, changed in place and returned as the state, with the flags."""
    state = lists
    if report.stopping:
        state["stopping"] = True
    if report.left_out:
        state["left_out"] = dict(report.left_out)
    if not report.bookings:
        del state["bookings"]
    if report.bookings_left_out:
        state["bookings_left_out"] = report.bookings_left_out
    flags: list[dict[str, str]] = []
    # a value's path is written out only for a flag: most reports have none
    for list_name, fields in _CHECKED.items():
        for i, item in enumerate(state.get(list_name, ())):
            for field in fields:
                value = item.get(field)
                if value:
                    try:
                        item[field] = check_description(field, value)
                    except DescriptionRejected as exc:
                        flags.append({"field": f"{list_name}[{i}].{field}", "rule": exc.rule})
                        item[field] = REDACTED
    for list_name in ("leases", "bookings"):
        for i, item in enumerate(state.get(list_name, ())):
            uuids = item["gpu_uuids"]
            for j, uuid in enumerate(uuids):
                try:
                    uuids[j] = check_description("gpu_uuid", uuid)
                except DescriptionRejected as exc:
                    flags.append({"field": f"{list_name}[{i}].gpu_uuids[{j}]", "rule": exc.rule})
                    uuids[j] = REDACTED
    for i, lease in enumerate(state["leases"]):
        observed: dict[str, int] = {}
        for j, (uuid, mib) in enumerate(lease["observed_mib"].items()):
            try:
                key = check_description("gpu_uuid", uuid)
            except DescriptionRejected as exc:
                flags.append({"field": f"leases[{i}].observed_mib.key[{j}]", "rule": exc.rule})
                key = REDACTED
            observed[key] = observed.get(key, 0) + mib
        lease["observed_mib"] = observed
    return state, flags


def checked_text(report: ReportPayload | Payload) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The top-level free text (`TOP_TEXT_FIELDS`) as stored, and the flags for each
    value replaced by `REDACTED`."""
    flags: list[dict[str, str]] = []
    values: dict[str, str] = {}
    for field in TOP_TEXT_FIELDS:
        value: str = getattr(report, field)
        values[field] = _checked(field, field, value, flags) if value else value
    return values, flags


def checked_name(name: str) -> tuple[str, dict[str, str] | None]:
    """The reported computer name, or `REDACTED` with a flag."""
    try:
        return check_description("computer_name", name), None
    except DescriptionRejected as exc:
        return REDACTED, {"field": "computer_name", "rule": exc.rule}
