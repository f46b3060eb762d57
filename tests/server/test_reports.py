"""POST /api/v1/reports: verification before parsing, ordering by (run, seq), size limit."""

from __future__ import annotations

import base64
import json

import nacl.signing

from rbroker_protocol import signing
from tests.fakes.reports import payload
from tests.server.conftest import Coordinator


def test_authentic_report_is_applied(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    r = pc.report()
    assert r.status_code == 200, r.text
    assert r.json()["applied"] is True
    row = coordinator.row(pc.id)
    assert (row.run_id, row.seq, row.reports_applied) == ("run-1", 1, 1)
    assert row.last_seen_at is not None and row.last_seen_at.tzinfo is not None


def test_one_flipped_payload_byte_is_401(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    env = pc.envelope()
    raw = bytearray(base64.b64decode(env["payload"]))
    raw[len(raw) // 2] ^= 0x01
    env["payload"] = base64.b64encode(bytes(raw)).decode()
    r = pc.send(env)
    assert r.status_code == 401
    assert coordinator.row(pc.id).seq is None  # nothing applied


def test_changed_seq_or_signature_is_401(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    env = pc.envelope()
    assert pc.send({**env, "seq": env["seq"] + 1}).status_code == 401
    other = nacl.signing.SigningKey.generate()
    forged = signing.sign_report(other, pc.id, "run-1", 9, payload().to_bytes())
    assert pc.send(forged).status_code == 401


def test_unknown_computer_and_malformed_envelopes_are_401(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    key = nacl.signing.SigningKey.generate()
    env = signing.sign_report(key, "c_unknown", "run-1", 1, payload().to_bytes())
    assert pc.send(env).status_code == 401
    for body in (b"not json", b"[]", b"{}", json.dumps({**pc.envelope(), "v": 99}).encode()):
        assert pc.send(body).status_code == 401, body


def test_replay_is_acknowledged_and_not_applied(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    env = pc.envelope()
    assert pc.send(env).json()["applied"] is True
    r = pc.send(env)
    assert r.status_code == 200
    assert (r.json()["applied"], r.json()["code"]) == (False, "not_newer")
    assert coordinator.row(pc.id).reports_applied == 1


def test_older_seq_is_acknowledged_and_not_applied(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    old = pc.envelope(payload(name="old-name"), seq=5)
    new = pc.envelope(payload(name="new-name"), seq=6)
    assert pc.send(new).json()["applied"] is True
    r = pc.send(old)
    assert r.status_code == 200 and r.json()["applied"] is False
    row = coordinator.row(pc.id)
    assert (row.seq, row.reported_name) == (6, "new-name")


def test_new_run_after_restart_is_accepted_and_old_run_retired(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    first_run = pc.envelope(seq=100)
    assert pc.send(first_run).json()["applied"] is True
    # The broker restarts: a new run_id, seq starting again from 1.
    restarted = pc.envelope(payload(run_id="run-2", name="after"), run_id="run-2", seq=1)
    r = pc.send(restarted)
    assert (r.json()["applied"], r.json()["code"]) == (True, "new_run")
    assert (coordinator.row(pc.id).run_id, coordinator.row(pc.id).seq) == ("run-2", 1)
    # Envelopes of the replaced run never apply again, even with a higher seq.
    stale = pc.envelope(payload(run_id="run-1"), run_id="run-1", seq=101)
    r = pc.send(stale)
    assert r.status_code == 200
    assert (r.json()["applied"], r.json()["code"]) == (False, "run_retired")
    assert pc.send(first_run).json()["applied"] is False
    assert coordinator.row(pc.id).run_id == "run-2"


def test_revoked_computer_gets_403(coordinator: Coordinator) -> None:
    from rbroker_server.admin import operations as admin

    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    assert pc.report().status_code == 200
    assert admin.revoke_computer(coordinator.engine, pc.id)
    assert pc.report().status_code == 403
    # A forged report for a revoked computer is still just unauthenticated.
    key = nacl.signing.SigningKey.generate()
    forged = signing.sign_report(key, pc.id, "run-1", 50, payload().to_bytes())
    assert pc.send(forged).status_code == 401


def test_body_over_one_mib_is_413(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    body = b'{"pad":"' + b"x" * (1024 * 1024) + b'"}'
    r = pc.send(body)
    assert r.status_code == 413
    # Also when the client streams it without a Content-Length.
    r = coordinator.http.post(
        "/api/v1/reports",
        content=iter([body[:4096], body[4096:]]),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413


def test_authentic_but_invalid_payload_is_422(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    assert pc.send(pc.envelope(b'{"computer_name": 5}')).status_code == 422
    mismatch = pc.envelope(payload(run_id="run-x"), run_id="run-1")
    assert pc.send(mismatch).status_code == 422
    assert coordinator.row(pc.id).seq is None


def test_fields_outside_the_schema_are_never_stored(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    raw = json.loads(payload().to_bytes())
    raw["gpus"][0]["processes"] = [{"pid": 4242, "name": "python", "cmdline": "train --pw=x"}]
    raw["environment"] = {"AWS_SECRET_ACCESS_KEY": "abc"}
    r = pc.send(pc.envelope(json.dumps(raw).encode()))
    assert r.json()["applied"] is True
    stored = json.dumps(coordinator.row(pc.id).state)
    assert "4242" not in stored and "cmdline" not in stored and "AWS_SECRET" not in stored


def test_a_broker_told_its_run_is_retired_recovers_with_a_new_run(
    coordinator: Coordinator,
) -> None:
    """A report of a run the coordinator never saw (withheld, then replayed late) becomes
    the current run; the live broker is told `run_retired` and starts a fresh run."""
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    withheld = pc.envelope(payload(run_id="run-0", name="old"), run_id="run-0", seq=9)
    assert pc.report(seq=1).json()["code"] == "new_run"
    assert pc.send(withheld).json()["code"] == "new_run"  # unseen run: indistinguishable
    r = pc.report(seq=2)
    assert (r.json()["applied"], r.json()["code"]) == (False, "run_retired")
    fresh = pc.envelope(payload(run_id="run-1b", name="live"), run_id="run-1b", seq=1)
    assert pc.send(fresh).json()["code"] == "new_run"
    assert coordinator.row(pc.id).reported_name == "live"


def test_the_ingest_answer_encodes_as_the_report_ack() -> None:
    """`schema.Ack` has `ReportAck`'s fields in its order with its defaults, and its JSON is
    `ReportAck.model_dump_json()` byte for byte, strings with escapes and any text included."""
    import random
    import typing

    import msgspec

    from rbroker_server.reports.schema import Ack, ReportAck, encode_ack

    assert Ack.__struct_fields__ == tuple(ReportAck.model_fields)
    assert encode_ack(Ack(True, "applied", "applied", "c_1", "r", 1)) == (
        ReportAck(
            applied=True, code="applied", reason="applied", computer_id="c_1", run_id="r", seq=1
        )
        .model_dump_json()
        .encode()
    )
    rng = random.Random(44)
    alphabet = [chr(c) for c in range(0, 0x80)] + ["é", "€", "\u2028", "\U0001f600", "\ud7ff"]
    codes = typing.get_args(ReportAck.model_fields["code"].annotation)
    assert codes  # a Literal
    for _ in range(500):

        def text() -> str:
            return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))

        values = {
            "applied": rng.random() < 0.5,
            "code": rng.choice(codes),
            "reason": text(),
            "computer_id": text(),
            "run_id": text(),
            "seq": rng.choice([0, 1, 2**31, 2**53 + 1, 2**63 - 1]),
            "current_run_counter": rng.choice([None, 0, 7, 2**40]),
            "flagged_fields": [text() for _ in range(rng.randrange(0, 3))],
        }
        expected = ReportAck(**values).model_dump_json().encode()  # type: ignore[arg-type]
        assert encode_ack(Ack(**values)) == expected, values
        assert msgspec.json.decode(expected, type=Ack) == Ack(**values)
