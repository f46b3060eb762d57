"""JSON-RPC 2.0 framing of the local API: one UTF-8 JSON object per line (architecture.md §5).

Messages are read and written with orjson; anything orjson refuses (NaN and infinities, a
lone surrogate, nesting deeper than 1 024, invalid UTF-8) goes through the standard
library's `json` instead, and so does a line with a run of 19 digits or more (orjson reads
an integer past 64 bits as a float), so what is accepted, the values read and every error
a bad line gets are exactly those of `json`. Writing, orjson turns a non-finite float into
`null` (`json` wrote `NaN`, which is not JSON); no answer of the broker holds one.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

import orjson

_DIGITS_AS_ZEROS: Final = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
"""A `bytes.translate` table: each ASCII digit becomes `0`, every other byte a space."""

_LONG_DIGITS: Final = b"0" * 19
"""A run of 19 digits, as `_DIGITS_AS_ZEROS` writes it: an integer orjson may read as a
float. Looked for in the translated line (about 1 ns a byte: a regular expression took
about 10 ns a byte, more than orjson's whole reading of the line)."""

MAX_LINE_BYTES: Final = 64 * 1024
"""Longest accepted request line, newline excluded. Longer lines get `request_too_large`."""


def encode(message: dict[str, Any]) -> bytes:
    """Serialise one message as a compact JSON line ending in `\\n` (UTF-8).

    Text that UTF-8 cannot carry (a lone surrogate such as `"\\ud800"`, which JSON's
    `\\u` escapes can produce) is written as a JSON `\\u` escape instead, so every
    message can be sent: a request id or method name echoed back never makes an answer fail.
    """
    try:
        return orjson.dumps(message, option=orjson.OPT_APPEND_NEWLINE)
    except (TypeError, orjson.JSONEncodeError):
        pass  # a lone surrogate, a non-str key, an int past 64 bits: the slow path
    text = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode() + b"\n"
    except UnicodeEncodeError:
        return json.dumps(message, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"


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


def decode(line: bytes | str) -> Any:
    """Parse one JSON text as `json.loads` does (same values, same errors).

    Raises:
        ValueError: not valid JSON (`json.JSONDecodeError`).
        UnicodeDecodeError: not UTF-8.
        RecursionError: nested deeper than the interpreter's recursion limit.
    """
    data = line.encode("utf-8", "surrogatepass") if isinstance(line, str) else line
    if _LONG_DIGITS not in data.translate(_DIGITS_AS_ZEROS):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # what orjson refuses: json's verdict, and its error
    return json.loads(line)


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
