"""rbroker: GPU memory leases from the local broker.

    import rbroker
    with rbroker.lease(8192, project="vision", session="run-42",
                       purpose="fine-tune ViT-B", wait_s=600) as lease:
        os.environ.update(lease.cuda_env())  # CUDA_VISIBLE_DEVICES (+ CUDA_DEVICE_ORDER)

Importing this package loads no NVML, Qt or server code (architecture.md §1).
"""

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
