"""`GET /api/v1/fleet`, `GET /api/v1/fleet/room`, `GET /api/v1/computers/{id}`,
`GET /api/v1/computers/{id}/history`."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, get
from litestar.di import NamedDependency, Provide
from litestar.exceptions import NotFoundException
from litestar.params import FromPath, QueryParameter
from sqlalchemy.engine import Engine

from rbroker_protocol.fleet import ComputerView, FleetView, HistoryView, RoomView
from rbroker_server.api.docs import errors
from rbroker_server.api.query import checked
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

    @get("/fleet", sync_to_thread=True, responses=errors(400, 401, 403, 429, 503))
    def fleet(
        self,
        request: Request[Any, Any, Any],
        engine: NamedDependency[Engine],
        settings: NamedDependency[Settings],
        caller: NamedDependency[Scope],
        limit: Annotated[
            str | None,
            QueryParameter(
                name="limit",
                required=False,
                description="At most this many computers in the answer (1 to "
                f"{service.FLEET_LIMIT_MAX}); the answer's `next_after` asks the next page.",
            ),
        ] = None,
        after: Annotated[
            str | None,
            QueryParameter(
                name="after",
                required=False,
                description="The computers after this computer id in the fleet's order "
                "(name, then id): the previous page's `next_after`.",
            ),
        ] = None,
    ) -> FleetView:
        """The group's computers with freshness, GPU states, leases, queue and jobs, by
        name; all of them, or a page of `limit` after `after`. One computer alone:
        `/api/v1/computers/{computer_id}`. 400 for a bad query (an unknown `after`
        included), with the problem in one line.

        Raises:
            ClientException: 400 (`service.FleetQueryInvalid`).
        """
        page = checked(lambda: service.parse_fleet_query(request.query_params.dict()))
        return checked(lambda: service.fleet(engine, settings, caller, page))

    @get("/fleet/room", sync_to_thread=True, responses=errors(400, 401, 403, 429, 503))
    def room(
        self,
        request: Request[Any, Any, Any],
        engine: NamedDependency[Engine],
        settings: NamedDependency[Settings],
        caller: NamedDependency[Scope],
        mib: Annotated[
            str | None,
            QueryParameter(
                name="mib",
                required=True,
                description="MiB wanted on each GPU: a whole number from 1 to "
                f"{service.ROOM_MIB_MAX}.",
            ),
        ] = None,
        gpus: Annotated[
            str | None,
            QueryParameter(
                name="gpus",
                required=False,
                description="How many GPUs of one computer must each have `mib` available: "
                f"1 (default) to {service.ROOM_GPUS_MAX}.",
            ),
        ] = None,
    ) -> RoomView:
        """Where is there room: the group's computers whose GPUs had `mib` MiB available
        (their brokers' admission figure) on `gpus` GPUs at their last report, freshest
        first, with each report's age and freshness. A view of the last reports, never a
        placement or a reservation: nothing is held, and the room may be gone when asked
        for. 400 for a bad query, with the problem in one line.

        Raises:
            ClientException: 400 (`service.RoomQueryInvalid`).
        """
        query = checked(lambda: service.parse_room_query(request.query_params.dict()))
        return service.room(engine, settings, caller, query)

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
