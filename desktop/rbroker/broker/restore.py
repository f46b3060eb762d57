"""Restore after a restart: bring back from the store the leases and waiting requests whose
holder processes are still alive (same pid and start time), and end the others with the
reason (docs/architecture.md §3).

A restored waiter has no connection yet: its client must come back (re-send its request key)
within `reattach_grace_s`, or the wait ends. A restored lease's holder must re-attach with its
token within `lease_reattach_grace_s` (seconds, not the TTL), or the lease ends even if the
holder process lives on: a holder that left its lease while the broker was down must not
keep memory booked for a whole TTL.

Holder start times are stored as `rbroker.base.proctime` reads them, with what they mean
(`holder_clock`, in the store's meta table): on Linux seconds since boot, with the boot's id.
Figures of another boot belong to processes that no longer exist (a pid and start ticks
repeat across boots, so they are never compared); a store written before the meta key
existed holds Unix start times (psutil's), which are brought to since-boot figures once. A
restored waiter's remaining wait is measured on the boot clock, never on the wall clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import psutil

from rbroker.base.proctime import CLK_TCK, holder_clock
from rbroker.broker.clock import Clock
from rbroker.broker.config import BrokerConfig
from rbroker.broker.holders import Holder
from rbroker.broker.jobs import JobTable
from rbroker.broker.leases import Lease, LeaseState, Waiter, declared_s
from rbroker.broker.lessor import Lessor
from rbroker.broker.members import Members
from rbroker.broker.store import STORAGE_ERRORS, LeaseStore
from rbroker.broker.waiting import WaitQueue, new_future

#: A stored start time → the one to compare with live processes; None: that process is gone.
StartTranslation = Callable[[float], float | None]

log = logging.getLogger(__name__)


def restore(
    store: LeaseStore,
    lessor: Lessor,
    waiting: WaitQueue,
    jobs: JobTable,
    clock: Clock,
    config: BrokerConfig,
    members: Members | None = None,
) -> None:
    """Fill `lessor` and `waiting` from `store` (GPUs must be enumerated and sampled first).

    Unreadable lease records are ended as `revoked`; leases of dead holders end as
    `holder_exited` ("holder exited while the broker was down"); waiters of dead holders,
    past their wait, or with too few of their GPUs left are dropped, and so are waiters whose
    owner is no longer a member of their project (`members`: `[members]` of the config the
    broker starts with may have changed since the request was queued; a restored waiter is
    granted before its client comes back, so it is checked here, by the lists alone: an
    administrator who is not listed re-sends the request and queues anew). Restored leases
    are kept whatever the lists say: they were granted under the lists of their time.
    """
    now, wall, boot = clock.monotonic(), clock.wall(), clock.boottime()
    translate = _start_translation(store.meta("holder_clock"), holder_clock())
    try:
        store.set_meta("holder_clock", holder_clock())
    except STORAGE_ERRORS as exc:  # a full disk: written at the next start
        log.warning("the store's holder clock not written: %s", exc)
    baselines = store.baselines()  # before the leases' own (older) figures are set
    for stored in store.active_leases():
        try:
            start = translate(float(stored.record["holder_start"]))
            record = {**stored.record, "holder_start": -1.0 if start is None else start}
            lease = Lease.from_record(record, now + float(stored.record["ttl_s"]), wall)
        except (KeyError, TypeError, ValueError, AttributeError):
            log.error("lease %s: unreadable record, dropped", stored.lease_id)
            store.end_lease_soon(stored.lease_id, LeaseState.REVOKED.value, wall, stored.record)
            continue
        if start is None or not lease.holder.alive():
            lease.state = LeaseState.HOLDER_EXITED
            lease.ended_reason = "holder exited while the broker was down"
            lease.ended_at_wall = wall
            store.end_lease_soon(lease.lease_id, lease.state.value, wall, lease.to_record())
            lessor.ended.append(lease)
            log.info("lease %s not restored: %s", lease.lease_id, lease.ended_reason)
            continue
        lease.reattach_by = now + config.lease_reattach_grace_s
        # Its age for the queue's estimates and the lifetimes history: from the grant's wall
        # time, since its monotonic grant time did not survive the restart. The rule is that
        # expiry and liveness run on the monotonic (or boot) clock, never the wall clock
        # (docs/architecture.md §3, Renewal and Persistence); an estimate is neither, only a
        # hint, so a wall clock that stepped makes one estimate less right and nothing more.
        lease.age_from = now - max(0.0, wall - lease.granted_at_wall)
        lessor.add(lease)
        lessor.token_sha256[lease.lease_id] = stored.token_sha256
        if lease.job_id is not None:
            jobs.restore_link(lease.job_id, lease.lease_id)
        for u, baseline in lease.baseline_mib.items():
            lessor.baselines[(lease.holder, u)] = baseline
        log.info("lease %s restored (holder %d alive)", lease.lease_id, lease.holder.pid)
    _restore_baselines(lessor, store, baselines, translate)
    for rec in store.waiters():
        key = rec["request_key"]
        try:
            start = translate(float(rec["holder_start"]))
            holder = Holder(int(rec["holder_pid"]), -1.0 if start is None else start)
            if "wait_until_boot" in rec:  # the same boot (else the holder is gone)
                remaining = float(rec["wait_until_boot"]) - boot
            else:  # written before `wait_until_boot` existed: only the wall clock was kept
                remaining = float(rec["wait_until_wall"]) - wall
            candidates = tuple(u for u in rec["candidates"] if u in lessor.slots)
            alive = start is not None and holder.alive()
        except (KeyError, TypeError, ValueError):
            alive, remaining, candidates = False, 0.0, ()
        if not alive or remaining <= 0 or len(candidates) < int(rec.get("gpus", 1)):
            store.delete_waiter(key)
            continue
        if members is not None and not members.is_member(str(rec["project"]), str(rec["owner"])):
            log.warning(
                "waiting request of %s for project %r not restored: %s is not in its "
                "[members] list",
                rec["owner"],
                rec["project"],
                rec["owner"],
            )
            store.delete_waiter(key)
            continue
        restored = Waiter(
            request_id=waiting.next_id(),
            asked_mib=int(rec["mib"]),
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
            enqueued_at=now - min(max(0.0, float(rec["wait_s"]) - remaining), float(rec["wait_s"])),
            deadline=now + remaining,
            wait_s=float(rec["wait_s"]),
            future=new_future(),
            request_key=key,
            wait_until_wall=float(rec.get("wait_until_wall", 0.0)),
            wait_until_boot=boot + remaining,
            reattach_by=now + config.reattach_grace_s,
            job_id=rec.get("job_id"),
            expected_s=declared_s(rec.get("expected_s")),
            booking_id=rec.get("booking_id") if isinstance(rec.get("booking_id"), str) else None,
        )
        waiting.add(restored)
        # stored again under this run's request number: a request made after the restart
        # (numbered from 1 again) must stay behind it at the next restart too
        try:
            waiting.persist(restored)
        except STORAGE_ERRORS as exc:  # a full disk: its row of the last run stays
            log.warning("waiting request %s not stored again: %s", restored.request_id, exc)
    store.flush_soon()  # the ends written above (a full disk: retried by the tick)
    for slot in lessor.slots.values():
        lessor.update_observed(slot)
    if lessor.leases or waiting.waiters:
        log.warning(
            "restored %d leases and %d waiting requests",
            len(lessor.leases),
            len(waiting.waiters),
        )


def _start_translation(stored: str | None, current: str) -> StartTranslation:
    """How to read a stored holder start time, given the store's `holder_clock` and this
    computer's now (`rbroker.base.proctime.holder_clock`): as it is (the same clock and boot);
    as gone (another boot, or another kind of figure); or, for a store from before the key
    (Unix start times; on Linux only: elsewhere those were already the OS's creation
    times), less this boot's start, rounded to /proc's clock ticks."""
    if stored == current:
        return lambda start: start
    if stored is None and current.startswith("since-boot"):
        booted = psutil.boot_time()
        return lambda start: start if start <= 0 else round((start - booted) * CLK_TCK) / CLK_TCK
    if stored is None:
        return lambda start: start
    return lambda start: None  # another boot: not even a pid-only identity carries over


def _restore_baselines(
    lessor: Lessor,
    store: LeaseStore,
    rows: list[tuple[int, float, str, int]],
    translate: StartTranslation,
) -> None:
    """Baselines as last written (`rbroker.broker.lessor.Baselines`, read before the leases were
    restored) replace the ones of the lease records, written at the grant; the rows of
    holders with no restored lease on that GPU are deleted. The pre-grant part of a
    baseline comes back as plain baseline."""
    leases_of: dict[tuple[Holder, str], list[Lease]] = {}
    for lease in lessor.leases.values():
        for u in lease.gpu_uuids:
            leases_of.setdefault((lease.holder, u), []).append(lease)
    for pid, stored_start, uuid, mib in rows:
        start = translate(stored_start)
        key = (Holder(pid, -1.0 if start is None else start), uuid)
        if key in leases_of:
            lessor.baselines[key] = mib
            for lease in leases_of[key]:
                lease.baseline_mib[uuid] = mib
            if start != stored_start:  # a figure brought to since-boot: stored anew
                store.put_baseline(pid, stored_start, uuid, 0)
                store.put_baseline(pid, key[0].start_time, uuid, mib)
        else:
            store.put_baseline(pid, stored_start, uuid, 0)
