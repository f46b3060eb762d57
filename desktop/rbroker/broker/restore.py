"""Restore after a restart: bring back from the store the leases and waiting requests whose
holder processes are still alive (same pid and start time), and end the others with the
reason (docs/architecture.md §3).

A restored waiter has no connection yet: its client must come back (re-send its request key)
within `reattach_grace_s`, or the wait ends. A restored lease's holder must re-attach with its
token within `lease_reattach_grace_s` (seconds, not the TTL), or the lease ends even if the
holder process lives on: a holder that left its lease while the broker was down must not
keep memory booked for a whole TTL.
"""

from __future__ import annotations

import logging

from rbroker.broker.clock import Clock
from rbroker.broker.config import BrokerConfig
from rbroker.broker.holders import Holder
from rbroker.broker.jobs import JobTable
from rbroker.broker.leases import Lease, LeaseState, Waiter
from rbroker.broker.store import LeaseStore
from rbroker.broker.table import LeaseTable
from rbroker.broker.waiting import WaitQueue, new_future

log = logging.getLogger(__name__)


def restore(
    store: LeaseStore,
    table: LeaseTable,
    waiting: WaitQueue,
    jobs: JobTable,
    clock: Clock,
    config: BrokerConfig,
) -> None:
    """Fill `table` and `waiting` from `store` (GPUs must be enumerated and sampled first).

    Unreadable lease records are ended as `revoked`; leases of dead holders end as
    `holder_exited` ("holder exited while the broker was down"); waiters of dead holders,
    past their wait, or with too few of their GPUs left are dropped.
    """
    now, wall = clock.monotonic(), clock.wall()
    baselines = store.baselines()  # before the leases' own (older) figures are set
    for stored in store.active_leases():
        try:
            lease = Lease.from_record(stored.record, now + float(stored.record["ttl_s"]), wall)
        except (KeyError, TypeError, ValueError, AttributeError):
            log.error("lease %s: unreadable record, dropped", stored.lease_id)
            store.end_lease(stored.lease_id, LeaseState.REVOKED.value, wall, stored.record)
            continue
        if not lease.holder.alive():
            lease.state = LeaseState.HOLDER_EXITED
            lease.ended_reason = "holder exited while the broker was down"
            lease.ended_at_wall = wall
            store.end_lease(lease.lease_id, lease.state.value, wall, lease.to_record())
            table.ended.append(lease)
            log.info("lease %s not restored: %s", lease.lease_id, lease.ended_reason)
            continue
        lease.reattach_by = now + config.lease_reattach_grace_s
        table.add(lease)
        table.token_sha256[lease.lease_id] = stored.token_sha256
        if lease.job_id is not None:
            jobs.restore_link(lease.job_id, lease.lease_id)
        for u, baseline in lease.baseline_mib.items():
            table.baselines[(lease.holder, u)] = baseline
        log.info("lease %s restored (holder %d alive)", lease.lease_id, lease.holder.pid)
    _restore_baselines(table, store, baselines)
    for rec in store.waiters():
        key = rec["request_key"]
        try:
            holder = Holder(int(rec["holder_pid"]), float(rec["holder_start"]))
            remaining = float(rec["wait_until_wall"]) - wall
            candidates = tuple(u for u in rec["candidates"] if u in table.slots)
            alive = holder.alive()
        except (KeyError, TypeError, ValueError):
            alive, remaining, candidates = False, 0.0, ()
        if not alive or remaining <= 0 or len(candidates) < int(rec.get("gpus", 1)):
            store.delete_waiter(key)
            continue
        waiting.add(
            Waiter(
                request_id=waiting.next_id(),
                mib=int(rec["mib"]),
                gpus=int(rec["gpus"]),
                candidates=candidates,
                pinned=bool(rec["pinned"]),
                owner=rec["owner"],
                project=rec["project"],
                session=rec["session"],
                purpose=rec["purpose"],
                ttl_s=float(rec["ttl_s"]),
                adopt=bool(rec["adopt"]),
                placement=rec["placement"],
                holder=holder,
                conn_id=None,
                # the wait began wait_s before wait_until_wall: its waited time goes on
                enqueued_at=now
                - min(max(0.0, float(rec["wait_s"]) - remaining), float(rec["wait_s"])),
                deadline=now + remaining,
                wait_s=float(rec["wait_s"]),
                future=new_future(),
                request_key=key,
                wait_until_wall=float(rec["wait_until_wall"]),
                reattach_by=now + config.reattach_grace_s,
                job_id=rec.get("job_id"),
            )
        )
    for slot in table.slots.values():
        table.update_observed(slot)
    if table.leases or waiting.waiters:
        log.warning(
            "restored %d leases and %d waiting requests",
            len(table.leases),
            len(waiting.waiters),
        )


def _restore_baselines(
    table: LeaseTable, store: LeaseStore, rows: list[tuple[int, float, str, int]]
) -> None:
    """Baselines as last written (`rbroker.broker.baselines`, read before the leases were
    restored) replace the ones of the lease records, written at the grant; the rows of
    holders with no restored lease on that GPU are deleted. The pre-grant part of a
    baseline comes back as plain baseline."""
    leases_of: dict[tuple[Holder, str], list[Lease]] = {}
    for lease in table.leases.values():
        for u in lease.gpu_uuids:
            leases_of.setdefault((lease.holder, u), []).append(lease)
    for pid, start, uuid, mib in rows:
        key = (Holder(pid, start), uuid)
        if key in leases_of:
            table.baselines[key] = mib
            for lease in leases_of[key]:
                lease.baseline_mib[uuid] = mib
        else:
            store.put_baseline(pid, start, uuid, 0)
