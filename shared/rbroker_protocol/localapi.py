"""Parameter and result models of the local API methods (architecture.md §5).

Parameters are validated with pydantic; a validation failure becomes `invalid_params`
with the field and the bound in the message. Results are plain JSON objects whose keys
are listed in each method's docstring in `rbroker.localapi.server`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from rbroker_protocol.params import MAX_UNIX_S

MAX_MIB: int = 16 * 1024 * 1024
"""Largest MiB figure accepted anywhere (16 TiB): larger values are absurd, not infeasible."""

Mib = Annotated[int, Field(ge=1, le=MAX_MIB, strict=True)]

MAX_EXPECTED_S: float = 30 * 24 * 3600.0
"""Longest declared lease duration accepted (`AcquireParams.expected_s`), 30 days."""

BookingId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]

GpuUuid = Annotated[
    str, Field(min_length=4, max_length=96, pattern=r"^(GPU|MIG)-[A-Za-z0-9/._-]+$")
]


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class HelloParams(_Params):
    """`hello`: the client's protocol version and a free-form client name."""

    protocol_version: Annotated[int, Field(ge=0, le=1_000_000, strict=True)]
    client: Annotated[str, Field(max_length=64)] = "unknown"


class AcquireParams(_Params):
    """`lease.acquire`: ask for `mib` MiB on each of `gpus` GPUs.

    `gpu_uuid` pins the request to one GPU (then `gpus` must be 1). `wait_s=0` refuses at
    once with `capacity_unavailable` instead of queueing. `ttl_s` is the heartbeat window.
    `adopt=true` leases memory the caller's processes already hold: only the extra is checked.
    Description fields are validated again by the description rules (architecture.md §8).
    """

    mib: Mib
    gpus: Annotated[int, Field(ge=1, le=64, strict=True)] = 1
    gpu_uuid: GpuUuid | None = None
    project: str
    session: str
    purpose: str
    ttl_s: Annotated[float, Field(ge=1.0, le=3600.0)] = 30.0
    wait_s: Annotated[float, Field(ge=0.0, le=7 * 24 * 3600.0)] = 0.0
    adopt: bool = False
    placement: Literal["pack", "spread"] = "pack"
    request_key: Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z0-9_-]*$")] | None = None
    """Client-chosen id of this request: re-sending it after a reconnect (e.g. a broker
    restart) re-attaches to the queued request or the lease granted for it."""
    job_id: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    """Links the lease to a declared parallel job (one of its workers)."""
    notify_waiting: bool = False
    """While the request waits in the queue (needs `wait_s` > 0 and a `request_key`), send
    `event` notifications of kind `waiting` ({request_id, reason, reason_kind, reason_data,
    ahead, waiting_s}) on this connection each time its reason changes, so the caller can say
    what it waits for."""
    expected_s: Annotated[float, Field(gt=0.0, le=MAX_EXPECTED_S)] | None = None
    """How long the caller expects to hold the lease, seconds (its declared duration, > 0, at
    most 30 days): the queue's estimate of when a request waiting behind it fits counts on
    it ending that long after its grant, and on the history of lifetimes once that is past
    (`rbroker.broker.eta`). A hint: nothing ends the lease when it runs over."""
    booking_id: BookingId | None = None
    """Claim this booking of the caller (docs/architecture.md §2a): the lease is placed on
    the booking's GPUs, at most the booked MiB not yet claimed, ahead of the queue, from the
    memory the booking holds. Only between the booking's start and end."""


class BookParams(_Params):
    """`booking.create`: book `mib` MiB on each of `gpus` GPUs (or on the pinned `gpu_uuid`)
    for the wall-clock window [`start_at`, `end_at`), Unix seconds (UTC). Description fields
    follow the lease's rules (architecture.md §8); `session` defaults to the CLI's."""

    mib: Mib
    gpus: Annotated[int, Field(ge=1, le=64, strict=True)] = 1
    gpu_uuid: GpuUuid | None = None
    start_at: Annotated[float, Field(ge=0.0, le=MAX_UNIX_S, strict=True)]
    end_at: Annotated[float, Field(ge=0.0, le=MAX_UNIX_S, strict=True)]
    project: str
    session: str
    purpose: str


class RoomCheckParams(_Params):
    """`room.check`: whether `mib` MiB on each of `gpus` GPUs (or on the pinned `gpu_uuid`)
    would be granted to the caller now, without taking it (`rbroker watch`). `expected_s`
    as for `lease.acquire` (the bookings it would overlap)."""

    mib: Mib
    gpus: Annotated[int, Field(ge=1, le=64, strict=True)] = 1
    gpu_uuid: GpuUuid | None = None
    expected_s: Annotated[float, Field(gt=0.0, le=MAX_EXPECTED_S)] | None = None


class BookingRef(_Params):
    """`booking.cancel`: the booking to cancel (its owner's, or anyone's for an admin)."""

    booking_id: BookingId


class BookingsListParams(_Params):
    """`bookings.list`: `include_ended` adds the bookings ended, lapsed or cancelled lately."""

    include_ended: bool = False


class AttachParams(_Params):
    """`lease.attach`: re-bind a lease to this connection with the token of its grant."""

    lease_id: Annotated[str, Field(min_length=1, max_length=64)]
    token: Annotated[str, Field(min_length=1, max_length=128)]


class LeaseRef(_Params):
    """`lease.renew` / `lease.release`: which lease."""

    lease_id: Annotated[str, Field(min_length=1, max_length=64)]


class RequestRef(_Params):
    """`request.cancel`: which waiting request (its `request_id`, as `leases.list` shows it
    in the queue)."""

    request_id: Annotated[int, Field(ge=1, le=2**62, strict=True)]


class ResizeParams(_Params):
    """`lease.resize`: change a lease's grant to `mib` MiB on each of its GPUs; a growth waits
    up to `wait_s` (0: only if there is room now). `mib` is range-checked by the broker, so
    that 0, a negative or an absurd size is refused with the numbers (`invalid_params`)."""

    lease_id: Annotated[str, Field(min_length=1, max_length=64)]
    mib: Annotated[int, Field(strict=True)]
    wait_s: Annotated[float, Field(ge=0.0, le=7 * 24 * 3600.0)] = 0.0


class LeasesListParams(_Params):
    """`leases.list`: `include_ended` adds the most recent ended leases (with end reason)."""

    include_ended: bool = False


class SimAllocateParams(_Params):
    """`sim.allocate`: make the caller's pid show `mib` more MiB on a simulated GPU."""

    mib: Mib
    gpu_uuid: GpuUuid | None = None


class SimFreeParams(_Params):
    """`sim.free`: undo `mib` MiB (all of the caller's, when omitted) on a simulated GPU."""

    mib: Mib | None = None
    gpu_uuid: GpuUuid | None = None


class PauseParams(_Params):
    """`broker.pause`: pause (true) or resume (false) new admissions."""

    model_config = ConfigDict(strict=True)

    paused: bool


class AuditListParams(_Params):
    """`audit.list` (administrators): the newest `limit` entries of the broker's audit trail,
    those with `seq` below `before_seq` when given (to page back)."""

    limit: Annotated[int, Field(ge=1, le=10_000, strict=True)] = 200
    before_seq: Annotated[int, Field(ge=1, strict=True)] | None = None


class EmptyParams(_Params):
    """Methods without parameters."""


class SimSetParams(_Params):
    """`sim.set`: change a simulated GPU's state (scenario fields of architecture.md §6)."""

    gpu_uuid: GpuUuid
    total_mib: Mib | None = None
    reserved_mib: Annotated[int, Field(ge=0, le=MAX_MIB, strict=True)] | None = None
    used_mib: Annotated[int, Field(ge=0, le=MAX_MIB, strict=True)] | None = None
    device_used_mib: Annotated[int, Field(ge=0, le=MAX_MIB, strict=True)] | None = None
    memory_api: Literal["v2", "v1", "not_supported"] | None = None
    per_process_memory: bool | None = None
    error: (
        Literal["", "gpu_lost", "unknown", "version_mismatch", "no_permission", "not_supported"]
        | None
    ) = None
    process_list_error: Literal["", "no_permission", "not_supported"] | None = None
    utilization_error: Literal["", "no_permission", "not_supported"] | None = None
    """What the GPU's per-process utilization query raises ("" for none)."""
    process_utilization: (
        Annotated[
            dict[
                Annotated[int, Field(ge=1, le=2**32 - 2)],
                Annotated[int, Field(ge=0, le=100, strict=True)],
            ],
            Field(max_length=64),
        ]
        | None
    ) = None
    """pid → SM utilization in percent that the GPU's per-process utilization reports from
    now on (0: not busy); JSON keys are the pids in decimal."""
    delay_s: Annotated[float, Field(ge=0.0, le=3600.0)] | None = None


class SimStallParams(_Params):
    """`sim.stall`: block the broker's event loop for `seconds` (tests of stall grace)."""

    seconds: Annotated[float, Field(gt=0.0, le=300.0)]


JobState = Literal["queued", "running", "succeeded", "failed", "cancelled", "stalled"]
Count = Annotated[int, Field(ge=0, le=10**12, strict=True)]


class JobDeclareParams(_Params):
    """`job.declare`: a parallel job (architecture.md §4). `handler` is the registered name of the
    function that processes chunks (e.g. `embed.encode_batch`); `workers` the allocated
    worker count; `total_items` optional."""

    project: str
    purpose: str
    handler: str
    total_items: Count | None = None
    workers: Annotated[int, Field(ge=1, le=100_000, strict=True)] = 1


class JobUpdateParams(_Params):
    """`job.update`: change state (running / succeeded / failed / cancelled; failed and
    cancelled need a `reason`) or the allocated `workers`."""

    job_id: Annotated[str, Field(min_length=1, max_length=64)]
    state: Literal["running", "succeeded", "failed", "cancelled"] | None = None
    reason: str | None = None
    workers: Annotated[int, Field(ge=1, le=100_000, strict=True)] | None = None


class JobReportParams(_Params):
    """`job.report`: a chunk's result counts; idempotent by `chunk_id`."""

    job_id: Annotated[str, Field(min_length=1, max_length=64)]
    chunk_id: Annotated[str, Field(min_length=1, max_length=128)]
    completed: Count = 0
    failed: Count = 0


class JobsListParams(_Params):
    """`jobs.list`: `include_finished` adds succeeded/failed/cancelled jobs."""

    include_finished: bool = True
