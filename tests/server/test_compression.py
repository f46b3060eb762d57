"""Compressed answers (issue 44, "big answers"; server/rbroker_server/edge/compression.py):
JSON, CSV, HTML, the metrics and static files go out gzipped to a client that accepts gzip,
never to one that does not; big bodies are compressed off the event loop."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from rbroker_server.edge.compression import MIN_BYTES, THREAD_BYTES, GzipAnswers, accepts_gzip
from rbroker_server.web.controller import STATIC
from tests.server.conftest import Coordinator


@pytest.mark.parametrize(
    ("header", "gzip_ok"),
    [
        ("gzip", True),
        ("gzip, deflate, br", True),
        ("br;q=1.0, gzip;q=0.8", True),
        ("GZIP", True),
        ("x-gzip", True),
        ("*", True),
        ("identity", False),
        ("", False),
        ("gzip;q=0", False),
        ("gzip;q=0.0, identity", False),
        ("*;q=0", False),
        ("deflate, br", False),
        ("gzip;q=nonsense", True),
    ],
)
def test_accept_encoding_is_read_as_rfc_9110_says(header: str, gzip_ok: bool) -> None:
    assert accepts_gzip(header) is gzip_ok


class Raw:
    """An answer's status, headers and body as sent (not decoded)."""

    def __init__(self, c: Coordinator, path: str, encoding: str, **headers: str) -> None:
        with httpx.Client(base_url=c.url) as client:
            sent = {"accept-encoding": encoding, **headers}
            with client.stream("GET", path, headers=sent) as response:
                self.content = b"".join(response.iter_raw())
                self.status_code = response.status_code
                self.headers = response.headers


def _big_group(coordinator: Coordinator) -> None:
    coordinator.group("alpha")
    for i in range(4):
        assert coordinator.enroll("alpha", f"lab-{i}").report().status_code == 200


def test_the_fleet_json_is_gzipped_only_for_a_client_that_accepts_it(
    coordinator: Coordinator,
) -> None:
    _big_group(coordinator)
    auth = coordinator.viewer("alpha")
    zipped = Raw(coordinator, "/api/v1/fleet", "gzip, deflate", **auth)
    plain = Raw(coordinator, "/api/v1/fleet", "identity", **auth)
    refused = Raw(coordinator, "/api/v1/fleet", "gzip;q=0", **auth)
    assert zipped.status_code == plain.status_code == refused.status_code == 200
    assert zipped.headers["content-encoding"] == "gzip"
    assert int(zipped.headers["content-length"]) == len(zipped.content)
    assert "accept-encoding" in zipped.headers["vary"].lower()
    assert "content-encoding" not in plain.headers and "content-encoding" not in refused.headers
    assert "accept-encoding" in plain.headers["vary"].lower()  # caches keep both apart
    assert len(plain.content) >= MIN_BYTES
    assert len(zipped.content) < len(plain.content) / 3
    unzipped = json.loads(gzip.decompress(zipped.content))
    expected = json.loads(plain.content)
    for body in (unzipped, expected):
        body.pop("generated_at")
        for computer in body["computers"]:
            computer["freshness"].pop("age_s")
    assert unzipped == expected


def _gzipped_when_worth_it(c: Coordinator, path: str, masked: bool = False, **auth: str) -> str:
    """Asserts `path` goes out gzipped when its body is worth it (MIN_BYTES), else as it
    is, the same bytes either way (`masked`: a page whose CSRF token is masked afresh in
    every answer, the same length); its content type."""
    zipped, plain = Raw(c, path, "gzip", **auth), Raw(c, path, "", **auth)
    assert zipped.status_code == plain.status_code == 200, plain.content
    if len(plain.content) >= MIN_BYTES:
        assert zipped.headers["content-encoding"] == "gzip"
        unzipped = gzip.decompress(zipped.content)
        assert len(unzipped) == len(plain.content) if masked else unzipped == plain.content
    else:  # too small to gain
        assert "content-encoding" not in zipped.headers and zipped.content == plain.content
    return str(plain.headers["content-type"])


def test_csv_pages_metrics_and_static_files_are_gzipped(coordinator: Coordinator) -> None:
    _big_group(coordinator)
    auth = coordinator.viewer("alpha")
    usage = "/api/v1/usage?days=7&by=project&format=csv"
    assert _gzipped_when_worth_it(coordinator, usage, **auth).startswith("text/csv")
    assert _gzipped_when_worth_it(coordinator, "/signin", masked=True).startswith("text/html")
    metrics = Raw(coordinator, "/metrics", "gzip", **auth)
    assert metrics.headers["content-encoding"] == "gzip"
    assert b"rbroker_" in gzip.decompress(metrics.content)
    script = Raw(coordinator, "/static/uPlot.iife.min.js", "gzip")
    assert script.status_code == 200
    assert script.headers["content-encoding"] == "gzip"
    assert gzip.decompress(script.content) == (Path(STATIC) / "uPlot.iife.min.js").read_bytes()
    health = Raw(coordinator, "/healthz", "gzip")
    assert "content-encoding" not in health.headers
    small = Raw(coordinator, "/api/v1/fleet", "gzip", authorization="Bearer rbv_nope_x")
    assert small.status_code == 401 and "content-encoding" not in small.headers  # < 1 KiB


def test_a_big_body_is_compressed_off_the_event_loop() -> None:
    """While a body of THREAD_BYTES or more is compressed, the loop runs other tasks: a
    ticker beside it keeps ticking (compressed in the loop, it could not tick at all)."""
    body = json.dumps([{"lease": i, "owner": f"user{i % 50}"} for i in range(400_000)]).encode()
    assert len(body) >= 16 * THREAD_BYTES

    async def app(scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    sent: list[dict[str, Any]] = []
    ticks = 0

    async def main() -> None:
        nonlocal ticks
        done = anyio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await anyio.sleep(0)

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "path": "/api/v1/fleet",
            "headers": [(b"accept-encoding", b"gzip")],
        }
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            await anyio.sleep(0)
            ticks = 0
            await GzipAnswers(app)(scope, None, send)  # type: ignore[arg-type]
            done.set()

    anyio.run(main)
    assert ticks > 10, ticks
    start, answer = sent
    assert dict(start["headers"])[b"content-encoding"] == b"gzip"
    assert gzip.decompress(answer["body"]) == body
