"""The report payload schema: round trips and the privacy rule (unknown fields dropped)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rbroker_protocol.reports import (
    REPORT_VERSION,
    BookingReport,
    GpuReport,
    JobSnapshot,
    LeaseReport,
    ReportPayload,
)


def sample() -> ReportPayload:
    return ReportPayload(
        computer_name="lab-1",
        broker_version="0.1.0",
        telemetry_source="simulated",
        run_id="run-1",
        generated_at=1_796_000_000.5,
        gpus=[GpuReport(uuid="GPU-1", index=0, name="Sim", total_mib=24576, available_mib=100)],
        leases=[
            LeaseReport(
                lease_id="l1",
                gpu_uuids=["GPU-1"],
                granted_mib=8192,
                project="vision",
                observed_mib={"GPU-1": 4096},
            )
        ],
        jobs=[JobSnapshot(job_id="j1", project="vision", handler="embed.encode_batch")],
        bookings=[
            BookingReport(
                booking_id="book-1a2b3c4d",
                gpu_uuids=["GPU-1"],
                mib=10_000,
                start_at=1_796_003_600.0,
                end_at=1_796_010_800.0,
                owner="alice",
                project="vision",
                purpose="fine-tune ViT-B",
                state="claimed",
                claimed_mib=4096,
            )
        ],
    )


def test_round_trip() -> None:
    p = sample()
    assert ReportPayload.from_bytes(p.to_bytes()) == p


def test_unknown_fields_are_dropped() -> None:
    raw = json.loads(sample().to_bytes())
    raw["leases"][0]["pid"] = 4242
    raw["leases"][0]["cmdline"] = "python train.py --token=x"
    raw["environment"] = {"HOME": "/root"}
    parsed = ReportPayload.from_bytes(json.dumps(raw).encode())
    dumped = parsed.model_dump_json()
    assert "4242" not in dumped and "cmdline" not in dumped and "environment" not in dumped


def test_rejects_bad_types() -> None:
    raw = json.loads(sample().to_bytes())
    raw["gpus"][0]["total_mib"] = -1
    with pytest.raises(ValidationError):
        ReportPayload.from_bytes(json.dumps(raw).encode())


@settings(max_examples=40, deadline=None)
@given(
    name=st.text(min_size=1, max_size=64),
    mibs=st.lists(st.integers(0, 2**40), max_size=5),
    purpose=st.text(max_size=200),
)
def test_round_trip_property(name: str, mibs: list[int], purpose: str) -> None:
    p = ReportPayload(
        computer_name=name,
        run_id="r",
        generated_at=0.0,
        gpus=[GpuReport(uuid=f"GPU-{i}", index=i, total_mib=m) for i, m in enumerate(mibs)],
        leases=[LeaseReport(lease_id="l", gpu_uuids=[], granted_mib=1, purpose=purpose)],
    )
    assert ReportPayload.from_bytes(p.to_bytes()) == p


def test_report_ack_parses_and_ignores_new_fields() -> None:
    from rbroker_protocol.reports import ReportAck

    raw = {
        "applied": False,
        "code": "run_retired",
        "reason": "not applied",
        "computer_id": "c_1",
        "run_id": "r",
        "seq": 3,
        "added_later": 1,
    }
    ack = ReportAck.model_validate(raw)
    assert ack.code == "run_retired" and ack.flagged_fields == []


def test_bookings_round_trip_and_are_optional() -> None:
    p = sample()
    assert p.report_version == REPORT_VERSION >= 6
    again = ReportPayload.from_bytes(p.to_bytes())
    assert again.bookings == p.bookings and again.bookings[0].claimed_mib == 4096
    # a broker before report version 6 sends none: an empty list, nothing left out
    raw = json.loads(p.to_bytes())
    del raw["bookings"], raw["bookings_left_out"]
    old = ReportPayload.from_bytes(json.dumps(raw).encode())
    assert old.bookings == [] and old.bookings_left_out == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("state", "pending"),
        ("booking_id", "book 1"),
        ("gpu_uuids", ["card-0"]),
        ("mib", -1),
        ("claimed_mib", 2**41),
    ],
)
def test_a_booking_breaking_the_schema_is_refused(field: str, value: object) -> None:
    raw = json.loads(sample().to_bytes())
    raw["bookings"][0][field] = value
    with pytest.raises(ValidationError):
        ReportPayload.from_bytes(json.dumps(raw).encode())


def test_at_most_a_thousand_bookings() -> None:
    raw = json.loads(sample().to_bytes())
    raw["bookings"] = raw["bookings"] * 1001
    with pytest.raises(ValidationError):
        ReportPayload.from_bytes(json.dumps(raw).encode())


def test_lease_idle_round_trips_and_is_optional() -> None:
    p = sample()
    assert REPORT_VERSION >= 7
    lease = p.leases[0].model_copy(update={"idle_state": "idle", "idle_s": 7800.0})
    again = ReportPayload.from_bytes(p.model_copy(update={"leases": [lease]}).to_bytes())
    assert (again.leases[0].idle_state, again.leases[0].idle_s) == ("idle", 7800.0)
    # a broker before report version 7 sends neither: unknown, no seconds
    raw = json.loads(p.to_bytes())
    for entry in raw["leases"]:
        entry.pop("idle_state", None)
        entry.pop("idle_s", None)
    old = ReportPayload.from_bytes(json.dumps(raw).encode())
    assert (old.leases[0].idle_state, old.leases[0].idle_s) == ("unknown", None)
    for field, value in (("idle_state", "asleep"), ("idle_s", -1)):
        bad = json.loads(p.to_bytes())
        bad["leases"][0][field] = value
        with pytest.raises(ValidationError):
            ReportPayload.from_bytes(json.dumps(bad).encode())
