"""Request lines of the local API: decoding and validation into `(id, answered, method,
params)`, with the stable error of architecture.md §5 for each kind of bad input, and the
results built from the broker's lease records (`rbroker_protocol.results`).

The methods of a lease cycle (`FAST_METHODS`) are first read in one pass: msgspec takes the
envelope straight from the bytes, and the params go to their model's `model_validate_json`
(pydantic's own JSON reader, the same model as ever, so `rbroker_protocol.localapi` stays the
one statement of each shape). Any line that pass does not accept as it is (bad JSON, a missing
or extra key, a bad value, another method) is read again by the full path, which gives every
error its exact wording: only valid requests get faster.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, Final, Literal

import msgspec
from pydantic import BaseModel, ValidationError

from rbroker.broker.leases import Lease
from rbroker.broker.service import Broker
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


def granted(lease: Lease, broker: Broker) -> AcquireResult:
    """The result of a granted `lease.acquire`, with the granted GPUs' figures
    (`Broker.granted_gpus`) so that the SDK needs no second call."""
    gpus, indices = broker.granted_gpus(lease)
    return {
        "lease": lease.to_wire(),
        "token": lease.token,
        "cuda_visible_devices": ",".join(lease.gpu_uuids),
        "gpus": gpus,
        "cuda_indices": indices,
    }


def lease_result(lease: Lease) -> LeaseResult:
    """The result of `lease.renew`, `lease.release` and `lease.resize`: the lease now."""
    return {"lease": lease.to_wire()}


MethodTable = Mapping[str, tuple[type[BaseModel], Any]]
"""A local API's methods: name → (its params model, its handler); the readers here look
only at the model."""

Decoded = tuple[Any, bool, str, Any]
"""`(request_id, answered, method, params)`: `answered` is False for a notification (no
`id` key), `params` the method's params model."""

FAST_METHODS: Final = frozenset({"hello", "lease.acquire", "lease.renew", "lease.release"})
"""Methods read by `decode_fast` first (a lease cycle's, and the hello before it)."""


class _Envelope(msgspec.Struct, forbid_unknown_fields=True):
    """A request's envelope as `decode_fast` takes it: any other key, an `id` that is not
    an integer, a string or null, or a `params` that is absent sends the line to the full
    path (which ignores unknown keys and names what is wrong)."""

    jsonrpc: Literal["2.0"]
    method: str
    params: msgspec.Raw
    id: int | str | msgspec.UnsetType | None = msgspec.UNSET


_ENVELOPE: Final = msgspec.json.Decoder(_Envelope)


class _IdOnly(msgspec.Struct):
    """A request's `id` alone (`request_id_of`); every other key is skipped."""

    id: int | str | None = None


_ID_ONLY: Final = msgspec.json.Decoder(_IdOnly)


class _MethodOnly(msgspec.Struct):
    """A request's `method` alone (`method_of`); every other key is skipped."""

    method: str | None = None


_METHOD_ONLY: Final = msgspec.json.Decoder(_MethodOnly)


def method_of(line: bytes) -> str | None:
    """The method a request line names, read without its params; None where the line is not
    a JSON object or names none (`decode` then says what is wrong)."""
    try:
        return _METHOD_ONLY.decode(line).method
    except (msgspec.DecodeError, RecursionError):
        return None


def request_id_of(line: bytes) -> Any:
    """The id a request line's answer carries when the line is refused unread (an integer,
    a string, or None where the line has none, or none `decode_full` would echo)."""
    try:
        return _ID_ONLY.decode(line).id
    except (msgspec.DecodeError, RecursionError):
        return None


def decode_fast(
    line: bytes,
    methods: MethodTable,
    admin_methods: frozenset[str],
) -> Decoded | None:
    """A request line of one of `FAST_METHODS` that is valid as it stands, read in one pass;
    None for any other line (`decode_full` reads it, and names what is wrong). What it
    returns is what `decode_full` returns for the same line."""
    try:
        envelope = _ENVELOPE.decode(line)
    except (msgspec.DecodeError, RecursionError):  # nested deeper than msgspec reads
        return None
    method = envelope.method
    if method not in FAST_METHODS or method in admin_methods or method not in methods:
        return None
    try:
        params = methods[method][0].model_validate_json(bytes(envelope.params))
    except (ValidationError, RecursionError):
        return None
    request_id = envelope.id
    if request_id is msgspec.UNSET:
        return None, False, method, params
    return request_id, True, method, params


def decode(
    line: bytes,
    methods: MethodTable,
    admin_methods: frozenset[str],
    peer: Peer,
    admin_group: str | None,
) -> Decoded:
    """`(request_id, answered, method, params)` of a request line, validated: `decode_fast`'s
    reading when it has one, else `decode_full`'s.

    Raises:
        Refused: as `decode_full`.
    """
    fast = decode_fast(line, methods, admin_methods)
    if fast is not None:
        return fast
    return decode_full(line, methods, admin_methods, peer, admin_group)


def decode_full(
    line: bytes,
    methods: MethodTable,
    admin_methods: frozenset[str],
    peer: Peer,
    admin_group: str | None,
) -> Decoded:
    """`(request_id, answered, method, params)` of any request line, validated, with the
    error of each kind of bad input.

    Raises:
        Refused: with the error to answer (`parse_error`, `invalid_request`,
            `method_not_found`, `invalid_params`, `not_allowed`); a line nested too deeply
            anywhere is `parse_error` (`too_deep`), never a RecursionError.
    """
    request_id: Any = None
    try:
        try:
            msg = jsonrpc.decode(line)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RpcError(ErrorCode.PARSE_ERROR, f"not valid JSON: {exc}") from None
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
    except RecursionError:  # reading the JSON, or validating what it holds
        raise Refused(request_id, too_deep()) from None
    return request_id, "id" in msg, method, params


def too_deep() -> RpcError:
    """The `parse_error` of a request nested deeper than the broker reads, wherever the
    nesting is (top level, `id`, `params` or anything inside them)."""
    return RpcError(
        ErrorCode.PARSE_ERROR,
        f"JSON nested too deeply ({sys.getrecursionlimit()} levels at most)",
    )
