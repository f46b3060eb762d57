"""Report envelopes and request signatures: known answers, round trips, tampering."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import nacl.signing
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rbroker_protocol import signing

VECTORS = json.loads((Path(__file__).parent.parent / "data" / "signing_vectors.json").read_text())

ids = st.from_regex(r"[A-Za-z0-9_.:-]{1,64}", fullmatch=True)
seqs = st.integers(min_value=0, max_value=signing.MAX_SEQ)


def _lp(b: bytes) -> bytes:
    return len(b).to_bytes(8, "big") + b


@pytest.mark.parametrize("vec", VECTORS["reports"], ids=lambda v: f"seq{v['seq']}")
def test_report_known_answers(vec: dict) -> None:
    key = nacl.signing.SigningKey(bytes.fromhex(vec["seed"]))
    payload = bytes.fromhex(vec["payload_hex"])
    # The encoding, written out independently of the implementation.
    expected = (
        b"rbroker/report/v1\x00"
        + _lp(vec["computer_id"].encode())
        + _lp(vec["run_id"].encode())
        + struct.pack(">Q", vec["seq"])
        + _lp(payload)
    )
    assert expected.hex() == vec["message_hex"]
    message = signing.report_message(vec["computer_id"], vec["run_id"], vec["seq"], payload)
    assert message == expected
    assert signing.public_key_b64(key) == vec["public_key"]
    env = signing.sign_report(key, vec["computer_id"], vec["run_id"], vec["seq"], payload)
    assert env == vec["envelope"]
    parsed = signing.parse_envelope(signing.encode_envelope(vec["envelope"]))
    assert signing.verify_report(parsed, vec["public_key"]) == payload


@pytest.mark.parametrize("vec", VECTORS["requests"], ids=lambda v: v["computer_id"])
def test_request_known_answers(vec: dict) -> None:
    key = nacl.signing.SigningKey(bytes.fromhex(vec["seed"]))
    message = signing.request_message(
        vec["computer_id"], vec["method"], vec["path"], vec["timestamp"], vec["nonce"]
    )
    assert message.hex() == vec["message_hex"]
    headers = signing.sign_request(
        key, vec["computer_id"], vec["method"], vec["path"], vec["timestamp"], vec["nonce"]
    )
    assert headers[signing.HEADER_SIGNATURE] == vec["signature"]
    signed = signing.parse_request_headers(headers)
    assert signed is not None
    signing.verify_request(signed, vec["public_key"], vec["method"], vec["path"])
    with pytest.raises(signing.BadSignature):
        signing.verify_request(signed, vec["public_key"], "POST", vec["path"])
    with pytest.raises(signing.BadSignature):
        signing.verify_request(signed, vec["public_key"], vec["method"], vec["path"] + "x")


@settings(max_examples=60, deadline=None)
@given(cid=ids, run=ids, seq=seqs, payload=st.binary(max_size=512))
def test_report_round_trip(cid: str, run: str, seq: int, payload: bytes) -> None:
    key = nacl.signing.SigningKey.generate()
    body = signing.encode_envelope(signing.sign_report(key, cid, run, seq, payload))
    env = signing.parse_envelope(body)
    assert (env.computer_id, env.run_id, env.seq) == (cid, run, seq)
    assert signing.verify_report(env, bytes(key.verify_key)) == payload


@settings(max_examples=60, deadline=None)
@given(payload=st.binary(min_size=1, max_size=256), data=st.data())
def test_any_flipped_payload_byte_fails(payload: bytes, data: st.DataObject) -> None:
    key = nacl.signing.SigningKey.generate()
    env = signing.sign_report(key, "c1", "r1", 5, payload)
    i = data.draw(st.integers(0, len(payload) - 1))
    bit = data.draw(st.integers(0, 7))
    tampered = bytearray(payload)
    tampered[i] ^= 1 << bit
    env["payload"] = base64.b64encode(bytes(tampered)).decode()
    with pytest.raises(signing.BadSignature):
        signing.verify_report(signing.parse_envelope(env), key.verify_key)


@pytest.mark.parametrize(
    "change",
    [
        {"computer_id": "c2"},
        {"run_id": "r2"},
        {"seq": 6},
    ],
)
def test_changed_header_field_fails(change: dict) -> None:
    key = nacl.signing.SigningKey.generate()
    env = {**signing.sign_report(key, "c1", "r1", 5, b"{}"), **change}
    with pytest.raises(signing.BadSignature):
        signing.verify_report(signing.parse_envelope(env), key.verify_key)


def test_other_key_fails() -> None:
    env = signing.sign_report(nacl.signing.SigningKey.generate(), "c1", "r1", 5, b"{}")
    with pytest.raises(signing.BadSignature):
        signing.verify_report(
            signing.parse_envelope(env), nacl.signing.SigningKey.generate().verify_key
        )


def test_length_prefix_is_unambiguous() -> None:
    # Moving a character between adjacent fields changes the signed bytes.
    a = signing.report_message("ab", "c", 1, b"x")
    b = signing.report_message("a", "bc", 1, b"x")
    assert a != b


def test_request_signature_is_not_a_report_signature() -> None:
    assert signing.REPORT_CONTEXT != signing.REQUEST_CONTEXT


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"v": 2, "computer_id": "c", "run_id": "r", "seq": 0, "payload": "", "sig": ""}',
        b'{"v": 1, "computer_id": "", "run_id": "r", "seq": 0, "payload": "", "sig": ""}',
        b'{"v": 1, "computer_id": "c", "run_id": "r", "seq": -1, "payload": "", "sig": ""}',
        b'{"v": 1, "computer_id": "c", "run_id": "r", "seq": true, "payload": "", "sig": ""}',
        b'{"v": 1, "computer_id": "c", "run_id": "r", "seq": 0, "payload": "!!", "sig": ""}',
        b'{"v": 1, "computer_id": "c", "run_id": "r", "seq": 0, "payload": "", "sig": "AA=="}',
    ],
)
def test_malformed_envelopes(body: bytes) -> None:
    with pytest.raises(signing.EnvelopeError):
        signing.parse_envelope(body)


def test_request_headers_partial_or_absent() -> None:
    assert signing.parse_request_headers({}) is None
    with pytest.raises(signing.EnvelopeError):
        signing.parse_request_headers({signing.HEADER_COMPUTER: "c1"})
    key = nacl.signing.SigningKey.generate()
    headers = signing.sign_request(key, "c1", "GET", "/p", 10**20 // 10**10)
    headers[signing.HEADER_TIMESTAMP] = "9" * 19
    with pytest.raises(signing.EnvelopeError):
        signing.parse_request_headers(headers)
