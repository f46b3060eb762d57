"""The coordinator's audit trail (`audit_entries`): enrollments, enrollment codes, computer
revocations, viewer tokens, web sign-ins and webhook changes, each written by `record` in
the transaction of the change it records. Entries are only ever inserted: nothing here or
elsewhere updates or deletes one, and they are kept (no pruning).

An entry never holds a secret: an actor is `cli:<OS user>` for `rbroker-server` or
`token:<token id>` for a web sign-in (the id is the public part of a token), and a
webhook's URL is kept as its scheme and host only (a chat's URL is often its secret).
Refused web sign-ins are bounded by `RefusalBound`: at most one entry per client network
per minute, carrying how many refusals it stands for.
"""

from __future__ import annotations

import getpass
import ipaddress
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final
from urllib.parse import urlsplit

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from rbroker_server.admin.errors import AdminError
from rbroker_server.db.engine import utcnow
from rbroker_server.db.tables import AUDIT, GROUPS

LIMIT_MAX: Final = 10_000
"""The most entries `rbroker-server audit --limit` lists."""
REFUSAL_WINDOW_S: Final = 60.0
"""A client network's refused sign-ins within this make one entry."""
REFUSAL_NETWORKS_MAX: Final = 4096
"""Networks `RefusalBound` remembers; past it, refusals from new networks share one line."""

ENROLLED: Final = "computer_enrolled"
CODE_CREATED: Final = "enroll_code_created"
CODE_REVOKED: Final = "enroll_code_revoked"
COMPUTER_REVOKED: Final = "computer_revoked"
GROUP_CREATED: Final = "group_created"
TOKEN_CREATED: Final = "token_created"
TOKEN_REVOKED: Final = "token_revoked"
SIGNIN: Final = "signin"
SIGNIN_REFUSED: Final = "signin_refused"
WEBHOOK_ADDED: Final = "webhook_added"
WEBHOOK_REMOVED: Final = "webhook_removed"


@dataclass(frozen=True, slots=True)
class Entry:
    """One audit entry as `rbroker-server audit` lists it."""

    id: int
    at: datetime
    actor: str
    action: str
    group: str | None
    target: str
    detail: str


def cli_actor() -> str:
    """`cli:<the OS user running the command>` (`cli:unknown` when the OS names none)."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError, ImportError):
        user = "unknown"
    return f"cli:{user or 'unknown'}"


def token_actor(token_id: str) -> str:
    """A viewer token as an actor: its id, the part of a token that is not secret."""
    return f"token:{token_id}"


def url_origin(url: str) -> str:
    """`scheme://host[:port]` of a URL: what an entry keeps of a webhook's URL, whose path
    or query may be a secret."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}"


def client_network(address: str) -> str:
    """The network a client address counts in for refused sign-ins: its /24 (IPv4) or /64
    (IPv6); the text itself (at most 64 characters) when it is not an address."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:64] or "unknown"
    prefix = 24 if ip.version == 4 else 64
    return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def record(
    conn: Any,
    *,
    actor: str,
    action: str,
    group: str | None,
    target: str,
    detail: str = "",
    at: datetime | None = None,
) -> None:
    """Insert one entry through `conn` (a Connection or an ORM Session inside the change's
    transaction: the entry commits or rolls back with it). Never pass a secret."""
    conn.execute(
        sa.insert(AUDIT).values(
            at=at or utcnow(),
            actor=_cut(actor, 128),
            action=action,
            group_name=group,
            target=_cut(target, 128),
            detail=_cut(detail, 512),
        )
    )


def entries(engine: Engine, group: str | None = None, limit: int = 50) -> list[Entry]:
    """The newest `limit` entries (of `group`, else all), newest first.

    Raises:
        AdminError: no such group, or a limit out of 1 to `LIMIT_MAX`.
    """
    if not 1 <= limit <= LIMIT_MAX:
        raise AdminError(f"--limit is from 1 to {LIMIT_MAX}, not {limit}")
    with engine.connect() as conn:
        q = sa.select(AUDIT)
        if group is not None:
            if conn.execute(sa.select(GROUPS.c.id).where(GROUPS.c.name == group)).first() is None:
                raise AdminError(f"no group named {group!r}")
            q = q.where(AUDIT.c.group_name == group)
        rows = conn.execute(q.order_by(AUDIT.c.at.desc(), AUDIT.c.id.desc()).limit(limit)).all()
    return [Entry(r.id, r.at, r.actor, r.action, r.group_name, r.target, r.detail) for r in rows]


class RefusalBound:
    """Which refused web sign-ins get an entry: the first of each client network in each
    `REFUSAL_WINDOW_S`; the ones after it are counted and the next entry of that network
    says how many there were. Kept in this process (each coordinator process bounds its
    own), for at most `REFUSAL_NETWORKS_MAX` networks."""

    STATE_KEY = "audit_refusals"

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, int]] = {}
        """network → (when its last entry was written, refusals not written since)."""

    def admit(self, network: str) -> tuple[str, int] | None:
        """(the network the entry names, the refusals it stands for: this one and the ones
        held back since its last entry), or None: hold this one back (counted for the
        next). The network is `*` once `REFUSAL_NETWORKS_MAX` others are being watched."""
        now = self._clock()
        with self._lock:
            if network not in self._seen and len(self._seen) >= REFUSAL_NETWORKS_MAX:
                self._seen = {k: v for k, v in self._seen.items() if now - v[0] < REFUSAL_WINDOW_S}
                if len(self._seen) >= REFUSAL_NETWORKS_MAX:
                    network = "*"
            last = self._seen.get(network)
            if last is not None and now - last[0] < REFUSAL_WINDOW_S:
                self._seen[network] = (last[0], last[1] + 1)
                return None
            self._seen[network] = (now, 0)
            return network, 1 + (last[1] if last is not None else 0)
