"""Request lines of the local API: decoding and validation into `(id, message, method,
params)`, with the stable error of architecture.md §5 for each kind of bad input, and the
results built from the broker's lease records (`rbroker_protocol.results`)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from rbroker.broker.leases import Lease
from rbroker.localapi.access import check_admin
from rbroker.transport.base import Peer
from rbroker_protocol import jsonrpc
from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.results import AcquireResult, LeaseResult


class Refused(Exception):
    """A request line answered with `error` (to `request_id`) before any method ran."""

    def __init__(self, request_id: Any, error: RpcError) -> None:
        self.request_id = request_id
        self.error = error


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_input=False, include_url=False):
        loc = ".".join(str(p) for p in err["loc"]) or "params"
        parts.append(f"{loc}: {err['msg']}")
    return "invalid params: " + "; ".join(parts)


def parse_params(model: type[BaseModel], params: Any) -> Any:
    """`params` (absent: `{}`) validated as `model`.

    Raises:
        RpcError: `invalid_params`, naming the bad fields in `fields`.
    """
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RpcError(ErrorCode.INVALID_PARAMS, "params must be a JSON object")
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        fields = sorted({str(e["loc"][0]) for e in exc.errors() if e["loc"]})
        raise RpcError(ErrorCode.INVALID_PARAMS, _validation_message(exc), fields=fields) from None


def granted(lease: Lease) -> AcquireResult:
    """The result of a granted `lease.acquire`."""
    return {
        "lease": lease.to_wire(),
        "token": lease.token,
        "cuda_visible_devices": ",".join(lease.gpu_uuids),
    }


def lease_result(lease: Lease) -> LeaseResult:
    """The result of `lease.renew`, `lease.release` and `lease.resize`: the lease now."""
    return {"lease": lease.to_wire()}


def decode(
    line: bytes,
    methods: Mapping[str, tuple[type[BaseModel], Any]],
    admin_methods: frozenset[str],
    peer: Peer,
    admin_group: str | None,
) -> tuple[Any, dict[str, Any], str, Any]:
    """`(request_id, message, method, params)` of a request line, validated.

    Raises:
        Refused: with the error to answer (`parse_error`, `invalid_request`,
            `method_not_found`, `invalid_params`, `not_allowed`).
    """
    request_id: Any = None
    try:
        try:
            msg = jsonrpc.decode(line)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RpcError(ErrorCode.PARSE_ERROR, f"not valid JSON: {exc}") from None
        except RecursionError:
            raise RpcError(
                ErrorCode.PARSE_ERROR,
                f"JSON nested too deeply ({sys.getrecursionlimit()} levels at most)",
            ) from None
        if not isinstance(msg, dict):
            raise RpcError(ErrorCode.INVALID_REQUEST, "a request must be a JSON object")
        request_id = msg.get("id")
        if not isinstance(request_id, int | str | None) or isinstance(request_id, bool):
            request_id = None
            raise RpcError(ErrorCode.INVALID_REQUEST, "id must be a string or an integer")
        method = msg.get("method")
        if msg.get("jsonrpc") != "2.0" or not isinstance(method, str):
            raise RpcError(ErrorCode.INVALID_REQUEST, 'need "jsonrpc": "2.0" and a string "method"')
        entry = methods.get(method)
        if entry is None:
            raise RpcError(
                ErrorCode.METHOD_NOT_FOUND,
                f"unknown method {method[:64]!r}",
                method=method[:64],
            )
        params = parse_params(entry[0], msg.get("params"))
        if method in admin_methods:
            check_admin(peer, method, admin_group)
    except RpcError as err:
        raise Refused(request_id, err) from None
    return request_id, msg, method, params
