"""`GET /metrics`: the caller's group in the Prometheus text format (viewer token)."""

from __future__ import annotations

from litestar import Controller, Response, get
from litestar.di import NamedDependency, Provide
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy.engine import Engine

from rbroker_server.auth.dependencies import provide_caller
from rbroker_server.auth.service import Scope
from rbroker_server.fleet import service as fleet_service
from rbroker_server.metrics import service
from rbroker_server.settings import Settings


class MetricsController(Controller):
    """Scraped with `Authorization: Bearer <viewer token>`; only that token's group."""

    path = "/metrics"
    tags = ("metrics",)
    security = ({"viewerToken": []}, {"signedRequest": []})
    dependencies = {"caller": Provide(provide_caller, sync_to_thread=True)}  # noqa: RUF012

    @get("/", sync_to_thread=True)
    def metrics(
        self,
        engine: NamedDependency[Engine],
        settings: NamedDependency[Settings],
        caller: NamedDependency[Scope],
    ) -> Response[bytes]:
        """Per GPU bytes and state, per computer leases, waiting requests, report age and
        freshness, per job items completed and failed (see `rbroker_server.metrics.service`)."""
        view = fleet_service.fleet(engine, settings, caller)
        return Response(
            service.exposition(view),
            media_type=CONTENT_TYPE_LATEST,
            headers={"Cache-Control": "no-store"},
        )
