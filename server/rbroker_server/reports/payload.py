"""A report's payload read in one msgspec pass: the fast reader of `ReportPayload`'s bytes
(architecture.md §7, §10), with pydantic's reader as the judge of everything it refuses.

`read` decodes the verified payload into msgspec structs that mirror `ReportPayload` and its
lists field for field (names, order, defaults, bounds, patterns) and converts the stored
lists to JSON-ready dicts in the same C pass over the structs (`msgspec.to_builtins`): the
state `ReportPayload.model_dump(mode="json")` gives, with no pydantic model built and no
second walk in Python. It returns None for anything it does not take, and the caller then
reads the bytes with `ReportPayload.from_bytes` as before, so every refusal, its error count
and first location, and every value pydantic's lax mode converts (`"5"` for an integer, `1.0`
for one, `1`/`0` for a boolean, `NaN`) stay pydantic's. What it takes, pydantic takes with
the same values:

- only bytes that are UTF-8 (msgspec does not check the text of a field it skips; pydantic's
  reader refuses the whole payload);
- only payloads that nest at most `MAX_DEPTH` levels (pydantic refuses more than 200, also in
  a field it ignores: `PayloadNestedTooDeeply`);
- patterns anchored with `\\Z` where the protocol's end in `$` (pydantic's Rust regex `$`
  is the end of the text; Python's `$` also matches before a final newline);
- strict JSON types (no `1.0` for an integer, no string for a number or a boolean).

Measured on 2 cores, the benchmark's report of 1.5 KB (bench/_coord_fixture.py) read 3 000
times in a loop: 8.8 µs here against 15 µs for pydantic's read and dump, and 15 µs against
24 µs with the description rules' walk (`redact.redacted_lists`). In a `serve` process under
load, pydantic's read alone took 28 µs of CPU a report.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec

from rbroker_protocol.reports import (
    GPU_UUID_PATTERN,
    ID_PATTERN,
    MAX_BOOKINGS,
    REPORT_VERSION,
    BookingStateName,
    JobStateName,
    LeaseStateName,
    TelemetryStateName,
)
from rbroker_server.edge.bodies import json_depth

MAX_DEPTH: Final = 64
"""The deepest payload read here (levels of arrays and objects; a report nests 4 deep):
deeper ones go to pydantic, which refuses more than 200 (`PayloadNestedTooDeeply`). A
payload with at most this many brackets is not measured (`edge.bodies.json_depth`)."""


def _end_of_text(pattern: str) -> str:
    """`pattern` with its final `$` as `\\Z` (see the module's docstring)."""
    if not pattern.endswith("$"):
        raise ValueError(f"pattern {pattern!r} does not end in $")
    return pattern[:-1] + r"\Z"


_ID = Annotated[str, msgspec.Meta(pattern=_end_of_text(ID_PATTERN))]
_GPU_UUID = Annotated[str, msgspec.Meta(pattern=_end_of_text(GPU_UUID_PATTERN))]
_MIB = Annotated[int, msgspec.Meta(ge=0, le=2**40)]
_TEXT = Annotated[str, msgspec.Meta(max_length=4096)]
_NAME = Annotated[str, msgspec.Meta(max_length=256)]
_COUNT = Annotated[int, msgspec.Meta(ge=0, le=2**53)]
_TEN_YEARS_S = 10 * 365 * 86400


class GpuReport(msgspec.Struct):
    """`rbroker_protocol.reports.GpuReport`."""

    uuid: _GPU_UUID
    index: Annotated[int, msgspec.Meta(ge=0, le=1024)]
    name: _NAME = ""
    telemetry: TelemetryStateName = "ok"
    total_mib: _MIB | None = None
    headroom_mib: _MIB | None = None
    device_used_mib: _MIB | None = None
    outstanding_mib: _MIB | None = None
    available_mib: _MIB | None = None
    leased_in_use_mib: _MIB | None = None
    other_in_use_mib: _MIB | None = None


class LeaseReport(msgspec.Struct):
    """`rbroker_protocol.reports.LeaseReport`."""

    lease_id: _ID
    gpu_uuids: Annotated[list[_GPU_UUID], msgspec.Meta(max_length=64)]
    granted_mib: _MIB
    owner: _TEXT = ""
    project: _TEXT = ""
    session: _TEXT = ""
    purpose: _TEXT = ""
    state: LeaseStateName = "active"
    granted_at: float | None = None
    expires_in_s: float | None = None
    observed_mib: Annotated[dict[_GPU_UUID, _MIB], msgspec.Meta(max_length=64)] = {}
    over_grant: bool = False
    expected_s: Annotated[float, msgspec.Meta(gt=0, le=_TEN_YEARS_S)] | None = None
    idle_state: Literal["active", "idle", "unknown"] = "unknown"
    idle_s: Annotated[float, msgspec.Meta(ge=0, le=_TEN_YEARS_S)] | None = None


class QueueEntry(msgspec.Struct):
    """`rbroker_protocol.reports.QueueEntry`."""

    mib: _MIB
    gpus: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    owner: _TEXT = ""
    project: _TEXT = ""
    session: _TEXT = ""
    purpose: _TEXT = ""
    waiting_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    reason: _TEXT = ""
    eta_s: Annotated[float, msgspec.Meta(ge=0, le=_TEN_YEARS_S)] | None = None
    eta_reason: _TEXT = ""


class BookingReport(msgspec.Struct):
    """`rbroker_protocol.reports.BookingReport`."""

    booking_id: _ID
    gpu_uuids: Annotated[list[_GPU_UUID], msgspec.Meta(max_length=64)]
    mib: _MIB
    start_at: float
    end_at: float
    owner: _TEXT = ""
    project: _TEXT = ""
    session: _TEXT = ""
    purpose: _TEXT = ""
    state: BookingStateName = "booked"
    claimed_mib: _MIB = 0


class JobSnapshot(msgspec.Struct):
    """`rbroker_protocol.reports.JobSnapshot`."""

    job_id: _ID
    project: _TEXT = ""
    purpose: _TEXT = ""
    handler: _TEXT = ""
    state: JobStateName = "running"
    workers: _COUNT = 0
    total_items: _COUNT | None = None
    completed_items: _COUNT = 0
    failed_items: _COUNT = 0


class Payload(msgspec.Struct, kw_only=True):
    """`rbroker_protocol.reports.ReportPayload`: the same attributes, read by `read`."""

    report_version: Annotated[int, msgspec.Meta(ge=1)] = REPORT_VERSION
    computer_name: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    broker_version: Annotated[str, msgspec.Meta(max_length=64)] = ""
    telemetry_source: Annotated[str, msgspec.Meta(max_length=32)] = ""
    run_id: _ID
    run_counter: _COUNT | None = None
    generated_at: float
    stopping: bool = False
    gpus: Annotated[list[GpuReport], msgspec.Meta(max_length=256)] = []
    leases: Annotated[list[LeaseReport], msgspec.Meta(max_length=4096)] = []
    queue: Annotated[list[QueueEntry], msgspec.Meta(max_length=4096)] = []
    jobs: Annotated[list[JobSnapshot], msgspec.Meta(max_length=4096)] = []
    bookings: Annotated[list[BookingReport], msgspec.Meta(max_length=MAX_BOOKINGS)] = []
    bookings_left_out: _COUNT = 0
    left_out: dict[Literal["leases", "queue", "jobs"], _COUNT] = {}


STATE_LISTS: Final = ("gpus", "leases", "queue", "jobs", "bookings")
"""The lists a report's stored state holds, in `ReportPayload`'s order."""

_DECODER: Final = msgspec.json.Decoder(Payload)


def read(data: bytes) -> tuple[Payload, dict[str, Any]] | None:
    """The payload of verified bytes `data` and its lists as JSON-ready dicts
    (`STATE_LISTS`, as `ReportPayload.model_dump(mode="json")` gives them), or None: not
    read here (see the module's docstring), for `ReportPayload.from_bytes` to judge."""
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if data.count(b"[") + data.count(b"{") > MAX_DEPTH and json_depth(data) > MAX_DEPTH:
        return None
    try:
        report = _DECODER.decode(data)
    except msgspec.DecodeError:  # ValidationError too
        return None
    lists = msgspec.to_builtins(
        (report.gpus, report.leases, report.queue, report.jobs, report.bookings)
    )
    return report, dict(zip(STATE_LISTS, lists, strict=True))
