"""`GET /api/v1/usage?days=N&by=project|user[&format=csv][&top=N]`: the caller's group's usage
history, per day, in MiB-hours granted and used (`rbroker_protocol.usage`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Final

from litestar import Controller, MediaType, Request, Response, get
from litestar.di import NamedDependency, Provide
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import OpenAPIMediaType, OpenAPIType, Operation, Schema
from litestar.params import QueryParameter
from sqlalchemy.engine import Engine

from rbroker_protocol.usage import UsageView
from rbroker_server.api.docs import errors
from rbroker_server.api.query import checked
from rbroker_server.auth.caller import Scope
from rbroker_server.auth.dependencies import provide_caller
from rbroker_server.settings import Settings
from rbroker_server.usage import service

CSV_MEDIA_TYPE: Final = "text/csv"
"""The CSV answer's content type (RFC 4180, with a header row), to which the framework adds
`; charset=utf-8`."""


@dataclass
class UsageOperation(Operation):
    """The usage read's operation: its 200 answer is JSON or, with `format=csv`, CSV."""

    def __post_init__(self) -> None:
        ok = (self.responses or {}).get("200")
        content = getattr(ok, "content", None)
        if content is not None:
            content["text/csv"] = OpenAPIMediaType(
                schema=Schema(
                    type=OpenAPIType.STRING,
                    description="With `format=csv`: a header row "
                    "(`day,project|user,granted_mib_hours,used_mib_hours`), then a row per "
                    "day and name.",
                )
            )


def answer(view: UsageView, fmt: str) -> Response[Any]:
    """`view` as the answer of a usage read in `fmt` (`json` or `csv`, a download)."""
    if fmt == "csv":
        return Response(
            service.to_csv(view).encode(),
            media_type=CSV_MEDIA_TYPE,
            headers={
                "Content-Disposition": f'attachment; filename="{service.csv_filename(view)}"',
                "Cache-Control": "no-store",
            },
        )
    return Response(view, media_type=MediaType.JSON, headers={"Cache-Control": "no-store"})


def checked_query(request: Request[Any, Any, Any], settings: Settings) -> service.UsageQuery:
    """The request's usage query.

    Raises:
        ClientException: 400, the problem in one line (`service.UsageQueryInvalid`).
    """
    return checked(lambda: service.parse_query(request.query_params.dict(), settings))


class UsageController(Controller):
    """Scoped to the caller's one group (viewer token or signed request), like the fleet."""

    path = "/api/v1/usage"
    tags = ("usage",)
    security = ({"viewerToken": []}, {"signedRequest": []})
    dependencies = {"caller": Provide(provide_caller, sync_to_thread=True)}  # noqa: RUF012

    @get(
        "/",
        sync_to_thread=True,
        operation_class=UsageOperation,
        responses={
            200: ResponseSpec(
                data_container=UsageView,
                description="The usage per day and name, and totals per name (JSON), or "
                "with `format=csv` the rows as CSV.",
                generate_examples=False,
            ),
            **errors(400, 401, 403, 429, 503),
        },
    )
    def usage(
        self,
        request: Request[Any, Any, Any],
        engine: NamedDependency[Engine],
        settings: NamedDependency[Settings],
        caller: NamedDependency[Scope],
        days: Annotated[
            str | None,
            QueryParameter(
                name="days",
                required=False,
                description="Days up to today (UTC), today included: 1 to the days kept "
                "(`usage_window_days`, 400). Default 30.",
            ),
        ] = None,
        by: Annotated[
            str | None,
            QueryParameter(name="by", required=False, description="`project` (default) or `user`."),
        ] = None,
        answer_format: Annotated[
            str | None,
            QueryParameter(name="format", required=False, description="`json` (default) or `csv`."),
        ] = None,
        top: Annotated[
            str | None,
            QueryParameter(
                name="top",
                required=False,
                description="Names shown: the most granted over the span, 1 to 1000 "
                "(default 50); the rest are summed per day under `(other)`.",
            ),
        ] = None,
    ) -> Response[Any]:
        """GPU memory granted and used per day, per project or per user, in MiB-hours, of
        the group's computers (400 for a bad query, with the problem in one line)."""
        query = checked_query(request, settings)
        return answer(service.usage(engine, caller, query), query.format)
