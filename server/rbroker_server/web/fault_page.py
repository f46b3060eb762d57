"""The web view's answer to a database fault: a 503 page a person can read.

The API keeps its JSON 503 (`db.faults.DatabaseFaults.answer`); a browser on one of the
web view's pages gets the same status, `Retry-After` and reason as an HTML page in the
site's layout instead of a JSON body.
"""

from __future__ import annotations

from typing import Any

from litestar import MediaType, Request, Response

from rbroker_server.web import controller


def is_page(request: Request[Any, Any, Any]) -> bool:
    """True when `request` was routed to the web view (`controller.WebController`, whose
    handlers carry `opt[controller.PAGE_OPT]`)."""
    handler = request.scope.get("route_handler")
    return bool(getattr(handler, "opt", {}).get(controller.PAGE_OPT))


def fault_page(request: Request[Any, Any, Any], why: str, retry_after_s: int) -> Response[str]:
    """503 with `Retry-After: retry_after_s` (whole seconds) and `message.html` saying
    `why` (a `db.faults.reason`, never the database's own error text)."""
    engine = request.app.template_engine
    assert engine is not None  # the app is always built with its templates (app.py)
    html = engine.get_template("message.html").render(
        **controller.page_context(
            request,
            heading="The coordinator cannot reach its database",
            message=f"{why}. The page will work again once it can; try again in a moment.",
        )
    )
    return Response(
        html,
        status_code=503,
        media_type=MediaType.HTML,
        headers={"Retry-After": str(retry_after_s)},
    )
