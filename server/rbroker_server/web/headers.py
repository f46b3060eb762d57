"""Safety headers on every response: a Content-Security-Policy without inline script,
no framing, no referrer, no MIME sniffing.

The OpenAPI pages under `/schema` load their own scripts and keep Litestar's defaults
(they get every header but the CSP).
"""

from __future__ import annotations

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
)


def security_headers(app: ASGIApp) -> ASGIApp:
    """ASGI middleware adding `HEADERS` (and `CSP` outside `/schema`) to HTTP responses."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        with_csp = not scope["path"].startswith("/schema")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.lower() not in {h for h, _ in HEADERS}
                ]
                headers.extend(HEADERS)
                if with_csp:
                    headers.append((b"content-security-policy", CSP.encode()))
                message["headers"] = headers
            await send(message)

        await app(scope, receive, send_with_headers)

    return middleware
