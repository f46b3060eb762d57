"""`POST /api/v1/reports`: the body is the signed envelope, read as exact bytes.

The route is built around the app's `ReportIngest` (`report_route`): no dependency
injection, and the answer is the JSON bytes of a `ReportAck`, encoded once by the ingest
and declared as one in the schema. In the app, `gate.ReportGate` answers this route before
the framework routes (the same ingest, the same answers, `refusal` for both); the route is
what the schema documents and what answers without the gate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from litestar import MediaType, Request, Response, post
from litestar.exceptions import (
    ClientException,
    HTTPException,
    NotAuthorizedException,
    PermissionDeniedException,
    ServiceUnavailableException,
)
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.datastructures import ResponseSpec

from rbroker_server.api.docs import EnvelopeBodyOperation, errors
from rbroker_server.db.engine import utcnow
from rbroker_server.edge.bodies import NestedTooDeeply, json_body
from rbroker_server.edge.net import client_address
from rbroker_server.reports import service
from rbroker_server.reports.ingest import ReportIngest
from rbroker_server.reports.schema import ReportAck
from rbroker_server.reports.writer import WriterClosed

log = logging.getLogger(__name__)

PATH = "/api/v1/reports"

REPORT_CHALLENGE = (("WWW-Authenticate", 'Rbroker-Signature realm="rbroker"'),)
"""The challenge of a 401 on a report: the envelope's Ed25519 signature (§7)."""

SHUTDOWN_RETRY_AFTER_S = 5
"""`Retry-After` of a report refused while the coordinator shuts down (seconds)."""

ANSWER = ResponseSpec(
    data_container=ReportAck,
    description="Delivered: `applied` true, or false for a replay or an older seq.",
    generate_examples=False,
)


def refusal(exc: Exception, client: Callable[[], str]) -> HTTPException | None:
    """The HTTP answer to an exception of `ReportIngest.handle` (None for any other, e.g.
    a database fault); `client` gives the client's address for the log line of a 401."""
    if isinstance(exc, service.ReportTooLarge):
        return ClientException("report body too large", status_code=413)
    if isinstance(exc, service.ReportUnauthenticated):
        log.warning("unauthenticated report from %s: %s", client(), exc)
        return NotAuthorizedException(
            f"report not authenticated: {exc}", headers=dict(REPORT_CHALLENGE)
        )
    if isinstance(exc, service.ComputerRevoked):
        return PermissionDeniedException("computer revoked")
    if isinstance(exc, service.PayloadNestedTooDeeply):
        return NestedTooDeeply(str(exc))
    if isinstance(exc, service.ReportInvalid):
        return ClientException(str(exc), status_code=422)
    if isinstance(exc, WriterClosed):
        return ServiceUnavailableException(
            f"{exc}; try again later", headers={"Retry-After": str(SHUTDOWN_RETRY_AFTER_S)}
        )
    return None


def report_route(ingest: ReportIngest) -> HTTPRouteHandler:
    """The route handler of `POST /api/v1/reports` for one app."""

    @post(
        PATH,
        status_code=200,
        operation_class=EnvelopeBodyOperation,
        tags=["reports"],
        responses={200: ANSWER, **errors(400, 401, 403, 413, 415, 422, 503)},
    )
    async def report(request: Request[Any, Any, Any]) -> Response[bytes]:
        """Verify and apply a signed report envelope (architecture.md §7).

        200 with `applied` true, or false for a replay or an older seq. 400: the envelope
        or its signed payload nested too deeply. 401: malformed, unknown computer or bad
        signature. 403: revoked computer. 413: over 1 MiB. 415: not `application/json`.
        422: authentic but not a valid payload. 503: the database is unavailable or the
        coordinator is shutting down (with `Retry-After`).
        """
        body = await json_body(request)
        received_at = utcnow()  # the freshness clock: when the whole body had arrived
        try:
            answer = await ingest.handle(body, received_at)
        except Exception as exc:
            refused = refusal(exc, lambda: client_address(request))
            if refused is None:
                raise  # a database fault (503 from `db.faults`) or a fault of ours
            raise refused from exc
        return Response(answer, media_type=MediaType.JSON)

    return report
