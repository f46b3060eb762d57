"""Resizing a grant (`lease.resize`, docs/architecture.md §3): the lease keeps its id,
owner, descriptions and token; only `granted_mib` changes, on each of its GPUs.

- Shrinking takes effect at once: the lease's grant is smaller now. The room it frees is
  offered to waiting requests as soon as a sample that began after the shrink confirms what
  the holder really uses (the release rule of §2: the shrink asks for that sample, so within
  about one sample's time); until then it stays booked, so a holder that allocated since the
  last sample can never make the broker over-admit.
- Growing is admitted like a new request for the extra MiB, pinned to the lease's GPUs and
  queued last: FIFO, so it waits behind requests already waiting there. It is refused at
  once (`infeasible`) when a GPU can never hold the new size (more than total − headroom),
  or, not granted at once, could hold it only after the holder's other leases end
  (`own_leases`),
  and ends with `capacity_unavailable` / `wait_timeout` (the reason and its numbers) when it
  is not granted within `wait_s`. When granted, the growth is booked at once (the new grant
  less what the lease already shows using, which device_used holds), so, as after any grant,
  the next admission may use the same sample.
- A resize the store cannot write (a full disk) is refused, `storage_unavailable`, with the
  lease unchanged; a growth granted in an admission pass is refused alone, the pass goes on.
- Bad input — a size below 1 MiB or above `MAX_MIB`, another user's lease, an ended lease, a
  resize while another of the same lease waits — is an `RpcError` with a stable name and the
  numbers; the lease is unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from rbroker.base.display import fmt_mib
from rbroker.broker import own_leases
from rbroker.broker.admission import Admission
from rbroker.broker.clock import Clock
from rbroker.broker.fairness import check_wait
from rbroker.broker.leases import Lease, Waiter
from rbroker.broker.lessor import Choice, Lessor
from rbroker.broker.store import STORAGE_ERRORS, storage_unavailable
from rbroker.broker.waiting import WaitQueue, new_future
from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.localapi import MAX_MIB

log = logging.getLogger(__name__)

Emit = Callable[[str, dict[str, Any]], None]


class Resizes:
    """The resizes of one broker; `pending` maps a lease id to its waiting growth."""

    def __init__(
        self,
        lessor: Lessor,
        waiting: WaitQueue,
        admission: Admission,
        clock: Clock,
        emit: Emit,
        admit: Callable[[], None],
    ) -> None:
        self.lessor = lessor
        self.waiting = waiting
        self.admission = admission
        self.clock = clock
        self.emit = emit
        self.admit = admit
        self.pending: dict[str, Waiter] = {}

    async def resize(
        self, lease_id: str, owner: str, mib: int, wait_s: float, conn_id: int | None
    ) -> Lease:
        """Change lease `lease_id`'s grant to `mib` MiB (see the module docstring).

        Raises:
            RpcError: `invalid_params` (size out of range), `lease_not_found`,
                `lease_expired`, `not_lease_owner`, `resize_pending`, `infeasible`,
                `capacity_unavailable`, `wait_timeout`, `cancelled` (connection closed),
                `wait_too_long` (a growth's `wait_s` past the broker's longest wait),
                `storage_unavailable` (the store cannot write the new size).
        """
        if not 1 <= mib <= MAX_MIB:
            raise RpcError(
                ErrorCode.INVALID_PARAMS,
                f"invalid params: mib: a lease is resized to 1 to {fmt_mib(MAX_MIB)} MiB, "
                f"not {mib}",
                field="mib",
                requested_mib=mib,
                min_mib=1,
                max_mib=MAX_MIB,
            )
        lease = self.lessor.lookup(lease_id, owner)
        pending = self.pending.get(lease_id)
        if pending is not None:
            target = lease.granted_mib + pending.asked_mib  # its growth
            raise RpcError(
                ErrorCode.RESIZE_PENDING,
                f"lease {lease_id} already waits to grow to {fmt_mib(target)} MiB; "
                f"resize it to {fmt_mib(mib)} MiB after that one ends",
                lease_id=lease_id,
                granted_mib=lease.granted_mib,
                pending_mib=target,
                requested_mib=mib,
            )
        old = lease.granted_mib
        if mib == old:
            return lease
        if mib < old:
            try:
                self._apply(lease, mib, {})
            except STORAGE_ERRORS as exc:
                raise _not_resized(exc) from None
            self.admit()
            return lease
        self._check_can_ever_fit(lease, mib)
        check_wait(wait_s, self.lessor.config.max_wait_s)
        now = self.clock.monotonic()
        waiter = Waiter(
            request_id=self.waiting.next_id(),
            asked_mib=mib - old,  # the growth
            gpus=len(lease.gpu_uuids),
            candidates=lease.gpu_uuids,
            pinned=True,
            owner=lease.owner,
            project=lease.project,
            session=lease.session,
            purpose=lease.purpose,
            ttl_s=lease.ttl_s,
            adopt=False,
            placement="pack",
            holder=lease.holder,
            conn_id=conn_id,
            enqueued_at=now,
            deadline=now + wait_s,
            wait_s=wait_s,
            future=new_future(),
            wait_until_wall=self.clock.wall() + wait_s,
            wait_until_boot=self.clock.boottime() + wait_s,
            resize_of=lease_id,
            booking_id=lease.booking_id,  # a claim grows into its booking's MiB first
        )
        self.pending[lease_id] = waiter
        self.waiting.add(waiter)
        try:
            self.admit()
            if not waiter.future.done():
                self._check_not_behind_own(lease, mib)
                self.emit("queue", {"request_id": waiter.request_id})
            return await waiter.future
        except RpcError as err:
            raise _growth_error(err, lease_id, old, mib) from None
        finally:
            self.pending.pop(lease_id, None)
            if waiter in self.waiting.waiters:  # cancelled (connection gone)
                self.waiting.remove(waiter)
                self.admit()

    def _check_can_ever_fit(self, lease: Lease, mib: int) -> None:
        for uuid in lease.gpu_uuids:
            never = self.admission.never_fits(mib, 1, (uuid,))
            if never is not None:
                raise _refused(lease, never)

    def _check_not_behind_own(self, lease: Lease, mib: int) -> None:
        """A growth not granted at once that could only fit after the holder's (or its
        parents') other leases end is refused (`own_leases`)."""
        gpus = lease.gpu_uuids
        try:
            own_leases.check(
                self.lessor, lease.holder, lease.owner, mib, len(gpus), gpus, resized=lease
            )
        except RpcError as err:
            raise _refused(lease, err) from None

    def grant(self, waiter: Waiter, chosen: list[Choice], now: float) -> None:
        """The admission pass granted a growth (`waiter.resize_of`): apply it, or, when the
        store cannot write it (a full disk), refuse it (`storage_unavailable`) with the lease
        unchanged."""
        self.waiting.remove(waiter)
        lease = self.lessor.leases.get(waiter.resize_of or "")
        if lease is None:  # ended while its growth waited (normally cancelled first)
            waiter.future.set_exception(
                RpcError(ErrorCode.LEASE_EXPIRED, f"lease {waiter.resize_of} ended")
            )
            return
        growth_mib = waiter.asked_mib
        records = {
            c.gpu_uuid: {**c.cap.as_dict(), "requested_mib": growth_mib, "extra_mib": c.extra_mib}
            for c in chosen
        }
        try:
            self._apply(lease, lease.granted_mib + growth_mib, records)
        except STORAGE_ERRORS as exc:  # only this request is refused, the pass goes on
            log.warning("lease %s not resized: %s", lease.lease_id, exc)
            waiter.future.set_exception(_not_resized(exc))
            self.emit("queue", {"request_id": waiter.request_id})
            return
        waiter.future.set_result(lease)

    def _apply(self, lease: Lease, mib: int, records: dict[str, dict[str, Any]]) -> None:
        self.lessor.resize(lease, mib, records)
        self.emit(
            "lease", {"lease_id": lease.lease_id, "state": lease.state.value, "resized_mib": mib}
        )

    def lease_ended(self, lease_id: str) -> None:
        """Cancel the waiting growth of a lease that ended."""
        waiter = self.pending.get(lease_id)
        if waiter is not None:
            self.waiting.remove(
                waiter, RpcError(ErrorCode.LEASE_EXPIRED, f"lease {lease_id} ended")
            )


def _not_resized(exc: Exception) -> RpcError:
    return storage_unavailable(exc, "not resized", "the lease is unchanged")


def _refused(lease: Lease, err: RpcError) -> RpcError:
    """`infeasible` `err`, said as the refusal of a resize of `lease`."""
    return RpcError(
        ErrorCode.INFEASIBLE,
        f"resize of {lease.lease_id} refused: {err.message}",
        **{**err.data, "lease_id": lease.lease_id, "granted_mib": lease.granted_mib},
    )


def _growth_error(err: RpcError, lease_id: str, old: int, mib: int) -> RpcError:
    """A growth's wait error, said as a resize: the new size and the extra it needed."""
    if err.name not in (ErrorCode.CAPACITY_UNAVAILABLE, ErrorCode.WAIT_TIMEOUT):
        return err
    data = {**err.data, "lease_id": lease_id, "granted_mib": old, "requested_mib": mib}
    data["extra_mib"] = mib - old
    return RpcError(
        err.name,
        f"resize of {lease_id} from {fmt_mib(old)} to {fmt_mib(mib)} MiB "
        f"({fmt_mib(mib - old)} more): {err.message}",
        **data,
    )
