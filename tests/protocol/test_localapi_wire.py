"""Wire contracts of the local API in `rbroker_protocol`: error codes, framing, parameters
(and the plain mirror the SDK builds)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from rbroker_protocol import jsonrpc
from rbroker_protocol.errors import ERROR_CODES, ErrorCode, RpcError
from rbroker_protocol.localapi import MAX_MIB, AcquireParams, HelloParams, SimSetParams
from rbroker_protocol.params import AcquireRequest

BASE: dict[str, Any] = {"mib": 1024, "project": "p", "session": "s", "purpose": "x"}


STANDARD = {
    "parse_error",
    "invalid_request",
    "method_not_found",
    "invalid_params",
    "internal_error",
}


def test_every_code_has_a_unique_number() -> None:
    assert set(ERROR_CODES) == set(ErrorCode)
    assert len(set(ERROR_CODES.values())) == len(ERROR_CODES)


def test_standard_json_rpc_numbers() -> None:
    assert ERROR_CODES[ErrorCode.PARSE_ERROR] == -32700
    assert ERROR_CODES[ErrorCode.INVALID_REQUEST] == -32600
    assert ERROR_CODES[ErrorCode.METHOD_NOT_FOUND] == -32601
    assert ERROR_CODES[ErrorCode.INVALID_PARAMS] == -32602
    assert ERROR_CODES[ErrorCode.INTERNAL_ERROR] == -32603
    own = [n for c, n in ERROR_CODES.items() if c.value not in STANDARD]
    assert all(-32099 <= n <= -32000 for n in own)  # the server-error range of the spec


@pytest.mark.parametrize("code", list(ErrorCode))
def test_error_round_trip(code: ErrorCode) -> None:
    err = RpcError(code, f"{code.value}: 6 144 MiB requested", requested_mib=6144)
    wire = json.loads(json.dumps(err.to_wire()))
    assert wire["code"] == ERROR_CODES[code]
    assert wire["data"] == {"name": code.value, "requested_mib": 6144}
    back = RpcError.from_wire(wire)
    assert (back.name, back.message, back.data) == (code, err.message, {"requested_mib": 6144})


@pytest.mark.parametrize(
    ("wire", "name"),
    [
        ({"code": -32011, "message": "m"}, ErrorCode.INFEASIBLE),  # no data: by number
        ({"code": -1, "message": "m", "data": {"name": "from_the_future"}}, "internal_error"),
        ({"code": "x", "message": "m"}, "internal_error"),
        ({}, "internal_error"),
    ],
)
def test_error_from_unknown_or_partial_wire(wire: dict[str, Any], name: str) -> None:
    assert RpcError.from_wire(wire).name == name


@given(st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=40), max_size=5))
def test_encode_is_one_utf8_line(params: dict[str, str]) -> None:
    line = jsonrpc.encode(jsonrpc.request(7, "m", params))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line.decode("utf-8")) == {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "m",
        "params": params,
    }


def test_notification_has_no_id() -> None:
    assert "id" not in jsonrpc.request(None, "m", {})


@given(st.integers(min_value=1, max_value=MAX_MIB))
def test_any_mib_in_range_is_accepted(mib: int) -> None:
    assert AcquireParams.model_validate({**BASE, "mib": mib}).mib == mib


@given(
    st.one_of(
        st.integers(max_value=0),
        st.integers(min_value=MAX_MIB + 1),
        st.floats(allow_nan=True),
        st.booleans(),
        st.text(),
        st.none(),
    )
)
def test_any_other_mib_is_refused(mib: object) -> None:
    with pytest.raises(ValidationError):
        AcquireParams.model_validate({**BASE, "mib": mib})


@pytest.mark.parametrize(
    "changes",
    [
        {"gpus": 0},
        {"gpus": 65},
        {"ttl_s": 0.5},
        {"ttl_s": float("nan")},
        {"wait_s": -1},
        {"wait_s": float("inf")},
        {"gpu_uuid": "GPU-"},
        {"gpu_uuid": "gpu-0000"},
        {"gpu_uuid": "GPU-0 with spaces"},
        {"placement": "random"},
        {"owner": "someone-else"},
    ],
)
def test_acquire_params_bounds(changes: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        AcquireParams.model_validate({**BASE, **changes})


def test_acquire_params_defaults() -> None:
    p = AcquireParams.model_validate(BASE)
    assert (p.gpus, p.gpu_uuid, p.ttl_s, p.wait_s, p.adopt, p.placement) == (
        1,
        None,
        30.0,
        0.0,
        False,
        "pack",
    )
    assert AcquireParams.model_validate({**BASE, "gpu_uuid": "MIG-a1/2.3_x"}).gpu_uuid


def test_hello_and_sim_set_are_strict() -> None:
    with pytest.raises(ValidationError):
        HelloParams.model_validate({"protocol_version": "1"})
    with pytest.raises(ValidationError):
        SimSetParams.model_validate({"gpu_uuid": "GPU-1", "error": "on_fire"})
    assert SimSetParams.model_validate({"gpu_uuid": "GPU-1", "used_mib": 0}).used_mib == 0


def test_the_sdk_acquire_request_has_the_params_keys() -> None:
    """`AcquireRequest` (what the SDK builds, without pydantic) mirrors `AcquireParams`:
    the same keys, required where the model has no default."""
    fields = AcquireParams.model_fields
    assert set(AcquireRequest.__annotations__) == set(fields)
    required = {name for name, info in fields.items() if info.is_required()}
    assert AcquireRequest.__required_keys__ == required
