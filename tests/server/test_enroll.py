"""POST /api/v1/enroll: one-time, expiring codes, stored hashed; keys never replaced."""

from __future__ import annotations

import time

import nacl.signing
import pytest
import sqlalchemy as sa

from rbroker_protocol import signing
from rbroker_server.admin import operations as admin
from rbroker_server.db.models import EnrollCode
from tests.server.conftest import Coordinator


def _enroll(
    c: Coordinator, code: str, key: nacl.signing.SigningKey | None = None, name: str = "pc"
):
    key = key or nacl.signing.SigningKey.generate()
    return c.http.post(
        "/api/v1/enroll",
        json={"code": code, "name": name, "public_key": signing.public_key_b64(key)},
    )


def test_enroll_returns_a_computer_id_in_the_codes_group(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    code = admin.create_enroll_code(coordinator.engine, "vision", 600)
    r = _enroll(coordinator, code.text, name="lab-7")
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["group"] == "vision" and body["computer_id"].startswith("c_")
    computers = admin.list_computers(coordinator.engine, "vision")
    assert [(c.id, c.name) for c in computers] == [(body["computer_id"], "lab-7")]


def test_code_is_stored_hashed(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    code = admin.create_enroll_code(coordinator.engine, "vision", 600)
    table = EnrollCode.__table__  # type: ignore[attr-defined]
    with coordinator.engine.connect() as conn:
        row = conn.execute(sa.select(table)).one()
    secret = code.text.split("_", 2)[2]
    assert secret not in str(tuple(row)) and code.text not in str(tuple(row))


def test_code_used_twice_is_refused(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    code = admin.create_enroll_code(coordinator.engine, "vision", 600).text
    assert _enroll(coordinator, code).status_code == 201
    r = _enroll(coordinator, code)
    assert r.status_code == 401
    assert len(admin.list_computers(coordinator.engine)) == 1


def test_expired_code_is_refused(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    code = admin.create_enroll_code(coordinator.engine, "vision", 1).text
    time.sleep(1.2)
    assert _enroll(coordinator, code).status_code == 401
    assert admin.list_computers(coordinator.engine) == []


def test_wrong_or_malformed_codes_are_refused(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    code = admin.create_enroll_code(coordinator.engine, "vision", 600).text
    prefix, code_id, secret = code.split("_", 2)
    wrong = f"{prefix}_{code_id}_{'A' * len(secret)}"
    assert _enroll(coordinator, wrong).status_code == 401
    assert _enroll(coordinator, "hello").status_code == 401
    assert _enroll(coordinator, code.replace("rbe_", "rbv_", 1)).status_code == 401
    # The right code still works after the failures.
    assert _enroll(coordinator, code).status_code == 201


def test_known_key_is_never_replaced(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    key = nacl.signing.SigningKey.generate()
    first = admin.create_enroll_code(coordinator.engine, "vision", 600).text
    assert _enroll(coordinator, first, key).status_code == 201
    second = admin.create_enroll_code(coordinator.engine, "vision", 600).text
    assert _enroll(coordinator, second, key).status_code == 409
    # The refused attempt did not burn the code.
    assert _enroll(coordinator, second).status_code == 201


def test_bad_key_or_name_is_400(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    code = admin.create_enroll_code(coordinator.engine, "vision", 600).text
    r = coordinator.http.post(
        "/api/v1/enroll", json={"code": code, "name": "pc", "public_key": "A" * 40 + "AA=="}
    )
    assert r.status_code == 400
    key = signing.public_key_b64(nacl.signing.SigningKey.generate())
    r = coordinator.http.post(
        "/api/v1/enroll", json={"code": code, "name": "pc\x07", "public_key": key}
    )
    assert r.status_code == 400
    assert _enroll(coordinator, code).status_code == 201


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        # before: 400 with `"message":"'data'"`, the name of an internal key
        (b"", "the request body is empty: send a JSON object with code, name and public_key"),
        (b" \n", "the request body is empty: send a JSON object with code, name and public_key"),
        # before: "Input should be a valid dictionary or instance of EnrollRequest"
        (b"null", "the request body is null: send a JSON object with code, name and public_key"),
        (b"[]", "the request body is an array: send a JSON object with code, name and public_key"),
        (b'"x"', "the request body is a string: send a JSON object with code, name and public_key"),
        (b"7", "the request body is a number: send a JSON object with code, name and public_key"),
        (
            b"true",
            "the request body is a boolean: send a JSON object with code, name and public_key",
        ),
    ],
)
def test_a_body_that_is_no_object_is_refused_in_words(
    coordinator: Coordinator, body: bytes, detail: str
) -> None:
    r = coordinator.http.post(
        "/api/v1/enroll", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400, r.text
    assert r.json() == {"status_code": 400, "detail": detail}


def test_missing_fields_are_named(coordinator: Coordinator) -> None:
    r = coordinator.http.post(
        "/api/v1/enroll", content=b"{}", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400, r.text
    missing = {(e["key"], e["message"]) for e in r.json()["extra"]}
    assert missing == {(k, "Field required") for k in ("code", "name", "public_key")}
    assert "EnrollRequest" not in r.text and "'data'" not in r.text
