"""Litestar app factory. Settings are passed in, never read at import time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio.to_thread
import sqlalchemy as sa
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from litestar import Litestar, Request, Response, get
from litestar.datastructures import CacheControlHeader, State
from litestar.di import NamedDependency, Provide
from litestar.exceptions import HTTPException
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components, Reference, SecurityScheme
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.static_files import create_static_files_router
from litestar.template import TemplateConfig
from litestar.types import ASGIApp
from sqlalchemy.engine import Engine

from rbroker_protocol import signing
from rbroker_server import __version__
from rbroker_server.admin.audit import RefusalBound
from rbroker_server.api.answers import json_error
from rbroker_server.api.docs import DocsRenderPlugin, errors
from rbroker_server.db import engine as db
from rbroker_server.db import faults as dbfaults
from rbroker_server.db import maintenance
from rbroker_server.edge.asgi import HeadAsGet
from rbroker_server.edge.compression import GzipAnswers
from rbroker_server.edge.net import STATE_PROXY_SECRET, STATE_TRUSTED, PrefixStrip, parse_networks
from rbroker_server.edge.ratelimit import ThrottleGate, Throttles
from rbroker_server.enroll.controller import EnrollController
from rbroker_server.fleet.controller import FleetController
from rbroker_server.metrics.controller import MetricsController
from rbroker_server.reports.controller import report_route
from rbroker_server.reports.gate import ReportFront, ReportGate
from rbroker_server.reports.ingest import ReportIngest
from rbroker_server.settings import Settings
from rbroker_server.usage.controller import UsageController
from rbroker_server.web import controller as web
from rbroker_server.web import fault_page, renders
from rbroker_server.web.headers import security_headers_for
from rbroker_server.web.usage_page import UsagePageController
from rbroker_server.webhooks.sender import Webhooks, running

log = logging.getLogger(__name__)

SECURITY_SCHEMES: dict[str, SecurityScheme | Reference] = {
    "viewerToken": SecurityScheme(
        type="http",
        scheme="bearer",
        bearer_format="rbv_<id>_<secret>",
        description="A group's viewer token (`rbroker-server token create --group G`).",
    ),
    "signedRequest": SecurityScheme(
        type="apiKey",
        name=signing.HEADER_SIGNATURE,
        security_scheme_in="header",
        description=(
            f"An enrolled computer signs method, the request target as sent (path with "
            f"query, a reverse proxy's prefix included), Unix time and a nonce "
            f"with its Ed25519 key (rbroker_protocol.signing.sign_request) and sends "
            f"{signing.HEADER_COMPUTER}, {signing.HEADER_TIMESTAMP}, {signing.HEADER_NONCE} "
            f"and {signing.HEADER_SIGNATURE}. The time must be within the server's window; "
            f"each nonce is accepted once."
        ),
    ),
}


@get("/healthz", sync_to_thread=True, tags=["health"], responses=errors(503))
def healthz(engine: NamedDependency[Engine], settings: NamedDependency[Settings]) -> dict[str, str]:
    """Liveness and a proven write: `{"status": "ok", "version": …}` once an upsert
    committed (`dbfaults.probe_write`). 503 with Retry-After and the reason when it did not
    or, for SQLite, when its disk has less than `min_free_mib` free."""
    dbfaults.probe_write(engine, settings)
    return {"status": "ok", "version": __version__}


async def _prune_forever(
    engine: Engine, settings: Settings, faults: dbfaults.DatabaseFaults
) -> None:
    while True:
        try:
            await anyio.to_thread.run_sync(maintenance.prune, engine, settings)
        except dbfaults.FAULTS as exc:
            faults.fault(exc)  # part of the fault episode: logged once with the requests
        except sa.exc.SQLAlchemyError:
            log.exception("pruning failed; retrying at the next interval")
        await asyncio.sleep(settings.prune_interval_s)


def _fault_answer(
    faults: dbfaults.DatabaseFaults,
) -> Callable[[Request[Any, Any, Any], Exception], Response[Any]]:
    """The handler of database faults: an HTML page for the web view, JSON elsewhere."""

    def answer(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
        if fault_page.is_page(request):
            return fault_page.fault_page(request, faults.fault(exc), faults.retry_after_s)
        return faults.answer(request, exc)

    return answer


def create_app(
    settings: Settings, *, engine: Engine | None = None, migrate: bool = True
) -> Litestar:
    """Build the coordinator from `settings`.

    Args:
        settings: everything configurable (see `Settings`).
        engine: an existing engine (else one is made from `settings.db_url` and disposed of
            at shutdown).
        migrate: bring the schema to the newest revision at startup.

    The application leaves the process's logging as it found it: whoever runs it configures
    that (`rbroker-server serve` with its `--log-level` and line format).
    """
    owned = engine is None
    eng = engine if engine is not None else db.make_engine(settings.db_url)
    faults = dbfaults.DatabaseFaults(eng, settings)
    throttles = Throttles(eng)  # counted in the database: shared by all its processes
    trusted = parse_networks(settings.trusted_proxies)
    reports = ReportIngest(eng, settings)
    hooks = Webhooks(eng, settings)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Litestar) -> AsyncIterator[None]:
        if migrate:
            await anyio.to_thread.run_sync(db.upgrade, eng)
        reports.start()
        task = asyncio.create_task(_prune_forever(eng, settings, faults))
        try:
            async with running(hooks):
                yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            # off the loop: the writer settles its last answers through it
            await anyio.to_thread.run_sync(reports.close)
            faults.close()
            if owned:
                eng.dispose()

    templates = Environment(
        loader=FileSystemLoader(web.TEMPLATES), autoescape=True, undefined=StrictUndefined
    )
    static = create_static_files_router(
        path="/static",
        directories=[web.STATIC],
        cache_control=CacheControlHeader(max_age=3600),
        include_in_schema=False,
    )
    app = Litestar(
        route_handlers=[
            healthz,
            EnrollController,
            report_route(reports),
            FleetController,
            MetricsController,
            UsageController,
            web.WebController,
            UsagePageController,
            static,
        ],
        exception_handlers={
            HTTPException: json_error,
            **dict.fromkeys(dbfaults.FAULTS, _fault_answer(faults)),
        },
        template_config=TemplateConfig(instance=JinjaTemplateEngine.from_environment(templates)),
        dependencies={
            "engine": Provide(lambda: eng, use_cache=True, sync_to_thread=False),
            "settings": Provide(lambda: settings, use_cache=True, sync_to_thread=False),
        },
        lifespan=[lifespan],
        # Litestar's default logging config took the root logger over when the app was built
        # (its own queue handler, INFO): `serve --log-level` and serve's line format were
        # ignored, and an app built inside another program rewrote that program's logging
        logging_config=None,
        request_max_body_size=settings.max_body_bytes,
        openapi_config=OpenAPIConfig(
            title="rbroker coordinator",
            version=__version__,
            description=(
                "Enrollment, signed reports and group-scoped fleet views "
                "(docs/architecture.md §7 of the rbroker repository)."
            ),
            path="/schema",
            render_plugins=[DocsRenderPlugin()],
            components=Components(security_schemes=SECURITY_SCHEMES),
        ),
        state=State(
            {
                STATE_TRUSTED: trusted,
                STATE_PROXY_SECRET: settings.trusted_proxy_secret,
                Throttles.STATE_KEY: throttles,
                RefusalBound.STATE_KEY: RefusalBound(),
                web.SETTINGS_STATE: settings,
                renders.STATE_KEY: renders.SharedRenders(web.REFRESH_MS / 1000),
                dbfaults.STATE_KEY: faults,
            }
        ),
    )
    app.asgi_handler = ThrottleGate(  # before routing
        app.asgi_handler, throttles, trusted, settings.trusted_proxy_secret
    )
    app.asgi_handler = ReportGate(  # the report hot path, before the framework
        app.asgi_handler,
        reports,
        faults,
        trusted,
        settings.max_body_bytes,
        settings.trusted_proxy_secret,
    )
    if settings.root_path:  # behind a proxy under a prefix: route with or without it
        app.asgi_handler = PrefixStrip(app.asgi_handler, settings.root_path)
    # gzip off the event loop (edge/compression.py), HEAD wherever GET is served: `wrap`
    # outermost, so that every answer gets them: a route's, an error's, the router's 404
    https_external = settings.external_url.startswith("https://")
    headers = security_headers_for(https_external)

    def wrap(handler: ASGIApp) -> ASGIApp:
        return headers(HeadAsGet(GzipAnswers(handler)))

    inner = app.asgi_handler
    # the report hot path before every wrapper, their headers on its answers worked out once
    app.asgi_handler = ReportFront(
        wrap(inner),
        wrap,
        reports,
        faults,
        trusted,
        settings.max_body_bytes,
        settings.trusted_proxy_secret,
        https_external=https_external,
        prefix=inner.prefix if isinstance(inner, PrefixStrip) else "",
    )
    return app
