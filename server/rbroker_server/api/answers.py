"""Error answers: always the JSON body `{"status_code", "detail"[, "extra"]}` with
`Content-Type: application/json`, on every route.

Litestar's own handler labels the error body with the media type of the route that failed,
so a refused `/metrics` scrape (Prometheus text on success) said `text/plain` around a JSON
body; `json_error`, installed for every `HTTPException`, keeps body and label in agreement.
"""

from __future__ import annotations

from typing import Any

from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException

INTERNAL = "Internal Server Error"


def json_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    """The app's handler for `HTTPException`: its status, headers (e.g. `Retry-After`,
    `WWW-Authenticate`), `detail` (never an internal one for a 500) and `extra`, as JSON."""
    status = exc.status_code
    content: dict[str, Any] = {
        "status_code": status,
        "detail": INTERNAL if status == 500 else exc.detail,
    }
    if exc.extra:
        content["extra"] = exc.extra
    return Response(content, status_code=status, headers=exc.headers, media_type=MediaType.JSON)
