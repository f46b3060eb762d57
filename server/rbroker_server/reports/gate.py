"""`POST /api/v1/reports` answered in front of the framework: the hot path of a
coordinator (architecture.md §10), without routing, request objects or middleware.

`ReportGate` takes only that method and path (with or without a trailing slash) and gives
the answers the Litestar route (`controller.report_route`) gives: the content type checked
before anything is read (415), the body size (413, announced or streamed), the nesting
(400), then `ReportIngest.handle` with `controller.refusal` for its refusals, a database
fault through the app's `DatabaseFaults` (503 with `Retry-After`) and a fault of ours as a
bare 500. Error bodies are `answers.json_error`'s: `{"status_code", "detail"}` as JSON.
It sits inside `PrefixStrip` and the security headers, so paths are the app's own and
every answer gets the same headers as the framework's. `ReportFront` is the same gate
outside all the app's wrappers, adding their headers itself (worked out once): what a
report takes in `create_app`; the inner gate answers the spellings of the path it leaves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgspec
from litestar.exceptions import HTTPException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from rbroker_protocol.signing import canonical_target
from rbroker_server.api.answers import INTERNAL
from rbroker_server.db import faults as dbfaults
from rbroker_server.db.engine import utcnow
from rbroker_server.edge.bodies import check_depth, check_media_type
from rbroker_server.edge.compression import MIN_BYTES
from rbroker_server.edge.net import Network, scope_client
from rbroker_server.metrics import health
from rbroker_server.reports.controller import PATH, refusal
from rbroker_server.reports.ingest import ReportIngest
from rbroker_server.web.headers import CHALLENGE, HEADERS, HSTS, NO_STORE

log = logging.getLogger(__name__)

_PATHS: Final = frozenset({PATH, PATH + "/"})
_JSON: Final = (b"content-type", b"application/json")
_ENCODE: Final = msgspec.json.Encoder()
_VARY: Final = (b"vary", b"Accept-Encoding")
"""What `compression.GzipAnswers` adds to a JSON answer it does not compress."""

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]


class _Disconnected(Exception):
    """The client went away before its body had arrived."""


class ReportGate:
    """ASGI wrapper: `POST /api/v1/reports` by `ingest`, everything else to `app`.

    Args:
        app: the app behind it.
        ingest: the app's report path.
        faults: the app's database fault episodes.
        trusted: the trusted proxies (for the client address in a 401's log line).
        max_body_bytes: the largest body (`Settings.max_body_bytes`).
        proxy_secret: `Settings.trusted_proxy_secret` (`net.scope_client`).
    """

    def __init__(
        self,
        app: ASGIApp,
        ingest: ReportIngest,
        faults: dbfaults.DatabaseFaults,
        trusted: Sequence[Network],
        max_body_bytes: int,
        proxy_secret: str = "",
    ) -> None:
        self.app = app
        self.proxy_secret = proxy_secret
        self.ingest = ingest
        self.faults = faults
        self.trusted = tuple(trusted)
        self.max_body_bytes = max_body_bytes

    def takes(self, scope: dict[str, Any]) -> bool:
        """Whether the request is one of this gate's (the method is POST already)."""
        return scope["path"] in _PATHS

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        http: dict[str, Any] = scope  # type: ignore[assignment]  # read as plain ASGI
        if http["type"] != "http" or http["method"] != "POST" or not self.takes(http):
            await self.app(scope, receive, send)
            return
        arrived: list[float] = []
        try:
            status, headers, body = await self._answer(http, receive, arrived)
        except _Disconnected:
            return
        if arrived:
            health.INGEST_SECONDS.observe(time.perf_counter() - arrived[0])
        if status != 200:
            health.report_refused(status)
        headers += [_JSON, (b"content-length", str(len(body)).encode())]
        await self.send_answer(http, send, status, headers, body)

    async def send_answer(
        self,
        scope: dict[str, Any],
        send: Send,
        status: int,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> None:
        """Send the answer: its start (status, headers) and its whole body."""
        start: Any = {"type": "http.response.start", "status": status, "headers": headers}
        await send(start)
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _answer(
        self, scope: dict[str, Any], receive: Receive, arrived: list[float]
    ) -> Answer:
        """The answer; `arrived` gets the `time.perf_counter()` of the whole body."""
        try:
            body = await self._body(scope, receive)
            arrived.append(time.perf_counter())
            received_at = utcnow()  # the freshness clock: when the whole body had arrived
            return 200, [], await self.ingest.handle(body, received_at)
        except _Disconnected:
            raise
        except HTTPException as exc:
            return _error(exc)
        except dbfaults.FAULTS as exc:
            why = self.faults.fault(exc)
            retry = [(b"retry-after", str(self.faults.retry_after_s).encode())]
            detail = f"{why}; try again later"
            return 503, retry, _ENCODE.encode({"status_code": 503, "detail": detail})
        except Exception as exc:
            refused = refusal(exc, lambda: self._client(scope))
            if refused is None:
                log.exception("a report failed")
                return 500, [], _ENCODE.encode({"status_code": 500, "detail": INTERNAL})
            return _error(refused)

    async def _body(self, scope: dict[str, Any], receive: Receive) -> bytes:
        """The body after the checks of `bodies.json_body`."""
        content_type: str | None = None
        length: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"content-type":
                content_type = value.decode("latin-1")
            elif name == b"content-length":
                length = value
        check_media_type(content_type)
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            raise RequestEntityTooLarge
        chunks: list[bytes] = []
        size = 0
        while True:
            message: dict[str, Any] = await receive()  # type: ignore[assignment]
            if message["type"] == "http.disconnect":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise RequestEntityTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        check_depth(body)
        return body

    def _client(self, scope: dict[str, Any]) -> str:
        return scope_client(scope, self.trusted, self.proxy_secret)


class ReportFront(ReportGate):
    """`ReportGate` outside the app's ASGI wrappers (`wrap`: the security headers, gzip,
    HEAD, put around the app by `create_app`), so that a report's answer does not pass
    through each of them: the headers they add to it are worked out here, once, as the
    wrappers would (the same names, values and order; a test holds them to the wrappers'),
    and an answer they could change otherwise (a body of `compression.MIN_BYTES` or more,
    which gzip may compress) is sent through `wrap` itself.

    Args:
        app: the app with its wrappers, for every other request.
        wrap: the wrappers, to put around one answer.
        https_external: `security_headers_for`'s argument (HSTS on every answer).
        prefix: `PrefixStrip`'s prefix (canonical, no trailing slash; "" for none): the
            report path under it is taken in its exact form only, and so is the path
            without it when the prefix would not strip it; any other spelling goes to
            `app` (whose own `ReportGate` sees the path after `PrefixStrip`).
        The rest as `ReportGate`'s.
    """

    def __init__(
        self,
        app: ASGIApp,
        wrap: Callable[[ASGIApp], ASGIApp],
        ingest: ReportIngest,
        faults: dbfaults.DatabaseFaults,
        trusted: Sequence[Network],
        max_body_bytes: int,
        proxy_secret: str = "",
        *,
        https_external: bool = False,
        prefix: str = "",
    ) -> None:
        super().__init__(app, ingest, faults, trusted, max_body_bytes, proxy_secret)
        self.wrap = wrap
        self.https_external = https_external
        self.raw_paths: frozenset[bytes] | None = None
        if prefix:
            under = [prefix + p for p in sorted(_PATHS)]
            if not PATH.startswith(prefix + "/"):
                under += sorted(_PATHS)
            self.raw_paths = frozenset(p.encode("ascii") for p in under if canonical_target(p) == p)
        self.tail = [_VARY, *HEADERS, NO_STORE]

    def takes(self, scope: dict[str, Any]) -> bool:
        if self.raw_paths is None:
            return scope["path"] in _PATHS
        return scope.get("raw_path") in self.raw_paths

    async def send_answer(
        self,
        scope: dict[str, Any],
        send: Send,
        status: int,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> None:
        if len(body) >= MIN_BYTES:
            answer = super().send_answer

            async def replay(scope: Scope, receive: Receive, send: Send) -> None:
                await answer(scope, send, status, headers, body)  # type: ignore[arg-type]

            await self.wrap(replay)(scope, _no_receive, send)  # type: ignore[arg-type]
            return
        # what gzip (below its size) and the security headers add, in their order
        names = {name for name, _ in headers}
        headers += self.tail
        if status == 401 and b"www-authenticate" not in names:
            headers.append(CHALLENGE)
        if self.https_external or scope.get("scheme") == "https":
            headers.append(HSTS)
        await super().send_answer(scope, send, status, headers, body)


async def _no_receive() -> Message:
    raise RuntimeError("the report's body was read already")


def _error(exc: HTTPException) -> Answer:
    content: dict[str, Any] = {"status_code": exc.status_code, "detail": exc.detail}
    if exc.extra:
        content["extra"] = exc.extra
    headers = [
        (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (exc.headers or {}).items()
    ]
    return exc.status_code, headers, _ENCODE.encode(content)
