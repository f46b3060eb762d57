"""Litestar dependency that turns a request into its `Scope` (or 401/403)."""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request
from litestar.di import NamedDependency
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException
from sqlalchemy.engine import Engine

from rbroker_protocol.signing import external_target
from rbroker_server.auth.caller import Forbidden, Scope, Unauthenticated, authenticate
from rbroker_server.edge.net import client_address
from rbroker_server.edge.ratelimit import Throttles, credential_key
from rbroker_server.settings import Settings

log = logging.getLogger(__name__)

CHALLENGE = (("WWW-Authenticate", 'Bearer realm="rbroker", charset="UTF-8"'),)
"""The challenge of a 401 on a fleet read: a viewer token (or a computer's signature)."""


def request_target(request: Request[Any, Any, Any], root_path: str = "") -> str:
    """The path with its query string as the client sent it (what it signed): the external
    prefix `root_path` (`Settings.root_path`, e.g. `/rbroker`) joined with the path this
    server received, in `canonical_target` form."""
    raw = request.scope.get("raw_path")
    path: str = raw.decode("utf-8", "surrogateescape") if raw else request.scope["path"]
    query = request.scope.get("query_string", b"")
    target = f"{path}?{query.decode('utf-8', 'surrogateescape')}" if query else path
    return external_target(root_path, target)


def provide_caller(
    request: Request[Any, Any, Any],
    engine: NamedDependency[Engine],
    settings: NamedDependency[Settings],
) -> Scope:
    """The group this request may read (runs in a worker thread: it touches the database).

    401 with `WWW-Authenticate` for credentials that do not hold; 429 with Retry-After once
    the credential or the address's network has failed too often a minute
    (`ratelimit.CredentialThrottle`: a credential served to that network before is still
    checked)."""
    address = client_address(request)
    throttle = Throttles.of(request).credentials
    headers = {k.lower(): v for k, v in request.headers.items()}
    credential = credential_key(headers)
    throttle.check(address, credential)
    try:
        caller = authenticate(
            engine, settings, headers, request.method, request_target(request, settings.root_path)
        )
    except Unauthenticated as exc:
        throttle.spend(address, credential)
        log.info("unauthenticated fleet read from %s: %s", address, exc)
        raise NotAuthorizedException(str(exc), headers=dict(CHALLENGE)) from exc
    except Forbidden as exc:
        raise PermissionDeniedException(str(exc)) from exc
    throttle.served(address, credential)
    return caller
