"""Waiting on oneself (docs/architecture.md §3): a request that can only fit after its
requester's own leases end is refused at once as `infeasible`, with the arithmetic.

The requester is the requesting process and its ancestors (`holders.lineage`) of the same OS
user (a parent of another user, such as root starting a job as a user, has leases that user
cannot end and does not count): a nested
`rbroker run` or SDK lease inside a process that holds a lease would wait for ever, since the
outer holder does not release while the inner waits. Its own leases book on a GPU what the
capacity model books for them (§2): per lease the larger of granted and observed. A GPU
blocks the request when the request does not fit there now and, with every other lease and
every other process's memory gone, still would not: `mib > total − headroom − own`, while
`mib ≤ total − headroom` (more than that is plainly infeasible, `Admission.never_fits`). A
GPU with no sample yet cannot be judged and never blocks. The request is refused when fewer
than `gpus` of its GPUs are left unblocked (all or nothing). A resize growth is checked the
same way for the new size, the resized lease left out; its requester is the lease's holder.

The check runs only for a request that the admission pass did not grant at once
(`Broker.begin_acquire`, `Resizes.resize`), so reading the requester's ancestors costs nothing
on the common path; a `wait_s` 0 request it does not refuse keeps `capacity_unavailable`.
"""

from __future__ import annotations

from typing import Any

from rbroker.base.display import fmt_mib, short_uuid
from rbroker.broker.holders import Holder, lineage
from rbroker.broker.leases import Lease
from rbroker.broker.lessor import Lessor
from rbroker_protocol.errors import ErrorCode, RpcError


def check(
    lessor: Lessor,
    requester: Holder,
    owner: str,
    mib: int,
    gpus: int,
    candidates: tuple[str, ...],
    resized: Lease | None = None,
) -> None:
    """Refuse a request of `mib` MiB on each of `gpus` of `candidates` by process
    `requester` of OS user `owner` (or the growth of lease `resized` to `mib`) that fewer
    than `gpus` of them could hold while the requester's own leases stay: those of `owner`
    held by `requester` or an ancestor (a parent of another user, e.g. root starting a job
    as a user, is not the requester: its leases are another user's to end).

    Raises:
        RpcError: `infeasible` with `reason` "own_leases", the figures of the GPU that
            would offer the most (`gpu_uuid`, `total_mib`, `headroom_mib`, `usable_mib`,
            `own_leased_mib`, `own_lease_ids`, `offer_mib`) and every blocked GPU's
            (`blocked`).
    """
    chain: tuple[Holder, ...] | None = None
    could = 0
    blocked: list[dict[str, Any]] = []
    texts: list[str] = []  # per blocked GPU: its own leases and what each books
    need_now = mib - (resized.granted_mib if resized is not None else 0)
    for uuid in candidates:
        cap = lessor.capacity(uuid)
        if cap is None:
            could += 1  # no sample yet: it cannot be judged
            continue
        usable = cap.usable_mib
        if mib > usable:
            continue  # never fits there at all: not this rule
        if cap.fits(need_now):
            could += 1  # fits now beside the requester's leases
            continue
        if chain is None:
            chain = lineage(requester)
        own = [
            x
            for h in chain
            for x in lessor.held_on(h, uuid)
            if x is not resized and x.owner == owner
        ]
        booked = [max(x.granted_mib, x.observed_mib.get(uuid, 0)) for x in own]
        if mib <= usable - sum(booked):
            could += 1
            continue
        blocked.append(
            {
                "gpu_uuid": uuid,
                "total_mib": cap.total_mib,
                "headroom_mib": cap.headroom_mib,
                "usable_mib": usable,
                "own_leased_mib": sum(booked),
                "own_lease_ids": [x.lease_id for x in own],
                "offer_mib": max(0, usable - sum(booked)),
            }
        )
        leases = ", ".join(
            f"{x.lease_id} {fmt_mib(m)} MiB" for x, m in zip(own, booked, strict=True)
        )
        texts.append(f"{leases}, held by {_held_by(own, requester)}")
    if could >= gpus or not blocked:
        return
    raise _refusal(mib, gpus, could, len(candidates), blocked, texts)


def _held_by(own: list[Lease], requester: Holder) -> str:
    mine = {x.holder == requester for x in own}
    if mine == {True}:
        return "this process"
    return "a parent process" if mine == {False} else "this process or a parent"


def _refusal(
    mib: int, gpus: int, could: int, of: int, blocked: list[dict[str, Any]], texts: list[str]
) -> RpcError:
    """The refusal, the GPU that would offer the most first."""
    order = sorted(range(len(blocked)), key=lambda i: -int(blocked[i]["offer_mib"]))
    blocked, texts = [blocked[i] for i in order], [texts[i] for i in order]
    what = f"{fmt_mib(mib)} MiB" + (f" on each of {gpus} GPUs" if gpus > 1 else "")
    where = " or ".join(short_uuid(b["gpu_uuid"]) for b in blocked)
    message = f"infeasible: {what} can only fit on {where} after your own leases end"
    if gpus > 1:
        message += f" (only {could} of its {of} GPUs could hold it while they stay)"
    named = len(blocked) > 1 or gpus > 1
    details = [
        (f"{short_uuid(b['gpu_uuid'])}: " if named else "")
        + f"({text}); total {fmt_mib(b['total_mib'])} − headroom {fmt_mib(b['headroom_mib'])}"
        f" − your leases {fmt_mib(b['own_leased_mib'])} = {fmt_mib(b['offer_mib'])} MiB"
        for b, text in zip(blocked, texts, strict=True)
    ]
    message += ("; " if named else " ") + "; ".join(details)
    fix = f"at most {fmt_mib(blocked[0]['offer_mib'])} MiB" if gpus == 1 else "less"
    message += f"; release or shrink them first, or ask for {fix}"
    return RpcError(
        ErrorCode.INFEASIBLE,
        message,
        reason="own_leases",
        requested_mib=mib,
        requested_gpus=gpus,
        **blocked[0],
        blocked=blocked,
    )
