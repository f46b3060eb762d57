"""Exit codes of the client commands (`rbroker run`, `status`, `top`, `jobs`, `release`)
when the broker cannot be used, as docs/user-guide.md lists them: 69 when no broker
answers, 2 when one is there and refuses this user (the code of every other refusal)."""

from __future__ import annotations

import rbroker

EX_REFUSED = 2
"""Refused: bad input, or a broker that is there and says no (as `infeasible`, another
user's lease, its per-user connection cap, this user not allowed on its socket)."""
EX_UNAVAILABLE = 69
"""sysexits.h EX_UNAVAILABLE: no broker answers at any address tried."""


def is_refusal(exc: BaseException) -> bool:
    """True when `exc` comes from a broker that is there and refuses this user: permission
    denied on its socket or its allowed group (`BrokerUnavailable`, code `not_allowed`), or
    its per-user connection cap (`NotAllowed`, code `too_many_connections`); False for no
    broker at all (and for anything else)."""
    if isinstance(exc, rbroker.BrokerUnavailable):
        return exc.code == "not_allowed"
    return isinstance(exc, rbroker.NotAllowed)


def unusable_exit(exc: BaseException) -> int:
    """The exit code for a broker that cannot be used: `EX_REFUSED` (2) for a refusal
    (`is_refusal`), `EX_UNAVAILABLE` (69) when none answers."""
    return EX_REFUSED if is_refusal(exc) else EX_UNAVAILABLE
