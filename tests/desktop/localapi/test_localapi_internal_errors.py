"""A hostile user cannot turn requests into the broker's internal errors, nor flood its log
with them (architecture.md §5).

Found before: a 2 KB line with 1 000 nested `[` inside `params` was answered `internal_error`
and logged a full RecursionError traceback (the one-pass reader let the RecursionError out;
the same depth at top level got `parse_error`), and each internal error logged its
traceback: 5 000 such lines added 4 MiB to the log in 0.5 s. Now nesting anywhere is the
error of a bad line, and a traceback is logged at most once a minute per user, method and
exception type (`InternalErrors`).
"""

from __future__ import annotations

import json
import logging
from typing import Any, cast

import pytest

from rbroker.localapi.internal_errors import TRACEBACK_EVERY_S, InternalErrors
from rbroker.localapi.requests import Refused, decode
from rbroker.localapi.server import LocalApi
from rbroker.transport.base import Peer
from tests.desktop.localapi.served import served_api

_API = LocalApi(cast(Any, None), "unused")
PEER = Peer(pid=1, user="someone", uid=1000)
ACQUIRE = '"project":"p","session":"s","purpose":"x"'


def _nested(depth: int, kind: str) -> str:
    if kind == "list":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def _line(place: str, value: str, method: str = "lease.acquire") -> bytes:
    """A request line with `value` (deeply nested) at `place`."""
    head = f'{{"jsonrpc":"2.0","method":"{method}"'
    lines = {
        "params value": f'{head},"id":1,"params":{{"mib":{value},{ACQUIRE}}}}}',
        "nested object": f'{head},"id":1,"params":{{"mib":{{"x":{value}}},{ACQUIRE}}}}}',
        "params list": f'{head},"id":1,"params":[{value}]}}',
        "id": f'{head},"id":{value},"params":{{"mib":64,{ACQUIRE}}}}}',
        "top level": value,
    }
    return lines[place].encode()


PLACES = ["params value", "nested object", "params list", "id", "top level"]
# `parse_error` past the JSON readers' depth; a shallower nesting is read, and then it is
# the wrong type where it stands
EXPECTED = {
    "params value": {"invalid_params", "parse_error"},
    "nested object": {"invalid_params", "parse_error"},
    "params list": {"invalid_params", "parse_error"},
    "id": {"invalid_request", "parse_error"},
    "top level": {"invalid_request", "parse_error"},
}


@pytest.mark.parametrize("depth", [900, 1000, 1024, 1025, 5000, 20000])
@pytest.mark.parametrize("kind", ["list", "object"])
@pytest.mark.parametrize("place", PLACES)
def test_nesting_anywhere_is_the_error_of_a_bad_line(place: str, kind: str, depth: int) -> None:
    for method in ("lease.acquire", "lease.renew", "hello", "leases.list", "job.declare"):
        line = _line(place, _nested(depth, kind), method)
        with pytest.raises(Refused) as refused:
            decode(line, _API.methods, _API.admin_methods, PEER, None)
        assert refused.value.error.name.value in EXPECTED[place], (method, refused.value.error)


@pytest.mark.contract
@pytest.mark.parametrize("place", PLACES)
def test_nesting_is_answered_in_one_line_and_nothing_is_logged_as_an_error(
    place: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    with served_api() as served:
        conn = served.connect()
        try:
            for depth in (1000, 30000):  # orjson reads the first, only json the second
                line = _line(place, _nested(depth, "list"))
                assert len(line) < 64 * 1024
                conn.write(line + b"\n")
                answer = json.loads(conn.readline())
                name = answer["error"]["data"]["name"]
                assert name in EXPECTED[place], answer
                assert "\n" not in answer["error"]["message"]
                if depth == 30000:
                    assert answer["error"]["message"].startswith("JSON nested too deeply")
            # and the connection serves on
            conn.write(b'{"jsonrpc":"2.0","id":9,"method":"gpus.list"}\n')
            assert json.loads(conn.readline())["id"] == 9
        finally:
            conn.close()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


class _Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def test_a_traceback_is_logged_once_per_user_method_and_exception_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = _Clock()
    errors = InternalErrors(clock=clock)
    caplog.set_level(logging.ERROR, logger="rbroker.localapi.internal_errors")
    for _ in range(5000):
        errors.report("mallory", "leases.list", RuntimeError("boom"))
    errors.report("mallory", "leases.list", KeyError("other type"))
    errors.report("mallory", "broker.status", RuntimeError("other method"))
    errors.report("alice", "leases.list", RuntimeError("other user"))
    assert len(caplog.records) == 4
    assert all(r.exc_info for r in caplog.records)
    assert errors.suppressed == 4999
    caplog.clear()
    clock.now_s += TRACEBACK_EVERY_S - 1
    errors.report("mallory", "leases.list", RuntimeError("still within the minute"))
    assert caplog.records == []
    clock.now_s += 1
    errors.report("mallory", "leases.list", RuntimeError("a minute on"))
    [record] = caplog.records
    assert "5000 more like it" in record.getMessage() and record.exc_info


@pytest.mark.contract
def test_a_flood_of_internal_errors_is_answered_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    with served_api() as served:
        clock = _Clock()
        served.api.internal_errors = InternalErrors(clock=clock)
        broker = served.api.broker

        def failing_status() -> Any:
            raise RuntimeError("an injected fault")

        served.call(lambda: setattr(broker, "status", failing_status))
        conn = served.connect()
        try:
            count = 2000
            request = b'{"jsonrpc":"2.0","id":%d,"method":"broker.status"}\n'
            conn.write(b"".join(request % i for i in range(count)))
            for i in range(count):
                answer = json.loads(conn.readline())
                assert answer["id"] == i and answer["error"]["data"]["name"] == "internal_error"
        finally:
            conn.close()
        logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(logged) == 1, [r.getMessage() for r in logged]
        assert "broker.status" in logged[0].getMessage() and logged[0].exc_info
        assert served.api.internal_errors.suppressed == count - 1
