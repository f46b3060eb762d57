"""Lease and waiter records of the broker's lessor (architecture.md §3)."""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rbroker.broker.holders import Holder
from rbroker_protocol.results import LeaseView, QueuedRequest


class LeaseState(StrEnum):
    """queued → active → released | expired | holder_exited | revoked."""

    QUEUED = "queued"
    ACTIVE = "active"
    RELEASED = "released"
    EXPIRED = "expired"
    HOLDER_EXITED = "holder_exited"
    REVOKED = "revoked"


TERMINAL_STATES = frozenset(
    {LeaseState.RELEASED, LeaseState.EXPIRED, LeaseState.HOLDER_EXITED, LeaseState.REVOKED}
)


@dataclass(slots=True)
class Lease:
    """An active (or ended) lease on one or more GPUs, `granted_mib` on each.

    Times: `deadline` and `granted_at` are monotonic (`granted_at` is -inf for a restored
    lease: what a sample after the restart shows is its own); `age_from` is the monotonic
    time its age counts from, for the queue's estimates and the lifetimes history (its
    grant; for a restored lease, its grant's wall time brought to the monotonic clock);
    `*_wall` fields are Unix seconds for display.
    `observed_mib` maps GPU UUID → MiB NVML attributes to the holder's process tree for this
    lease (unknown counts 0); `over_grant` is set when that exceeds `granted_mib`, and the
    `over_*` fields follow the episode (`rbroker.broker.overgrant`).
    """

    lease_id: str
    token: str
    gpu_uuids: tuple[str, ...]
    granted_mib: int
    owner: str
    project: str
    session: str
    purpose: str
    holder: Holder
    ttl_s: float
    deadline: float
    granted_at_wall: float
    conn_id: int | None
    adopt: bool = False
    state: LeaseState = LeaseState.ACTIVE
    renewed_at_wall: float = 0.0
    waited_s: float = 0.0
    observed_mib: dict[str, int] = field(default_factory=dict)
    claimed_mib: dict[str, int] = field(default_factory=dict)
    over_grant: bool = False
    admission: dict[str, Any] = field(default_factory=dict)
    ended_reason: str = ""
    ended_at_wall: float = 0.0
    request_key: str = ""
    baseline_mib: dict[str, int] = field(default_factory=dict)
    restored: bool = False
    job_id: str | None = None
    reattach_by: float | None = None  # restored: its holder must re-attach by then (monotonic)
    over_since: float | None = None  # monotonic start of the current over-grant episode
    over_mib: int = 0  # MiB over the grant now (the worst GPU), 0 when inside it
    over_noticed: bool = False  # this episode outlasted the grace and was reported
    granted_at: float = -math.inf  # monotonic; a sample that began before it shows no use of it
    expected_s: float | None = None  # the holder's declared duration (`AcquireParams.expected_s`)
    age_from: float = -math.inf  # monotonic: its age counts from here (`rbroker.broker.restore`)
    booking_id: str | None = None  # the booking it claims (`rbroker.broker.bookings`)

    @property
    def gpu_uuid(self) -> str:
        """The first (for single-GPU leases, the only) GPU."""
        return self.gpu_uuids[0]

    def to_wire(self, now: float | None = None) -> LeaseView:
        """The JSON view of architecture.md §3 (no token, no pid: those never leave the broker
        except the token, which goes only to the holder in the acquire result)."""
        now = time.monotonic() if now is None else now
        return {
            "lease_id": self.lease_id,
            "gpu_uuid": self.gpu_uuid,
            "gpu_uuids": list(self.gpu_uuids),
            "granted_mib": self.granted_mib,
            "owner": self.owner,
            "project": self.project,
            "session": self.session,
            "purpose": self.purpose,
            "state": self.state.value,
            "granted_at": self.granted_at_wall,
            "renewed_at": self.renewed_at_wall,
            "ttl_s": self.ttl_s,
            "expires_in_s": round(max(0.0, self.deadline - now), 3)
            if self.state is LeaseState.ACTIVE
            else 0.0,
            "waited_s": round(self.waited_s, 3),
            "observed_mib": dict(self.observed_mib),
            "over_grant": self.over_grant,
            "over_grant_mib": self.over_mib,
            "over_grant_noticed": self.over_noticed,
            "adopt": self.adopt,
            "admission": self.admission,
            "ended_reason": self.ended_reason,
            "ended_at": self.ended_at_wall,
            "restored": self.restored,
            "job_id": self.job_id,
            "expected_s": self.expected_s,
            "booking_id": self.booking_id,
        }

    def to_record(self) -> dict[str, Any]:
        """Everything needed to restore the lease after a broker restart, minus the token."""
        return {
            "lease_id": self.lease_id,
            "gpu_uuids": list(self.gpu_uuids),
            "granted_mib": self.granted_mib,
            "owner": self.owner,
            "project": self.project,
            "session": self.session,
            "purpose": self.purpose,
            "holder_pid": self.holder.pid,
            "holder_start": self.holder.start_time,
            "ttl_s": self.ttl_s,
            "granted_at": self.granted_at_wall,
            "adopt": self.adopt,
            "waited_s": self.waited_s,
            "claimed_mib": self.claimed_mib,
            "baseline_mib": self.baseline_mib,
            "admission": self.admission,
            "request_key": self.request_key,
            "job_id": self.job_id,
            "expected_s": self.expected_s,
            "booking_id": self.booking_id,
            "state": self.state.value,
            "ended_reason": self.ended_reason,
        }

    @classmethod
    def granted(cls, waiter: Waiter, gpu_uuids: tuple[str, ...], now: float, wall: float) -> Lease:
        """A new lease for `waiter` on `gpu_uuids`, granted at `now` (monotonic) and `wall`
        (Unix seconds), with a fresh id and token."""
        lease = cls(
            lease_id="lease-" + secrets.token_hex(6),
            token=secrets.token_urlsafe(24),
            gpu_uuids=gpu_uuids,
            granted_mib=waiter.asked_mib,
            owner=waiter.owner,
            project=waiter.project,
            session=waiter.session,
            purpose=waiter.purpose,
            holder=waiter.holder,
            ttl_s=waiter.ttl_s,
            deadline=now + waiter.ttl_s,
            granted_at_wall=wall,
            renewed_at_wall=wall,
            conn_id=waiter.conn_id,
            adopt=waiter.adopt,
            waited_s=now - waiter.enqueued_at,
            granted_at=now,
            age_from=now,
        )
        lease.request_key = waiter.request_key
        lease.job_id = waiter.job_id
        lease.expected_s = waiter.expected_s
        lease.booking_id = waiter.booking_id
        return lease

    @classmethod
    def from_record(cls, rec: dict[str, Any], deadline: float, now_wall: float) -> Lease:
        """Rebuild a restored lease; it gets `deadline` and no connection (the holder
        re-attaches with its token). Raises KeyError/TypeError on a malformed record."""
        return cls(
            lease_id=rec["lease_id"],
            token="",
            gpu_uuids=tuple(rec["gpu_uuids"]),
            granted_mib=int(rec["granted_mib"]),
            owner=rec["owner"],
            project=rec["project"],
            session=rec["session"],
            purpose=rec["purpose"],
            holder=Holder(int(rec["holder_pid"]), float(rec["holder_start"])),
            ttl_s=float(rec["ttl_s"]),
            deadline=deadline,
            granted_at_wall=float(rec["granted_at"]),
            renewed_at_wall=now_wall,
            conn_id=None,
            adopt=bool(rec["adopt"]),
            waited_s=float(rec["waited_s"]),
            claimed_mib={k: int(v) for k, v in rec["claimed_mib"].items()},
            baseline_mib={k: int(v) for k, v in rec["baseline_mib"].items()},
            admission=dict(rec["admission"]),
            request_key=rec.get("request_key", ""),
            restored=True,
            job_id=rec.get("job_id"),
            expected_s=declared_s(rec.get("expected_s")),
            booking_id=rec.get("booking_id") if isinstance(rec.get("booking_id"), str) else None,
        )


@dataclass(slots=True, eq=False)
class Waiter:
    """A queued `lease.acquire`. `candidates` are the GPU UUIDs it may take, in order.
    Waiters compare by identity (the queue finds and removes them)."""

    request_id: int
    asked_mib: int
    """MiB asked for on each GPU: a new lease's size; for a resize's waiter (`resize_of`),
    the growth (the lease's grant plus it is the size asked for)."""
    gpus: int
    candidates: tuple[str, ...]
    pinned: bool
    owner: str
    project: str
    session: str
    purpose: str
    ttl_s: float
    adopt: bool
    placement: str
    holder: Holder
    conn_id: int | None
    enqueued_at: float
    deadline: float
    wait_s: float
    future: asyncio.Future[Lease]
    reason: str = "waiting for a fresh GPU sample"
    reason_kind: str = "sampling"  # "sampling" | "capacity" | "telemetry"
    reason_data: dict[str, Any] = field(default_factory=dict)
    evaluated: bool = False
    # monotonic time it began waiting for a sample to confirm memory released on its GPUs
    # (it waits for one such sample at most, also with wait_s 0)
    release_wait_since: float | None = None
    request_key: str = ""
    job_id: str | None = None
    # Unix time the wait ends at: still written, read back only from a record without
    # `wait_until_boot` (written before it existed); never decides a wait of this boot
    wait_until_wall: float = 0.0
    wait_until_boot: float = 0.0  # `Clock.boottime()` the wait ends at (same boot only)
    reattach_by: float | None = None  # restored after a restart: its client must come back
    resize_of: str | None = None  # the lease whose growth this is (`broker.resize`)
    expected_s: float | None = None  # its declared duration, once granted (`Lease.expected_s`)
    booking_id: str | None = None  # the booking it claims (or, for a growth, its lease's)
    booked_at: float | None = None  # a claim: when its booking was accepted (monotonic)

    def to_record(self) -> dict[str, Any]:
        """What is persisted of a waiting request (see `store.LeaseStore`)."""
        return {
            "mib": self.asked_mib,
            "gpus": self.gpus,
            "candidates": list(self.candidates),
            "pinned": self.pinned,
            "owner": self.owner,
            "project": self.project,
            "session": self.session,
            "purpose": self.purpose,
            "ttl_s": self.ttl_s,
            "adopt": self.adopt,
            "placement": self.placement,
            "holder_pid": self.holder.pid,
            "holder_start": self.holder.start_time,
            "wait_s": self.wait_s,
            "wait_until_wall": self.wait_until_wall,
            "wait_until_boot": self.wait_until_boot,
            "job_id": self.job_id,
            "expected_s": self.expected_s,
            "booking_id": self.booking_id,
        }

    def to_wire(self, now: float, ahead: int) -> QueuedRequest:
        """The JSON view of a queued request, with its reason and position."""
        return {
            "request_id": self.request_id,
            "state": LeaseState.QUEUED.value,
            "mib": self.asked_mib,
            "gpus": self.gpus,
            "gpu_uuid": self.candidates[0] if self.pinned else None,
            "owner": self.owner,
            "project": self.project,
            "session": self.session,
            "purpose": self.purpose,
            "waiting_s": round(now - self.enqueued_at, 3),
            "ahead": ahead,
            "reason": self.reason,
            "reason_kind": self.reason_kind,
            "reason_data": self.reason_data,
            "resize_of": self.resize_of,
        }


def declared_s(value: Any) -> float | None:
    """A declared duration read back from a record: seconds > 0, else None (a record written
    before durations were declared has none)."""
    return float(value) if isinstance(value, int | float) and value > 0 else None
