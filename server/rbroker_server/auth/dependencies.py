"""Litestar dependency that turns a request into its `Scope` (or 401/403)."""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.di import NamedDependency
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from sqlalchemy.engine import Engine

from rbroker_server.auth.service import Forbidden, Scope, Unauthenticated, authenticate
from rbroker_server.settings import Settings


def request_target(request: Request[Any, Any, Any]) -> str:
    """The path with its query string, exactly as the client sent it (what it signed)."""
    raw = request.scope.get("raw_path")
    path: str = raw.decode("latin-1") if raw else request.scope["path"]
    query = request.scope.get("query_string", b"")
    return f"{path}?{query.decode('latin-1')}" if query else path


def provide_caller(
    request: Request[Any, Any, Any],
    engine: NamedDependency[Engine],
    settings: NamedDependency[Settings],
) -> Scope:
    """The group this request may read (runs in a worker thread: it touches the database)."""
    headers = {k.lower(): v for k, v in request.headers.items()}
    try:
        return authenticate(engine, settings, headers, request.method, request_target(request))
    except Unauthenticated as exc:
        raise NotAuthorizedException(str(exc)) from exc
    except Forbidden as exc:
        raise PermissionDeniedException(str(exc)) from exc
