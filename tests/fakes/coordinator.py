"""A scripted coordinator: a small real HTTP server on 127.0.0.1 that answers every POST
(an enrollment, a report) from a script, for the tests of how the desktop reads answers a
real coordinator would rarely give (a proxy's page, 4xx/5xx with hints, a fleet view of
another shape).

    with FakeCoordinator([Answer(429, headers={"Retry-After": "3"})]) as fake:
        ...  # point a broker or `enroll` at fake.url
        fake.arrivals  # monotonic seconds at which each request arrived
        fake.bodies  # each request's body, as sent

The n-th request gets `script[n]`, every one after the script `then` (which a test may
change between requests). The coordinator's real answers are tested against the real
coordinator (tests/e2e)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

ACK: dict[str, Any] = {"applied": True, "code": "applied", "reason": ""}
"""The coordinator's acknowledgement of an applied report (`rbroker_protocol.reports.ReportAck`)."""


@dataclass
class Answer:
    """One scripted answer: `status`, then `body` (bytes as they are, anything else as JSON;
    `None` for the coordinator's error shape `{"status_code", "detail"}` with `detail`, or
    `ACK` for a 200), and `headers` (a value may be a function, called when answering)."""

    status: int
    body: Any = None
    headers: dict[str, str | Callable[[], str]] = field(default_factory=dict)
    detail: str = ""

    def encoded(self) -> bytes:
        """The body as sent."""
        if isinstance(self.body, bytes):
            return self.body
        if self.body is not None:
            return json.dumps(self.body).encode()
        if self.status == 200:
            return json.dumps(ACK).encode()
        return json.dumps({"status_code": self.status, "detail": self.detail}).encode()


class FakeCoordinator:
    """Answers requests (POST or GET) in turn from `script`, then with `then` (200 with
    `ACK` unless given); records each request's arrival (monotonic seconds) and body.
    `start()` returns the URL (also `url`); `stop()` (or leaving the `with` block) closes
    it."""

    def __init__(self, script: list[Answer] | None = None, then: Answer | None = None) -> None:
        self.script = list(script or [])
        self.then = then or Answer(200)
        self.arrivals: list[float] = []
        self.bodies: list[bytes] = []
        self.url = ""
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def _next(self, body: bytes) -> Answer:
        with self._lock:
            self.arrivals.append(time.monotonic())
            self.bodies.append(body)
            turn = len(self.arrivals) - 1
        return self.script[turn] if turn < len(self.script) else self.then

    def start(self) -> str:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                answer = fake._next(self.rfile.read(int(self.headers.get("content-length", 0))))
                body = answer.encoded()
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value() if callable(value) else value)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeCoordinator:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
