"""Stable error codes of the local API (architecture.md §5) and their JSON-RPC numbers.

Every error the broker returns is a JSON-RPC error object::

    {"code": -32010, "message": "waiting: ... (human text with the numbers)",
     "data": {"name": "capacity_unavailable", ...numbers...}}

`data.name` is the stable contract; the numeric `code` is fixed too, so that clients in
other languages can switch on either. The JSON-RPC 2.0 standard codes keep their numbers.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """Stable error code names. New names are only ever added."""

    # JSON-RPC 2.0 standard errors (https://www.jsonrpc.org/specification#error_object)
    PARSE_ERROR = "parse_error"
    INVALID_REQUEST = "invalid_request"
    METHOD_NOT_FOUND = "method_not_found"
    INVALID_PARAMS = "invalid_params"
    INTERNAL_ERROR = "internal_error"
    # rbroker errors (architecture.md §5)
    REQUEST_TOO_LARGE = "request_too_large"
    CAPACITY_UNAVAILABLE = "capacity_unavailable"
    INFEASIBLE = "infeasible"
    WAIT_TIMEOUT = "wait_timeout"
    LEASE_NOT_FOUND = "lease_not_found"
    LEASE_EXPIRED = "lease_expired"
    NOT_LEASE_OWNER = "not_lease_owner"
    DESCRIPTION_REJECTED = "description_rejected"
    TELEMETRY_UNAVAILABLE = "telemetry_unavailable"
    PROTOCOL_VERSION = "protocol_version"
    NOT_SIMULATED = "not_simulated"
    CANCELLED = "cancelled"
    JOB_NOT_FOUND = "job_not_found"
    JOB_FINISHED = "job_finished"
    NOT_JOB_OWNER = "not_job_owner"
    NOT_ALLOWED = "not_allowed"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    RESIZE_PENDING = "resize_pending"
    WAIT_TOO_LONG = "wait_too_long"
    TOO_MANY_WAITING = "too_many_waiting"
    TOO_MANY_LEASES = "too_many_leases"
    TOO_MANY_JOBS = "too_many_jobs"
    UNSENT_OVER_LIMIT = "unsent_over_limit"
    REQUEST_NOT_FOUND = "request_not_found"
    NOT_A_MEMBER = "not_a_member"
    TOO_MANY_IN_FLIGHT = "too_many_in_flight"
    TOO_MANY_CHUNKS = "too_many_chunks"
    STORAGE_UNAVAILABLE = "storage_unavailable"
    BOOKING_NOT_FOUND = "booking_not_found"
    NOT_BOOKING_OWNER = "not_booking_owner"
    BOOKING_CONFLICT = "booking_conflict"
    TOO_MANY_BOOKINGS = "too_many_bookings"
    BOOKING_TOO_FAR = "booking_too_far"
    BOOKING_TOO_LONG = "booking_too_long"
    BOOKING_NOT_STARTED = "booking_not_started"
    BOOKING_ENDED = "booking_ended"


ERROR_CODES: dict[ErrorCode, int] = {
    ErrorCode.PARSE_ERROR: -32700,
    ErrorCode.INVALID_REQUEST: -32600,
    ErrorCode.METHOD_NOT_FOUND: -32601,
    ErrorCode.INVALID_PARAMS: -32602,
    ErrorCode.INTERNAL_ERROR: -32603,
    ErrorCode.REQUEST_TOO_LARGE: -32001,
    ErrorCode.CAPACITY_UNAVAILABLE: -32010,
    ErrorCode.INFEASIBLE: -32011,
    ErrorCode.WAIT_TIMEOUT: -32012,
    ErrorCode.CANCELLED: -32013,
    ErrorCode.LEASE_NOT_FOUND: -32020,
    ErrorCode.LEASE_EXPIRED: -32021,
    ErrorCode.NOT_LEASE_OWNER: -32022,
    ErrorCode.DESCRIPTION_REJECTED: -32030,
    ErrorCode.TELEMETRY_UNAVAILABLE: -32040,
    ErrorCode.PROTOCOL_VERSION: -32050,
    ErrorCode.NOT_SIMULATED: -32060,
    ErrorCode.JOB_NOT_FOUND: -32070,
    ErrorCode.JOB_FINISHED: -32071,
    ErrorCode.NOT_JOB_OWNER: -32072,
    ErrorCode.NOT_ALLOWED: -32080,
    ErrorCode.TOO_MANY_CONNECTIONS: -32081,
    ErrorCode.RESIZE_PENDING: -32023,
    ErrorCode.WAIT_TOO_LONG: -32014,
    ErrorCode.TOO_MANY_WAITING: -32082,
    ErrorCode.TOO_MANY_LEASES: -32083,
    ErrorCode.TOO_MANY_JOBS: -32084,
    ErrorCode.UNSENT_OVER_LIMIT: -32085,
    ErrorCode.REQUEST_NOT_FOUND: -32024,
    ErrorCode.NOT_A_MEMBER: -32086,
    ErrorCode.TOO_MANY_IN_FLIGHT: -32087,
    ErrorCode.TOO_MANY_CHUNKS: -32088,
    ErrorCode.STORAGE_UNAVAILABLE: -32090,
    ErrorCode.BOOKING_NOT_FOUND: -32091,
    ErrorCode.NOT_BOOKING_OWNER: -32092,
    ErrorCode.BOOKING_CONFLICT: -32093,
    ErrorCode.TOO_MANY_BOOKINGS: -32094,
    ErrorCode.BOOKING_TOO_FAR: -32095,
    ErrorCode.BOOKING_TOO_LONG: -32096,
    ErrorCode.BOOKING_NOT_STARTED: -32097,
    ErrorCode.BOOKING_ENDED: -32098,
}
"""JSON-RPC numeric code for each name. Standard codes from the JSON-RPC 2.0 spec."""

_BY_NUMBER = {number: name for name, number in ERROR_CODES.items()}


class RpcError(Exception):
    """An error with a stable name, a readable message and machine-readable numbers.

    Raised inside the broker and turned into a JSON-RPC error object by the dispatcher;
    rebuilt on the client side by `from_wire`.

    Attributes:
        name: the stable `ErrorCode`.
        message: text a person can read, carrying the numbers (never a secret).
        data: extra fields (MiB figures, GPU UUID, rule name); JSON-serialisable.
    """

    def __init__(self, name: ErrorCode, message: str, **data: Any) -> None:
        super().__init__(message)
        self.name = name
        self.message = message
        self.data = data

    def to_wire(self) -> dict[str, Any]:
        """Return the JSON-RPC error object `{code, message, data: {name, ...}}`."""
        return {
            "code": ERROR_CODES[self.name],
            "message": self.message,
            "data": {"name": self.name.value, **self.data},
        }

    @classmethod
    def from_wire(cls, error: dict[str, Any]) -> RpcError:
        """Rebuild from a JSON-RPC error object; unknown names map to `internal_error`, a
        `data` that is not an object to none. Its `data` is kept whatever its keys (a peer
        that is not a broker may send `message`: passed as keywords, that was a TypeError)."""
        raw = error.get("data")
        data = dict(raw) if isinstance(raw, dict) else {}
        raw_name = data.pop("name", None)
        try:
            name = ErrorCode(raw_name) if raw_name else _BY_NUMBER[int(error.get("code", 0))]
        except (ValueError, KeyError, TypeError):
            name = ErrorCode.INTERNAL_ERROR
        err = cls(name, str(error.get("message", "")))
        err.data = data
        return err

    def __repr__(self) -> str:
        return f"RpcError({self.name.value!r}, {self.message!r})"
