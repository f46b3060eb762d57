"""The web view's usage page: the group's GPU MiB-hours granted and used per day, per
project or per user, as bars drawn on the server (`usage_chart`), and the same figures
as a CSV download. Both need a session, as every page (`rbroker_server.web.controller`).
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, get
from litestar.datastructures import CacheControlHeader
from litestar.di import NamedDependency
from litestar.response import Redirect, Template
from sqlalchemy.engine import Engine

from rbroker_protocol.usage import USAGE_BY
from rbroker_server.settings import Settings
from rbroker_server.usage import controller as usage_api
from rbroker_server.usage import service as usage
from rbroker_server.web import controller as web
from rbroker_server.web.usage_chart import fmt_hours, label, usage_chart

DAY_CHOICES = (7, 30, 90, 365)
"""The spans the page offers as links (any `days` the API takes works)."""


class UsagePageController(Controller):
    """`/usage` and `/usage.csv` of the group a session was signed in for."""

    path = "/"
    include_in_schema = False
    cache_control = CacheControlHeader(no_store=True)
    opt = {web.PAGE_OPT: True}  # noqa: RUF012 - Litestar's layered option, read per request

    @get("/usage", sync_to_thread=True)
    def usage_page(
        self,
        request: Request[Any, Any, Any],
        engine: NamedDependency[Engine],
        settings: NamedDependency[Settings],
    ) -> Template | Redirect:
        """The usage chart and totals; `?days=N&by=project|user` as the API takes them
        (a bad query: 400 with the problem in words)."""
        signed = web.signed_in(request, engine)
        if signed is None:
            return web.to_signin(request)
        try:
            query = usage.parse_query(request.query_params.dict(), settings)
        except usage.UsageQueryInvalid as exc:
            return web.message_page(request, signed, "Usage: bad query", f"{exc}.", 400)
        view = usage.usage(engine, signed.scope, query)
        context = web.page_context(
            request,
            group=view.group,
            csrf_token=signed.csrf_token,
            view=view,
            chart=usage_chart(view),
            fmt_hours=fmt_hours,
            usage_label=label,
            day_choices=[d for d in DAY_CHOICES if d <= settings.usage_window_days],
            by_choices=USAGE_BY,
        )
        return Template(template_name="usage.html", context=context)

    @get("/usage.csv", sync_to_thread=True)
    def usage_csv(
        self,
        request: Request[Any, Any, Any],
        engine: NamedDependency[Engine],
        settings: NamedDependency[Settings],
    ) -> Response[Any] | Redirect:
        """The page's figures as CSV (a download); 400 for a bad query."""
        signed = web.signed_in(request, engine)
        if signed is None:
            return web.to_signin(request)
        query = usage_api.checked_query(request, settings)
        return usage_api.answer(usage.usage(engine, signed.scope, query), "csv")
