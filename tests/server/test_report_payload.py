"""The fast reader of a report's payload (`reports.payload.read`): it mirrors
`ReportPayload` field for field, what it reads is what pydantic reads (the same attributes,
the same stored state and flags once redacted), and whatever it does not take goes to
pydantic, which judges it as before; a property test changes a realistic report at random
and holds the reader to pydantic's verdict and values."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from rbroker_protocol import reports as protocol
from rbroker_server.reports import payload
from rbroker_server.reports.redact import redacted_lists, redacted_state
from tests.fakes.reports import GPU_A, gpu_report
from tests.fakes.reports import payload as make_payload

MIRRORS: list[tuple[type[msgspec.Struct], type[BaseModel]]] = [
    (payload.GpuReport, protocol.GpuReport),
    (payload.LeaseReport, protocol.LeaseReport),
    (payload.QueueEntry, protocol.QueueEntry),
    (payload.BookingReport, protocol.BookingReport),
    (payload.JobSnapshot, protocol.JobSnapshot),
    (payload.Payload, protocol.ReportPayload),
]

_SCALARS = [n for n in protocol.ReportPayload.model_fields if n not in payload.STATE_LISTS]


def _full() -> dict[str, Any]:
    """A report with every list and most optional fields set, as JSON."""
    report = make_payload(
        "lab-1",
        "run-7",
        generated_at=1_765_000_100.25,
        run_counter=3,
        stopping=True,
        leases=[
            protocol.LeaseReport(
                lease_id="lease-00a1",
                gpu_uuids=[GPU_A],
                granted_mib=4096,
                owner="alice",
                project="vision",
                session="s-1",
                purpose="fine-tune a ViT-B",
                granted_at=1_765_000_000.5,
                expires_in_s=25.0,
                observed_mib={GPU_A: 3900},
                expected_s=3600.0,
                idle_state="idle",
                idle_s=12.5,
            )
        ],
        queue=[protocol.QueueEntry(mib=2048, owner="bob", waiting_s=3.0, eta_s=60.0)],
        jobs=[protocol.JobSnapshot(job_id="job-1", project="vision", total_items=10)],
        bookings=[
            protocol.BookingReport(
                booking_id="book-1",
                gpu_uuids=[GPU_A],
                mib=1024,
                start_at=1_765_000_000.0,
                end_at=1_765_003_600.0,
                owner="carol",
            )
        ],
        bookings_left_out=2,
        left_out={"leases": 4},
        gpus=[gpu_report(other_in_use_mib=500)],
    )
    out: dict[str, Any] = json.loads(report.to_bytes())
    return out


def _pydantic(data: bytes) -> tuple[dict[str, Any], bytes, list[dict[str, str]]] | None:
    try:
        report = protocol.ReportPayload.from_bytes(data)
    except ValidationError:
        return None
    state, flags = redacted_state(report)
    return _facts(report), orjson.dumps(state), flags


def _fast(data: bytes) -> tuple[dict[str, Any], bytes, list[dict[str, str]]] | None:
    read = payload.read(data)
    if read is None:
        return None
    state, flags = redacted_lists(*read)
    return _facts(read[0]), orjson.dumps(state), flags


def _facts(report: Any) -> dict[str, Any]:
    """The top-level values with their types (1 and 1.0 are not the same to a store)."""
    return {n: (type(getattr(report, n)), getattr(report, n)) for n in _SCALARS}


@pytest.mark.parametrize(("struct", "model"), MIRRORS, ids=lambda t: getattr(t, "__name__", ""))
def test_each_struct_has_its_models_fields_in_order_with_its_defaults(
    struct: type[msgspec.Struct], model: type[BaseModel]
) -> None:
    ours = msgspec.structs.fields(struct)
    assert [f.name for f in ours] == list(model.model_fields)
    for f in ours:
        theirs = model.model_fields[f.name]
        if theirs.is_required():
            assert f.required, f.name
        else:
            default = f.default_factory() if f.default is msgspec.NODEFAULT else f.default
            assert default == theirs.get_default(call_default_factory=True), f.name


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"gpus": [], "leases": [], "queue": [], "jobs": [], "bookings": [], "left_out": {}},
        {"stopping": False, "bookings_left_out": 0, "run_counter": None},
        {"generated_at": 1_765_000_000, "leases": [{**_full()["leases"][0], "granted_at": 7}]},
        {"computer_name": "Labor-Rechner Ü 🎉", "broker_version": "0.1.0\u00a0beta"},
        {"computer_name": "  lab-1  ", "telemetry_source": ""},
        {"leases": [{**_full()["leases"][0], "purpose": "token ghp_" + "a1B2" * 9}]},
        {"jobs": [{**_full()["jobs"][0], "handler": "ok\u0007bell"}]},
        {"queue": [{**_full()["queue"][0], "reason": "\u200b"}]},
        {"unknown": {"nested": [1, 2.5, None, "x", {"y": True}]}, "report_version": 99},
        {"left_out": {"leases": 1, "queue": 2, "jobs": 3}},
    ],
)
def test_what_it_reads_is_what_pydantic_reads(change: dict[str, Any]) -> None:
    data = json.dumps({**_full(), **change}, ensure_ascii=False).encode()
    expected = _pydantic(data)
    assert expected is not None
    assert _fast(data) == expected
    # the JSON text's own form changes nothing: escapes, white space, a repeated key
    escaped = b" \n" + json.dumps({**_full(), **change}).encode() + b"\t"
    assert _fast(escaped) == expected
    repeated = data[:1] + b'"computer_name": "other", ' + data[1:]
    assert _fast(repeated) == expected


@pytest.mark.parametrize(
    "raw",
    [
        b'"total_mib": "24576"',  # lax: a string for an integer
        b'"total_mib": 24576.0',  # lax: a whole float for an integer
        b'"index": true',
        b'"name": "\\ud800"',  # a lone surrogate
        b'"name": "ok", "zz": "\xff"',  # not UTF-8, in a field nobody reads
        b'"name": "ok", "zz": NaN',
        b'"uuid": "GPU-1\\n"',  # `$` before a final newline
        b'"name": "ok", "zz": ' + b"[" * 65 + b"]" * 65,
    ],
)
def test_what_it_does_not_take_goes_to_pydantic(raw: bytes) -> None:
    data = json.dumps(_full()).encode()
    start = data.index(b'"gpus": [{') + len(b'"gpus": [{')
    changed = data[:start] + raw + b", " + data[start:]
    assert payload.read(changed) is None


def test_the_state_lists_are_the_stored_ones() -> None:
    assert set(payload.STATE_LISTS) == {"gpus", *protocol.DESCRIPTION_FIELDS}


# ---------------------------------------------------------------- the property

_JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, 1, 64, 65, 1024, 1025, 2**40, 2**40 + 1, 2**53, 2**53 + 1, -1])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0.0, -0.0, 1.0, 1e300, 5e-324, 0.5])
    | st.text(max_size=70)
    | st.sampled_from(["", " ", "GPU-x", "MIG-GPU-a/1/0", "lease-1", "a\n", "ok", "active"])
    | st.sampled_from(["idle", "unknown", "booked", "queued", "running", "leases", "queue"])
)
_JSON = st.recursive(
    _JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


_BOUNDS = [0, 1, -1, 32, 33, 64, 65, 128, 129, 256, 257, 1024, 1025, 4096, 4097]
_BIG = [2**40, 2**40 + 1, 2**53, 2**53 + 1, 2**63, 2**64 + 1]
_LENGTHS = [0, 1, 32, 33, 64, 65, 124, 125, 128, 129, 256, 257, 4096, 4097]
_OTHERS: list[Any] = [None, True, "x", 1.5, [], {}]


def _candidates(value: Any) -> list[Any]:
    """Values of the kind `value` is, at and past the bounds the schema sets, and others."""
    if isinstance(value, bool):
        return [not value, 0, 1, "true", *_OTHERS]
    if isinstance(value, int):
        return [*_BOUNDS, *_BIG, value + 1, -value, float(value), *_OTHERS]
    if isinstance(value, float):
        return [0, 1, 0.0, -0.0, -1.5, 5e-324, 1e300, 315_360_001, int(value), *_OTHERS]
    if isinstance(value, str):
        near = [value + "\n", value + " ", " " + value, value + "/1/0", value.upper()]
        sized = [c * n for c in ("a", "Ü", "\u0301") for n in _LENGTHS]
        return [*near, "x", "Ü" + value, "GPU-" + "a" * 124, "GPU-" + "a" * 125, *sized, 1, None]
    if isinstance(value, list) and value:
        return [value[:1] * n for n in (0, 2, 64, 65, 256, 257)] + [None, {}]
    if isinstance(value, dict) and value:  # observed_mib, left_out
        key, figure = next(iter(value.items()))
        sizes = [{f"{key}{i or ''}": figure for i in range(n)} for n in (0, 2, 64, 65)]
        named = [{"leases": 1, "queue": 2, "jobs": 3}, {"zz": 1}, {key: -1}, {key: 2**53 + 1}]
        return [*sizes, *named, None, []]
    return [*_OTHERS, 0]


def _changed(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> bytes:
    changed = json.loads(json.dumps(doc))
    *head, last = path
    parent: Any = changed
    for step in head:
        parent = parent[step]
    parent[last] = value
    return json.dumps(changed).encode()


def test_every_field_at_its_bounds_is_read_as_pydantic_reads_it_or_left_to_pydantic() -> None:
    doc = _full()
    read = 0
    for path in _paths(doc)[1:]:
        parent: Any = doc
        for step in path:
            parent = parent[step]
        for value in _candidates(parent):
            data = _changed(doc, path, value)
            fast = _fast(data)
            if fast is not None:
                read += 1
                assert fast == _pydantic(data), (path, value)
    assert read > 500  # most of them are read here, not left to pydantic


def _near(value: Any) -> st.SearchStrategy[Any]:
    """`_candidates`, and any JSON."""
    return st.sampled_from(_candidates(value)) | _JSON


@st.composite
def _changed_reports(draw: st.DrawFn) -> bytes:
    doc = _full()
    for _ in range(draw(st.integers(min_value=1, max_value=2))):
        path = draw(st.sampled_from(_paths(doc)[1:]))
        *head, last = path
        parent: Any = doc
        for step in head:
            parent = parent[step]
        action = draw(st.sampled_from(["near", "near", "near", "any", "delete", "add"]))
        if action == "delete":
            del parent[last]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=12))] = draw(_JSON)
        elif action == "near":
            parent[last] = draw(_near(parent[last]))
        else:
            parent[last] = draw(_JSON)
    ascii_only = draw(st.booleans())
    return json.dumps(doc, ensure_ascii=ascii_only).encode()


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_changed_reports())
def test_a_changed_report_is_read_as_pydantic_reads_it_or_left_to_pydantic(data: bytes) -> None:
    fast = _fast(data)
    if fast is None:
        return  # pydantic judges it, as before
    expected = _pydantic(data)
    assert expected is not None, "read a payload pydantic refuses"
    assert fast == expected
