"""`GET /metrics`: the caller's group in the Prometheus text format (viewer token)."""

from __future__ import annotations

from litestar import Controller, Response, get
from litestar.di import NamedDependency, Provide
from sqlalchemy.engine import Engine

from rbroker_server.api.docs import errors
from rbroker_server.auth.caller import Scope
from rbroker_server.auth.dependencies import provide_caller
from rbroker_server.db.engine import utcnow
from rbroker_server.fleet import service as fleet_service
from rbroker_server.metrics import exposition, health
from rbroker_server.settings import Settings

MEDIA_TYPE = "text/plain; version=1.0.0"
"""Prometheus' text format (`prometheus_client.CONTENT_TYPE_LATEST` without its charset,
which the framework adds: `text/plain; version=1.0.0; charset=utf-8`)."""


class MetricsController(Controller):
    """Scraped with `Authorization: Bearer <viewer token>`; only that token's group."""

    path = "/metrics"
    tags = ("metrics",)
    security = ({"viewerToken": []}, {"signedRequest": []})
    dependencies = {"caller": Provide(provide_caller, sync_to_thread=True)}  # noqa: RUF012

    @get("/", sync_to_thread=True, media_type=MEDIA_TYPE, responses=errors(401, 403, 429, 503))
    def metrics(
        self,
        engine: NamedDependency[Engine],
        settings: NamedDependency[Settings],
        caller: NamedDependency[Scope],
    ) -> Response[bytes]:
        """Per GPU bytes and state, per computer leases, waiting requests, report age and
        freshness, per job items completed and failed; offline computers' last-known figures
        and jobs finished over an hour ago left out (see `rbroker_server.metrics.exposition`);
        then the group's queued webhook deliveries and, for a group of
        `Settings.health_groups` only, this coordinator process's health
        (`rbroker_server.metrics.health`: it counts every group's reports and connections,
        which no other group may see)."""
        view = fleet_service.fleet(engine, settings, caller)
        view = exposition.live_jobs(engine, view, utcnow())
        queued = exposition.queued_deliveries(engine, caller.group_id)
        process = view.group in settings.health_groups
        return Response(
            exposition.exposition(view) + health.exposition(queued, process=process),
            media_type=MEDIA_TYPE,
            headers={"Cache-Control": "no-store"},
        )
