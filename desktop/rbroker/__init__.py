"""rbroker: GPU memory leases from the local broker.

    import rbroker
    with rbroker.lease(8192, project="vision", session="run-42",
                       purpose="fine-tune ViT-B", wait_s=600) as lease:
        os.environ.update(lease.cuda_env())  # CUDA_VISIBLE_DEVICES (+ CUDA_DEVICE_ORDER)

Importing this package loads no NVML, Qt or server code (architecture.md §1), and its
names load on first use.
"""

from __future__ import annotations

import importlib

# `typing` costs a quarter of what this package may cost to import: the idiom type checkers
# read as typing.TYPE_CHECKING (PEP 484's constant, never true at run time)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    # what the names are, for type checkers; at run time they load on first use
    from rbroker._booking import Booking, book, bookings, cancel_booking
    from rbroker._job import ChunkTask, Job, JobRef, job
    from rbroker._lease import Lease, alease, lease
    from rbroker.base.exceptions import (
        BookingNotClaimable,
        BookingNotFound,
        BookingRefused,
        BrokerUnavailable,
        Cancelled,
        CapacityUnavailable,
        DescriptionRejected,
        Infeasible,
        InvalidParams,
        JobFinished,
        JobNotFound,
        LeaseExpired,
        LeaseNotFound,
        LimitReached,
        MethodNotFound,
        NotAllowed,
        NotBookingOwner,
        NotJobOwner,
        NotLeaseOwner,
        NotSimulated,
        OverGrantWarning,
        ProtocolVersionError,
        RBrokerError,
        RequestNotFound,
        ResizePending,
        StorageUnavailable,
        TelemetryUnavailable,
        WaitTimeout,
        WaitTooLong,
    )
    from rbroker.base.version import __version__
    from rbroker.client.local import Client

_EXPORTS: dict[str, str] = {  # name → the module that defines it
    "Booking": "rbroker._booking",
    "book": "rbroker._booking",
    "bookings": "rbroker._booking",
    "cancel_booking": "rbroker._booking",
    "ChunkTask": "rbroker._job",
    "Job": "rbroker._job",
    "JobRef": "rbroker._job",
    "job": "rbroker._job",
    "Lease": "rbroker._lease",
    "alease": "rbroker._lease",
    "lease": "rbroker._lease",
    "BookingNotClaimable": "rbroker.base.exceptions",
    "BookingNotFound": "rbroker.base.exceptions",
    "BookingRefused": "rbroker.base.exceptions",
    "BrokerUnavailable": "rbroker.base.exceptions",
    "Cancelled": "rbroker.base.exceptions",
    "CapacityUnavailable": "rbroker.base.exceptions",
    "DescriptionRejected": "rbroker.base.exceptions",
    "Infeasible": "rbroker.base.exceptions",
    "InvalidParams": "rbroker.base.exceptions",
    "JobFinished": "rbroker.base.exceptions",
    "JobNotFound": "rbroker.base.exceptions",
    "LeaseExpired": "rbroker.base.exceptions",
    "LeaseNotFound": "rbroker.base.exceptions",
    "LimitReached": "rbroker.base.exceptions",
    "MethodNotFound": "rbroker.base.exceptions",
    "NotAllowed": "rbroker.base.exceptions",
    "NotBookingOwner": "rbroker.base.exceptions",
    "NotJobOwner": "rbroker.base.exceptions",
    "NotLeaseOwner": "rbroker.base.exceptions",
    "NotSimulated": "rbroker.base.exceptions",
    "OverGrantWarning": "rbroker.base.exceptions",
    "ProtocolVersionError": "rbroker.base.exceptions",
    "RBrokerError": "rbroker.base.exceptions",
    "RequestNotFound": "rbroker.base.exceptions",
    "ResizePending": "rbroker.base.exceptions",
    "StorageUnavailable": "rbroker.base.exceptions",
    "TelemetryUnavailable": "rbroker.base.exceptions",
    "WaitTimeout": "rbroker.base.exceptions",
    "WaitTooLong": "rbroker.base.exceptions",
    "__version__": "rbroker.base.version",
    "Client": "rbroker.client.local",
}


def __getattr__(name: str) -> Any:
    """`rbroker.NAME` for the SDK's names, each module loaded on its first use (PEP 562):
    `import rbroker` alone loads no asyncio, no client and no protocol model, so a command
    or a job that only imports it starts at the speed of Python itself (docs/architecture.md
    §10, start-up; tests/desktop/sdk/test_import_cost.py keeps it so).

    Raises:
        AttributeError: not a name of the SDK.
    """
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rbroker' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next use is a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = [
    "Booking",
    "BookingNotClaimable",
    "BookingNotFound",
    "BookingRefused",
    "BrokerUnavailable",
    "Cancelled",
    "CapacityUnavailable",
    "ChunkTask",
    "Client",
    "DescriptionRejected",
    "Infeasible",
    "InvalidParams",
    "Job",
    "JobFinished",
    "JobNotFound",
    "JobRef",
    "Lease",
    "LeaseExpired",
    "LeaseNotFound",
    "LimitReached",
    "MethodNotFound",
    "NotAllowed",
    "NotBookingOwner",
    "NotJobOwner",
    "NotLeaseOwner",
    "NotSimulated",
    "OverGrantWarning",
    "ProtocolVersionError",
    "RBrokerError",
    "RequestNotFound",
    "ResizePending",
    "StorageUnavailable",
    "TelemetryUnavailable",
    "WaitTimeout",
    "WaitTooLong",
    "__version__",
    "alease",
    "book",
    "bookings",
    "cancel_booking",
    "job",
    "lease",
]
