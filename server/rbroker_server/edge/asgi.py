"""ASGI wrappers at the coordinator's edge that no route should have to know about.

`HeadAsGet`: `HEAD` is answered wherever `GET` is (RFC 9110 §9.3.2: the same status and
headers, `Content-Length` included, and no body), so load balancers and link checkers that
probe with `HEAD` get 200 instead of 405.
"""

from __future__ import annotations

from litestar.types import ASGIApp, Message, Receive, Scope, Send


class HeadAsGet:
    """ASGI wrapper: a `HEAD` request runs as `GET`; its answer's headers go out unchanged
    and its body is dropped (one empty final body message instead)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "HEAD":
            await self.app(scope, receive, send)
            return
        done = False

        async def send_headers_only(message: Message) -> None:
            nonlocal done
            if message["type"] == "http.response.body":
                if done or message.get("more_body", False):
                    return
                done = True
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, send_headers_only)  # type: ignore[arg-type]
