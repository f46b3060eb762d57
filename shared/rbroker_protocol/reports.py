"""The report payload a broker sends to the coordinator (architecture.md §7, privacy rules of §8).

A report is a state snapshot of one computer: its GPUs with the capacity split of §2, the
active leases, the queue, the live bookings and the declared jobs with cumulative counts.
Field names follow the broker's `gpus_view()` / `leases_view()`. It never carries pids,
command lines, environment variables, process names or job inputs: unknown fields are
dropped on parse, so nothing outside this schema is ever stored. Fields are only ever
added; `REPORT_VERSION` is bumped when they are.

History:
    1 (2026-11-30): computer name, broker version, telemetry source, run id, generated_at,
                    gpus, leases, queue, jobs.
    2 (2026-11-30): run_counter (the order of a computer's runs).
    3: left_out (per list, how many entries a trimmed report left out).
    4: queue entries' eta_s and eta_reason (when the request will likely be granted).
    5: leases' expected_s (the holder's declared duration).
    6: bookings (the live bookings, §2a: at most `MAX_BOOKINGS`, the nearest first) and
       bookings_left_out.
    7: leases' idle_state and idle_s (whether the lease's holders are using it, §3 "Idle").

Identifiers (GPU UUIDs, lease, booking and job ids, run id) must match `GPU_UUID_PATTERN`
or `ID_PATTERN`, and state fields are enumerations (`TelemetryStateName`, `LeaseStateName`,
`JobStateName`, `BookingStateName`): a report breaking either does not fit the schema. What
remains free text (`TEXT_FIELDS`: the declared descriptions, the GPU name, broker version
and telemetry source) and every identifier pass the description rules (§8) on the
coordinator, which stores a value that breaks one redacted and flags it.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

REPORT_VERSION: Final = 7
"""The payload version this build writes."""

MAX_REPORT_BYTES: Final = 1024 * 1024
"""Largest report body the coordinator accepts (the whole envelope), 1 MiB."""

ID_PATTERN: Final = r"^[A-Za-z0-9_.:-]{1,64}$"
"""A lease, booking, job or run id: the broker's `lease-<hex>` / `book-<hex>` / `job-<hex>` /
hex run ids, or a job
id its declarer chose (`job.declare` checks the same pattern): 1-64 characters of
`[A-Za-z0-9_.:-]`, as the envelope's ids (`rbroker_protocol.signing`)."""

GPU_UUID_PATTERN: Final = r"^(GPU|MIG)-[A-Za-z0-9][A-Za-z0-9_./:-]{0,123}$"
"""An NVML UUID: `GPU-<uuid>`, `MIG-<uuid>` or `MIG-GPU-<uuid>/<gi>/<ci>` (simulated GPUs
follow the same prefixes)."""

TelemetryStateName = Literal["ok", "stale", "unavailable", "lost", "unknown_capacity"]
"""A GPU's telemetry state (architecture.md §2)."""

LeaseStateName = Literal["queued", "active", "released", "expired", "holder_exited", "revoked"]
"""A lease's state (architecture.md §3)."""

JobStateName = Literal["queued", "running", "succeeded", "failed", "cancelled", "stalled"]
"""A job's state (architecture.md §4)."""

BookingStateName = Literal["booked", "held", "claimed", "ended", "lapsed", "cancelled"]
"""A booking's state (architecture.md §2a); a report carries the live ones (`booked`, `held`,
`claimed`), the others are here so a later broker's report still parses."""

MAX_BOOKINGS: Final = 1000
"""The most bookings one report carries: the nearest (by start) first."""

_ID = Annotated[str, Field(pattern=ID_PATTERN)]
_GPU_UUID = Annotated[str, Field(pattern=GPU_UUID_PATTERN)]
_MIB = Annotated[int, Field(ge=0, le=2**40)]
_TEXT = Annotated[str, Field(max_length=4096)]
"""Declared text: loose bounds here; the description rules (§8) run on both sides."""
_NAME = Annotated[str, Field(max_length=256)]
_COUNT = Annotated[int, Field(ge=0, le=2**53)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class GpuReport(_Model):
    """One GPU (or MIG slice), keyed by UUID; MiB figures are None when unknown."""

    uuid: _GPU_UUID
    index: Annotated[int, Field(ge=0, le=1024)]
    name: _NAME = ""
    telemetry: TelemetryStateName = "ok"
    total_mib: _MIB | None = None
    headroom_mib: _MIB | None = None
    device_used_mib: _MIB | None = None
    outstanding_mib: _MIB | None = None
    available_mib: _MIB | None = None
    leased_in_use_mib: _MIB | None = None
    other_in_use_mib: _MIB | None = None


class LeaseReport(_Model):
    """An active lease (architecture.md §3), without token or holder pid."""

    lease_id: _ID
    gpu_uuids: Annotated[list[_GPU_UUID], Field(max_length=64)]
    granted_mib: _MIB
    owner: _TEXT = ""
    project: _TEXT = ""
    session: _TEXT = ""
    purpose: _TEXT = ""
    state: LeaseStateName = "active"
    granted_at: float | None = None
    """Computer wall clock, Unix seconds (display only)."""
    expires_in_s: float | None = None
    observed_mib: dict[_GPU_UUID, _MIB] = Field(default_factory=dict, max_length=64)
    """MiB attributed to the lease's processes, per GPU UUID."""
    over_grant: bool = False
    expected_s: Annotated[float, Field(gt=0, le=10 * 365 * 86400)] | None = None
    """How long its holder declared it would hold it, seconds (None: not declared, or a
    broker before report version 5)."""
    idle_state: Literal["active", "idle", "unknown"] = "unknown"
    """`active`, `idle` (no GPU utilization by its holders and no job progress for the
    broker's `idle_after_s`) or `unknown` (not measured, or a broker before report
    version 7)."""
    idle_s: Annotated[float, Field(ge=0, le=10 * 365 * 86400)] | None = None
    """Seconds since its last measured activity (None when `idle_state` is `unknown`)."""


class QueueEntry(_Model):
    """A waiting request with its human-readable reason."""

    mib: _MIB
    gpus: Annotated[int, Field(ge=1, le=64)] = 1
    owner: _TEXT = ""
    project: _TEXT = ""
    session: _TEXT = ""
    purpose: _TEXT = ""
    waiting_s: Annotated[float, Field(ge=0)] = 0.0
    reason: _TEXT = ""
    eta_s: Annotated[float, Field(ge=0, le=10 * 365 * 86400)] | None = None
    """When it will likely be granted, seconds from the report (None: no estimate, or a
    broker before report version 4)."""
    eta_reason: _TEXT = ""
    """What the estimate rests on, or why there is none (free text, §8's rules)."""


class BookingReport(_Model):
    """A live booking (architecture.md §2a): `mib` MiB on each of `gpu_uuids` for the
    wall-clock window [`start_at`, `end_at`), with the declared descriptions of a lease and
    nothing else (no claim ids, no account)."""

    booking_id: _ID
    gpu_uuids: Annotated[list[_GPU_UUID], Field(max_length=64)]
    mib: _MIB
    """MiB booked on each GPU."""
    start_at: float
    """Computer wall clock, Unix seconds (UTC)."""
    end_at: float
    """Computer wall clock, Unix seconds (UTC), after `start_at`."""
    owner: _TEXT = ""
    project: _TEXT = ""
    session: _TEXT = ""
    purpose: _TEXT = ""
    state: BookingStateName = "booked"
    claimed_mib: _MIB = 0
    """MiB of it the leases claiming it hold, on each GPU; it protects `mib - claimed_mib`
    while it is live."""


class JobSnapshot(_Model):
    """A declared job's cumulative progress (architecture.md §4)."""

    job_id: _ID
    project: _TEXT = ""
    purpose: _TEXT = ""
    handler: _TEXT = ""
    state: JobStateName = "running"
    workers: _COUNT = 0
    total_items: _COUNT | None = None
    completed_items: _COUNT = 0
    failed_items: _COUNT = 0


class ReportPayload(_Model):
    """The signed payload of one report."""

    report_version: Annotated[int, Field(ge=1)] = REPORT_VERSION
    computer_name: Annotated[str, Field(min_length=1, max_length=128)]
    broker_version: Annotated[str, Field(max_length=64)] = ""
    telemetry_source: Annotated[str, Field(max_length=32)] = ""
    """`nvml` or `simulated` (architecture.md §6)."""
    run_id: _ID
    run_counter: _COUNT | None = None
    """The order of this run among the computer's runs: a counter kept in the broker's data
    dir, raised for every new run (each broker start). The coordinator never lets a run
    with a lower counter replace the current one (`run_outdated`). None from brokers
    before report version 2: such runs are ordered by arrival, as before."""
    generated_at: float
    """The computer's wall clock, Unix seconds. The coordinator never uses it for freshness."""
    stopping: bool = False
    """The broker is stopping (its last report): the coordinator shows the computer offline
    ("stopped") at once instead of stale for minutes, with these last known values, until
    a report of a new run arrives."""
    gpus: Annotated[list[GpuReport], Field(max_length=256)] = Field(default_factory=list)
    leases: Annotated[list[LeaseReport], Field(max_length=4096)] = Field(default_factory=list)
    queue: Annotated[list[QueueEntry], Field(max_length=4096)] = Field(default_factory=list)
    jobs: Annotated[list[JobSnapshot], Field(max_length=4096)] = Field(default_factory=list)
    bookings: Annotated[list[BookingReport], Field(max_length=MAX_BOOKINGS)] = Field(
        default_factory=list
    )
    """The live bookings, by start (report version 6; empty from older brokers)."""
    bookings_left_out: _COUNT = 0
    """How many live bookings this report left out (the furthest first) to fit
    `MAX_BOOKINGS` or the size limit; apart from `left_out`, whose keys older
    coordinators check."""
    left_out: dict[Literal["leases", "queue", "jobs"], _COUNT] = Field(default_factory=dict)
    """Per list, how many of the computer's entries this report left out to fit its limits
    (each list is trimmed fairly: round-robin by owner, each owner's newest first); absent
    lists left nothing out."""

    def to_bytes(self) -> bytes:
        """The exact JSON bytes to sign and send."""
        return self.model_dump_json().encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ReportPayload:
        """Parse verified payload bytes.

        Raises:
            pydantic.ValidationError: not a valid payload.
        """
        return cls.model_validate_json(data)


DESCRIPTION_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "leases": ("owner", "project", "session", "purpose"),
    "queue": ("owner", "project", "session", "purpose", "reason", "eta_reason"),
    "jobs": ("project", "purpose", "handler"),
    "bookings": ("owner", "project", "session", "purpose"),
}
"""Which declared-text fields of each list the description rules (§8) apply to."""

TEXT_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "gpus": ("uuid", "name"),
    "leases": ("lease_id",),
    "jobs": ("job_id",),
    "bookings": ("booking_id",),
}
"""The other text of each list the coordinator runs the description rules on: the GPU name
and every identifier (a lease's or booking's `gpu_uuids` and the keys of a lease's
`observed_mib` too), and at
the top level `broker_version` and `telemetry_source` (`computer_name` has its own rules)."""

TOP_TEXT_FIELDS: Final = ("broker_version", "telemetry_source")
"""Top-level free text the description rules run on."""


AckCode = Literal["applied", "new_run", "not_newer", "run_retired", "run_outdated", "superseded"]
"""Why a report was or was not applied (see `ReportAck`)."""


class ReportAck(_Model):
    """The coordinator's answer (HTTP 200) to an authentic report.

    `applied=false` means the report was delivered but not applied (a replay, an older seq);
    it needs no resending. `code`: `applied`; `new_run` (applied, first report of a run);
    `not_newer` (seq not above the last applied one of this run); `superseded` (a newer
    report won a race); `run_retired` (this run_id was replaced by another run: a broker
    that gets this for its live run should switch to a new run_id, which is accepted);
    `run_outdated` (a run the coordinator has not applied yet whose `run_counter` is lower
    than the current run's, e.g. an old report delivered late: not applied; a live broker
    that gets this, e.g. after its data dir was restored from a backup, continues with a
    new run whose counter is above `current_run_counter`, which is accepted).
    """

    applied: bool
    code: AckCode
    reason: str
    computer_id: str
    run_id: str
    seq: int
    current_run_counter: int | None = None
    """With `run_outdated`: the run counter of the computer's current run."""
    flagged_fields: list[str] = Field(default_factory=list)
    """Description fields that broke a rule, stored redacted (paths like
    `leases[0].purpose`; never the values)."""
