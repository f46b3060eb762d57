"""`POST /api/v1/reports`: the body is the signed envelope, read as exact bytes.

The route is built around the app's `ReportIngest` (`report_route`): no dependency
injection on the hot path, and the answer is JSON bytes encoded once
(`service.Answer.encoded`), declared in the schema as a `ReportAck`.
"""

from __future__ import annotations

import logging
from typing import Any

from litestar import MediaType, Request, Response, post
from litestar.exceptions import (
    ClientException,
    NotAuthorizedException,
    PermissionDeniedException,
    ServiceUnavailableException,
)
from litestar.handlers import HTTPRouteHandler
from litestar.openapi.datastructures import ResponseSpec

from rbroker_server.apidocs import EnvelopeBodyOperation, errors
from rbroker_server.bodies import NestedTooDeeply, json_body
from rbroker_server.db import utcnow
from rbroker_server.net import client_address
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
        except service.ReportTooLarge as exc:
            raise ClientException("report body too large", status_code=413) from exc
        except service.ReportUnauthenticated as exc:
            log.warning("unauthenticated report from %s: %s", client_address(request), exc)
            raise NotAuthorizedException(
                f"report not authenticated: {exc}", headers=dict(REPORT_CHALLENGE)
            ) from exc
        except service.ComputerRevoked as exc:
            raise PermissionDeniedException("computer revoked") from exc
        except service.PayloadNestedTooDeeply as exc:
            raise NestedTooDeeply(str(exc)) from exc
        except service.ReportInvalid as exc:
            raise ClientException(str(exc), status_code=422) from exc
        except WriterClosed as exc:
            raise ServiceUnavailableException(
                f"{exc}; try again later",
                headers={"Retry-After": str(SHUTDOWN_RETRY_AFTER_S)},
            ) from exc
        return Response(answer, media_type=MediaType.JSON)

    return report
