"""Bad input on the local API (architecture.md §5), spoken over a raw socket without the SDK.

Every case gets a JSON-RPC error whose `data.name` is a stable code of
`rbroker_protocol.errors`, with the numbers in the message; the same connection keeps
answering and the broker process stays alive. Every case runs on both event loops the broker
may use (uvloop where installed, the standard asyncio loop: `rbroker.base.eventloop`).
"""

from __future__ import annotations

import json
import math
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import rbroker
from rbroker_protocol.errors import ERROR_CODES, ErrorCode
from rbroker_protocol.jsonrpc import MAX_LINE_BYTES
from rbroker_protocol.localapi import MAX_MIB
from tests.conftest import GPU0, SINGLE_24G, BrokerProcess, start_broker
from tests.desktop.conftest import LOOPS, RawConnection

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

GOOD = {"mib": 1024, "project": "tests", "session": "bad-input", "purpose": "check errors"}


@pytest.fixture(scope="module", params=LOOPS)
def broker(request: pytest.FixtureRequest) -> Iterator[BrokerProcess]:
    """One broker per event loop for the whole module: every test checks that it is still
    alive."""
    bp = start_broker(SINGLE_24G, env={"RBROKER_EVENT_LOOP": request.param})
    with bp.client() as c:
        assert c.status()["event_loop"] == request.param
    yield bp
    bp.stop(signal.SIGKILL)


@pytest.fixture
def conn(
    broker: BrokerProcess, raw_connect: Callable[[str], RawConnection]
) -> Iterator[RawConnection]:
    """A raw connection that has said hello; after the test it must still answer, and the
    broker must still run."""
    c = raw_connect(broker.socket)
    c.hello()
    yield c
    assert c.hello()["protocol_version"] == 1, "the connection must stay usable"
    assert broker.proc.poll() is None, "the broker must survive bad input"


def _error(answer: dict[str, Any], name: ErrorCode) -> dict[str, Any]:
    assert "result" not in answer, answer
    err = answer["error"]
    assert err["data"]["name"] == name.value, err
    assert err["code"] == ERROR_CODES[name], err
    assert isinstance(err["message"], str) and err["message"], err
    return dict(err)


def _acquire(conn: RawConnection, **changes: Any) -> dict[str, Any]:
    params = {**GOOD, **changes}
    return conn.request("lease.acquire", {k: v for k, v in params.items() if v is not None})


def test_malformed_json(conn: RawConnection) -> None:
    conn.send_line(b'{"jsonrpc": "2.0", "id": 1, "method": hello}')
    err = _error(conn.read_message(), ErrorCode.PARSE_ERROR)
    assert "line 1 column 39 (char 38)" in err["message"], err["message"]


def test_invalid_utf8(conn: RawConnection) -> None:
    conn.send_line(b'{"jsonrpc": "2.0", "id": 1, "method": "\xff\xfe"}')
    _error(conn.read_message(), ErrorCode.PARSE_ERROR)


@pytest.mark.parametrize("size", [MAX_LINE_BYTES + 1, 3 * MAX_LINE_BYTES, 1024 * 1024])
def test_line_over_64_kib(conn: RawConnection, size: int) -> None:
    head = b'{"jsonrpc": "2.0", "id": 7, "method": "hello", "params": {"client": "'
    tail = b'"}}'
    line = head + b"x" * (size - len(head) - len(tail)) + tail
    assert len(line) == size
    conn.send_line(line)
    err = _error(conn.read_message(), ErrorCode.REQUEST_TOO_LARGE)
    assert str(MAX_LINE_BYTES) in err["message"]
    assert err["data"]["limit_bytes"] == MAX_LINE_BYTES


def test_line_of_exactly_64_kib_is_parsed(conn: RawConnection) -> None:
    head = b'{"jsonrpc": "2.0", "id": 7, "method": "hello", "params": {"protocol_version": 1, '
    head += b'"client": "a", "pad": "'
    tail = b'"}}'
    line = head + b"x" * (MAX_LINE_BYTES - len(head) - len(tail)) + tail
    assert len(line) == MAX_LINE_BYTES
    conn.send_line(line)
    err = _error(conn.read_message(), ErrorCode.INVALID_PARAMS)  # read, then `pad` refused
    assert "pad" in err["message"]


def test_unknown_method(conn: RawConnection) -> None:
    err = _error(conn.request("lease.steal", {}), ErrorCode.METHOD_NOT_FOUND)
    assert "lease.steal" in err["message"]


def test_unknown_method_through_the_sdk_is_method_not_found(broker: BrokerProcess) -> None:
    """The wire says method_not_found (-32601); the SDK raises `MethodNotFound`, a kind
    of `InvalidParams` (before: a plain `InvalidParams`, named as if the params were bad)."""
    with broker.client() as c:
        with pytest.raises(rbroker.MethodNotFound) as err:
            c.call("lease.steal")
        assert type(err.value) is rbroker.MethodNotFound
        assert isinstance(err.value, rbroker.InvalidParams)
        assert err.value.code == "method_not_found" and "lease.steal" in err.value.message
        with pytest.raises(rbroker.InvalidParams) as bad:  # bad params stay what they were
            c.call("lease.acquire", mib="1024", project="p", session="s", purpose="x")
        assert type(bad.value) is rbroker.InvalidParams and bad.value.code == "invalid_params"


def test_missing_params(conn: RawConnection) -> None:
    err = _error(conn.request("lease.acquire"), ErrorCode.INVALID_PARAMS)
    for field in ("mib", "project", "session", "purpose"):
        assert field in err["message"]
        assert field in err["data"]["fields"]


def test_params_not_an_object(conn: RawConnection) -> None:
    _error(conn.request("lease.acquire", [1024, "tests"]), ErrorCode.INVALID_PARAMS)


@pytest.mark.parametrize(
    ("mib", "bound"),
    [("1024", "integer"), (1024.0, "integer"), (1024.5, "integer"), (True, "integer")],
    ids=["string", "float", "fraction", "bool"],
)
def test_ill_typed_mib(conn: RawConnection, mib: Any, bound: str) -> None:
    err = _error(_acquire(conn, mib=mib), ErrorCode.INVALID_PARAMS)
    assert "mib" in err["message"] and bound in err["message"]
    assert err["data"]["fields"] == ["mib"]


@pytest.mark.parametrize(
    ("mib", "bound"),
    [(0, "1"), (-4096, "1"), (10**12, str(MAX_MIB)), (MAX_MIB + 1, str(MAX_MIB))],
    ids=["zero", "negative", "absurd", "just-over"],
)
def test_out_of_range_mib(conn: RawConnection, mib: int, bound: str) -> None:
    err = _error(_acquire(conn, mib=mib), ErrorCode.INVALID_PARAMS)
    assert "mib" in err["message"] and bound in err["message"], err["message"]


@pytest.mark.parametrize(
    ("expected_s", "bound"),
    [(0, "greater than 0"), (-60, "greater than 0"), (31 * 86400, "2592000"), ("1h", "number")],
    ids=["zero", "negative", "over-30-days", "string"],
)
def test_bad_declared_duration(conn: RawConnection, expected_s: Any, bound: str) -> None:
    err = _error(_acquire(conn, expected_s=expected_s), ErrorCode.INVALID_PARAMS)
    assert err["message"].startswith("invalid params: expected_s: "), err["message"]
    assert bound in err["message"] and err["data"]["fields"] == ["expected_s"]


def test_larger_than_any_gpu_is_infeasible(conn: RawConnection) -> None:
    err = _error(_acquire(conn, mib=MAX_MIB), ErrorCode.INFEASIBLE)
    assert err["data"]["usable_mib"] == 24576 - 1229
    assert "23 347" in err["message"] and "24 576" in err["message"]


def test_unknown_gpu_uuid_is_infeasible(conn: RawConnection) -> None:
    uuid = "GPU-00000000-dead-beef-0000-000000000000"
    err = _error(_acquire(conn, gpu_uuid=uuid), ErrorCode.INFEASIBLE)
    assert uuid in err["message"]
    assert err["data"]["gpu_uuid"] == uuid
    assert err["data"]["requested_mib"] == 1024


def test_malformed_gpu_uuid(conn: RawConnection) -> None:
    err = _error(_acquire(conn, gpu_uuid="../../etc/passwd"), ErrorCode.INVALID_PARAMS)
    assert err["data"]["fields"] == ["gpu_uuid"]


def test_empty_description(conn: RawConnection) -> None:
    err = _error(_acquire(conn, purpose="   "), ErrorCode.DESCRIPTION_REJECTED)
    assert err["data"]["field"] == "purpose"
    assert err["data"]["rule"] == "empty"


def test_over_long_description(conn: RawConnection) -> None:
    value = "Q7" * 150
    err = _error(_acquire(conn, purpose=value), ErrorCode.DESCRIPTION_REJECTED)
    assert err["data"] == {"name": "description_rejected", "field": "purpose", "rule": "too_long"}
    assert "300" in err["message"] and "200" in err["message"]
    assert "Q7Q7" not in json.dumps(err)


def test_secret_description_is_not_echoed(conn: RawConnection) -> None:
    secret = "AKIAQWERTYUIOPASDFGH"
    err = _error(_acquire(conn, session=f"run with {secret}"), ErrorCode.DESCRIPTION_REJECTED)
    assert err["data"]["field"] == "session"
    assert err["data"]["rule"].startswith("secret:")
    assert secret not in json.dumps(err)


def test_description_not_text(conn: RawConnection) -> None:
    err = _error(_acquire(conn, project=42), ErrorCode.INVALID_PARAMS)
    assert err["data"]["fields"] == ["project"]


@pytest.mark.parametrize(
    "line",
    [b"[1, 2, 3]", b'"hello"', b"42", b"null", b"[]"],
    ids=["array", "string", "number", "null", "empty-batch"],
)
def test_request_not_an_object(conn: RawConnection, line: bytes) -> None:
    conn.send_line(line)
    answer = conn.read_message()
    err = _error(answer, ErrorCode.INVALID_REQUEST)
    assert answer["id"] is None
    assert "object" in err["message"]


@pytest.mark.parametrize("version", ["1.0", 2.0, None], ids=["1.0", "number", "missing"])
def test_wrong_jsonrpc_version(conn: RawConnection, version: Any) -> None:
    msg: dict[str, Any] = {"id": 5, "method": "hello", "params": {"protocol_version": 1}}
    if version is not None:
        msg["jsonrpc"] = version
    conn.send_line(json.dumps(msg).encode())
    answer = conn.read_message()
    err = _error(answer, ErrorCode.INVALID_REQUEST)
    assert answer["id"] == 5
    assert "2.0" in err["message"]


def test_bad_id_type(conn: RawConnection) -> None:
    conn.send_line(b'{"jsonrpc": "2.0", "id": {"x": 1}, "method": "hello", "params": {}}')
    answer = conn.read_message()
    _error(answer, ErrorCode.INVALID_REQUEST)
    assert answer["id"] is None


def test_old_protocol_version(conn: RawConnection) -> None:
    err = _error(
        conn.request("hello", {"protocol_version": 0, "client": "old"}),
        ErrorCode.PROTOCOL_VERSION,
    )
    assert err["data"]["min"] == 1 and "0" in err["message"]


def test_unknown_lease(conn: RawConnection) -> None:
    err = _error(conn.request("lease.renew", {"lease_id": "lease-nope"}), ErrorCode.LEASE_NOT_FOUND)
    assert "lease-nope" in err["message"]


def test_many_bad_lines_then_a_good_request(conn: RawConnection) -> None:
    for line in (b"{", b"[]", b'{"jsonrpc": "2.0", "id": 1, "method": "nope"}', b"x" * 70000):
        conn.send_line(line)
    names = {conn.read_message()["error"]["data"]["name"] for _ in range(4)}
    assert names == {"parse_error", "invalid_request", "method_not_found", "request_too_large"}
    answer = _acquire(conn)
    assert answer["result"]["lease"]["granted_mib"] == 1024


def test_deeply_nested_json(conn: RawConnection) -> None:
    depth = 30000  # fits in 64 KiB, deeper than the parser's recursion limit
    conn.send_line(b"[" * depth + b"]" * depth)
    err = _error(conn.read_message(), ErrorCode.PARSE_ERROR)
    assert "nested" in err["message"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("ttl_s", "NaN"), ("ttl_s", "Infinity"), ("wait_s", "NaN"), ("wait_s", "-Infinity")],
)
def test_non_finite_numbers(conn: RawConnection, field: str, value: str) -> None:
    params = json.dumps({**GOOD, "session": "non-finite"})[:-1] + f', "{field}": {value}}}'
    conn.send_line(
        b'{"jsonrpc":"2.0","id":3,"method":"lease.acquire","params":%s}' % params.encode()
    )
    err = _error(conn.read_message(), ErrorCode.INVALID_PARAMS)
    assert err["data"]["fields"] == [field]
    assert "finite number" in err["message"], err  # not "less than or equal to …"


def test_non_finite_numbers_through_the_sdk_are_refused_before_sending(
    broker: BrokerProcess,
) -> None:
    """Before: the SDK wrote NaN as `null` ("not given"), so `sim_set(delay_s=nan)` was
    answered as if accepted and changed nothing. Right: `InvalidParams` naming the field,
    nothing sent, and the connection stays usable."""
    with broker.client() as c:
        for call, field in (
            (lambda: c.sim_set(GPU0, delay_s=float("nan")), "delay_s"),
            (lambda: c.call("lease.acquire", **GOOD, wait_s=float("inf")), "wait_s"),
            (
                lambda: c.call("sim.set", gpu_uuid=GPU0, processes=[{"used_mib": -math.inf}]),
                "processes.0.used_mib",
            ),
        ):
            with pytest.raises(rbroker.InvalidParams) as bad:
                call()
            assert f"{field} must be a finite number" in bad.value.message, bad.value.message
        assert c.hello()["protocol_version"] >= 1
        assert c.leases()["leases"] == []


def test_over_long_line_followed_by_a_good_one_in_the_same_write(conn: RawConnection) -> None:
    big = b'{"jsonrpc":"2.0","id":1,"method":"hello","pad":"' + b"y" * 200_000 + b'"}\n'
    good = b'{"jsonrpc":"2.0","id":2,"method":"hello","params":{"protocol_version":1}}\n'
    conn.sock.sendall(big + good)
    first = conn.read_message()
    _error(first, ErrorCode.REQUEST_TOO_LARGE)
    second = conn.read_message()
    assert second["id"] == 2 and second["result"]["protocol_version"] == 1


def test_unknown_params_field(conn: RawConnection) -> None:
    err = _error(_acquire(conn, priority=10), ErrorCode.INVALID_PARAMS)
    assert err["data"]["fields"] == ["priority"]
