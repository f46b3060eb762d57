"""Description rules run again on the server: a rejected field is stored redacted, flagged."""

from __future__ import annotations

import json

import sqlalchemy as sa

from rbroker_protocol.reports import BookingReport, JobSnapshot, LeaseReport, QueueEntry
from tests.fakes.reports import payload
from tests.server.conftest import Coordinator

AWS_KEY = "AKIA" + "Z7Q2M4N8P1R5T3V6"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"


def test_rejected_description_is_redacted_and_the_computer_flagged(
    coordinator: Coordinator,
) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    p = payload(
        leases=[
            LeaseReport(
                lease_id="l1",
                gpu_uuids=["GPU-1"],
                granted_mib=1024,
                owner="alice",
                project="vision",
                session="run-42",
                purpose=f"sync with {AWS_KEY}",
            )
        ],
        queue=[QueueEntry(mib=2048, project="vision", purpose="fine-tune ViT-B")],
        jobs=[JobSnapshot(job_id="j1", project="vision", purpose="embed", handler=JWT)],
    )
    r = pc.report(p)
    assert r.status_code == 200, r.text
    ack = r.json()
    assert ack["applied"] is True
    assert ack["flagged_fields"] == ["leases[0].purpose", "jobs[0].handler"]

    view = coordinator.computer("vision", pc.id)
    assert view["flagged"] is True and view["flagged_at"]
    assert [f["field"] for f in view["flags"]] == ["leases[0].purpose", "jobs[0].handler"]
    assert all(f["rule"].startswith("secret:") for f in view["flags"])
    assert view["leases"][0]["purpose"] == "[redacted]"
    assert view["leases"][0]["session"] == "run-42"  # clean fields kept
    assert view["jobs"][0]["handler"] == "[redacted]"
    assert view["queue"][0]["purpose"] == "fine-tune ViT-B"

    # The secret is nowhere: not in any response, not in the database.
    fleet = coordinator.http.get("/api/v1/fleet", headers=coordinator.viewer("vision")).text
    assert AWS_KEY not in fleet and JWT not in fleet and AWS_KEY not in r.text
    with coordinator.engine.connect() as conn:
        dump = json.dumps(
            [
                [str(v) for v in row]
                for table in ("computers", "history_points")
                for row in conn.execute(sa.text(f"SELECT * FROM {table}"))
            ]
        )
    assert AWS_KEY not in dump and JWT not in dump


def test_flag_stays_after_a_clean_report(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    assert pc.report(payload(name="mail me at someone@example.com")).json()["flagged_fields"] == [
        "computer_name"
    ]
    assert coordinator.computer("vision", pc.id)["reported_name"] == "[redacted]"
    assert pc.report(payload(name="lab-1")).json()["flagged_fields"] == []
    view = coordinator.computer("vision", pc.id)
    assert view["flagged"] is True and view["reported_name"] == "lab-1"


def test_booking_descriptions_are_checked_as_a_leases(coordinator: Coordinator) -> None:
    """A booking's owner, project, session and purpose, its id and GPU UUIDs pass the same
    rules as a lease's: a value that breaks one is stored redacted and flagged."""
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    booked = {"mib": 10_000, "start_at": 1_796_003_600.0, "end_at": 1_796_010_800.0}
    p = payload(
        bookings=[
            BookingReport(
                booking_id="book-0001",
                gpu_uuids=["GPU-1"],
                owner="alice",
                project="vision",
                session="run-42",
                purpose=f"sync with {AWS_KEY}",
                **booked,
            ),
            BookingReport(
                booking_id="book-0002",
                gpu_uuids=["GPU-1", f"GPU-{AWS_KEY}"],
                owner="bob",
                project="nlp",
                purpose="fine-tune ViT-B",
                **booked,
            ),
        ],
    )
    r = pc.report(p)
    assert r.status_code == 200, r.text
    assert r.json()["flagged_fields"] == ["bookings[0].purpose", "bookings[1].gpu_uuids[1]"]
    stored = coordinator.row(pc.id).state["bookings"]
    assert stored[0]["purpose"] == "[redacted]" and stored[0]["session"] == "run-42"
    assert stored[1]["gpu_uuids"] == ["GPU-1", "[redacted]"]
    assert stored[1]["purpose"] == "fine-tune ViT-B"
    with coordinator.engine.connect() as conn:
        dump = json.dumps(
            [[str(v) for v in row] for row in conn.execute(sa.text("SELECT * FROM computers"))]
        )
    assert AWS_KEY not in dump


def test_a_report_without_bookings_stores_none(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    assert pc.report(payload()).status_code == 200
    assert "bookings" not in coordinator.row(pc.id).state
