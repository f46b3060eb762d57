"""JSON-RPC 2.0 framing of the local API: one UTF-8 JSON object per line (architecture.md §5).

Messages are read and written with orjson; anything orjson refuses (NaN and infinities, a
lone surrogate, nesting deeper than 1 024, invalid UTF-8) goes through the standard
library's `json` instead (`rbroker_protocol.framing`, where the messages are built and
checked too), and so does a line with a run of 19 digits or more (orjson reads an integer
past 64 bits as a float), so what is accepted, the values read and every error a bad line
gets are exactly those of `json`. Writing, orjson turns a non-finite float into
`null` (`json` wrote `NaN`, which is not JSON); no answer of the broker holds one.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from rbroker_protocol import framing
from rbroker_protocol.framing import error, non_finite_path, request, result

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
    return framing.encode(message)


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
    return framing.decode(line)


__all__ = ["MAX_LINE_BYTES", "decode", "encode", "error", "non_finite_path", "request", "result"]
