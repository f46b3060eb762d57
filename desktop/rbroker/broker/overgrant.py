"""Over-grant episodes: a lease whose observed memory stays above its grant for longer than
the grace (`BrokerConfig.over_grant_grace_s`, 10 s by default) is reported once per
episode with an `over_grant` event (docs/architecture.md §2).

An episode starts with the first sample that shows a lease over its grant on any of its GPUs
and ends with the first sample that shows it inside again (or the lease ending); a new
episode may then be reported again. Policy is "warn": the broker never kills, throttles or
revokes work for using more than it was granted; its real use already counts in the GPU's
`device_used`, so admission stays safe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from rbroker.broker.leases import Lease

log = logging.getLogger(__name__)

Emit = Callable[[str, dict[str, Any]], None]


def worst_gpu(lease: Lease) -> tuple[str, int]:
    """`(gpu_uuid, observed_mib)` of the lease's GPU with the most observed memory."""
    uuid = max(lease.gpu_uuids, key=lambda u: lease.observed_mib.get(u, 0))
    return uuid, lease.observed_mib.get(uuid, 0)


def event_data(lease: Lease, now: float) -> dict[str, Any]:
    """The `over_grant` event's numbers: which lease (its declared descriptions, never a
    pid), the GPU furthest over, granted, observed and over MiB, and for how long."""
    uuid, observed = worst_gpu(lease)
    return {
        "lease_id": lease.lease_id,
        "owner": lease.owner,
        "project": lease.project,
        "session": lease.session,
        "purpose": lease.purpose,
        "gpu_uuid": uuid,
        "granted_mib": lease.granted_mib,
        "observed_mib": observed,
        "over_mib": max(0, observed - lease.granted_mib),
        "over_s": round(now - (lease.over_since if lease.over_since is not None else now), 3),
    }


def watch(leases: Iterable[Lease], now: float, grace_s: float, emit: Emit) -> None:
    """Follow the over-grant episode of each of `leases` after a new sample (`now`
    monotonic): start or end it, and emit `("over_grant", event_data)` once, when it has
    lasted `grace_s`."""
    for lease in leases:
        _, observed = worst_gpu(lease)
        over = observed - lease.granted_mib
        if over <= 0:
            if lease.over_since is not None:
                log.info("lease %s is inside its grant again", lease.lease_id)
            lease.over_since, lease.over_mib, lease.over_noticed = None, 0, False
            continue
        lease.over_mib = over
        if lease.over_since is None:
            lease.over_since = now
        if not lease.over_noticed and now - lease.over_since >= grace_s:
            lease.over_noticed = True
            data = event_data(lease, now)
            log.warning(
                "lease %s of %s/%s uses %d MiB over its grant of %d MiB on %s (for %.1f s)",
                lease.lease_id,
                lease.project,
                lease.session,
                data["over_mib"],
                lease.granted_mib,
                data["gpu_uuid"],
                data["over_s"],
            )
            emit("over_grant", data)
