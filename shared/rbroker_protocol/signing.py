"""Signed report envelopes and signed requests between a computer and the coordinator (§7).

A report travels as the envelope ``{v, computer_id, run_id, seq, payload, sig}`` where
``payload`` is the base64 of the exact JSON bytes the computer produced and ``sig`` is an
Ed25519 signature (base64) over::

    REPORT_CONTEXT || lp(computer_id) || lp(run_id) || u64(seq) || lp(payload bytes)

``lp(x)`` is the 8-byte big-endian length of ``x`` followed by ``x`` (UTF-8 for text) and
``u64`` is an 8-byte big-endian unsigned integer, so no two different field tuples ever
produce the same signed bytes. `verify_report` returns the payload bytes only when the
signature holds; the caller parses them afterwards, never before.

Fleet reads by an enrolled computer are signed the same way over the method, the request
target (the path with its query) exactly as the client sent it on the wire, a Unix
timestamp and a random nonce (`sign_request` / `verify_request`): the server accepts a
timestamp within a short window and each nonce once. Behind a reverse proxy that serves
the coordinator under a path prefix, the target includes the prefix (`/rbroker/api/v1/fleet`)
and the server verifies against its external path: the configured prefix joined with the
path it received. Both sides first bring the target to `canonical_target` form (RFC 3986
§6.2.2.1-2 percent-encoding normalization), so `%7e` and `~`, or `%c3%a9` and `%C3%A9`,
sign the same while `%2F` and `/` stay different.

Exceptions::

    ValueError
     └── EnvelopeError        the envelope is not well-formed (bad JSON, field, base64)
          └── BadSignature    well-formed, but the signature does not hold
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import secrets
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import nacl.exceptions
import nacl.signing
import orjson

ENVELOPE_VERSION: Final = 1
"""The `v` field of envelopes this build writes and reads."""

REPORT_CONTEXT: Final = b"rbroker/report/v1\x00"
"""Domain separation for report signatures."""

REQUEST_CONTEXT: Final = b"rbroker/request/v1\x00"
"""Domain separation for request signatures (never valid as a report signature)."""

MAX_SEQ: Final = 2**63 - 1
"""Largest sequence number (fits a signed 64-bit database column)."""

_ID_PATTERN: Final = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_NONCE_PATTERN: Final = re.compile(r"^[A-Za-z0-9_-]{16,64}$")

HEADER_COMPUTER: Final = "X-Rbroker-Computer"
HEADER_TIMESTAMP: Final = "X-Rbroker-Timestamp"
HEADER_NONCE: Final = "X-Rbroker-Nonce"
HEADER_SIGNATURE: Final = "X-Rbroker-Signature"


class EnvelopeError(ValueError):
    """The envelope or signed request is malformed (message says which field)."""


class BadSignature(EnvelopeError):
    """The signature does not verify with the given key."""


@dataclass(frozen=True, slots=True)
class Envelope:
    """A structurally valid, not yet verified envelope.

    The payload bytes are deliberately named `unverified_payload`: the only way to get
    bytes to parse is `verify_report`, which returns them once the signature holds.
    """

    v: int
    computer_id: str
    run_id: str
    seq: int
    unverified_payload: bytes
    sig: bytes


def _lp(data: bytes) -> bytes:
    return struct.pack(">Q", len(data)) + data


def report_message(computer_id: str, run_id: str, seq: int, payload: bytes) -> bytes:
    """The exact bytes a report signature covers (see the module docstring)."""
    _check_id("computer_id", computer_id)
    _check_id("run_id", run_id)
    _check_seq(seq)
    return (
        REPORT_CONTEXT
        + _lp(computer_id.encode())
        + _lp(run_id.encode())
        + struct.pack(">Q", seq)
        + _lp(payload)
    )


_UNRESERVED: Final = frozenset(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"
)
_TARGET_SAFE: Final = _UNRESERVED | frozenset(b"!$&'()*+,;=:@/?")
"""Bytes a request target carries as they are: RFC 3986 pchar, `/` and `?`."""
_HEX: Final = frozenset(b"0123456789abcdefABCDEF")


def canonical_target(target: str) -> str:
    """The request target (path with query) in the form a request signature covers.

    RFC 3986 §6.2.2.1-2 normalization of percent-encoding: an escape of an unreserved
    character (`A-Z a-z 0-9 - . _ ~`) becomes the character, other escapes get upper-case
    hex digits, and any byte outside `pchar / "/" / "?"` (a space, non-ASCII text as UTF-8,
    a `%` that starts no escape) is escaped. Reserved characters keep their form: `%2F` is
    not `/`. Nothing else changes (no dot-segment removal, no slash merging).

    >>> canonical_target("/lab%20tools/r%c3%a9/api/v1/fleet?x=%7e1")
    '/lab%20tools/r%C3%A9/api/v1/fleet?x=~1'
    """
    raw = target.encode("utf-8", "surrogateescape")  # raw bytes decoded with surrogateescape
    out = bytearray()
    i = 0
    while i < len(raw):
        byte = raw[i]
        if byte == 0x25 and i + 2 < len(raw) and raw[i + 1] in _HEX and raw[i + 2] in _HEX:
            value = int(raw[i + 1 : i + 3], 16)
            out += bytes([value]) if value in _UNRESERVED else b"%%%02X" % value
            i += 3
            continue
        out += bytes([byte]) if byte in _TARGET_SAFE else b"%%%02X" % byte
        i += 1
    return out.decode("ascii")


def external_target(prefix: str, target: str) -> str:
    """The target a client sent through a proxy that serves the coordinator under `prefix`.

    `prefix` is the path of the coordinator's external URL (`/rbroker`, `/lab%20tools/rb`,
    or '' at the root; a trailing `/` is ignored) and `target` the path with query the
    coordinator received after the proxy (or the coordinator itself) removed the prefix.
    The result is in `canonical_target` form.
    """
    head = canonical_target(prefix).rstrip("/")
    return head + canonical_target(target)


def request_message(computer_id: str, method: str, path: str, timestamp: int, nonce: str) -> bytes:
    """The exact bytes a request signature covers: context, computer, method, the request
    target (`path` with its query, prefix included, in `canonical_target` form), time and
    nonce, each length-prefixed (the timestamp as a signed 64-bit integer)."""
    _check_id("computer_id", computer_id)
    if not _NONCE_PATTERN.match(nonce):
        raise EnvelopeError("nonce must be 16-64 characters of [A-Za-z0-9_-]")
    if type(timestamp) is not int or not -(2**63) <= timestamp < 2**63:
        raise EnvelopeError("timestamp must be a 64-bit integer")
    return (
        REQUEST_CONTEXT
        + _lp(computer_id.encode())
        + _lp(method.upper().encode())
        + _lp(canonical_target(path).encode())
        + struct.pack(">q", timestamp)
        + _lp(nonce.encode())
    )


def _check_id(name: str, value: object) -> None:
    if not isinstance(value, str) or not _ID_PATTERN.match(value):
        raise EnvelopeError(f"{name} must be 1-64 characters of [A-Za-z0-9_.:-]")


def _check_seq(seq: object) -> None:
    if type(seq) is not int or not 0 <= seq <= MAX_SEQ:
        raise EnvelopeError(f"seq must be an integer in 0..{MAX_SEQ}")


def _b64decode(name: str, value: object) -> bytes:
    if not isinstance(value, str):
        raise EnvelopeError(f"{name} must be base64 text")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise EnvelopeError(f"{name} is not valid base64") from exc


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def public_key_b64(key: nacl.signing.SigningKey) -> str:
    """The base64 of the 32-byte Ed25519 public key (what enrollment registers)."""
    return _b64(bytes(key.verify_key))


def load_verify_key(public_key: str | bytes) -> nacl.signing.VerifyKey:
    """A verify key from its 32 raw bytes or their base64.

    Raises:
        EnvelopeError: not 32 bytes of key material.
    """
    raw = _b64decode("public_key", public_key) if isinstance(public_key, str) else public_key
    if len(raw) != 32:
        raise EnvelopeError("public_key must be 32 bytes (Ed25519)")
    return nacl.signing.VerifyKey(raw)


def sign_report(
    key: nacl.signing.SigningKey, computer_id: str, run_id: str, seq: int, payload: bytes
) -> dict[str, Any]:
    """Sign `payload` (the exact JSON bytes) and return the envelope as a JSON object."""
    sig = key.sign(report_message(computer_id, run_id, seq, payload)).signature
    return {
        "v": ENVELOPE_VERSION,
        "computer_id": computer_id,
        "run_id": run_id,
        "seq": seq,
        "payload": _b64(payload),
        "sig": _b64(sig),
    }


def encode_envelope(envelope: Mapping[str, Any]) -> bytes:
    """The envelope as compact JSON bytes (the body of `POST /api/v1/reports`)."""
    return json.dumps(dict(envelope), separators=(",", ":")).encode()


def _loads(body: bytes | bytearray) -> Any:
    """The envelope's JSON. orjson reads it; what orjson refuses (NaN, nesting past 1 024,
    what is not JSON) is read by `json`, whose verdict stands. orjson reads an integer past
    64 bits as a float where `json` reads an int: no envelope field takes either (`v` and
    `seq` are refused alike), so the outcome is `json`'s.

    Raises:
        EnvelopeError: not JSON, or nested too deeply.
    """
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise EnvelopeError("envelope is not JSON") from exc
    except RecursionError as exc:
        raise EnvelopeError("envelope nested too deeply") from exc


def parse_envelope(body: bytes | Mapping[str, Any]) -> Envelope:
    """Check the envelope's structure and decode its fields; the payload stays unparsed.

    Raises:
        EnvelopeError: bad JSON, a missing or mistyped field, bad base64, unknown `v`.
    """
    obj = _loads(body) if isinstance(body, bytes | bytearray) else body
    if not isinstance(obj, Mapping):
        raise EnvelopeError("envelope must be a JSON object")
    if obj.get("v") != ENVELOPE_VERSION or type(obj.get("v")) is not int:
        raise EnvelopeError(f"unsupported envelope version (this side reads {ENVELOPE_VERSION})")
    _check_id("computer_id", obj.get("computer_id"))
    _check_id("run_id", obj.get("run_id"))
    _check_seq(obj.get("seq"))
    sig = _b64decode("sig", obj.get("sig"))
    if len(sig) != 64:
        raise EnvelopeError("sig must be 64 bytes (Ed25519)")
    return Envelope(
        v=obj["v"],
        computer_id=obj["computer_id"],
        run_id=obj["run_id"],
        seq=obj["seq"],
        unverified_payload=_b64decode("payload", obj.get("payload")),
        sig=sig,
    )


def verify_report(envelope: Envelope, public_key: str | bytes | nacl.signing.VerifyKey) -> bytes:
    """Return the payload bytes if the signature holds for `public_key`.

    Raises:
        BadSignature: the signature does not verify (any changed byte of any field).
        EnvelopeError: the key is malformed.
    """
    vk = (
        public_key
        if isinstance(public_key, nacl.signing.VerifyKey)
        else load_verify_key(public_key)
    )
    payload = envelope.unverified_payload
    message = report_message(envelope.computer_id, envelope.run_id, envelope.seq, payload)
    try:
        vk.verify(message, envelope.sig)
    except nacl.exceptions.BadSignatureError as exc:
        raise BadSignature("report signature does not verify") from exc
    return payload


def sign_request(
    key: nacl.signing.SigningKey,
    computer_id: str,
    method: str,
    path: str,
    timestamp: int,
    nonce: str | None = None,
) -> dict[str, str]:
    """The headers that authenticate one request.

    `path` is the request target as it goes on the wire: the path of the full URL the
    request is sent to (the coordinator's base path, e.g. `/rbroker`, included) with its
    query string, e.g. `httpx.URL(url).raw_path.decode()`.
    """
    nonce = nonce or secrets.token_urlsafe(18)
    sig = key.sign(request_message(computer_id, method, path, timestamp, nonce)).signature
    return {
        HEADER_COMPUTER: computer_id,
        HEADER_TIMESTAMP: str(timestamp),
        HEADER_NONCE: nonce,
        HEADER_SIGNATURE: _b64(sig),
    }


@dataclass(frozen=True, slots=True)
class SignedRequest:
    """The authentication headers of a request, structurally checked, not yet verified."""

    computer_id: str
    timestamp: int
    nonce: str
    sig: bytes


def parse_request_headers(headers: Mapping[str, str]) -> SignedRequest | None:
    """The signed-request headers, or None when the request carries none of them.

    Raises:
        EnvelopeError: some but not all headers, or a malformed value.
    """
    names = (HEADER_COMPUTER, HEADER_TIMESTAMP, HEADER_NONCE, HEADER_SIGNATURE)
    values = [headers.get(n) or headers.get(n.lower()) for n in names]
    if all(v is None for v in values):
        return None
    if any(v is None for v in values):
        raise EnvelopeError("signed request needs all of " + ", ".join(names))
    computer_id, ts, nonce, sig_b64 = (str(v) for v in values)
    _check_id("computer_id", computer_id)
    if not re.fullmatch(r"-?[0-9]{1,19}", ts):
        raise EnvelopeError(f"{HEADER_TIMESTAMP} must be an integer Unix time")
    if not _NONCE_PATTERN.match(nonce):
        raise EnvelopeError("nonce must be 16-64 characters of [A-Za-z0-9_-]")
    if not -(2**63) <= int(ts) < 2**63:
        raise EnvelopeError(f"{HEADER_TIMESTAMP} is out of range")
    sig = _b64decode(HEADER_SIGNATURE, sig_b64)
    if len(sig) != 64:
        raise EnvelopeError("signature must be 64 bytes (Ed25519)")
    return SignedRequest(computer_id, int(ts), nonce, sig)


def verify_request(
    signed: SignedRequest,
    public_key: str | bytes | nacl.signing.VerifyKey,
    method: str,
    path: str,
) -> None:
    """Check the signature of a request (freshness and nonce reuse are the server's part).

    `path` is the target the client sent: behind a prefix, `external_target(prefix, path
    received)`; it is compared in `canonical_target` form.

    Raises:
        BadSignature: the signature does not hold for this method, path, time and nonce.
    """
    vk = (
        public_key
        if isinstance(public_key, nacl.signing.VerifyKey)
        else load_verify_key(public_key)
    )
    message = request_message(signed.computer_id, method, path, signed.timestamp, signed.nonce)
    try:
        vk.verify(message, signed.sig)
    except nacl.exceptions.BadSignatureError as exc:
        raise BadSignature("request signature does not verify") from exc
