"""Fleet reads: one group per caller (viewer token or signed request), replay-resistant."""

from __future__ import annotations

import time

import pytest

from rbroker_protocol import signing
from rbroker_server.admin import operations as admin
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
    headers = a.signed_headers("GET", "/api/v1/fleet?x=1")
    assert coordinator.http.get("/api/v1/fleet?x=1", headers=headers).status_code == 200
    headers = a.signed_headers("GET", "/api/v1/fleet?x=1")
    assert coordinator.http.get("/api/v1/fleet?x=2", headers=headers).status_code == 401
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
        "/api/v1/computers/{computer_id}",
        "/api/v1/computers/{computer_id}/history",
        "/healthz",
    ):
        assert path in schema["paths"], path
