"""Build the report payload (rbroker_protocol.reports) from the broker's own views.

Only declared descriptions, owners, resources, states and progress leave the computer
(DESIGN §8): the views hold no pids, command lines, environment or process names, and the
payload model drops any field it does not define. Lists are trimmed, newest kept, so the
signed envelope fits the coordinator's size limit; the count of what was left out is
returned so the link state can say so.
"""

from __future__ import annotations

from typing import Any

from rbroker._version import __version__
from rbroker.broker.service import Broker
from rbroker_protocol.reports import MAX_REPORT_BYTES, ReportPayload

REASON_LIMIT = 200
"""Queue reasons are cut to the description rules' limit for `reason` (characters)."""

_ENVELOPE_BUDGET = int(MAX_REPORT_BYTES * 0.7)
"""Payload bytes that still fit 1 MiB after base64 (4/3) and the envelope's other fields."""


def _max_items(field: str) -> int:
    """The schema's item limit of one of the payload's lists."""
    for meta in ReportPayload.model_fields[field].metadata:
        limit = getattr(meta, "max_length", None)
        if limit is not None:
            return int(limit)
    raise LookupError(field)  # pragma: no cover - every list is bounded


def build_payload(broker: Broker, computer_name: str, run_id: str) -> tuple[bytes, int]:
    """The payload bytes to sign, and how many list entries were trimmed to fit."""
    gpus = broker.gpus_view()
    view = broker.leases_view()
    jobs = broker.jobs.view(include_finished=True, live_lease_ids=set(broker.leases))
    queue = [{**q, "reason": q["reason"][:REASON_LIMIT]} for q in view["queue"]]
    lists: dict[str, list[dict[str, Any]]] = {
        "leases": view["leases"],
        "queue": queue,
        "jobs": jobs,
    }
    trimmed = 0
    for name, items in lists.items():
        limit = _max_items(name)
        if len(items) > limit:  # a long-lived broker can hold more finished jobs than this
            trimmed += len(items) - limit
            lists[name] = items[-limit:]
    while True:
        payload = ReportPayload(
            computer_name=computer_name,
            broker_version=__version__,
            telemetry_source=broker.gateway.source,
            run_id=run_id,
            generated_at=broker.clock.wall(),
            gpus=gpus,  # type: ignore[arg-type]  # validated from dicts by pydantic
            **lists,  # type: ignore[arg-type]
        )
        data = payload.to_bytes()
        if len(data) <= _ENVELOPE_BUDGET:
            return data, trimmed
        longest = max(lists, key=lambda k: len(lists[k]))
        if not lists[longest]:
            return data, trimmed  # only GPUs left: cannot shrink further
        cut = max(1, len(lists[longest]) // 4)
        lists[longest] = lists[longest][cut:]
        trimmed += cut
