"""JSON-RPC 2.0 framing of the local API: one UTF-8 JSON object per line (architecture.md §5)."""

from __future__ import annotations

import json
from typing import Any, Final

MAX_LINE_BYTES: Final = 64 * 1024
"""Longest accepted request line, newline excluded. Longer lines get `request_too_large`."""


def encode(message: dict[str, Any]) -> bytes:
    """Serialise one message as a compact JSON line ending in `\\n` (UTF-8).

    Text that UTF-8 cannot carry (a lone surrogate such as `"\\ud800"`, which JSON's
    `\\u` escapes can produce) is written as a JSON `\\u` escape instead, so every
    message can be sent: a request id or method name echoed back never makes an answer fail.
    """
    text = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode() + b"\n"
    except UnicodeEncodeError:
        return json.dumps(message, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"


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
