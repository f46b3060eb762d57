"""What every JSON request body must be before anything parses it: sent as
`application/json` (else 415) and nested at most `MAX_JSON_DEPTH` levels (else 400
"nested too deeply"; a parser would otherwise recurse until it fails with a 500).

`json_body` is the check for handlers that read the body themselves (reports);
`json_body_guard` is the same as a Litestar `before_request` hook for handlers whose
`data` Litestar decodes (enrollment): it runs before that decoding.
"""

from __future__ import annotations

import re
from itertools import accumulate
from typing import Any, Final

from litestar import Request
from litestar.exceptions import ClientException

MAX_JSON_DEPTH: Final = 32
"""Deepest nesting of arrays and objects accepted in a request body. Every body of this
API is at most 4 levels deep (a report's `leases[i].observed_mib`)."""

JSON_MEDIA_TYPE: Final = "application/json"

NESTED_TOO_DEEPLY: Final = f"JSON body nested too deeply (more than {MAX_JSON_DEPTH} levels)"

_STRINGS: Final = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")
_STEP: Final = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class UnsupportedMediaType(ClientException):
    """415: the body is not declared `application/json`."""

    status_code = 415


class NestedTooDeeply(ClientException):
    """400: the body nests arrays and objects deeper than `MAX_JSON_DEPTH`."""

    status_code = 400


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text `data` (0 for a scalar).

    Brackets inside strings do not count. Malformed JSON gets a figure too (the parser
    refuses it afterwards). Linear in `len(data)`, at C speed but for one step per bracket.
    """
    brackets = _STRINGS.sub(b"", data).translate(None, _NOT_BRACKETS)
    return max(accumulate(_STEP[b] for b in brackets), default=0)


def is_json_media_type(content_type: str | None) -> bool:
    """True for `application/json`, with or without parameters (`; charset=utf-8`)."""
    if not content_type:
        return False
    return content_type.partition(";")[0].strip().lower() == JSON_MEDIA_TYPE


def check_content_type(request: Request[Any, Any, Any]) -> None:
    """Raises UnsupportedMediaType unless the request declares a JSON body."""
    check_media_type(request.headers.get("content-type"))


def check_media_type(content_type: str | None) -> None:
    """Raises UnsupportedMediaType unless `content_type` (a Content-Type header's value,
    None when there is none) is JSON."""
    if not is_json_media_type(content_type):
        sent = content_type.partition(";")[0].strip() if content_type else "no Content-Type"
        raise UnsupportedMediaType(f"send the body as {JSON_MEDIA_TYPE} (got {sent[:64]})")


def check_depth(data: bytes) -> None:
    """Raises NestedTooDeeply when `data` nests deeper than `MAX_JSON_DEPTH`.

    A body with few brackets (a report envelope: one object around base64 text) costs two
    `bytes.count` calls: it cannot nest deeper than it has opening brackets.
    """
    if data.count(b"[") + data.count(b"{") <= MAX_JSON_DEPTH:
        return
    if json_depth(data) > MAX_JSON_DEPTH:
        raise NestedTooDeeply(NESTED_TOO_DEEPLY)


async def json_body(request: Request[Any, Any, Any]) -> bytes:
    """The request body after both checks (content type first, before anything is read).

    Raises:
        UnsupportedMediaType (415), NestedTooDeeply (400), and Litestar's 413 for a body
        over the app's `request_max_body_size`.
    """
    check_content_type(request)
    body = await request.body()
    check_depth(body)
    return body


async def json_body_guard(request: Request[Any, Any, Any]) -> None:
    """`before_request` hook: `json_body`, so the body Litestar then decodes is checked."""
    await json_body(request)
