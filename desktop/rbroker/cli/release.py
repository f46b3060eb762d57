"""`rbroker release ID`: end a lease, or cancel a waiting request, by its id.

For a holder that cannot release it any more (a hung process, a lost terminal); the lease
ends at once and its memory is admissible again. Ids are accepted whole
(`lease-3f2a1b4c5d6e`) or as a prefix with or without `lease-` (`3f2a1b`), as shown by
`rbroker status` in a narrow terminal, in any case (`LEASE-3F2A`); an ambiguous prefix is
refused with the candidates, and `lease-` or the start of it (`l`) names no lease. A waiting
request is named `req-N`, as the queue in `rbroker status` shows it (`REQ-N` too).

Everyone may end their own leases and requests; the broker's administrators (its own user,
root and the members of its `--admin-group`) may end anyone's: the lease's reason then says
"released by admin <user>", and its holder is told.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from rich.console import Console

import rbroker
from rbroker.base.display import REQUEST_PREFIX, fmt_mib, request_name
from rbroker.cli.exits import unusable_exit
from rbroker.cli.sheet import resolve_prefix
from rbroker.cli.views import LEASE_PREFIX

EX_USAGE = 2


def resolve_lease_id(client: rbroker.Client, given: str) -> str:
    """The active lease id that `given` names (whole id or unique prefix). Raises
    `LookupError` with a message in words when none or several match, `ValueError` when
    `given` is empty."""
    ids = [x["lease_id"] for x in client.leases()["leases"]]
    return resolve_prefix(given, ids, LEASE_PREFIX, "active lease")


def request_number(given: str) -> int | None:
    """The request id `req-N` (or `REQ-N`) names (N ≥ 1), None for anything that is not
    `req-…`.

    Raises:
        ValueError: `req-` followed by something other than a number from 1.
    """
    given = given.strip()
    if not given.lower().startswith(REQUEST_PREFIX):
        return None
    tail = given[len(REQUEST_PREFIX) :]
    if not tail.isdigit() or int(tail) < 1 or len(tail) > 18:
        raise ValueError(
            f"{given!r} names no waiting request: give req- and its number, as the queue of "
            "rbroker status shows it (e.g. req-7)"
        )
    return int(tail)


def _said(item: Mapping[str, Any], what: str) -> str:
    mib = int(item.get("granted_mib", item.get("mib")) or 0)
    return f"{what} ({fmt_mib(mib)} MiB, {item['owner']}: {item['project']}/{item['session']})"


def run_release(args: argparse.Namespace) -> int:
    """Release or cancel; exit 0, 2 for an unknown, ambiguous or foreign id or a broker that
    refuses this user, 69 without broker."""
    err = Console(stderr=True, highlight=False)
    out = Console(highlight=False)
    try:
        with rbroker.Client(args.socket, timeout_s=5) as client:
            try:
                number = request_number(args.lease)
                if number is not None:
                    request = client.cancel_request(number)["request"]
                    out.print(
                        "cancelled " + _said(request, request_name(number)),
                        markup=False,
                        soft_wrap=True,
                    )
                    return 0
                lease_id = resolve_lease_id(client, args.lease)
            except (LookupError, ValueError) as exc:
                err.print(f"rbroker release: {exc}", markup=False, soft_wrap=True)
                return EX_USAGE
            lease = client.release(lease_id)["lease"]
    except rbroker.BrokerUnavailable as exc:
        err.print(f"rbroker release: {exc}", markup=False, soft_wrap=True)
        return unusable_exit(exc)
    except rbroker.RBrokerError as exc:
        err.print(f"rbroker release: {exc}", markup=False, soft_wrap=True)
        return EX_USAGE
    line = (
        f"released {lease['lease_id']} ({fmt_mib(lease['granted_mib'])} MiB, {lease['project']}/"
        f"{lease['session']})"
    )
    if lease.get("state") == "revoked":
        line += f"; {lease['owner']}'s lease, {lease['ended_reason']}"
    out.print(line, markup=False, soft_wrap=True)
    return 0
