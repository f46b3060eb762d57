"""Build the report payload (rbroker_protocol.reports) from the broker's own views.

Only declared descriptions, owners, resources, states and progress leave the computer
(architecture.md §8): the views hold no pids, command lines, environment or process names, and the
payload model drops any field it does not define. Lists are trimmed so the signed envelope
fits the coordinator's size limit (a binary search for the largest list length that fits),
fairly between owners: round-robin by owner, each owner's newest entries first, so one user
with thousands of jobs cannot push the others' out of view. What was left out is counted
per list, in the payload (`left_out`, which the coordinator's web view shows as "N jobs not
shown") and for the link state. The live bookings go nearest first (by start): at most
`MAX_BOOKINGS`, and cut like the other lists to fit, the furthest left out
(`bookings_left_out`).
"""

from __future__ import annotations

from typing import Any

from rbroker.base.version import __version__
from rbroker.broker.service import Broker
from rbroker_protocol.reports import MAX_REPORT_BYTES, ReportPayload
from rbroker_protocol.results import BookingView
from rbroker_protocol.signing import ENVELOPE_VERSION, MAX_SEQ, encode_envelope

REASON_LIMIT = 200
"""Queue reasons are cut to the description rules' limit for `reason` (characters)."""

_ID_MAX = "x" * 64
_SIG_B64 = "A" * 86 + "=="


def max_payload_bytes(limit_bytes: int = MAX_REPORT_BYTES) -> int:
    """The largest payload whose signed envelope fits `limit_bytes` (the coordinator's body
    limit, 1 MiB) for any computer and run id (up to 64 characters) and sequence number.

    The envelope is compact JSON whose only variable part is the payload's base64
    (4 characters per 3 bytes, rounded up), so the answer is exact for the longest ids.
    """
    empty = encode_envelope(
        {"v": ENVELOPE_VERSION, "computer_id": _ID_MAX, "run_id": _ID_MAX,
         "seq": MAX_SEQ, "payload": "", "sig": _SIG_B64}
    )  # fmt: skip
    room = limit_bytes - len(empty)
    return max(0, room // 4 * 3)


def _max_items(field: str) -> int:
    """The schema's item limit of one of the payload's lists."""
    for meta in ReportPayload.model_fields[field].metadata:
        limit = getattr(meta, "max_length", None)
        if limit is not None:
            return int(limit)
    raise LookupError(field)  # pragma: no cover - every list is bounded


def fair_order(items: list[dict[str, Any]]) -> list[int]:
    """The indices of `items` in the order a trimmed list keeps them: round-robin over the
    owners (`owner`, by name; "" for items without one), each owner's newest (last) first.
    Keeping the first `n` gives every owner ⌊n / owners⌋ or one more, or all they have."""
    by_owner: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        by_owner.setdefault(str(item.get("owner", "")), []).append(i)
    queues = [by_owner[owner][::-1] for owner in sorted(by_owner)]
    order: list[int] = []
    for depth in range(max((len(q) for q in queues), default=0)):
        order.extend(q[depth] for q in queues if depth < len(q))
    return order


def _order(name: str, items: list[dict[str, Any]]) -> list[int]:
    """The order a list of the report is cut in: bookings as listed (nearest first), the
    others fairly (`fair_order`)."""
    return list(range(len(items))) if name == "bookings" else fair_order(items)


def keep_fairly(items: list[dict[str, Any]], order: list[int], n: int) -> list[dict[str, Any]]:
    """The `n` items `order` (from `fair_order`) keeps first, in their own order."""
    if n >= len(items):
        return items
    return [items[i] for i in sorted(order[:n])]


BOOKING_FIELDS = (
    "booking_id", "gpu_uuids", "mib", "start_at", "end_at",
    "owner", "project", "session", "purpose", "state", "claimed_mib",
)  # fmt: skip
"""What a report carries of a booking (`rbroker_protocol.reports.BookingReport`): never its
claims' lease ids, its creation or end details."""


def booking_entries(bookings: list[BookingView]) -> list[dict[str, Any]]:
    """The live bookings of `bookings` as report entries, nearest first (by start, then id)."""
    live = [b for b in bookings if b["state"] in ("booked", "held", "claimed")]
    live.sort(key=lambda b: (b["start_at"], b["booking_id"]))
    return [{k: b[k] for k in BOOKING_FIELDS} for b in live]  # type: ignore[literal-required]


def build_payload(
    broker: Broker,
    computer_name: str,
    run_id: str,
    limit_bytes: int = MAX_REPORT_BYTES,
    *,
    run_counter: int | None = None,
    stopping: bool = False,
) -> tuple[bytes, dict[str, int]]:
    """The payload bytes to sign, and per list (`leases`, `queue`, `jobs`, `bookings`) how
    many of its entries were left out: first to the schema's item limits, then to fit the
    size limit (`max_payload_bytes(limit_bytes)`). The payload says the same in `left_out`
    (and `bookings_left_out`).

    To fit, every list is cut to at most `n` entries, with `n` the largest that fits, found
    by binary search (about log2(longest list) encodings); lists shorter than `n` are sent
    whole. A list is cut fairly (`fair_order`): round-robin by owner, newest first; the
    bookings nearest first (`booking_entries`). When
    even `n = 0` does not fit (GPUs alone too large), the smallest payload is returned and
    the coordinator will refuse it.

    `run_counter`: this run's place in the computer's run order (`rbroker.uplink.runs`).
    `stopping`: the broker's last report (the coordinator shows the computer offline).
    """
    gpus = broker.gpus_view()
    view = broker.leases_view()
    jobs = broker.jobs_view(include_finished=True)
    bookings = booking_entries(broker.bookings_list(asker="", include_ended=False)["bookings"])
    queue = [{**q, "reason": q["reason"][:REASON_LIMIT]} for q in view["queue"]]
    lists: dict[str, list[Any]] = {  # of `rbroker_protocol.results` records
        "leases": view["leases"],
        "queue": queue,
        "jobs": jobs,
        "bookings": bookings,
    }
    totals = {name: len(items) for name, items in lists.items()}
    orders = {name: _order(name, items) for name, items in lists.items()}
    for name, items in lists.items():
        limit = _max_items(name)
        if len(items) > limit:  # a long-lived broker can hold more finished jobs than this
            lists[name] = keep_fairly(items, orders[name], limit)
            orders[name] = _order(name, lists[name])

    generated_at = broker.now_wall()

    def encode(cap: int | None) -> tuple[bytes, dict[str, int]]:
        """The payload with each list cut to its `cap` first entries in fair order (None:
        whole), and what it leaves out per list."""
        kept = {k: v if cap is None else keep_fairly(v, orders[k], cap) for k, v in lists.items()}
        left_out = {k: totals[k] - len(v) for k, v in kept.items() if totals[k] > len(v)}
        data = ReportPayload(
            computer_name=computer_name,
            broker_version=__version__,
            telemetry_source=broker.telemetry_source(),
            run_id=run_id,
            run_counter=run_counter,
            generated_at=generated_at,
            stopping=stopping,
            gpus=gpus,  # type: ignore[arg-type]  # validated from dicts by pydantic
            left_out={k: n for k, n in left_out.items() if k != "bookings"},  # type: ignore[misc]
            bookings_left_out=left_out.get("bookings", 0),
            **kept,  # type: ignore[arg-type]
        ).to_bytes()
        return data, left_out

    budget = max_payload_bytes(limit_bytes)
    data, left_out = encode(None)
    if len(data) > budget:
        # the largest cap that fits lies in [0, longest - 1] (the longest does not fit)
        low, high = 0, max(len(v) for v in lists.values()) - 1
        while low < high:
            mid = (low + high + 1) // 2
            if len(encode(mid)[0]) <= budget:
                low = mid
            else:
                high = mid - 1
        data, left_out = encode(low)
    return data, left_out
