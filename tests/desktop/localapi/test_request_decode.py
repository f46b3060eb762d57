"""The one-pass reading of a lease cycle's request lines (`requests.decode_fast`) against the
full path (`requests.decode_full`): whatever line the fast path accepts, the full path reads
the same way (same id, the same notification or not, the same method, the same params with
the same types), so a line's error and wording never depend on which path read it."""

from __future__ import annotations

import json
from typing import Any, cast

from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from rbroker.localapi.requests import FAST_METHODS, Refused, decode_fast, decode_full
from rbroker.localapi.server import LocalApi
from rbroker.transport.base import Peer

_API = LocalApi(cast(Any, None), "unused")
METHODS, ADMIN = _API.methods, _API.admin_methods
PEER = Peer(pid=1, user="someone", uid=1000)

GOOD: dict[str, dict[str, Any]] = {
    "hello": {"protocol_version": 1, "client": "tests"},
    "lease.acquire": {"mib": 64, "project": "p", "session": "s", "purpose": "x", "wait_s": 5},
    "lease.renew": {"lease_id": "lease-1"},
    "lease.release": {"lease_id": "lease-1"},
}

_TEXT = st.sampled_from(
    [
        *("", "a", "pack", "spread", "GPU-0", "MIG-1/2", "GPU-abc\n", "x" * 64, "x" * 65),
        *("é" * 64, "\ud800", "\U0001f600", " p ", "a\x00", "abc_-9", "GPU-0 "),
    ]
)
_NUMBER = st.one_of(
    st.sampled_from([0, 1, 2, 64, 65, -1, 2**24, 2**24 + 1, 10**6, 10**6 + 1, 2**63, 10**30]),
    st.sampled_from([0.0, 0.5, 1.0, 30.0, 3600.0, 3600.5, 604800.0, 1e400, -0.0, 64.0, 1e2]),
    st.floats(),
)
_VALUE = st.one_of(
    _NUMBER, _TEXT, st.booleans(), st.none(), st.just([]), st.just({}), st.just([[1]])
)
_KEYS = sorted({key for model, _ in METHODS.values() for key in model.model_fields} | {"extra"})


@st.composite
def request_lines(draw: st.DrawFn) -> bytes:
    """A request line of a lease cycle's method, often valid, often slightly wrong."""
    method = draw(st.sampled_from([*sorted(FAST_METHODS), "leases.list", "broker.pause"]))
    params: Any = dict(GOOD.get(method, {}))
    if draw(st.booleans()):  # half the lines change one or two params
        for key in draw(st.lists(st.sampled_from(_KEYS), min_size=1, max_size=2)):
            params[key] = draw(_VALUE)
        if draw(st.integers(0, 3)) == 0:
            params.pop(draw(st.sampled_from(sorted(params))), None)
    msg: dict[str, Any] = {"jsonrpc": draw(st.sampled_from(["2.0"] * 8 + ["1.0", 2]))}
    msg["method"] = method
    params = draw(st.sampled_from([params] * 12 + [None, [], "x", "absent"]))
    if params != "absent":
        msg["params"] = params
    request_id: Any = draw(st.sampled_from([1, "a", None, "absent"]))
    if draw(st.integers(0, 3)) == 0:
        request_id = draw(st.one_of(_NUMBER, _TEXT, st.booleans()))
    if request_id != "absent":
        msg["id"] = request_id
    if draw(st.integers(0, 9)) == 0:
        msg["extra"] = draw(_VALUE)
    text = json.dumps(msg, ensure_ascii=draw(st.booleans()), separators=(",", ":"))
    return text.encode("utf-8", "surrogatepass")


def typed(value: Any) -> Any:
    """`value` with the type of every scalar beside it (so that 30 and 30.0 differ)."""
    if isinstance(value, BaseModel):
        return type(value).__name__, [(k, typed(v)) for k, v in value]
    if isinstance(value, tuple | list):
        return [typed(v) for v in value]
    return type(value).__name__, repr(value)


def full(line: bytes) -> Any:
    try:
        return typed(decode_full(line, METHODS, ADMIN, PEER, None))
    except Refused as refused:
        return "refused", refused.request_id, refused.error.to_wire()


@settings(max_examples=400, deadline=None)
@given(request_lines())
@example(b'{"jsonrpc":"2.0","id":1,"id":"2","method":"lease.renew","params":{"lease_id":"a"}}')
@example(b'{"jsonrpc":"2.0","id":1,"method":"lease.renew","params":{"lease_id":"a","lease_id":""}}')
@example(b'{"jsonrpc":"2.0","id":1,"method":"lease.renew","params":{"lease_id":"\xff"}}')
@example(b'{"jsonrpc":"2.0","id":1,"method":"lease.renew","params":{"lease_id":"\\ud800"}}')
@example(b'{"jsonrpc":"2.0","id":1,"method":"lease.renew","params":{"lease_id":"a"}} x')
@example(b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"method":"hello","params":{"protocol_version":1}}')
def test_the_fast_path_reads_a_line_as_the_full_path_does(line: bytes) -> None:
    fast = decode_fast(line, METHODS, ADMIN)
    if fast is not None:
        assert typed(fast) == full(line), line


def test_a_lease_cycle_takes_the_fast_path() -> None:
    for method, params in GOOD.items():
        for request_id in (7, "seven", None):
            msg = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
            line = json.dumps(msg).encode()
            fast = decode_fast(line, METHODS, ADMIN)
            assert fast is not None, line
            assert typed(fast) == full(line)
        notification = json.dumps({"jsonrpc": "2.0", "method": method, "params": params})
        assert decode_fast(notification.encode(), METHODS, ADMIN) == (
            None,
            False,
            method,
            METHODS[method][0].model_validate(params),
        )
