"""Reading JSON fast never changes what is read: `jsonrpc.decode` (orjson, with `json` for what
orjson refuses or would read as a float) gives `json.loads`'s values, types and errors, and
`signing.parse_envelope` reads a body as it reads `json.loads` of it. The standard library's
framing (`rbroker_protocol.framing`, what a short client command uses) and orjson's write
lines that read back the same."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rbroker_protocol import framing, jsonrpc
from rbroker_protocol.signing import EnvelopeError, parse_envelope

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**17, max_value=10**21).map(lambda n: n * st_sign(n)),
    st.floats(),
    st.text(max_size=30),
    st.text(alphabet="0123456789", min_size=15, max_size=25),  # digit runs inside strings
)


def st_sign(n: int) -> int:
    return -1 if n % 3 == 0 else 1


VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


def typed(value: Any) -> Any:
    """`value` with each scalar's type beside it (1 and 1.0 differ; NaN equals NaN)."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return type(value).__name__, repr(value)


def outcome(read: Any, line: bytes) -> Any:
    try:
        return typed(read(line))
    except (ValueError, RecursionError) as exc:
        return type(exc).__name__, str(exc)


@settings(max_examples=300, deadline=None)
@given(VALUES, st.booleans())
@example([1234567890123456789, -9223372036854775809, 18446744073709551616], True)
@example({"a": 10**30, "b": "1234567890123456789012"}, False)
@example([1e400, float("nan"), -0.0], True)
def test_decode_reads_what_json_reads(value: Any, ascii_only: bool) -> None:
    line = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    assert outcome(jsonrpc.decode, line) == outcome(json.loads, line)


FINITE = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=30),  # lone surrogates too: written as \u escapes
    ),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(FINITE)
@example({"id": "\ud800", "method": "lease.renew", "params": {"n": 2**70}})
@example({"jsonrpc": "2.0", "params": {"wait_s": 1e16, "mib": 8192, "purpose": "é ✓"}})
def test_the_standard_librarys_lines_read_back_as_orjsons_do(value: Any) -> None:
    message = {"jsonrpc": "2.0", "id": 7, "result": value}
    line = framing.encode(message)
    assert line.endswith(b"\n") and b"\n" not in line[:-1]  # one line
    assert typed(framing.decode(line)) == typed(jsonrpc.decode(jsonrpc.encode(message)))
    assert outcome(framing.decode, line) == outcome(jsonrpc.decode, line)


@pytest.mark.parametrize(
    "line",
    [b"{", b"[1,]", b'{"a": NaN}', b"[" * 3000 + b"]" * 3000, b'"\xff"', b"1" * 40, b" 7 "],
)
def test_decode_refuses_what_json_refuses(line: bytes) -> None:
    assert outcome(jsonrpc.decode, line) == outcome(json.loads, line)


ENVELOPE = {
    "v": 1,
    "computer_id": "c-0123456789abcdef",
    "run_id": "run-1",
    "seq": 5,
    "payload": "e30=",
    "sig": "A" * 86 + "==",
}


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"v": 10**20},
        {"seq": 10**20},
        {"seq": 2**64},
        {"seq": 1.0},
        {"v": float("nan")},
        {"seq": float("inf")},
        {"computer_id": 10**25},
        {"extra": [[[[]]]]},
    ],
)
def test_an_envelope_is_read_as_json_reads_it(changes: dict[str, Any]) -> None:
    body = json.dumps({**ENVELOPE, **changes}).encode()

    def parsed(source: Any) -> Any:
        try:
            return parse_envelope(source)
        except EnvelopeError as exc:
            return str(exc)

    assert parsed(body) == parsed(json.loads(body))
