"""Sign-in sessions of the web view, kept in the database (several coordinator processes
behind a load balancer share them).

A browser signs in with a group's viewer token and gets a random session id in an HttpOnly,
SameSite=Strict cookie; only a SHA-256 of the id is stored. A session lasts `SESSION_TTL_S`
at most and ends at once when its token is revoked (every lookup joins the token).

A sign-in writes its audit entry in the session's transaction (the actor is the token's
id, never its secret); a refused one writes one through `record_refusal`, bounded per
client network by `audit.RefusalBound`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from rbroker_server.admin import audit
from rbroker_server.auth.caller import Scope, Unauthenticated, authenticate
from rbroker_server.db.engine import utcnow, write_lock
from rbroker_server.db.tables import GROUPS, SESSIONS, TOKENS
from rbroker_server.settings import Settings

SESSION_TTL_S = 12 * 3600.0
"""Longest life of a sign-in (a working day); signing in again makes a new session."""


@dataclass(frozen=True, slots=True)
class SignedIn:
    """A live session: the group it reads (as a fleet `Scope`) and its CSRF token."""

    scope: Scope
    csrf_token: str
    expires_at: datetime


def _hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def sign_in(engine: Engine, settings: Settings, token: str) -> tuple[str, SignedIn]:
    """Check a viewer token and open a session for its group.

    Returns:
        (the session id for the cookie, the session).

    Raises:
        Unauthenticated: the token is malformed, unknown or revoked.
    """
    token = token.strip()
    if not token:
        raise Unauthenticated("no token given")
    scope = authenticate(engine, settings, {"authorization": f"Bearer {token}"}, "POST", "/signin")
    session_id = secrets.token_urlsafe(32)
    now = utcnow()
    signed = SignedIn(scope, secrets.token_urlsafe(32), now + timedelta(seconds=SESSION_TTL_S))
    with write_lock(engine), engine.begin() as conn:
        conn.execute(sa.delete(SESSIONS).where(SESSIONS.c.expires_at < now))
        conn.execute(
            sa.insert(SESSIONS).values(
                id_hash=_hash(session_id),
                token_id=scope.principal,
                csrf_token=signed.csrf_token,
                created_at=now,
                expires_at=signed.expires_at,
            )
        )
        who = conn.execute(
            sa.select(TOKENS.c.name, GROUPS.c.name.label("group_name"))
            .join(GROUPS, GROUPS.c.id == TOKENS.c.group_id)
            .where(TOKENS.c.id == scope.principal)
        ).first()
        audit.record(
            conn,
            actor=audit.token_actor(scope.principal),
            action=audit.SIGNIN,
            group=who.group_name if who is not None else None,
            target=scope.principal,
            detail=f"token name {who.name!r}" if who is not None and who.name else "",
            at=now,
        )
    return session_id, signed


def record_refusal(engine: Engine, bound: audit.RefusalBound, address: str) -> None:
    """The audit entry of a refused sign-in from `address`, unless `bound` holds it back
    (its network had one in the last minute; the next entry counts it). What the client
    typed is never written: a wrong token may be a mistyped real one."""
    admitted = bound.admit(audit.client_network(address))
    if admitted is None:
        return
    network, count = admitted
    with write_lock(engine), engine.begin() as conn:
        audit.record(
            conn,
            actor=f"web:{network}",
            action=audit.SIGNIN_REFUSED,
            group=None,
            target=network,
            detail="1 refused sign-in"
            if count == 1
            else f"{count} refused sign-ins ({count - 1} since this network's last entry)",
        )


def lookup(engine: Engine, session_id: str | None) -> SignedIn | None:
    """The live session with this id, or None (unknown, expired, or its token revoked)."""
    if not session_id or len(session_id) > 128:
        return None
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(
                SESSIONS.c.token_id,
                SESSIONS.c.csrf_token,
                SESSIONS.c.expires_at,
                TOKENS.c.group_id,
            )
            .join(TOKENS, TOKENS.c.id == SESSIONS.c.token_id)
            .where(
                SESSIONS.c.id_hash == _hash(session_id),
                SESSIONS.c.expires_at > utcnow(),
                TOKENS.c.revoked_at.is_(None),
            )
        ).first()
    if row is None:
        return None
    return SignedIn(Scope(row.group_id, "token", row.token_id), row.csrf_token, row.expires_at)


def sign_out(engine: Engine, session_id: str | None) -> None:
    """End the session (nothing happens for an unknown id)."""
    if not session_id:
        return
    with write_lock(engine), engine.begin() as conn:
        conn.execute(sa.delete(SESSIONS).where(SESSIONS.c.id_hash == _hash(session_id)))


def mask_token(token: str) -> str:
    """`token` as a form sends it: a fresh random pad and the token XORed with it (URL-safe
    base64), different in every page, so a compressed page never repeats the same secret
    bytes (the masking Django uses against BREACH-style compression side channels)."""
    raw = token.encode()
    pad = secrets.token_bytes(len(raw))
    return base64.urlsafe_b64encode(
        pad + bytes(a ^ b for a, b in zip(pad, raw, strict=True))
    ).decode()


def unmask_token(text: str) -> str | None:
    """The token inside a masked form value, or None when it is not one."""
    try:
        blob = base64.urlsafe_b64decode(text.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return None
    half = len(blob) // 2
    if not blob or len(blob) % 2:
        return None
    try:
        return bytes(a ^ b for a, b in zip(blob[:half], blob[half:], strict=True)).decode()
    except UnicodeDecodeError:
        return None


def csrf_matches(expected: str | None, given: str | None) -> bool:
    """Whether a form's masked CSRF value (`mask_token`) holds the expected token (constant
    time in the token's length)."""
    if not expected or not given or len(given) > 512:
        return False
    token = unmask_token(given)
    return token is not None and secrets.compare_digest(expected.encode(), token.encode())
