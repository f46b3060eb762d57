"""One broker, many users: what keeps one user from taking the broker from the others
(docs/architecture.md §3, §5).

- **Administrators** (the broker's own user, root and the members of `--admin-group`; the
  local API decides who is one) may end any lease (`Broker.release`) and cancel any waiting
  request (`Broker.cancel_request`). The lease ends `revoked` with the reason "released by
  admin <user>", and its holder is told: a `lease_ended` event `{lease_id, state,
  ended_reason}` goes to the lease's own connection, and its next heartbeat is answered
  `lease_expired` with the same reason.
- **The longest wait**: a `wait_s` over `BrokerConfig.max_wait_s` (24 h by default) is
  refused at once (`wait_too_long`), never clamped: the caller learns the broker's rule.
- **Per-user caps**, each refused at once with its own name and the numbers (`limit`,
  `count`): waiting requests (`too_many_waiting`), live leases (`too_many_leases`) and jobs
  not yet finished (`too_many_jobs`, checked by `rbroker.broker.jobs`). The caps on unsent
  answer bytes are the local API's (`rbroker.localapi.limits.UnsentBudget`).
"""

from __future__ import annotations

from rbroker.base.display import fmt_count
from rbroker.broker.config import BrokerConfig
from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.localapi import AcquireParams


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
            f"user {owner} already has {fmt_count(count)} {what} on this broker "
            f"({fmt_count(limit)} at most); {fix}",
            limit=limit,
            count=count,
        )


def check_request(
    params: AcquireParams,
    owner: str,
    cfg: BrokerConfig,
    leases_owned: int,
    waiting_of_owner: int,
) -> None:
    """The fairness checks of a new `lease.acquire` (after the capacity checks), for `owner`
    holding `leases_owned` live leases and `waiting_of_owner` waiting requests.

    Raises:
        RpcError: `wait_too_long`, `too_many_leases`, `too_many_waiting` (only for a request
            that may wait).
    """
    check_wait(params.wait_s, cfg.max_wait_s)
    cap(
        ErrorCode.TOO_MANY_LEASES,
        owner,
        leases_owned,
        cfg.max_leases_per_user,
        "live leases",
        "release some and try again",
    )
    if params.wait_s > 0:
        cap(
            ErrorCode.TOO_MANY_WAITING,
            owner,
            waiting_of_owner,
            cfg.max_waiting_per_user,
            "waiting requests",
            "wait for some to end (or cancel them) and try again",
        )
