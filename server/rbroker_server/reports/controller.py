"""`POST /api/v1/reports`: the body is the signed envelope, read as exact bytes."""

from __future__ import annotations

import logging
from typing import Any

import anyio.to_thread
from litestar import Controller, Request, post
from litestar.di import NamedDependency
from litestar.exceptions import (
    ClientException,
    NotAuthorizedException,
    PermissionDeniedException,
)
from sqlalchemy.engine import Engine

from rbroker_server.apidocs import EnvelopeBodyOperation, errors
from rbroker_server.bodies import NestedTooDeeply, json_body
from rbroker_server.db import utcnow
from rbroker_server.net import client_address
from rbroker_server.reports import service
from rbroker_server.reports.schema import ReportAck
from rbroker_server.settings import Settings

log = logging.getLogger(__name__)

REPORT_CHALLENGE = (("WWW-Authenticate", 'Rbroker-Signature realm="rbroker"'),)
"""The challenge of a 401 on a report: the envelope's Ed25519 signature (§7)."""


class ReportsController(Controller):
    path = "/api/v1/reports"
    tags = ("reports",)

    @post(
        "/",
        status_code=200,
        operation_class=EnvelopeBodyOperation,
        responses=errors(400, 401, 403, 413, 415, 422, 503),
    )
    async def report(
        self,
        request: Request[Any, Any, Any],
        engine: NamedDependency[Engine],
        settings: NamedDependency[Settings],
    ) -> ReportAck:
        """Verify and apply a signed report envelope (architecture.md §7).

        200 with `applied` true, or false for a replay or an older seq. 400: the envelope
        or its signed payload nested too deeply. 401: malformed, unknown computer or bad
        signature. 403: revoked computer. 413: over 1 MiB. 415: not `application/json`.
        422: authentic but not a valid payload.
        """
        body = await json_body(request)
        received_at = utcnow()  # the freshness clock: when the whole body had arrived
        try:
            return await anyio.to_thread.run_sync(
                service.ingest, engine, settings, body, received_at
            )
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
