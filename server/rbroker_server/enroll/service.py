"""Redeem an enrollment code: one use, before it expires, for a key the server does not know
(the enrollment's audit entry is written in its transaction)."""

from __future__ import annotations

import logging
import secrets

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from rbroker_protocol.descriptions import DescriptionRejected, check_description
from rbroker_protocol.enroll import EnrollRequest, EnrollResponse
from rbroker_protocol.signing import EnvelopeError, load_verify_key
from rbroker_server.admin import audit
from rbroker_server.auth.credentials import ENROLL_PREFIX, parse_credential, secret_matches
from rbroker_server.db.engine import utcnow, write_lock
from rbroker_server.db.tables import CODES, COMPUTERS, GROUPS

log = logging.getLogger(__name__)


class EnrollRefused(Exception):
    """The code is unknown, already used or expired (one message for all three)."""


class EnrollConflict(Exception):
    """The public key is already enrolled (never silently replaced)."""


class EnrollInvalid(ValueError):
    """The name or key is malformed."""


def enroll(engine: Engine, req: EnrollRequest) -> EnrollResponse:
    """Consume the code and create the computer, atomically.

    Raises:
        EnrollInvalid: bad name or public key.
        EnrollRefused: the code is not valid now.
        EnrollConflict: the key is already known.
    """
    try:
        load_verify_key(req.public_key)
    except EnvelopeError as exc:
        raise EnrollInvalid(str(exc)) from exc
    try:
        name = check_description("computer_name", req.name)
    except DescriptionRejected as exc:
        raise EnrollInvalid(f"name rejected by rule {exc.rule}") from exc
    cred = parse_credential(ENROLL_PREFIX, req.code)
    if cred is None:
        raise EnrollRefused
    now = utcnow()
    computer_id = "c_" + secrets.token_hex(8)
    # A wrong code is refused by a read, outside the write lock: guessing never queues
    # honest writers (reports) behind it. The locked transaction below decides.
    with engine.connect() as conn:
        row = conn.execute(sa.select(CODES.c.secret_hash).where(CODES.c.id == cred.id)).first()
    if row is None or not secret_matches(cred, row.secret_hash):
        raise EnrollRefused
    with write_lock(engine), engine.begin() as conn:
        row = conn.execute(
            sa.select(CODES.c.secret_hash, CODES.c.group_id).where(CODES.c.id == cred.id)
        ).first()
        if row is None or not secret_matches(cred, row.secret_hash):
            raise EnrollRefused
        # One use: the conditional update is the decision (safe across processes).
        used = conn.execute(
            sa.update(CODES)
            .where(CODES.c.id == cred.id, CODES.c.used_at.is_(None), CODES.c.expires_at > now)
            .values(used_at=now, computer_id=computer_id)
        )
        if used.rowcount != 1:
            raise EnrollRefused
        known = conn.execute(
            sa.select(COMPUTERS.c.id).where(COMPUTERS.c.public_key == req.public_key)
        ).first()
        if known is not None:
            raise EnrollConflict  # rolls the code back: it stays usable
        conn.execute(
            sa.insert(COMPUTERS).values(
                id=computer_id,
                group_id=row.group_id,
                name=name,
                public_key=req.public_key,
                enrolled_at=now,
                reports_applied=0,
                flagged=False,
            )
        )
        group = conn.execute(sa.select(GROUPS.c.name).where(GROUPS.c.id == row.group_id)).one()
        audit.record(
            conn,
            actor=f"enroll_code:{cred.id}",
            action=audit.ENROLLED,
            group=group.name,
            target=computer_id,
            detail=f"name {name!r}",
            at=now,
        )
    log.info("enrolled computer %s (%s) into group %s", computer_id, name, group.name)
    return EnrollResponse(computer_id=computer_id, group=group.name)
