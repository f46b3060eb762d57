"""Fleet reads: one group per caller (viewer token or signed request), replay-resistant; the
room read (where the asked MiB fit, freshest first) and its refusals of a bad query."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from rbroker_protocol import signing
from rbroker_protocol.fleet import RoomView
from rbroker_protocol.reports import GpuReport, QueueEntry, TelemetryStateName
from rbroker_server.admin import operations as admin
from rbroker_server.db.engine import utcnow
from rbroker_server.db.tables import COMPUTERS
from tests.fakes.reports import gpu_report, payload
from tests.server.conftest import Coordinator, EnrolledComputer


@pytest.fixture
def two_groups(coordinator: Coordinator) -> tuple[EnrolledComputer, EnrolledComputer]:
    coordinator.group("alpha")
    coordinator.group("beta")
    a = coordinator.enroll("alpha", "alpha-1")
    b = coordinator.enroll("beta", "beta-1")
    assert a.report().status_code == 200
    assert b.report().status_code == 200
    return a, b


def test_viewer_sees_only_its_group(
    coordinator: Coordinator, two_groups: tuple[EnrolledComputer, EnrolledComputer]
) -> None:
    a, b = two_groups
    fleet = coordinator.fleet("alpha")
    assert fleet["group"] == "alpha"
    assert [c["id"] for c in fleet["computers"]] == [a.id]
    assert b.id not in str(fleet)
    assert coordinator.computer("alpha", a.id)["name"] == "alpha-1"
    r = coordinator.http.get(f"/api/v1/computers/{b.id}", headers=coordinator.viewer("alpha"))
    assert r.status_code == 404
    r = coordinator.http.get(
        f"/api/v1/computers/{b.id}/history", headers=coordinator.viewer("alpha")
    )
    assert r.status_code == 404
    r = coordinator.http.get("/api/v1/computers/c_nope", headers=coordinator.viewer("alpha"))
    assert r.status_code == 404


def test_enrolled_computer_reads_only_its_group(
    coordinator: Coordinator, two_groups: tuple[EnrolledComputer, EnrolledComputer]
) -> None:
    a, b = two_groups
    r = a.get("/api/v1/fleet")
    assert r.status_code == 200, r.text
    assert [c["id"] for c in r.json()["computers"]] == [a.id]
    assert a.get(f"/api/v1/computers/{b.id}").status_code == 404
    assert a.get(f"/api/v1/computers/{a.id}").status_code == 200
    assert b.get("/api/v1/fleet").json()["group"] == "beta"


def test_no_or_bad_credentials_are_401(
    coordinator: Coordinator, two_groups: tuple[EnrolledComputer, EnrolledComputer]
) -> None:
    http = coordinator.http
    assert http.get("/api/v1/fleet").status_code == 401
    assert http.get("/api/v1/fleet", headers={"authorization": "Bearer nope"}).status_code == 401
    token = coordinator.tokens["alpha"]
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    assert (
        http.get("/api/v1/fleet", headers={"authorization": f"Bearer {forged}"}).status_code == 401
    )
    # An enrollment code is not a viewer token.
    code = admin.create_enroll_code(coordinator.engine, "alpha", 60).text
    assert http.get("/api/v1/fleet", headers={"authorization": f"Bearer {code}"}).status_code == 401


def test_revoked_token_is_401(
    coordinator: Coordinator, two_groups: tuple[EnrolledComputer, EnrolledComputer]
) -> None:
    assert admin.revoke_token(coordinator.engine, "alpha", coordinator.tokens["alpha"])
    r = coordinator.http.get("/api/v1/fleet", headers=coordinator.viewer("alpha"))
    assert r.status_code == 401
    assert coordinator.fleet("beta")["group"] == "beta"


def test_signed_request_replay_is_refused(
    coordinator: Coordinator, two_groups: tuple[EnrolledComputer, EnrolledComputer]
) -> None:
    a, _ = two_groups
    headers = a.signed_headers("GET", "/api/v1/fleet")
    assert coordinator.http.get("/api/v1/fleet", headers=headers).status_code == 200
    assert coordinator.http.get("/api/v1/fleet", headers=headers).status_code == 401


def test_signed_request_outside_the_window_is_refused(
    coordinator: Coordinator, two_groups: tuple[EnrolledComputer, EnrolledComputer]
) -> None:
    a, _ = two_groups
    window = int(coordinator.settings.request_window_s)
    for ts in (int(time.time()) - window - 5, int(time.time()) + window + 5):
        headers = a.signed_headers("GET", "/api/v1/fleet", timestamp=ts)
        assert coordinator.http.get("/api/v1/fleet", headers=headers).status_code == 401


def test_signature_binds_method_and_path(
    coordinator: Coordinator, two_groups: tuple[EnrolledComputer, EnrolledComputer]
) -> None:
    a, _ = two_groups
    headers = a.signed_headers("GET", f"/api/v1/computers/{a.id}")
    assert coordinator.http.get("/api/v1/fleet", headers=headers).status_code == 401
    headers = a.signed_headers("POST", "/api/v1/fleet")
    assert coordinator.http.get("/api/v1/fleet", headers=headers).status_code == 401
    headers = a.signed_headers("GET", "/api/v1/fleet?limit=5")
    assert coordinator.http.get("/api/v1/fleet?limit=5", headers=headers).status_code == 200
    headers = a.signed_headers("GET", "/api/v1/fleet?limit=5")
    assert coordinator.http.get("/api/v1/fleet?limit=6", headers=headers).status_code == 401
    partial = {signing.HEADER_COMPUTER: a.id}
    assert coordinator.http.get("/api/v1/fleet", headers=partial).status_code == 401


def test_revoked_computer_cannot_read(
    coordinator: Coordinator, two_groups: tuple[EnrolledComputer, EnrolledComputer]
) -> None:
    a, _ = two_groups
    admin.revoke_computer(coordinator.engine, a.id)
    assert a.get("/api/v1/fleet").status_code == 403
    # Revoked computers leave the fleet view; the detail still says revoked.
    assert coordinator.fleet("alpha")["computers"] == []
    assert coordinator.computer("alpha", a.id)["revoked"] is True


def test_health_and_openapi(coordinator: Coordinator) -> None:
    r = coordinator.http.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    schema = coordinator.http.get("/schema/openapi.json").json()
    for path in (
        "/api/v1/enroll",
        "/api/v1/reports",
        "/api/v1/fleet",
        "/api/v1/fleet/room",
        "/api/v1/computers/{computer_id}",
        "/api/v1/computers/{computer_id}/history",
        "/healthz",
    ):
        assert path in schema["paths"], path


def _gpu(n: int, available_mib: int, telemetry: TelemetryStateName = "ok") -> GpuReport:
    """A 48 GiB GPU reporting `available_mib` whatever its other figures say."""
    uuid = f"GPU-5a1e0000-0000-0000-0000-00000000000{n}"
    return gpu_report(uuid, n, telemetry=telemetry, total_mib=49152, available_mib=available_mib)


def test_room_lists_where_the_mib_fit_freshest_first_in_the_callers_group(
    coordinator: Coordinator,
) -> None:
    coordinator.group("alpha")
    coordinator.group("beta")
    older = coordinator.enroll("alpha", "lab-older")
    newer = coordinator.enroll("alpha", "lab-newer")
    lost = coordinator.enroll("alpha", "lab-lost")
    other = coordinator.enroll("beta", "beta-1")
    waiting = QueueEntry(mib=40000, owner="bob", reason="waiting: 40 000 asked")
    assert older.report(payload("lab-older", gpus=[_gpu(1, 22847)])).status_code == 200
    assert (
        newer.report(
            payload("lab-newer", gpus=[_gpu(1, 10000), _gpu(2, 30000)], queue=[waiting])
        ).status_code
        == 200
    )
    assert lost.report(payload("lab-lost", gpus=[_gpu(1, 40000, "lost")])).status_code == 200
    assert other.report(payload("beta-1", gpus=[_gpu(1, 40000)])).status_code == 200
    # lab-older's last report is 20 s old: stale (past stale_after_s, 15 s)
    with coordinator.engine.begin() as conn:
        conn.execute(
            sa.update(COMPUTERS)
            .where(COMPUTERS.c.id == older.id)
            .values(last_seen_at=utcnow() - timedelta(seconds=20))
        )

    def room(query: str) -> dict[str, Any]:
        r = coordinator.http.get(f"/api/v1/fleet/room?{query}", headers=coordinator.viewer("alpha"))
        assert r.status_code == 200, r.text
        return RoomView.model_validate(r.json()).model_dump(mode="json")

    view = room("mib=20000")
    assert (view["group"], view["mib"], view["gpus"]) == ("alpha", 20000, 1)
    names = [c["name"] for c in view["computers"]]
    assert names == ["lab-newer", "lab-older"]  # not lab-lost (telemetry lost), not beta's
    fresh, stale = view["computers"]
    assert fresh["freshness"]["state"] == "online" and fresh["freshness"]["age_s"] < 15
    assert stale["freshness"]["state"] == "stale" and 19 <= stale["freshness"]["age_s"] < 60
    assert [(g["index"], g["available_mib"]) for g in fresh["gpus"]] == [(2, 30000)]
    assert fresh["waiting"] == 1 and stale["waiting"] == 0
    assert stale["gpus"][0]["available_mib"] == 22847 and stale["gpus"][0]["total_mib"] == 49152
    both = room("mib=5000&gpus=2")["computers"]
    assert [c["name"] for c in both] == ["lab-newer"]
    assert [g["available_mib"] for g in both[0]["gpus"]] == [30000, 10000]  # most room first
    assert room("mib=20000&gpus=2")["computers"] == []
    assert room("mib=30001")["computers"] == []
    # an enrolled computer reads its own group's room, signed
    r = newer.get("/api/v1/fleet/room?mib=20000")
    assert r.status_code == 200, r.text
    assert [c["name"] for c in r.json()["computers"]] == ["lab-newer", "lab-older"]
    r = other.get("/api/v1/fleet/room?mib=20000")
    assert [c["name"] for c in r.json()["computers"]] == ["beta-1"]


def test_room_refuses_a_bad_query_in_one_line(coordinator: Coordinator) -> None:
    coordinator.group("alpha")
    viewer = coordinator.viewer("alpha")
    cases = {
        "": "mib is missing",
        "gpus=2": "mib is missing",
        "mib=-5": "mib must be a whole number from 1 to 1099511627776 (MiB on each GPU), not '-5'",
        "mib=abc": "not 'abc'",
        "mib=1.5": "not '1.5'",
        "mib=0": "not '0'",
        f"mib={10**20}": "mib must be a whole number from 1 to 1099511627776",
        "mib=100&gpus=0": "gpus must be a whole number from 1 to 64 (GPUs of one computer), "
        "not '0'",
        "mib=100&gpus=65": "not '65'",
        "mib=100&mib=200": "mib is given 2 times; give it once",
        "mib=100&gpu=2": "unknown query parameter 'gpu' (known: mib, gpus)",
    }
    for query, words in cases.items():
        r = coordinator.http.get(f"/api/v1/fleet/room?{query}", headers=viewer)
        assert r.status_code == 400, (query, r.text)
        detail = r.json()["detail"]
        assert words in detail and "\n" not in detail, (query, detail)
    assert coordinator.http.get("/api/v1/fleet/room?mib=100").status_code == 401
