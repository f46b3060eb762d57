"""Safety headers on every response: a Content-Security-Policy without inline script (the
API documentation under `/schema` included: it is plain HTML, `rbroker_server.api.docs`),
no framing, no referrer, no MIME sniffing; `Cache-Control: no-store` on everything that
does not set its own caching (fleet data, authenticated or not, is never kept by a cache;
the static files say `max-age`); a `WWW-Authenticate` challenge on a 401 that has none; and
HSTS on answers sent over HTTPS (or behind a proxy serving an `https://` external URL).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from litestar.types import ASGIApp, Message, Receive, Scope, Send

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)

HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", CSP.encode()),
)

HSTS: Final = (b"strict-transport-security", b"max-age=31536000")
"""One year; no `includeSubDomains`: the coordinator does not speak for its domain."""

NO_STORE: Final = (b"cache-control", b"no-store")
CHALLENGE: Final = (b"www-authenticate", b'Bearer realm="rbroker", charset="UTF-8"')
_OURS: Final = frozenset(h for h, _ in HEADERS)


def security_headers_for(https_external: bool = False) -> Callable[[ASGIApp], ASGIApp]:
    """The middleware; `https_external`: the coordinator is served at an `https://`
    external URL by a proxy (HSTS then on every answer, though the hop to it is HTTP)."""

    def security_headers(app: ASGIApp) -> ASGIApp:
        """ASGI middleware adding the headers of the module docstring."""

        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            https = https_external or scope.get("scheme") == "https"

            async def send_with_headers(message: Message) -> None:
                if message["type"] == "http.response.start":
                    headers = [
                        (k, v) for k, v in message.get("headers", []) if k.lower() not in _OURS
                    ]
                    names = {k.lower() for k, _ in headers}
                    headers.extend(HEADERS)
                    if b"cache-control" not in names:
                        headers.append(NO_STORE)
                    if message["status"] == 401 and b"www-authenticate" not in names:
                        headers.append(CHALLENGE)
                    if https:
                        headers.append(HSTS)
                    message["headers"] = headers
                await send(message)

            await app(scope, receive, send_with_headers)

        return middleware

    return security_headers


security_headers = security_headers_for()
"""The middleware for a coordinator served directly (HSTS on its HTTPS answers)."""
