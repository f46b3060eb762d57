"""The synchronous part of `Broker.acquire`: a request keyed like one already granted or
waiting gets that lease or queue entry back; a new one is checked (infeasible, telemetry,
the per-user rules of `fairness`), queued and given one admission pass at once, so that
a request that fits is granted without waiting (and the local API answers it without a
task of its own); a request queued behind others on every GPU it may take only gets its
reason (the cost of an acquire stays flat in the length of the queue). One that is not
granted at once and could only fit after its requester's own leases end is refused
(`own_leases`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rbroker.broker import fairness, own_leases
from rbroker.broker.holders import Holder
from rbroker.broker.leases import Lease, Waiter
from rbroker_protocol.errors import RpcError
from rbroker_protocol.localapi import AcquireParams

if TYPE_CHECKING:
    from rbroker.broker.service import Broker


def begin(
    b: Broker, params: AcquireParams, owner: str, holder: Holder, conn_id: int | None
) -> Lease | Waiter:
    """The lease when granted (or re-bound by its request key) at once, else the queue
    entry to await (`Broker.await_waiter`).

    Raises:
        RpcError: as `Broker.acquire`, for what is refused at once.
    """
    if params.request_key:
        lease = b.table.by_request_key(params.request_key, owner, holder)
        if lease is not None:
            return b.table.rebind(lease, conn_id)
        found = b.waiting.find(params.request_key, owner, holder)
        if found is not None:
            found.conn_id, found.reattach_by = conn_id, None
            return found
    if params.job_id is not None:
        b.jobs.get(params.job_id, owner)  # job_not_found / not_lease_owner
    candidates = b.admission.candidates(params)
    b.admission.check_feasible(params, candidates)
    fairness.check_request(b, params, owner)
    waiter = b.waiting.new_waiter(
        params,
        candidates,
        owner,
        holder,
        conn_id,
        b.clock.monotonic(),
        b.clock.wall(),
        b.clock.boottime(),
    )
    behind = bool(candidates) and all(b.waiting.waiting_on(u) for u in candidates)
    b.waiting.add(waiter)
    if behind:
        # queued behind other requests on every GPU it may take: FIFO, it cannot be granted
        # before them, and every change that could admit them runs a pass of its own (a
        # sample, a cancel, a closed connection, a resume, the tick): no pass over the queue
        b.admission.explain_behind(waiter, b.waiting.waiting_on, b.paused)
    else:
        b._admit()
    future = waiter.future
    if future.done() and not future.cancelled() and future.exception() is None:
        return future.result()
    if not future.done():
        try:  # not granted now: refused when it could only fit after its own leases end
            own_leases.check(b.table, holder, owner, params.mib, params.gpus, waiter.candidates)
        except RpcError:
            b.waiting.remove(waiter)
            raise
        if params.wait_s > 0:
            b.waiting.persist(waiter)
        b.emit("queue", {"request_id": waiter.request_id})
    return waiter
