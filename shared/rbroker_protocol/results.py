"""The results of the local API's methods (architecture.md §5), as plain `TypedDict`s.

The broker builds them and the client (`rbroker.client.local`, the SDK) reads them, both
against these types, so a key added on one side is added here first. Stdlib only: `import
rbroker` loads no pydantic. On the wire they are JSON objects with exactly these keys, in
the order the broker writes them. MiB figures are integers, times are seconds (`*_at`: Unix
time, wall clock; `*_s`: durations).
"""

from typing import Any, NotRequired, Required, TypedDict

# -- records ---------------------------------------------------------------------------------


class LeaseView(TypedDict):
    """A lease (architecture.md §3), without its pid; the token travels beside it only to
    its holder (`AcquireResult`, `AttachResult`)."""

    lease_id: str
    gpu_uuid: str
    """The first granted GPU (for single-GPU leases, the only one)."""
    gpu_uuids: list[str]
    granted_mib: int
    """MiB granted on each GPU."""
    owner: str
    project: str
    session: str
    purpose: str
    state: str
    """`active`, `released`, `expired`, `holder_exited` or `revoked`."""
    granted_at: float
    renewed_at: float
    ttl_s: float
    expires_in_s: float
    waited_s: float
    observed_mib: dict[str, int]
    """MiB attributed to the lease's processes, per GPU UUID."""
    over_grant: bool
    over_grant_mib: int
    over_grant_noticed: bool
    adopt: bool
    admission: dict[str, Any]
    """The figures the admission decided on."""
    ended_reason: str
    ended_at: float
    restored: bool
    job_id: str | None
    expected_s: NotRequired[float | None]
    """How long its holder declared it would hold it, seconds (`AcquireParams.expected_s`);
    None when not declared. Absent from older brokers."""
    booking_id: NotRequired[str | None]
    """The booking it claims (`AcquireParams.booking_id`), None for none. Absent from older
    brokers."""
    idle_state: NotRequired[str]
    """`active`, `idle` or `unknown` (architecture.md §3, "Idle"): idle once its holders showed
    no GPU utilization and its job no progress for the broker's `idle_after_s`; unknown where
    utilization cannot be read (never idle then). In listed leases only; absent from older
    brokers."""
    idle_s: NotRequired[float | None]
    """Seconds since its last measured activity (None when `idle_state` is `unknown`)."""


class ListedLease(LeaseView):
    """An active lease as `leases.list` shows it: with its GPUs' telemetry states and flags
    (`gpu_<state>` per GPU not `ok`, `over_grant`)."""

    gpu_telemetry: dict[str, str]
    flags: list[str]


class QueuedRequest(TypedDict):
    """A waiting `lease.acquire` (or the growth of a `lease.resize`), with its reason and
    how many requests are ahead of it."""

    request_id: int
    state: str
    """Always `queued`."""
    mib: int
    gpus: int
    gpu_uuid: str | None
    """The GPU it is pinned to, if any."""
    owner: str
    project: str
    session: str
    purpose: str
    waiting_s: float
    ahead: int
    reason: str
    reason_kind: str
    """`sampling`, `capacity` or `telemetry`."""
    reason_data: dict[str, Any]
    resize_of: str | None
    """The lease whose growth this is."""
    eta_s: NotRequired[float | None]
    """When it will likely be granted, in seconds from now (`rbroker.broker.eta`); None when
    the broker cannot say (then `eta_reason` says why). Absent from older brokers."""
    eta_reason: NotRequired[str]
    """What the estimate rests on (the leases it waits for), or why there is none."""


class GpuView(TypedDict):
    """One GPU (or MIG slice) with the capacity split of architecture.md §2. The capacity
    figures are absent while the GPU's capacity is unknown."""

    uuid: str
    index: int
    name: str
    telemetry: str
    """`ok`, `stale`, `unavailable`, `lost` or `unknown_capacity`."""
    telemetry_reason: str
    sample_age_s: float | None
    memory_api: str | None
    leases: int
    granted_mib: int
    leased_in_use_mib: int
    waiting: int
    total_mib: NotRequired[int]
    headroom_mib: NotRequired[int]
    device_used_mib: NotRequired[int]
    outstanding_mib: NotRequired[int]
    available_mib: NotRequired[int]
    other_in_use_mib: NotRequired[int]
    """`device_used_mib` less the leases' observed use: processes without a lease here, and
    what lease holders hold outside their leases (`held_outside_mib`)."""
    held_outside_mib: NotRequired[int]
    """The part of `other_in_use_mib` that holders of active leases here hold outside them:
    memory held before their grant (a sample that began before a grant counts what it shows
    of the new holder as held before it, docs/architecture.md §2 "Attribution before a
    grant") or kept after one of their leases ended. Absent from older brokers."""
    booked_mib: NotRequired[int]
    """What bookings hold back from a request that declares no end, now: the peak of those
    starting within the protection window (docs/architecture.md §2a); such a request gets
    at most `available_mib` − `booked_mib`. Absent from older brokers."""
    booked_within_s: NotRequired[float]
    """That window, seconds (`[bookings] protect_s`)."""


class JobRecord(TypedDict):
    """A declared job (architecture.md §4) as the broker keeps it."""

    job_id: str
    owner: str
    project: str
    purpose: str
    handler: str
    total_items: int | None
    workers: int
    state: str
    """`queued`, `running`, `succeeded`, `failed`, `cancelled` or `stalled`."""
    reason: str
    completed_items: int
    failed_items: int
    chunks_reported: int
    declared_at: float
    first_report_at: float | None
    last_report_at: float | None
    finished_at: float | None


class JobView(JobRecord):
    """A job as the local API shows it: its live leases, the observed rate (items/s) and
    the ETA (s), None while unknown."""

    lease_ids: list[str]
    items_per_s: float | None
    eta_s: float | None


class NvmlProblem(TypedDict):
    """Why NVML is not usable, in words, and whether an NVIDIA device is present."""

    reason: str
    words: str
    device_present: bool | None


# -- results, one per method -----------------------------------------------------------------


class HelloResult(TypedDict):
    """`hello`: the protocol version both sides speak and who the broker takes you for."""

    protocol_version: int
    broker_version: str
    simulated: bool
    telemetry_source: str
    owner: str


class GpusListResult(TypedDict):
    """`gpus.list`, by index."""

    gpus: list[GpuView]


class GrantedGpu(TypedDict):
    """One GPU of a granted lease, in the lease's order: what the SDK sets frameworks up
    with, so that a grant takes one round trip (no `gpus.list` after it)."""

    uuid: str
    index: int
    """NVML's index (a MIG slice: its parent GPU's)."""
    total_mib: int | None
    """NVML's total memory, MiB; None while the GPU's capacity is unknown."""
    memory_api: str | None
    """How its memory was read: `v2`, `v1`, `override` (a configured total), None before
    the first sample."""


class AcquireResult(TypedDict):
    """`lease.acquire`, granted: the lease, the token that re-attaches it and a value for
    `CUDA_VISIBLE_DEVICES` (the granted UUIDs, comma separated); `gpus`, the granted GPUs
    (`GrantedGpu`), and `cuda_indices`, their NVML indices when these name the same GPUs to
    CUDA under `CUDA_DEVICE_ORDER=PCI_BUS_ID` (None when they may not:
    `rbroker.base.cuda.cuda_indices`). Both are absent from older brokers (fields are only
    added: `rbroker_protocol.versions`)."""

    lease: LeaseView
    token: str
    cuda_visible_devices: str
    gpus: NotRequired[list[GrantedGpu]]
    cuda_indices: NotRequired[list[int] | None]


class LeaseResult(TypedDict):
    """`lease.renew`, `lease.release`, `lease.resize`: the lease as it is now."""

    lease: LeaseView


class AttachResult(TypedDict):
    """`lease.attach`: the lease and its new token."""

    lease: LeaseView
    token: str


class CancelResult(TypedDict):
    """`request.cancel`: the cancelled request (`ahead` 0: it is no longer queued)."""

    request: QueuedRequest


class LeasesListResult(TypedDict):
    """`leases.list`: active leases and the queue; `ended` (the latest ended leases) only
    when asked with `include_ended`. Each list holds the asker's own entries and at most
    2 000 of other users' (the largest leases; the head of the queue); `leases_left_out`
    and `queue_left_out` count the others not listed (absent: none)."""

    leases: list[ListedLease]
    queue: list[QueuedRequest]
    ended: NotRequired[list[LeaseView]]
    leases_left_out: NotRequired[int]
    queue_left_out: NotRequired[int]


class BookingView(TypedDict):
    """A booking (docs/architecture.md §2a): `mib` on each of `gpu_uuids` for the wall-clock
    window [`start_at`, `end_at`) (Unix seconds, UTC; shown in the viewer's zone)."""

    booking_id: str
    owner: str
    project: str
    session: str
    purpose: str
    mib: int
    """MiB booked on each GPU."""
    gpu_uuids: list[str]
    start_at: float
    end_at: float
    created_at: float
    state: str
    """`booked` (before its start), `held` (started, its memory held for a claim),
    `claimed` (a lease of its owner holds it), `ended`, `lapsed` (not claimed within the
    claim grace), `cancelled`."""
    claims: list[str]
    """The ids of the live leases that claim it."""
    claimed_mib: int
    """MiB of it that those leases hold, on each GPU."""
    claim_until: float | None
    """While `held`: Unix time (wall) it lapses at unless claimed; None otherwise."""
    ended_reason: str
    ended_at: float


class BookResult(TypedDict):
    """`booking.create`: the booking accepted."""

    booking: BookingView


class BookingResult(TypedDict):
    """`booking.cancel`: the booking as it is now."""

    booking: BookingView


class BookingsListResult(TypedDict):
    """`bookings.list`: the asker's bookings first, then everyone's, each by start;
    `now_at` is the broker's wall clock (Unix seconds); `usable_mib`, each GPU's total −
    headroom by UUID (what bookings may take at any instant), for timelines;
    `others_left_out`: how many of other users' bookings were not listed (absent: none)."""

    bookings: list[BookingView]
    now_at: float
    usable_mib: dict[str, int]
    others_left_out: NotRequired[int]


class RoomGpu(TypedDict):
    """A GPU a `room.check` would be placed on, with what it has available for that request
    (beside the bookings it would overlap), MiB."""

    uuid: str
    index: int
    available_mib: int


class RoomCheckResult(TypedDict):
    """`room.check`: `fits` when a `lease.acquire` of these figures would be granted now
    (nothing is taken); `gpus`, the GPUs it would get (empty when it does not fit);
    `reason`, `reason_kind` and `reason_data`, what a request would wait for, as a queue
    entry says it (`reason` empty when it fits)."""

    fits: bool
    gpus: list[RoomGpu]
    reason: str
    reason_kind: str
    reason_data: dict[str, Any]


class ShareView(TypedDict):
    """One project's share of the broker (`[shares]` in the broker's config file) and its
    use now."""

    project: str
    """The project, or `*` for every project the config does not name."""
    weight: float
    share: float
    """Its weight over the weights of the projects holding or asking now (0..1)."""
    granted_mib: int
    """MiB granted to its active leases now, summed over their GPUs."""
    waiting: int
    """Its requests waiting now."""


class CoordinatorLink(TypedDict, total=False):
    """`broker.status`'s `coordinator`: the uplink's state. `link` is always there: `ok`,
    `not enrolled`, `retrying: …`, `rejected: …`, `config error: …`, `key unavailable: …`,
    `error: …`; the rest once the broker is enrolled."""

    link: Required[str]
    last_report_at: float | None
    """When a report was last delivered (seconds since the epoch)."""
    url: str
    computer_id: str
    group: str
    reports_sent: int
    detail: str
    """More on the link's state (e.g. what a report left out to fit its size limit)."""
    left_out: dict[str, int]
    """What the last report left out to fit, by kind: how many."""
    key: str
    """Where the computer's private key lives."""
    warning: str
    """A problem the link's state alone does not say (a plaintext keyring), with the fix."""


class BrokerStatus(TypedDict):
    """`broker.status`."""

    version: str
    uptime_s: float
    started_at: float
    telemetry_source: str
    simulated: bool
    driver_version: str
    nvml_problem: NvmlProblem | None
    gpus: dict[str, str]
    """Each GPU's telemetry state, by UUID."""
    active_leases: int
    queued_requests: int
    leases_granted_total: int
    paused: bool
    coordinator: CoordinatorLink
    """The uplink's state (`CoordinatorLink`)."""
    socket: str
    event_loop: str | None
    """`uvloop` or `asyncio`."""
    shares: NotRequired[list[ShareView]]
    """With `[shares]` set: each project's share and use, the named projects first and
    any other holding or asking now; absent without `[shares]` (and from older brokers)."""


class JobResult(TypedDict):
    """`job.declare`, `job.update`: the job as it is now."""

    job: JobView


class JobReportResult(TypedDict):
    """`job.report`: the job, and whether the chunk was a duplicate (acknowledged, not
    counted again)."""

    job: JobView
    duplicate: bool


class JobsListResult(TypedDict):
    """`jobs.list`, newest last: every job of the asking OS user and the newest 2 000 of
    other users (`others_left_out`: how many older ones were not listed); finished jobs are
    kept per OS user, the newest `finished_kept_per_user`, and `finished_dropped` older ones
    were dropped since the broker started."""

    jobs: list[JobView]
    others_left_out: NotRequired[int]
    finished_kept_per_user: NotRequired[int]
    finished_dropped: NotRequired[int]


class PauseResult(TypedDict):
    """`broker.pause`: whether new admissions are paused now."""

    paused: bool


class AuditTarget(TypedDict):
    """What an audited action touched ("" where not known): its owner (OS user), project,
    kind (`lease`, `request`, `booking`, `job`, `broker`, `audit`) and id."""

    owner: str
    project: str
    kind: str
    id: str


class AuditEntry(TypedDict):
    """One line of the broker's audit trail (architecture.md §3, "Audit trail")."""

    seq: int
    """From 1, one more per entry."""
    at: float
    actor: str
    """The OS user who acted; `broker` for the broker itself."""
    action: str
    """`lease_revoked`, `lease_reclaimed`, `request_cancelled`, `booking_cancelled`,
    `admissions_paused`, `admissions_resumed`, `member_refused` or `chain_broken`."""
    target: AuditTarget
    reason: str
    prev: str
    """SHA-256 (hex) of the line before it: the hash chain."""


class AuditListResult(TypedDict):
    """`audit.list`: entries oldest first; `verified` false when the record kept does not
    verify, `problem` then says where (else null)."""

    entries: list[AuditEntry]
    verified: bool
    problem: str | None


class SubscribeResult(TypedDict):
    """`events.subscribe`: always `{"subscribed": true}`; events follow as notifications."""

    subscribed: bool


class SimMemoryResult(TypedDict):
    """`sim.allocate`, `sim.free`: the GPU and the caller's simulated MiB on it now."""

    gpu_uuid: str
    pid_mib: int


class SimSetResult(TypedDict):
    """`sim.set`: the GPU's UUID and the scenario fields changed."""

    gpu: dict[str, Any]


class SimStallResult(TypedDict):
    """`sim.stall`: how long the event loop was blocked."""

    stalled_s: float


__all__ = [
    "AcquireResult",
    "AttachResult",
    "AuditEntry",
    "AuditListResult",
    "AuditTarget",
    "BrokerStatus",
    "CancelResult",
    "GpuView",
    "GpusListResult",
    "HelloResult",
    "JobRecord",
    "JobReportResult",
    "JobResult",
    "JobView",
    "JobsListResult",
    "LeaseResult",
    "LeaseView",
    "LeasesListResult",
    "ListedLease",
    "NvmlProblem",
    "PauseResult",
    "QueuedRequest",
    "SimMemoryResult",
    "SimSetResult",
    "SimStallResult",
    "SubscribeResult",
]
