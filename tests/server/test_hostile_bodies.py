"""Hostile request bodies: deep nesting is a 400 "nested too deeply" (never a 500), a JSON
body needs `application/json` (415), identifiers and states are checked, and a secret
planted in any text field of a report is stored redacted and flagged."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa

from rbroker_protocol import signing
from rbroker_protocol.reports import (
    BookingReport,
    JobSnapshot,
    LeaseReport,
    ReportPayload,
    TelemetryStateName,
)
from rbroker_server.edge.bodies import MAX_JSON_DEPTH, json_depth
from rbroker_server.reports.redact import REDACTED
from tests.fakes.reports import GPU_A, gpu_report, payload
from tests.server.conftest import Coordinator

GITHUB = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
AWS_KEY = "AKIA" + "Z7Q2M4N8P1R5T3V6"
JSON = {"content-type": "application/json"}


def _nested(levels: int, open_: bytes = b"[", close: bytes = b"]") -> bytes:
    return open_ * levels + close * levels


def _deep_object(levels: int) -> bytes:
    return b'{"a":' * levels + b"1" + b"}" * levels


@pytest.mark.parametrize("levels", [MAX_JSON_DEPTH + 1, 1000, 100_000])
@pytest.mark.parametrize("path", ["/api/v1/reports", "/api/v1/enroll"])
def test_nested_bodies_are_400_nested_too_deeply(
    coordinator: Coordinator, path: str, levels: int
) -> None:
    for body in (_nested(levels), _deep_object(levels), _nested(levels, b"{", b"}")):
        r = coordinator.http.post(path, content=body, headers=JSON)
        assert r.status_code == 400, r.text
        assert "nested too deeply" in r.json()["detail"]
    # the coordinator still answers
    assert coordinator.http.get("/healthz").status_code == 200


def test_nesting_inside_strings_does_not_count_and_the_limit_is_exact() -> None:
    assert json_depth(b'{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}') == 1
    assert json_depth(b'{"a": "\\"' + b"[" * 40 + b'\\""}') == 1
    assert json_depth(_nested(MAX_JSON_DEPTH)) == MAX_JSON_DEPTH
    assert json_depth(b"[" * 40 + b"1") == 40  # unclosed still counts
    assert json_depth(b"5") == 0


def test_enroll_at_the_depth_limit_is_an_ordinary_validation_error(
    coordinator: Coordinator,
) -> None:
    r = coordinator.http.post("/api/v1/enroll", content=_nested(MAX_JSON_DEPTH), headers=JSON)
    assert r.status_code == 400 and "nested too deeply" not in r.text


def test_a_deeply_nested_signed_payload_is_400(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    for inner in (_nested(1000), _deep_object(1000)):
        r = pc.send(pc.envelope(b'{"computer_name":' + inner + b"}"))
        assert r.status_code == 400, r.text
        assert "nested too deeply" in r.json()["detail"]
    assert coordinator.row(pc.id).seq is None
    assert pc.report().status_code == 200  # the computer's next honest report applies


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "application/jsonx", "json"],
)
@pytest.mark.parametrize("path", ["/api/v1/reports", "/api/v1/enroll"])
def test_json_bodies_need_application_json(
    coordinator: Coordinator, path: str, content_type: str | None
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    r = coordinator.http.post(path, content=b"{}", headers=headers)
    assert r.status_code == 415, r.text
    assert "application/json" in r.json()["detail"]


def test_application_json_with_a_charset_is_accepted(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    r = coordinator.http.post(
        "/api/v1/reports",
        content=signing.encode_envelope(pc.envelope()),
        headers={"content-type": "Application/JSON; charset=utf-8"},
    )
    assert r.status_code == 200, r.text


def _lease(**kw: Any) -> LeaseReport:
    fields: dict[str, Any] = {
        "lease_id": "lease-0a1b2c3d4e5f",
        "gpu_uuids": [GPU_A],
        "granted_mib": 1024,
        "project": "vision",
        "observed_mib": {GPU_A: 512},
    }
    return LeaseReport(**(fields | kw))


def _booking(**kw: Any) -> BookingReport:
    fields: dict[str, Any] = {
        "booking_id": "book-0a1b2c3d",
        "gpu_uuids": [GPU_A],
        "mib": 1024,
        "start_at": 1_796_003_600.0,
        "end_at": 1_796_007_200.0,
        "project": "vision",
    }
    return BookingReport(**(fields | kw))


PLANTED: list[tuple[str, dict[str, Any], str]] = [
    ("broker_version", {"broker_version": f"0.1.0+{GITHUB}"}, "broker_version"),
    ("telemetry_source", {"telemetry_source": AWS_KEY}, "telemetry_source"),
    ("gpu name", {"gpus": [gpu_report(name=f"RTX {GITHUB}")]}, "gpus[0].name"),
    ("gpu uuid", {"gpus": [gpu_report(uuid=f"GPU-{GITHUB}")]}, "gpus[0].uuid"),
    ("lease id", {"leases": [_lease(lease_id=GITHUB)]}, "leases[0].lease_id"),
    ("lease gpu", {"leases": [_lease(gpu_uuids=[f"GPU-{AWS_KEY}"])]}, "leases[0].gpu_uuids[0]"),
    (
        "observed_mib key",
        {"leases": [_lease(observed_mib={GPU_A: 1, f"MIG-{GITHUB}": 7})]},
        "leases[0].observed_mib.key[1]",
    ),
    ("job id", {"jobs": [JobSnapshot(job_id=GITHUB, project="vision")]}, "jobs[0].job_id"),
    ("booking id", {"bookings": [_booking(booking_id=GITHUB)]}, "bookings[0].booking_id"),
    (
        "booking gpu",
        {"bookings": [_booking(gpu_uuids=[f"GPU-{AWS_KEY}"])]},
        "bookings[0].gpu_uuids[0]",
    ),
    ("booking owner", {"bookings": [_booking(owner=GITHUB)]}, "bookings[0].owner"),
    ("booking session", {"bookings": [_booking(session=AWS_KEY)]}, "bookings[0].session"),
]


@pytest.mark.parametrize(("label", "fields", "path"), PLANTED, ids=[p[0] for p in PLANTED])
def test_a_secret_in_any_text_field_is_redacted_and_flagged(
    coordinator: Coordinator, label: str, fields: dict[str, Any], path: str
) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    r = pc.report(payload().model_copy(update=fields))
    assert r.status_code == 200, r.text
    assert r.json()["applied"] is True
    assert r.json()["flagged_fields"] == [path]
    view = coordinator.computer("vision", pc.id)
    assert view["flagged"] is True
    assert [(f["field"], f["rule"].split(":")[0]) for f in view["flags"]] == [(path, "secret")]
    fleet = coordinator.http.get("/api/v1/fleet", headers=coordinator.viewer("vision")).text
    with coordinator.engine.connect() as conn:
        dump = json.dumps(
            [
                [str(v) for v in row]
                for table in ("computers", "history_points")
                for row in conn.execute(sa.text(f"SELECT * FROM {table}"))
            ]
        )
    for text in (fleet, json.dumps(view), dump, r.text):
        assert GITHUB not in text and AWS_KEY not in text
    assert REDACTED in json.dumps(view)


def test_redacted_observed_key_keeps_its_mib(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    lease = _lease(observed_mib={GPU_A: 1, f"MIG-{GITHUB}": 7})
    assert pc.report(payload(leases=[lease])).status_code == 200
    stored = coordinator.row(pc.id).state["leases"][0]
    assert stored["observed_mib"] == {GPU_A: 1, REDACTED: 7}
    assert stored["lease_id"] == "lease-0a1b2c3d4e5f"  # clean identifiers stay as sent


def _raw_payload(**changes: Any) -> bytes:
    """A valid payload as JSON with fields replaced (bypassing the model's own checks)."""
    data = json.loads(payload(leases=[_lease()], jobs=[JobSnapshot(job_id="job-1")]).to_bytes())
    for dotted, value in changes.items():
        target = data
        *head, last = dotted.split(".")
        for part in head:
            target = target[int(part)] if part.isdigit() else target[part]
        target[last] = value
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    "change",
    [
        {"gpus.0.telemetry": "fine"},
        {"leases.0.state": GITHUB},
        {"jobs.0.state": "done"},
        {"leases.0.lease_id": "lease one"},
        {"leases.0.lease_id": "x" * 65},
        {"jobs.0.job_id": "job/../1"},
        {"gpus.0.uuid": "0"},
        {"gpus.0.uuid": "GPU-with space"},
        {"leases.0.gpu_uuids": ["gpu 0"]},
        {"leases.0.observed_mib": {"not-a-gpu": 5}},
        {"run_id": "run 1"},
    ],
    ids=lambda c: next(iter(c)),
)
def test_identifiers_and_states_outside_their_patterns_are_422(
    coordinator: Coordinator, change: dict[str, Any]
) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    r = pc.send(pc.envelope(_raw_payload(**change)))
    assert r.status_code == 422, r.text
    assert coordinator.row(pc.id).seq is None
    assert GITHUB not in r.text


def test_every_state_name_the_schema_allows_is_accepted(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    states = ["queued", "active", "released", "expired", "holder_exited", "revoked"]
    jobs = ["queued", "running", "succeeded", "failed", "cancelled", "stalled"]
    names: list[TelemetryStateName] = ["ok", "stale", "unavailable", "lost", "unknown_capacity"]
    p = ReportPayload.model_validate(
        json.loads(payload().to_bytes())
        | {
            "gpus": [gpu_report(index=i, telemetry=t).model_dump() for i, t in enumerate(names)],
            "leases": [
                _lease(lease_id=f"lease-{i}", state=s).model_dump() for i, s in enumerate(states)
            ],
            "jobs": [{"job_id": f"job-{i}", "state": s} for i, s in enumerate(jobs)],
        }
    )
    r = pc.report(p)
    assert r.status_code == 200 and r.json()["flagged_fields"] == [], r.text
