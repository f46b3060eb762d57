"""gzip for the coordinator's answers, compressed off the event loop when they are big.

Every answer whose type is text-like (JSON, CSV, HTML, the metrics exposition, scripts,
SVG) and whose body is at least `MIN_BYTES` goes out gzipped to a client whose
`Accept-Encoding` accepts gzip (RFC 9110 §12.5.3: `gzip`, `x-gzip` or `*`, not with
`q=0`), with `Vary: Accept-Encoding`; answers that already carry a `Content-Encoding`, and
`/healthz` and `/schema`, go out as they are.

Why not Litestar's `CompressionConfig`: it compresses in the event loop's thread, and a big
group's `GET /api/v1/fleet` (300 computers × 200 leases, 28.5 MB of JSON) holds zlib for
hundreds of milliseconds, while every report, probe and viewer of that process waits. Here a
body of `THREAD_BYTES` or more is compressed in a worker thread (`anyio.to_thread`); smaller
ones, and the chunks of a streamed answer (static files), in the loop, where they cost
microseconds.

BREACH (compression as a side channel on a secret beside attacker-chosen text): the pages'
CSRF tokens are masked afresh in every answer (`rbroker_server.web.sessions`), and the API's
answers carry no secret (tokens travel in headers only), so both are compressed.
"""

from __future__ import annotations

import zlib
from typing import Final

import anyio.to_thread
from litestar.datastructures import MutableScopeHeaders
from litestar.types import ASGIApp, Message, Receive, Scope, Send

GZIP_LEVEL: Final = 6
"""zlib's level (1 fastest … 9 smallest): 6 is gzip's own default."""

MIN_BYTES: Final = 1024
"""Bodies smaller than this go out as they are: gzip's header and trailer would eat the gain."""

THREAD_BYTES: Final = 64 * 1024
"""Bodies of this size or more are compressed in a worker thread, not the event loop."""

EXCLUDED_PREFIXES: Final = ("/healthz", "/schema")

_COMPRESSIBLE: Final = (
    "application/json",
    "application/problem+json",
    "application/javascript",
    "application/openmetrics-text",
    "image/svg+xml",
    "text/",
)


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an `Accept-Encoding` value accepts gzip: a `gzip`, `x-gzip` or `*` coding
    whose `q` is not 0 (a `q` that is not a number counts as 1)."""
    for item in accept_encoding.split(","):
        coding, _, params = item.strip().partition(";")
        if coding.strip().lower() not in ("gzip", "x-gzip", "*"):
            continue
        q = 1.0
        for param in params.split(";"):
            name, _, value = param.strip().partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 1.0
        if q > 0:
            return True
    return False


def gzip_bytes(body: bytes) -> bytes:
    """`body` as one gzip member (RFC 1952) at `GZIP_LEVEL`."""
    packer = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)  # 16 + 15: gzip framing
    return packer.compress(body) + packer.flush()


def _compressible(headers: MutableScopeHeaders) -> bool:
    kind = (headers.get("content-type") or "").lower()
    return kind.startswith(_COMPRESSIBLE) and "content-encoding" not in headers


class GzipAnswers:
    """ASGI wrapper: gzip as the module says. Args: `app`, the wrapped ASGI application."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(EXCLUDED_PREFIXES):
            await self.app(scope, receive, send)
            return
        accept = ""
        for name, value in scope["headers"]:
            if name == b"accept-encoding":
                accept += value.decode("latin-1") + ","
        wanted = accepts_gzip(accept)
        start: Message | None = None
        packer: zlib._Compress | None = None  # a streamed answer being compressed
        passing = False  # an answer going out as it is

        async def send_gzipped(message: Message) -> None:
            nonlocal start, packer, passing
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] != "http.response.body" or start is None or passing:
                await send(message)
                return
            body: bytes = message.get("body", b"")
            more: bool = message.get("more_body", False)
            if packer is not None:  # the next chunk of a compressed stream
                out = packer.compress(body) + (b"" if more else packer.flush())
                await send({"type": "http.response.body", "body": out, "more_body": more})
                return
            headers = MutableScopeHeaders(start)
            if not _compressible(headers):
                passing = True
                await send(start)
                await send(message)
                return
            headers.extend_header_value("vary", "Accept-Encoding")
            if not wanted or (not more and len(body) < MIN_BYTES):
                passing = True
                await send(start)
                await send(message)
                return
            headers["Content-Encoding"] = "gzip"
            if more:  # streamed (a static file): chunk by chunk in the loop, no length
                del headers["Content-Length"]
                packer = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
                await send(start)
                await send(
                    {"type": "http.response.body", "body": packer.compress(body), "more_body": True}
                )
                return
            if len(body) >= THREAD_BYTES:
                out = await anyio.to_thread.run_sync(gzip_bytes, body)
            else:
                out = gzip_bytes(body)
            headers["Content-Length"] = str(len(out))
            await send(start)
            await send({"type": "http.response.body", "body": out, "more_body": False})

        await self.app(scope, receive, send_gzipped)
