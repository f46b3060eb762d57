"""Who may connect to a broker, and who may use its administrative methods (`broker.pause`,
`sim.set`, `sim.stall`) and rights (ending another user's lease, cancelling another user's
waiting request).

With an allowed group (`rbroker broker --allowed-group`), only the broker's own user, root and
that group's members may connect; the others are answered `not_allowed` and disconnected.
Everyone who can connect may lease, list and report; changing what the broker does for
everyone is kept to the broker's own OS user and, when configured, the members of an admin
group (e.g. the operators of a system broker). The caller is the `Peer` the OS reported for
the connection, never a name from the request.
"""

from __future__ import annotations

import getpass
import os
import sys
from functools import lru_cache

from rbroker.broker.members import user_in_group
from rbroker.transport.base import Peer
from rbroker_protocol.errors import ErrorCode, RpcError


@lru_cache(maxsize=1)
def broker_user() -> str:
    """The OS user this broker process runs as: its name, or its uid as a number where the
    passwd database has no entry for it (a container run with an arbitrary uid)."""
    if sys.platform == "win32":
        return getpass.getuser()
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def is_admin(peer: Peer, admin_group: str | None) -> bool:
    """True when `peer` may pause admissions, change a simulation, end any lease or cancel
    any waiting request on this broker: its own user (on Windows: the same account SID), an
    elevated administrator on Windows (the service's account is LocalSystem, which no person
    signs in as), root (uid 0) or a member of `admin_group` (Unix)."""
    if sys.platform == "win32" and peer.sid is not None:
        from rbroker.transport.win_accounts import own_sid

        return peer.elevated_admin or peer.sid == own_sid()
    if sys.platform != "win32" and peer.uid is not None:
        if peer.uid in (0, os.getuid()):
            return True
    elif peer.user == broker_user():
        return True
    return admin_group is not None and user_in_group(peer.user, admin_group)


def admin_description(admin_group: str | None) -> str:
    """Who may use the administrative methods, in words (for refusals)."""
    who = f"the broker's own user ({broker_user()})"
    if sys.platform == "win32":
        return who + " and elevated administrators"
    who += ", root"
    if admin_group:
        who += f" and members of the group {admin_group!r}"
    return who


READS = {"audit.list": "shows what users did to each other's work"}
"""The administrative methods that change nothing, and what they show instead (for refusals)."""


def check_admin(peer: Peer, method: str, admin_group: str | None) -> None:
    """Refuse `method` unless `peer` is the broker's user or in its admin group.

    Raises:
        RpcError: `not_allowed`, naming who may use it.
    """
    if is_admin(peer, admin_group):
        return
    what = READS.get(method, "changes the broker for everyone")
    raise RpcError(
        ErrorCode.NOT_ALLOWED,
        f"{method} {what}: only {admin_description(admin_group)} may use it, not {peer.user}",
        method=method,
    )


def connect_refusal(peer: Peer, allowed_group: str | None, address: str) -> RpcError | None:
    """The `not_allowed` answer for a peer outside `allowed_group`, else None: the broker's
    own user and root (uid 0) always connect; the answer names that rule.

    The group is checked in the OS's group database (primary and supplementary groups), so
    removing a user from the group takes effect at their next connection.
    """
    if allowed_group is None or sys.platform == "win32":
        return None
    if peer.uid is not None and peer.uid in (0, os.getuid()):
        return None
    if user_in_group(peer.user, allowed_group):
        return None
    own = broker_user()
    who = "root" if own == "root" else f"its own user ({own}), root"
    return RpcError(
        ErrorCode.NOT_ALLOWED,
        f"not allowed to use the broker at {address}: only {who} and the members of the "
        f"group {allowed_group!r} may, not {peer.user}; ask its "
        f"administrator to add you to {allowed_group!r}",
        allowed_group=allowed_group,
    )
