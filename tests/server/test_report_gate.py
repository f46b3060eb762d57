"""The report gate (`reports.gate.ReportGate`, in front of the framework) answers exactly
as the documented Litestar route (`reports.controller.report_route`) does: every refusal
with the same status, JSON body and headers, every acceptance with the same answer."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import httpx
import nacl.signing
from litestar import Litestar
from litestar.exceptions import HTTPException
from sqlalchemy.engine import Engine

from rbroker_protocol import signing
from rbroker_protocol.enroll import EnrollRequest
from rbroker_server.admin import operations as admin
from rbroker_server.api.answers import json_error
from rbroker_server.db import faults as dbfaults
from rbroker_server.edge.asgi import HeadAsGet
from rbroker_server.edge.compression import MIN_BYTES, GzipAnswers
from rbroker_server.enroll import service as enroll_service
from rbroker_server.reports.controller import report_route
from rbroker_server.reports.gate import ReportFront, ReportGate
from rbroker_server.reports.ingest import ReportIngest
from rbroker_server.settings import Settings
from rbroker_server.web.headers import security_headers_for
from tests.fakes.reports import payload, signed_body


def _enroll(engine: Engine, name: str) -> tuple[str, nacl.signing.SigningKey]:
    key = nacl.signing.SigningKey.generate()
    code = admin.create_enroll_code(engine, "vision", 600).text
    req = EnrollRequest(code=code, name=name, public_key=signing.public_key_b64(key))
    return enroll_service.enroll(engine, req).computer_id, key


def _cases(engine: Engine) -> list[tuple[str, bytes, dict[str, str]]]:
    """(what, body, headers) of one request of each kind, for one computer of its own."""
    json_type = {"content-type": "application/json"}
    cid, key = _enroll(engine, "lab-1")
    revoked, revoked_key = _enroll(engine, "lab-2")

    def envelope(seq: int, raw: bytes | None = None, k: Any = key, c: str = cid) -> bytes:
        return signed_body(k, c, "run-1", seq, raw if raw is not None else payload())

    forged = envelope(3, k=nacl.signing.SigningKey.generate())
    flipped = json.loads(envelope(4))
    raw = bytearray(base64.b64decode(flipped["payload"]))
    raw[len(raw) // 2] ^= 1
    flipped["payload"] = base64.b64encode(bytes(raw)).decode()
    deep = b'{"a":' * 40 + b"1" + b"}" * 40
    return [
        ("new run", envelope(1), json_type),
        ("applied", envelope(2), json_type),
        ("replay", envelope(2), json_type),
        ("older", envelope(1), json_type),
        ("forged", forged, json_type),
        ("flipped byte", json.dumps(flipped).encode(), json_type),
        ("not json", b"not json", json_type),
        ("no content type", envelope(5), {}),
        ("text/plain", envelope(5), {"content-type": "text/plain"}),
        ("too large", b'{"pad":"' + b"x" * (1024 * 1024) + b'"}', json_type),
        ("nested", deep, json_type),
        ("invalid payload", envelope(6, b'{"report_version": 1}'), json_type),
        ("revoked", envelope(1, k=revoked_key, c=revoked), json_type),
        ("unknown", envelope(1, c="c_unknown"), json_type),
    ]


async def _not_found(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("the gate passed a report on")


def _answers(
    handler: Any, cases: list[tuple[str, bytes, dict[str, str]]]
) -> list[tuple[str, int, dict[str, Any], dict[str, str]]]:
    async def run() -> list[tuple[str, int, dict[str, Any], dict[str, str]]]:
        transport = httpx.ASGITransport(app=handler)
        out = []
        async with httpx.AsyncClient(transport=transport, base_url="http://coordinator") as http:
            for what, body, headers in cases:
                r = await http.post("/api/v1/reports", content=body, headers=headers)
                kept = {
                    k: v
                    for k, v in r.headers.items()
                    if k in ("content-type", "www-authenticate", "retry-after")
                }
                out.append((what, r.status_code, r.json(), kept))
        return out

    return asyncio.run(run())


def test_the_gate_answers_as_the_route(engine: Engine, database_url: str, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", database_url=database_url)
    admin.create_group(engine, "vision")
    faults = dbfaults.DatabaseFaults(engine, settings)
    ingest = ReportIngest(engine, settings)
    ingest.start()
    route = Litestar(
        route_handlers=[report_route(ingest)],
        exception_handlers={
            HTTPException: json_error,
            **dict.fromkeys(dbfaults.FAULTS, faults.answer),
        },
        request_max_body_size=settings.max_body_bytes,
    )
    gate = ReportGate(_not_found, ingest, faults, (), settings.max_body_bytes)
    try:
        by_route_cases = _cases(engine)
        by_gate_cases = _cases(engine)
        for cases in (by_route_cases, by_gate_cases):
            revoked_id = json.loads(cases[-2][1])["computer_id"]
            assert admin.revoke_computer(engine, revoked_id)
        by_route = _answers(route, by_route_cases)
        by_gate = _answers(gate, by_gate_cases)
    finally:
        ingest.close()
        faults.close()
    assert [a[0] for a in by_gate] == [a[0] for a in by_route]
    for (what, status, body, headers), (_, g_status, g_body, g_headers) in zip(
        by_route, by_gate, strict=True
    ):
        assert g_status == status, what
        assert g_headers == headers, what
        if status == 200:
            # the same answer but for the computer (each path had one of its own)
            assert {**g_body, "computer_id": ""} == {**body, "computer_id": ""}, what
        else:
            assert g_body == body, what
    assert [s for _, s, _, _ in by_gate] == [
        200,
        200,
        200,
        200,
        401,
        401,
        401,
        415,
        415,
        413,
        400,
        422,
        403,
        401,
    ]
    assert [b.get("code") for _, _, b, _ in by_gate[:4]] == [
        "new_run",
        "applied",
        "not_newer",
        "not_newer",
    ]


def _wrap(https_external: bool) -> Any:
    headers = security_headers_for(https_external)
    return lambda handler: headers(HeadAsGet(GzipAnswers(handler)))


def _sent(handler: Any, scope: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    asyncio.run(handler(scope, receive, send))
    return messages


def test_the_front_adds_the_wrappers_headers_as_they_do(engine: Engine, tmp_path: Path) -> None:
    """`ReportFront.send_answer` sends what the wrappers around `ReportGate.send_answer`
    send: the same messages, headers in the same order, for every kind of answer."""
    settings = Settings(data_dir=tmp_path / "data")
    faults = dbfaults.DatabaseFaults(engine, settings)
    ingest = ReportIngest(engine, settings)
    json_type = [(b"content-type", b"application/json")]
    big = b'{"detail":"' + b"x" * MIN_BYTES + b'"}'
    answers = [
        (200, [], b'{"applied":true}'),
        (401, [(b"www-authenticate", b'Rbroker-Signature realm="rbroker"')], b"{}"),
        (401, [], b'{"status_code":401}'),
        (503, [(b"retry-after", b"5")], b'{"status_code":503}'),
        (422, [], big),
        (422, [], big[: MIN_BYTES - 1]),
    ]
    try:
        for https_external in (False, True):
            wrap = _wrap(https_external)
            gate = ReportGate(_not_found, ingest, faults, (), settings.max_body_bytes)
            front = ReportFront(
                _not_found,
                wrap,
                ingest,
                faults,
                (),
                settings.max_body_bytes,
                https_external=https_external,
            )
            for scheme in ("http", "https"):
                for accept in (b"gzip", b"identity"):
                    for status, extra, body in answers:
                        scope = {
                            "type": "http",
                            "method": "POST",
                            "scheme": scheme,
                            "path": "/api/v1/reports",
                            "headers": [(b"accept-encoding", accept)],
                        }
                        headers = [*extra, *json_type, (b"content-length", b"%d" % len(body))]

                        async def by_gate(scope: Any, receive: Any, send: Any) -> None:
                            await gate.send_answer(scope, send, status, list(headers), body)  # noqa: B023

                        async def by_front(scope: Any, receive: Any, send: Any) -> None:
                            await front.send_answer(scope, send, status, list(headers), body)  # noqa: B023

                        expected = _sent(wrap(by_gate), scope)
                        got = _sent(by_front, scope)
                        what = (https_external, scheme, accept, status, len(body))
                        assert got == expected, what
                        assert len(got) == 2, what
                        names = [k for k, _ in got[0]["headers"]]
                        assert b"content-security-policy" in names, what
                        assert (b"strict-transport-security" in names) == (
                            https_external or scheme == "https"
                        ), what
                        gzipped = (b"content-encoding", b"gzip") in got[0]["headers"]
                        assert gzipped == (accept == b"gzip" and len(body) >= MIN_BYTES), what
    finally:
        faults.close()


def test_the_front_takes_the_report_path_in_its_exact_forms_only(
    engine: Engine, tmp_path: Path
) -> None:
    """Under a prefix the front takes the report path with the prefix, and without it where
    the prefix would not strip it, byte for byte; any other spelling goes to the app."""
    settings = Settings(data_dir=tmp_path / "data")
    faults = dbfaults.DatabaseFaults(engine, settings)
    ingest = ReportIngest(engine, settings)
    try:

        def front(prefix: str) -> ReportFront:
            return ReportFront(_not_found, _wrap(False), ingest, faults, (), 1024, prefix=prefix)

        def takes(f: ReportFront, raw: bytes) -> bool:
            return f.takes({"path": raw.decode(), "raw_path": raw})

        plain, under, api = front(""), front("/rbroker"), front("/api")
        for raw in (b"/api/v1/reports", b"/api/v1/reports/"):
            assert takes(plain, raw) and takes(under, raw)
            assert takes(under, b"/rbroker" + raw)
            assert not takes(api, raw)  # `/api` would be stripped from it: a 404
            assert takes(api, b"/api" + raw)
        assert not takes(under, b"/rbroker/api/v1/report%73")
        assert not takes(under, b"/rbroker//api/v1/reports")
        assert not takes(plain, b"/api/v1/fleet")
    finally:
        faults.close()
