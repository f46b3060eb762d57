"""`rbroker release LEASE`: end one of your own leases by its id or a short unique prefix.

For a holder that cannot release it any more (a hung process, a lost terminal); the lease
ends as "released" at once and its memory is admissible again. Ids are accepted whole
(`lease-3f2a1b4c5d6e`) or as a prefix with or without `lease-` (`3f2a1b`), as shown by
`rbroker status` in a narrow terminal; an ambiguous prefix is refused with the candidates.
"""

from __future__ import annotations

import argparse

from rich.console import Console

import rbroker
from rbroker.cli.sheet import resolve_prefix
from rbroker.cli.views import LEASE_PREFIX

EX_USAGE = 2
EX_UNAVAILABLE = 69


def resolve_lease_id(client: rbroker.Client, given: str) -> str:
    """The active lease id that `given` names (whole id or unique prefix). Raises
    `LookupError` with a message in words when none or several match, `ValueError` when
    `given` is empty."""
    ids = [x["lease_id"] for x in client.leases()["leases"]]
    return resolve_prefix(given, ids, LEASE_PREFIX, "active lease")


def run_release(args: argparse.Namespace) -> int:
    """Release; exit 0, 2 for an unknown, ambiguous or foreign lease, 69 without broker."""
    err = Console(stderr=True, highlight=False)
    try:
        with rbroker.Client(args.socket, timeout_s=5) as client:
            try:
                lease_id = resolve_lease_id(client, args.lease)
            except (LookupError, ValueError) as exc:
                err.print(f"rbroker release: {exc}", markup=False, soft_wrap=True)
                return EX_USAGE
            lease = client.call("lease.release", lease_id=lease_id)["lease"]
    except rbroker.BrokerUnavailable as exc:
        err.print(f"rbroker release: {exc}", markup=False, soft_wrap=True)
        return EX_UNAVAILABLE
    except rbroker.RBrokerError as exc:
        err.print(f"rbroker release: {exc}", markup=False, soft_wrap=True)
        return EX_USAGE
    Console(highlight=False).print(
        f"released {lease['lease_id']} ({lease['granted_mib']} MiB, {lease['project']}/"
        f"{lease['session']})",
        markup=False,
    )
    return 0
