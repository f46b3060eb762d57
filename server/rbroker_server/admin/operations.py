"""Administrative operations on the database: used by `rbroker-server` commands and setup.

Cold paths, so they use the ORM. Secrets are returned once, as text, and stored hashed.
Each change writes its audit entry (`audit.record`) in its own transaction; `actor` names
who made it (default: the OS user running the command).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from rbroker_server.admin import audit
from rbroker_server.admin.errors import AdminError
from rbroker_server.auth.credentials import ENROLL_PREFIX, VIEWER_PREFIX, new_credential
from rbroker_server.db.engine import utcnow
from rbroker_server.db.models import Computer, EnrollCode, Group, ViewerToken


@dataclass(frozen=True, slots=True)
class GroupInfo:
    id: int
    name: str
    created_at: datetime
    computers: int
    tokens: int


@dataclass(frozen=True, slots=True)
class NewSecret:
    """A credential made just now: `text` is shown once and never stored."""

    id: str
    group: str
    text: str
    expires_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class ComputerInfo:
    id: str
    group: str
    name: str
    enrolled_at: datetime
    last_seen_at: datetime | None
    revoked: bool
    flagged: bool


@dataclass(frozen=True, slots=True)
class TokenInfo:
    id: str
    group: str
    name: str
    created_at: datetime
    revoked: bool


def _group(session: Session, name: str) -> Group:
    group = session.exec(select(Group).where(Group.name == name)).first()
    if group is None:
        raise AdminError(f"no group named {name!r}")
    return group


def _check_group_name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > 64 or not name.isprintable():
        raise AdminError("a group name is 1-64 printable characters")
    return name


def create_group(engine: Engine, name: str, actor: str | None = None) -> GroupInfo:
    """Create group `name`.

    Raises:
        AdminError: the name is taken or invalid.
    """
    name = _check_group_name(name)
    with Session(engine) as session:
        if session.exec(select(Group).where(Group.name == name)).first() is not None:
            raise AdminError(f"group {name!r} exists already")
        group = Group(name=name, created_at=utcnow())
        session.add(group)
        audit.record(
            session,
            actor=actor or audit.cli_actor(),
            action=audit.GROUP_CREATED,
            group=name,
            target=name,
        )
        session.commit()
        session.refresh(group)
        assert group.id is not None
        return GroupInfo(group.id, group.name, group.created_at, 0, 0)


def list_groups(engine: Engine) -> list[GroupInfo]:
    """All groups with their count of live computers and live tokens."""
    with Session(engine) as session:
        out = []
        for group in session.exec(select(Group).order_by(col(Group.name))):
            computers = session.exec(
                select(sa.func.count())
                .select_from(Computer)
                .where(Computer.group_id == group.id, col(Computer.revoked_at).is_(None))
            ).one()
            tokens = session.exec(
                select(sa.func.count())
                .select_from(ViewerToken)
                .where(ViewerToken.group_id == group.id, col(ViewerToken.revoked_at).is_(None))
            ).one()
            assert group.id is not None
            out.append(GroupInfo(group.id, group.name, group.created_at, computers, tokens))
        return out


def create_token(
    engine: Engine, group_name: str, name: str = "", actor: str | None = None
) -> NewSecret:
    """A new viewer token for the group; its text is returned once."""
    cred = new_credential(VIEWER_PREFIX)
    with Session(engine) as session:
        group = _group(session, group_name)
        assert group.id is not None
        session.add(
            ViewerToken(
                id=cred.id,
                group_id=group.id,
                name=name[:64],
                secret_hash=cred.secret_hash,
                created_at=utcnow(),
            )
        )
        audit.record(
            session,
            actor=actor or audit.cli_actor(),
            action=audit.TOKEN_CREATED,
            group=group.name,
            target=cred.id,
            detail=f"name {name[:64]!r}" if name else "",
        )
        session.commit()
    return NewSecret(cred.id, group_name, cred.text)


def list_tokens(engine: Engine, group_name: str) -> list[TokenInfo]:
    """The group's viewer tokens (ids and names; secrets are not kept)."""
    with Session(engine) as session:
        group = _group(session, group_name)
        rows = session.exec(
            select(ViewerToken)
            .where(ViewerToken.group_id == group.id)
            .order_by(col(ViewerToken.created_at))
        )
        return [
            TokenInfo(t.id, group.name, t.name, t.created_at, t.revoked_at is not None)
            for t in rows
        ]


def revoke_token(engine: Engine, group_name: str, token: str, actor: str | None = None) -> bool:
    """Revoke a viewer token of the group, by id or by its full text. False: none found."""
    token_id = token.split("_")[1] if token.startswith(f"{VIEWER_PREFIX}_") else token
    with Session(engine) as session:
        group = _group(session, group_name)
        row = session.exec(
            select(ViewerToken).where(ViewerToken.id == token_id, ViewerToken.group_id == group.id)
        ).first()
        if row is None:
            return False
        if row.revoked_at is None:
            row.revoked_at = utcnow()
            session.add(row)
            audit.record(
                session,
                actor=actor or audit.cli_actor(),
                action=audit.TOKEN_REVOKED,
                group=group.name,
                target=row.id,
                detail=f"name {row.name!r}" if row.name else "",
            )
            session.commit()
        return True


def create_enroll_code(
    engine: Engine, group_name: str, ttl_s: float, actor: str | None = None
) -> NewSecret:
    """A one-time enrollment code for the group, valid for `ttl_s` seconds."""
    if not 0 < ttl_s <= 365 * 24 * 3600:
        raise AdminError("an enrollment code lives between 1 second and 365 days")
    cred = new_credential(ENROLL_PREFIX)
    now = utcnow()
    expires = now + timedelta(seconds=ttl_s)
    with Session(engine) as session:
        group = _group(session, group_name)
        assert group.id is not None
        session.add(
            EnrollCode(
                id=cred.id,
                group_id=group.id,
                secret_hash=cred.secret_hash,
                created_at=now,
                expires_at=expires,
            )
        )
        audit.record(
            session,
            actor=actor or audit.cli_actor(),
            action=audit.CODE_CREATED,
            group=group.name,
            target=cred.id,
            detail=f"expires {expires.strftime('%Y-%m-%d %H:%M:%S UTC')}",
            at=now,
        )
        session.commit()
    return NewSecret(cred.id, group_name, cred.text, expires)


@dataclass(frozen=True, slots=True)
class EnrollCodeInfo:
    """An enrollment code's record (the secret is not kept). `state`: `unused`, `used`
    (by `computer_id`) or `expired` (revoked codes expire at the moment of revocation)."""

    id: str
    group: str
    created_at: datetime
    expires_at: datetime
    used_at: datetime | None
    computer_id: str | None
    state: str


def list_enroll_codes(
    engine: Engine, group_name: str, include_done: bool = False
) -> list[EnrollCodeInfo]:
    """The group's enrollment codes, oldest first: the unused ones, or with `include_done`
    also the used and expired ones."""
    now = utcnow()
    with Session(engine) as session:
        group = _group(session, group_name)
        rows = session.exec(
            select(EnrollCode)
            .where(EnrollCode.group_id == group.id)
            .order_by(col(EnrollCode.created_at))
        )
        out = []
        for c in rows:
            state = (
                "used" if c.used_at is not None else "expired" if c.expires_at <= now else "unused"
            )
            if state == "unused" or include_done:
                out.append(
                    EnrollCodeInfo(
                        c.id,
                        group.name,
                        c.created_at,
                        c.expires_at,
                        c.used_at,
                        c.computer_id,
                        state,
                    )
                )
        return out


def revoke_enroll_code(
    engine: Engine, group_name: str, code: str, actor: str | None = None
) -> bool:
    """Make an unused enrollment code of the group unusable now (by id or its full text):
    it expires at once. False: no such code in the group. Raises `AdminError` for a code
    that was already used (revoke the computer instead)."""
    code_id = code.split("_")[1] if code.startswith(f"{ENROLL_PREFIX}_") else code
    with Session(engine) as session:
        group = _group(session, group_name)
        row = session.exec(
            select(EnrollCode).where(EnrollCode.id == code_id, EnrollCode.group_id == group.id)
        ).first()
        if row is None:
            return False
        if row.used_at is not None:
            raise AdminError(
                f"enrollment code {code_id} was already used by computer {row.computer_id}; "
                "revoke the computer instead (rbroker-server computer revoke ID)"
            )
        now = utcnow()
        if row.expires_at > now:
            row.expires_at = now
            session.add(row)
            audit.record(
                session,
                actor=actor or audit.cli_actor(),
                action=audit.CODE_REVOKED,
                group=group.name,
                target=row.id,
                at=now,
            )
            session.commit()
        return True


def list_computers(engine: Engine, group_name: str | None = None) -> list[ComputerInfo]:
    """Enrolled computers, of one group or all."""
    with Session(engine) as session:
        query = select(Computer, Group).where(Computer.group_id == Group.id)
        if group_name is not None:
            query = query.where(Computer.group_id == _group(session, group_name).id)
        rows = session.exec(query.order_by(col(Group.name), col(Computer.name)))
        return [
            ComputerInfo(
                c.id,
                g.name,
                c.name,
                c.enrolled_at,
                c.last_seen_at,
                c.revoked_at is not None,
                c.flagged,
            )
            for c, g in rows
        ]


def revoke_computer(engine: Engine, computer_id: str, actor: str | None = None) -> bool:
    """Revoke a computer: its reports get 403 and it can no longer read the fleet."""
    with Session(engine) as session:
        computer = session.get(Computer, computer_id)
        if computer is None:
            return False
        if computer.revoked_at is None:
            computer.revoked_at = utcnow()
            session.add(computer)
            group = session.get(Group, computer.group_id)
            audit.record(
                session,
                actor=actor or audit.cli_actor(),
                action=audit.COMPUTER_REVOKED,
                group=group.name if group is not None else None,
                target=computer.id,
                detail=f"name {computer.name!r}",
            )
            session.commit()
        return True
