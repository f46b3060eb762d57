"""The local API's JSON-RPC 2.0 lines with the standard library alone (architecture.md §5): one
UTF-8 JSON object per line, its messages built and checked, written and read by `json`.

`rbroker_protocol.jsonrpc` reads and writes the same lines faster with orjson, falling back
on `encode` and `decode` here for what orjson refuses, so both read the same values and
give the same errors. A client that sends a few requests and exits uses these instead
(`rbroker.base.lazy.quick_start`): `json` loads in a fraction of the time orjson and what it
imports take (start-up, docs/architecture.md §10).
"""

from __future__ import annotations

import json
import math

TYPE_CHECKING = False  # typing.TYPE_CHECKING's idiom: no `typing` on a client's start
if TYPE_CHECKING:
    from typing import Any


def encode(message: dict[str, Any]) -> bytes:
    """Serialise one message as a compact JSON line ending in `\\n` (UTF-8), with `json`.

    Text that UTF-8 cannot carry (a lone surrogate such as `"\\ud800"`, which JSON's
    `\\u` escapes can produce) is written as a JSON `\\u` escape instead, so every
    message can be sent: a request id or method name echoed back never makes an answer fail.
    A NaN or an infinity is written as `json` writes it (`NaN`, not JSON): senders refuse
    them first (`non_finite_path`).
    """
    text = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode() + b"\n"
    except UnicodeEncodeError:
        return json.dumps(message, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"


def decode(line: bytes | str) -> Any:
    """Parse one JSON text: `json.loads`.

    Raises:
        ValueError: not valid JSON (`json.JSONDecodeError`).
        UnicodeDecodeError: not UTF-8.
        RecursionError: nested deeper than the interpreter's recursion limit.
    """
    return json.loads(line)


def non_finite_path(value: Any, path: str = "") -> str | None:
    """Where in `value` (dicts and lists, nested) a float is NaN or infinite, as a dotted
    path (`"delay_s"`, `"gpus.0"`; `""` for `value` itself), or None when there is none.
    Such a value has no JSON form (`encode` would write `null`, which means something else):
    a sender refuses it instead."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = non_finite_path(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def request(request_id: int | str | None, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """Build a request object; `request_id=None` makes it a notification."""
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if request_id is not None:
        msg["id"] = request_id
    return msg


def result(request_id: int | str | None, value: Any) -> dict[str, Any]:
    """Build a success response."""
    return {"jsonrpc": "2.0", "id": request_id, "result": value}


def error(request_id: int | str | None, err: dict[str, Any]) -> dict[str, Any]:
    """Build an error response from an error object (see `RpcError.to_wire`)."""
    return {"jsonrpc": "2.0", "id": request_id, "error": err}
