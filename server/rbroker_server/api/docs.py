"""The API's documentation: the page at `/schema`, plain HTML rendered on the server from
the OpenAPI schema, with no script and nothing loaded from elsewhere (a coordinator often has
no internet access, and the page is served under the same Content-Security-Policy as every
other page); the schema itself is at `/schema/openapi.json`. Also what the schema declares
beyond what the framework finds: every error answer (`errors`) and the report envelope body
(`EnvelopeBodyOperation`).
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from typing import Any, Final

from litestar import Request
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.plugins import OpenAPIRenderPlugin
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIType, Operation, RequestBody, Schema
from pydantic import BaseModel

_METHODS = ("get", "post", "put", "patch", "delete")


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _ref_name(schema: dict[str, Any]) -> str:
    ref = schema.get("$ref", "")
    return ref.rsplit("/", 1)[-1] if ref else schema.get("type", "any")


def _operation(path: str, method: str, op: dict[str, Any]) -> list[str]:
    out = [f'<section id="{_e(op.get("operationId", method + path))}">']
    out.append(f"<h3><code>{_e(method.upper())} {_e(path)}</code></h3>")
    if op.get("summary"):
        out.append(f"<p><strong>{_e(op['summary'])}</strong></p>")
    if op.get("description"):
        out.extend(f"<p>{_e(part)}</p>" for part in str(op["description"]).split("\n\n"))
    params = op.get("parameters", [])
    if params:
        out.append("<p>Parameters:</p><ul>")
        for p in params:
            required = " (required)" if p.get("required") else ""
            out.append(f"<li><code>{_e(p.get('name'))}</code> in {_e(p.get('in'))}{required}</li>")
        out.append("</ul>")
    body = op.get("requestBody", {}).get("content", {})
    for media, content in body.items():
        name = _ref_name(content.get("schema", {}))
        out.append(f"<p>Body: <code>{_e(media)}</code>, schema <code>{_e(name)}</code></p>")
    responses = op.get("responses", {})
    if responses:
        out.append("<p>Answers:</p><ul>")
        for code, answer in sorted(responses.items()):
            out.append(f"<li><code>{_e(code)}</code> {_e(answer.get('description', ''))}</li>")
        out.append("</ul>")
    out.append("</section>")
    return out


def render_page(schema: dict[str, Any], json_url: str) -> str:
    """The documentation page of `schema` (an OpenAPI document as a dict) as HTML text,
    every value escaped; `json_url` is where the schema can be downloaded."""
    info = schema.get("info", {})
    title = f"{info.get('title', 'API')} {info.get('version', '')}".strip()
    out = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_e(title)}</title></head><body>",
        f"<h1>{_e(title)}</h1>",
        f"<p>{_e(info.get('description', ''))}</p>",
        f'<p>The OpenAPI document: <a href="{_e(json_url)}">{_e(json_url)}</a>.</p>',
        "<h2>Operations</h2>",
    ]
    for path, item in schema.get("paths", {}).items():
        for method in _METHODS:
            if method in item:
                out.extend(_operation(path, method, item[method]))
    schemas = schema.get("components", {}).get("schemas", {})
    if schemas:
        out.append("<h2>Schemas</h2>")
        for name, body in schemas.items():
            out.append(f'<h3 id="schema-{_e(name)}">{_e(name)}</h3>')
            out.append(f"<pre>{_e(json.dumps(body, indent=2, sort_keys=True))}</pre>")
    out.append("</body></html>")
    return "\n".join(out)


class DocsRenderPlugin(OpenAPIRenderPlugin):
    """`/schema` (and `/schema/docs`): `render_page` of the app's schema."""

    def __init__(self) -> None:
        super().__init__(path=["/", "/docs"])

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        """The page as UTF-8 HTML."""
        # the route as the browser reaches it: behind a proxy, under its prefix
        from rbroker_server.web.controller import base_path

        route = base_path(request) + self.get_openapi_json_route(request)
        return render_page(openapi_schema, route).encode()


class ErrorAnswer(BaseModel):
    """Every error answer of the API: the HTTP status, the problem in words and, for a body
    that does not fit its schema, the fields concerned."""

    status_code: int
    detail: str
    extra: list[dict[str, Any]] | dict[str, Any] | None = None


ERROR_WORDS: Final[dict[int, str]] = {
    400: "Malformed: the body does not fit its schema, or it is nested too deeply.",
    401: "Not authenticated (with `WWW-Authenticate`).",
    403: "Authentic but not allowed (a revoked computer).",
    404: "No such computer in the caller's group.",
    409: "This public key is already enrolled.",
    413: "The body is over the size limit (1 MiB).",
    415: "The body is not `application/json`.",
    422: "An authentic report whose payload does not fit the report schema.",
    429: "Too many attempts from this address; `Retry-After` says when to try again.",
    503: "The database is unavailable; `Retry-After` says when to try again.",
}
"""What each error status of the API means (the schema's description of it)."""


def errors(*codes: int) -> dict[int, ResponseSpec]:
    """The OpenAPI error answers `codes` of a route (each an `ErrorAnswer`)."""
    return {
        code: ResponseSpec(
            data_container=ErrorAnswer, description=ERROR_WORDS[code], generate_examples=False
        )
        for code in codes
    }


ENVELOPE_SCHEMA: Final = Schema(
    type=OpenAPIType.OBJECT,
    required=["v", "computer_id", "run_id", "seq", "payload", "sig"],
    properties={
        "v": Schema(type=OpenAPIType.INTEGER, enum=[1], description="Envelope version."),
        "computer_id": Schema(type=OpenAPIType.STRING, pattern=r"^[A-Za-z0-9_.:-]{1,64}$"),
        "run_id": Schema(type=OpenAPIType.STRING, pattern=r"^[A-Za-z0-9_.:-]{1,64}$"),
        "seq": Schema(type=OpenAPIType.INTEGER, minimum=0, maximum=2**63 - 1),
        "payload": Schema(
            type=OpenAPIType.STRING,
            description="Base64 of the exact JSON bytes of a report payload "
            "(`rbroker_protocol.reports.ReportPayload`).",
        ),
        "sig": Schema(
            type=OpenAPIType.STRING,
            description="Base64 of the 64-byte Ed25519 signature (rbroker_protocol.signing).",
        ),
    },
    description="A signed report envelope (docs/architecture.md §7).",
)
"""The request body of `POST /api/v1/reports` (read as exact bytes, not decoded by the
framework, so it is declared here)."""


@dataclass
class EnvelopeBodyOperation(Operation):
    """An operation whose request body is the signed report envelope (`ENVELOPE_SCHEMA`)."""

    def __post_init__(self) -> None:
        if self.request_body is None:
            self.request_body = RequestBody(
                content={"application/json": OpenAPIMediaType(schema=ENVELOPE_SCHEMA)},
                required=True,
            )
