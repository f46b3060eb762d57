"""Resolve the caller of a fleet read to exactly one group.

Two ways in (architecture.md §7): a viewer token (`Authorization: Bearer rbv_…`, hashed at rest,
compared in constant time) or a request signed by an enrolled computer (method, path with
query, timestamp within `request_window_s` of the server clock, and a nonce accepted once).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine

from rbroker_protocol.signing import (
    EnvelopeError,
    SignedRequest,
    parse_request_headers,
    verify_request,
)
from rbroker_server.auth.credentials import VIEWER_PREFIX, parse_credential, secret_matches
from rbroker_server.db.engine import utcnow, write_lock
from rbroker_server.db.tables import COMPUTERS, NONCES, TOKENS
from rbroker_server.settings import Settings


class Unauthenticated(Exception):
    """No credentials, or credentials that do not hold (401). The message says which part."""


class Forbidden(Exception):
    """Authentic credentials that may no longer read (a revoked computer: 403)."""


@dataclass(frozen=True, slots=True)
class Scope:
    """The one group a request may read, and who asked."""

    group_id: int
    via: Literal["token", "computer"]
    principal: str
    """Token id or computer id (for logs; never a secret)."""


def authenticate(
    engine: Engine,
    settings: Settings,
    headers: dict[str, str],
    method: str,
    path: str,
) -> Scope:
    """The caller's scope from request headers (lower-case names).

    Raises:
        Unauthenticated: nothing usable, a bad token, a bad or stale signature, a reused nonce.
        Forbidden: a revoked computer.
    """
    try:
        signed = parse_request_headers(headers)
    except EnvelopeError as exc:
        raise Unauthenticated(str(exc)) from exc
    if signed is not None:
        return _computer_scope(engine, settings, signed, method, path)
    auth = headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() != "bearer" or not value:
        raise Unauthenticated("send a viewer token (Authorization: Bearer …) or a signed request")
    cred = parse_credential(VIEWER_PREFIX, value)
    if cred is None:
        raise Unauthenticated("malformed viewer token")
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(TOKENS.c.group_id, TOKENS.c.secret_hash, TOKENS.c.revoked_at).where(
                TOKENS.c.id == cred.id
            )
        ).first()
    if row is None or not secret_matches(cred, row.secret_hash) or row.revoked_at is not None:
        raise Unauthenticated("viewer token unknown or revoked")
    return Scope(row.group_id, "token", cred.id)


def _computer_scope(
    engine: Engine, settings: Settings, signed: SignedRequest, method: str, path: str
) -> Scope:
    now = utcnow()
    if abs(now.timestamp() - signed.timestamp) > settings.request_window_s:
        raise Unauthenticated("signed request timestamp outside the accepted window")
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(COMPUTERS.c.group_id, COMPUTERS.c.public_key, COMPUTERS.c.revoked_at).where(
                COMPUTERS.c.id == signed.computer_id
            )
        ).first()
    if row is None:
        raise Unauthenticated("unknown computer")
    try:
        verify_request(signed, row.public_key, method, path)
    except EnvelopeError as exc:
        raise Unauthenticated(str(exc)) from exc
    if row.revoked_at is not None:
        raise Forbidden("computer revoked")
    # Each nonce once, across every coordinator sharing the database.
    with write_lock(engine), engine.begin() as conn:
        insert = (postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert)(NONCES)
        used = conn.execute(
            insert.values(
                computer_id=signed.computer_id,
                nonce=signed.nonce,
                expires_at=now + timedelta(seconds=2 * settings.request_window_s),
            )
            .on_conflict_do_nothing()
            .returning(NONCES.c.nonce)
        ).first()
    if used is None:
        raise Unauthenticated("nonce already used (replayed request)")
    return Scope(row.group_id, "computer", signed.computer_id)
