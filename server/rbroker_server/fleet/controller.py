"""`GET /api/v1/fleet`, `GET /api/v1/computers/{id}`, `GET /api/v1/computers/{id}/history`."""

from __future__ import annotations

from litestar import Controller, get
from litestar.di import NamedDependency, Provide
from litestar.exceptions import NotFoundException
from litestar.params import FromPath
from sqlalchemy.engine import Engine

from rbroker_protocol.fleet import ComputerView, FleetView, HistoryView
from rbroker_server.apidocs import errors
from rbroker_server.auth.caller import Scope
from rbroker_server.auth.dependencies import provide_caller
from rbroker_server.fleet import service
from rbroker_server.settings import Settings

_ONE = errors(400, 401, 403, 404, 429, 503)


class FleetController(Controller):
    """Every read is scoped to the caller's one group (viewer token or signed request)."""

    path = "/api/v1"
    tags = ("fleet",)
    security = ({"viewerToken": []}, {"signedRequest": []})
    dependencies = {"caller": Provide(provide_caller, sync_to_thread=True)}  # noqa: RUF012

    @get("/fleet", sync_to_thread=True, responses=errors(401, 403, 429, 503))
    def fleet(
        self,
        engine: NamedDependency[Engine],
        settings: NamedDependency[Settings],
        caller: NamedDependency[Scope],
    ) -> FleetView:
        """The group's computers with freshness, GPU states, leases, queue and jobs."""
        return service.fleet(engine, settings, caller)

    @get("/computers/{computer_id:str}", sync_to_thread=True, responses=_ONE)
    def computer(
        self,
        computer_id: FromPath[str],
        engine: NamedDependency[Engine],
        settings: NamedDependency[Settings],
        caller: NamedDependency[Scope],
    ) -> ComputerView:
        """One computer of the group (404 for unknown ones and other groups' alike)."""
        try:
            return service.computer(engine, settings, caller, computer_id)
        except service.ComputerNotFound as exc:
            raise NotFoundException("no such computer") from exc

    @get("/computers/{computer_id:str}/history", sync_to_thread=True, responses=_ONE)
    def history(
        self,
        computer_id: FromPath[str],
        engine: NamedDependency[Engine],
        settings: NamedDependency[Settings],
        caller: NamedDependency[Scope],
    ) -> HistoryView:
        """Downsampled history of one computer inside the configured window (for charts)."""
        try:
            return service.history(engine, settings, caller, computer_id)
        except service.ComputerNotFound as exc:
            raise NotFoundException("no such computer") from exc
