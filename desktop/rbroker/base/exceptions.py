"""Exceptions raised by the rbroker SDK, one per stable error code of architecture.md §5.

RBrokerError                      base: .code (stable name), .message, .data (numbers)
├── BrokerUnavailable             no broker answers on the socket / pipe
├── ProtocolVersionError          protocol_version
├── InvalidParams                 invalid_params, parse_error, invalid_request,
│   │                             request_too_large
│   ├── MethodNotFound            method_not_found (a method this broker does not have)
│   └── WaitTooLong               wait_too_long (wait_s past the broker's longest wait)
├── DescriptionRejected           description_rejected (.data["rule"], never the value)
├── CapacityUnavailable           capacity_unavailable (wait_s=0 and no room now)
│   └── WaitTimeout               wait_timeout (not granted within wait_s)
├── Infeasible                    infeasible (can never fit on this computer)
├── TelemetryUnavailable          telemetry_unavailable (GPU lost / NVML failing)
├── LeaseNotFound                 lease_not_found
├── LeaseExpired                  lease_expired
├── NotLeaseOwner                 not_lease_owner
│   └── NotJobOwner               not_job_owner (another user's job)
├── RequestNotFound               request_not_found (no such waiting request)
├── ResizePending                 resize_pending (another resize of the lease still waits)
├── NotSimulated                  not_simulated (sim.* on a real-GPU broker)
├── NotAllowed                    not_allowed (pause/simulation by another user),
│   │                             too_many_connections (per-user connection cap),
│   │                             not_a_member (a project kept to its members)
│   └── LimitReached              too_many_waiting, too_many_leases, too_many_jobs,
│                                 too_many_chunks, unsent_over_limit (a per-user cap),
│                                 too_many_in_flight (a connection's requests at once)
├── StorageUnavailable            storage_unavailable (the broker could not write its data
│                                 directory, e.g. a full disk: nothing was granted
│                                 or changed)
└── Cancelled                     cancelled

OverGrantWarning (a Warning, not an error): the broker saw a lease of this process use more
than its grant for longer than the grace (its `over_grant` event).
"""

from __future__ import annotations

import functools

from rbroker.base.lazy import is_quick

# The wire's error codes load with the first error read (`from_rpc_error`): a command that
# meets none starts without them, and without `typing` (docs/architecture.md §10); the idiom
# type checkers read as typing.TYPE_CHECKING (PEP 484's constant, never true at run time).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from rbroker_protocol.errors import ErrorCode, RpcError


class RBrokerError(Exception):
    """Base of every SDK error. `code` is the stable name; `data` carries the numbers."""

    def __init__(self, message: str, code: str = "internal_error", **data: Any) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.data = data


class BrokerUnavailable(RBrokerError):
    """No broker answers at the socket path / pipe name (or it went away mid-call)."""


class ProtocolVersionError(RBrokerError):
    """The broker does not speak this client's protocol version."""


class InvalidParams(RBrokerError):
    """The request was malformed or its parameters out of range."""


class MethodNotFound(InvalidParams):
    """The broker has no such method (JSON-RPC -32601, e.g. an older broker); `.code` is
    `method_not_found`. A kind of `InvalidParams`, so handlers of that still catch it."""


class WaitTooLong(InvalidParams):
    """`wait_s` is longer than the broker's longest wait (`data`: `wait_s`, `max_wait_s`)."""


class DescriptionRejected(RBrokerError):
    """A project/session/purpose text broke a description rule (`data["rule"]`)."""


class CapacityUnavailable(RBrokerError):
    """Not enough GPU memory available now; the message has the arithmetic."""


class WaitTimeout(CapacityUnavailable):
    """The request waited `wait_s` seconds without being granted."""


class Infeasible(RBrokerError):
    """The request can never be granted on this computer (too large, unknown GPU)."""


class TelemetryUnavailable(RBrokerError):
    """GPU telemetry is failing (lost GPU, NVML errors); the broker fails closed."""


class LeaseNotFound(RBrokerError):
    """No such lease."""


class LeaseExpired(RBrokerError):
    """The lease ended (expired, holder exited, revoked) before this call."""


class NotLeaseOwner(RBrokerError):
    """The lease belongs to another OS user."""


class NotJobOwner(NotLeaseOwner):
    """The job belongs to another OS user (a `NotLeaseOwner`, which brokers before
    `not_job_owner` answered for a job, so code catching that catches this too)."""


class RequestNotFound(RBrokerError):
    """No waiting request with that id (granted, ended or never queued)."""


class ResizePending(RBrokerError):
    """Another `resize` of the same lease is still waiting (`data`: its `pending_mib`)."""


class NotSimulated(RBrokerError):
    """A `sim.*` method was called on a broker that reads real NVML."""


class NotAllowed(RBrokerError):
    """The caller may not do this: an administrative method (`broker.pause`, `sim.set`,
    `sim.stall`) from a user other than the broker's own or its admin group, a connection
    past the per-user cap, or a project whose members list in the broker's config does not
    name this user (`not_a_member`; `data`: `project`, `user`) (`code` says which)."""


class LimitReached(NotAllowed):
    """The caller's OS user is at one of the broker's per-user caps (`code`:
    `too_many_waiting`, `too_many_leases`, `too_many_jobs`, `too_many_chunks`; `data`:
    `limit`, `count`), or
    one connection already has the most requests in flight it may (`too_many_in_flight`;
    `data`: `limit`)."""


class JobNotFound(RBrokerError):
    """No such job."""


class JobFinished(RBrokerError):
    """The job already succeeded, failed or was cancelled."""


class StorageUnavailable(RBrokerError):
    """The broker could not write what a grant, re-attach, resize or job call must keep (its
    data directory is full, read-only or failing: `data.reason`); nothing was granted or
    changed. Try again once the operator has made room."""


class BookingNotFound(RBrokerError):
    """No such booking (or one long ended and forgotten)."""


class NotBookingOwner(RBrokerError):
    """The booking belongs to another OS user: only its owner claims it, and only its
    owner or an administrator cancels it."""


class BookingRefused(RBrokerError):
    """A booking was not accepted (`code`): `booking_conflict` (it does not fit beside the
    bookings of its window; `data`: the arithmetic and `nearest_start_at`, the nearest start
    where it fits, or None), `too_many_bookings`, `booking_too_far`, `booking_too_long`
    (`data`: `limit`)."""


class BookingNotClaimable(RBrokerError):
    """A lease asked for a booking that cannot be claimed now (`code`): `booking_not_started`
    (`data.start_at`) or `booking_ended` (lapsed, cancelled or over: `data.state`)."""


class Cancelled(RBrokerError):
    """The request was cancelled (connection closed, broker stopping)."""


class OverGrantWarning(UserWarning):
    """A lease of this process used more memory than it was granted for longer than the
    broker's grace (10 s by default). rbroker never stops the work; cap the framework
    (`lease.limit_torch()`, ...) or `lease.resize()` the grant. Its own category, so
    `warnings.simplefilter("error", rbroker.OverGrantWarning)` makes it an error: then
    `lease.check()` and the end of the `with` block raise it.

    Attributes:
        data: the event's numbers: `lease_id`, `gpu_uuid`, `granted_mib`, `observed_mib`,
            `over_mib`, `over_s`, `project`, `session`.
    """

    def __init__(self, message: str, data: dict[str, Any]) -> None:
        super().__init__(message)
        self.data = data


@functools.cache
def _classes_by_code() -> dict[ErrorCode, type[RBrokerError]]:
    """The SDK exception of each stable error code (the others: `RBrokerError`), made by the
    first `from_rpc_error`."""
    from rbroker_protocol.errors import ErrorCode

    return {
        ErrorCode.PARSE_ERROR: InvalidParams,
        ErrorCode.INVALID_REQUEST: InvalidParams,
        ErrorCode.METHOD_NOT_FOUND: MethodNotFound,
        ErrorCode.INVALID_PARAMS: InvalidParams,
        ErrorCode.REQUEST_TOO_LARGE: InvalidParams,
        ErrorCode.INTERNAL_ERROR: RBrokerError,
        ErrorCode.CAPACITY_UNAVAILABLE: CapacityUnavailable,
        ErrorCode.INFEASIBLE: Infeasible,
        ErrorCode.WAIT_TIMEOUT: WaitTimeout,
        ErrorCode.LEASE_NOT_FOUND: LeaseNotFound,
        ErrorCode.LEASE_EXPIRED: LeaseExpired,
        ErrorCode.NOT_LEASE_OWNER: NotLeaseOwner,
        ErrorCode.DESCRIPTION_REJECTED: DescriptionRejected,
        ErrorCode.TELEMETRY_UNAVAILABLE: TelemetryUnavailable,
        ErrorCode.PROTOCOL_VERSION: ProtocolVersionError,
        ErrorCode.NOT_SIMULATED: NotSimulated,
        ErrorCode.CANCELLED: Cancelled,
        ErrorCode.JOB_NOT_FOUND: JobNotFound,
        ErrorCode.JOB_FINISHED: JobFinished,
        ErrorCode.NOT_JOB_OWNER: NotJobOwner,
        ErrorCode.NOT_ALLOWED: NotAllowed,
        ErrorCode.TOO_MANY_CONNECTIONS: NotAllowed,
        ErrorCode.RESIZE_PENDING: ResizePending,
        ErrorCode.WAIT_TOO_LONG: WaitTooLong,
        ErrorCode.TOO_MANY_WAITING: LimitReached,
        ErrorCode.TOO_MANY_LEASES: LimitReached,
        ErrorCode.TOO_MANY_JOBS: LimitReached,
        ErrorCode.TOO_MANY_CHUNKS: LimitReached,
        ErrorCode.UNSENT_OVER_LIMIT: LimitReached,
        ErrorCode.REQUEST_NOT_FOUND: RequestNotFound,
        ErrorCode.NOT_A_MEMBER: NotAllowed,
        ErrorCode.TOO_MANY_IN_FLIGHT: LimitReached,
        ErrorCode.STORAGE_UNAVAILABLE: StorageUnavailable,
        ErrorCode.BOOKING_NOT_FOUND: BookingNotFound,
        ErrorCode.NOT_BOOKING_OWNER: NotBookingOwner,
        ErrorCode.BOOKING_CONFLICT: BookingRefused,
        ErrorCode.TOO_MANY_BOOKINGS: BookingRefused,
        ErrorCode.BOOKING_TOO_FAR: BookingRefused,
        ErrorCode.BOOKING_TOO_LONG: BookingRefused,
        ErrorCode.BOOKING_NOT_STARTED: BookingNotClaimable,
        ErrorCode.BOOKING_ENDED: BookingNotClaimable,
    }


if not is_quick():  # a job, the tray: the codes loaded now (rbroker.base.lazy)
    _classes_by_code()


def from_rpc_error(err: RpcError) -> RBrokerError:
    """The SDK exception for a wire error (its `data`, less keys that would name the
    message or the code again: a peer that is not a broker sent them, and the exception
    was a TypeError)."""
    cls = _classes_by_code().get(err.name, RBrokerError)
    data = {k: v for k, v in err.data.items() if k not in ("message", "code")}
    return cls(err.message, err.name.value, **data)
