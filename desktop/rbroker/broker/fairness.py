"""One broker, many users: what keeps one user from taking the broker from the others
(docs/architecture.md §3, §5).

- **Administrators** (the broker's own user, root and the members of `--admin-group`; the
  local API decides who is one) may end any lease and cancel any waiting request. The lease
  ends `revoked` with the reason "released by admin <user>", and its holder is told: a
  `lease_ended` event `{lease_id, state, ended_reason}` goes to the lease's own connection,
  and its next heartbeat is answered `lease_expired` with the same reason.
- **The longest wait**: a `wait_s` over `BrokerConfig.max_wait_s` (24 h by default) is
  refused at once (`wait_too_long`), never clamped: the caller learns the broker's rule.
- **Per-user caps**, each refused at once with its own name and the numbers (`limit`,
  `count`): waiting requests (`too_many_waiting`), live leases (`too_many_leases`) and jobs
  not yet finished (`too_many_jobs`, checked by `rbroker.broker.jobs`). The caps on unsent
  answer bytes are the local API's (`rbroker.localapi.unsent`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rbroker.broker.leases import Lease, LeaseState, Waiter
from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.localapi import AcquireParams

if TYPE_CHECKING:
    from rbroker.broker.service import Broker


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds:g} s"


def check_wait(wait_s: float, max_wait_s: float) -> None:
    """Refuse a `wait_s` (seconds) over the broker's longest wait.

    Raises:
        RpcError: `wait_too_long` with `wait_s` and `max_wait_s`.
    """
    if wait_s > max_wait_s:
        raise RpcError(
            ErrorCode.WAIT_TOO_LONG,
            f"wait_s {wait_s:g} s is longer than this broker's longest wait, "
            f"{max_wait_s:g} s ({_hours(max_wait_s)}): ask for {max_wait_s:g} s or less",
            wait_s=wait_s,
            max_wait_s=max_wait_s,
        )


def cap(code: ErrorCode, owner: str, count: int, limit: int, what: str, fix: str) -> None:
    """Refuse with `code` when `owner` already has `count` ≥ `limit` of `what`, saying
    how to `fix` it.

    Raises:
        RpcError: `code` with `limit` and `count`.
    """
    if count >= limit:
        raise RpcError(
            code,
            f"user {owner} already has {count} {what} on this broker ({limit} at most); {fix}",
            limit=limit,
            count=count,
        )


def check_request(b: Broker, params: AcquireParams, owner: str) -> None:
    """The fairness checks of a new `lease.acquire` (after the capacity checks).

    Raises:
        RpcError: `wait_too_long`, `too_many_leases`, `too_many_waiting` (only for a request
            that may wait).
    """
    cfg = b.config
    check_wait(params.wait_s, cfg.max_wait_s)
    cap(
        ErrorCode.TOO_MANY_LEASES,
        owner,
        b.table.owned_by(owner),
        cfg.max_leases_per_user,
        "live leases",
        "release some and try again",
    )
    if params.wait_s > 0:
        cap(
            ErrorCode.TOO_MANY_WAITING,
            owner,
            b.waiting.waiting_of(owner),
            cfg.max_waiting_per_user,
            "waiting requests",
            "wait for some to end (or cancel them) and try again",
        )


def release(
    b: Broker, lease_id: str, user: str, conn_id: int | None, pid: int | None, admin: bool
) -> Lease:
    """End lease `lease_id` for `user` (see `Broker.release`); an admin may end anyone's.

    Raises:
        RpcError: `lease_not_found`, `lease_expired`, `not_lease_owner` (not an admin).
    """
    found = b.leases.get(lease_id)
    by_admin = admin and found is not None and found.owner != user
    lease = b.table.find(lease_id, found.owner if by_admin and found else user)
    state = LeaseState.RELEASED
    if by_admin:
        state, reason = LeaseState.REVOKED, f"released by admin {user}"
    elif conn_id is None or conn_id == lease.conn_id or pid == lease.holder.pid:
        reason = "released by holder"
    else:
        reason = f"released by another process of {user}"
    b._end(lease, state, reason)
    if reason != "released by holder":  # tell the holder (its connection, if it has one)
        b.emit("lease_ended", {"lease_id": lease_id, "state": state.value, "ended_reason": reason})
    return lease


def cancel(b: Broker, request_id: int, user: str, admin: bool) -> Waiter:
    """Cancel waiting request `request_id`: its owner's, or anyone's for an admin. The
    waiting `lease.acquire` (or resize) ends `cancelled` with "request cancelled by admin
    <user>" (or "... by <user>", another process of its owner).

    Raises:
        RpcError: `request_not_found` (not waiting: granted, ended, unknown),
            `not_lease_owner` (another user's, and `user` is no admin).
    """
    waiter = next((w for w in b.queue if w.request_id == request_id), None)
    if waiter is None or waiter.future.done():
        raise RpcError(
            ErrorCode.REQUEST_NOT_FOUND,
            f"no waiting request {request_id} (granted, ended or never queued)",
            request_id=request_id,
        )
    if waiter.owner != user and not admin:
        raise RpcError(
            ErrorCode.NOT_LEASE_OWNER,
            f"request {request_id} belongs to another user",
            request_id=request_id,
        )
    who = f"admin {user}" if waiter.owner != user else user
    b.waiting.remove(
        waiter,
        RpcError(
            ErrorCode.CANCELLED,
            f"request cancelled by {who}",
            request_id=request_id,
            cancelled_by=user,
        ),
    )
    b.emit("queue", {"request_id": request_id})
    b._admit()
    return waiter
