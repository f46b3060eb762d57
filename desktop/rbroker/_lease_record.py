"""The holder's view of a granted lease (`rbroker.Lease`): its GPUs and grant, the CUDA
environment for them, what keeps frameworks inside the grant (`rbroker._frameworks`),
`resize()`, and the over-grant warning (docs/architecture.md §6a).
"""

from __future__ import annotations

import reprlib
import warnings

from rbroker._frameworks import FrameworkLimits
from rbroker.base.cuda import cuda_env
from rbroker.base.display import fmt_mib
from rbroker.base.exceptions import OverGrantWarning, RBrokerError
from rbroker.client.local import Client

TYPE_CHECKING = False  # typing.TYPE_CHECKING's idiom (PEP 484): no `typing` at run time
if TYPE_CHECKING:
    from typing import Any


class Lease(FrameworkLimits):
    """A granted lease, as the holder sees it.

    Attributes:
        lease_id: the broker's id.
        gpu_uuid: the granted GPU (the first one for multi-GPU leases).
        gpu_uuids: every granted GPU.
        granted_mib: MiB granted on each GPU.
        cuda_visible_devices: the granted GPUs' UUIDs, comma separated: a value for
            `CUDA_VISIBLE_DEVICES` that never depends on device order (unchanged meaning; many
            tools parse that variable as integers: prefer `cuda_env()`).
        gpu_indices: the granted GPUs' NVML indices when they name the same GPUs to CUDA under
            `CUDA_DEVICE_ORDER=PCI_BUS_ID`; None for MIG slices or when unknown (see
            `rbroker.base.cuda`).
        gpu_total_mib: each granted GPU's total MiB (NVML's), in order; None when unknown.
        gpu_total_override: the granted GPUs whose total is a capacity override
            (`--capacity-mib`, unified memory): they get no memory fraction.
            `memory_fraction`, `limit_torch()` and `limit_tensorflow()` keep a framework
            inside the grant (see `rbroker._frameworks`).
        info: the broker's full lease record.
        lost: set when a heartbeat found the lease gone; `error` says why.
        over_grant: the numbers of the broker's latest `over_grant` event for this lease
            (None before any): it used more than `granted_mib` for longer than the grace.
        socket: the broker's address, for `resize()`.

    What `@dataclass` would make of these fields, written out (`@dataclass` imports
    `inspect` and compiles code at run time: a measurable part of `rbroker run`'s start,
    issue 44): the constructor (every field by position or name; `gpu_total_override` a new
    list by default), `repr` (without the token, the over-grant error and the socket), `==`
    field by field between leases, no hash (a lease changes), `__match_args__`.
    tests/desktop/sdk/test_lease_record.py holds them to the dataclass's.
    """

    __match_args__ = (
        "lease_id",
        "gpu_uuid",
        "gpu_uuids",
        "granted_mib",
        "cuda_visible_devices",
        "info",
        "token",
        "lost",
        "error",
        "gpu_indices",
        "gpu_total_mib",
        "gpu_total_override",
        "over_grant",
        "over_grant_error",
        "socket",
    )
    _HIDDEN = frozenset({"token", "over_grant_error", "socket"})  # left out of `repr`
    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value: unhashable

    lease_id: str
    gpu_uuid: str
    gpu_uuids: list[str]
    granted_mib: int
    cuda_visible_devices: str
    info: dict[str, Any]
    token: str = ""
    lost: bool = False
    error: RBrokerError | None = None
    gpu_indices: list[int] | None = None
    gpu_total_mib: list[int] | None = None
    gpu_total_override: list[str]
    over_grant: dict[str, Any] | None = None
    over_grant_error: OverGrantWarning | None = None
    socket: str | None = None

    def __init__(
        self,
        lease_id: str,
        gpu_uuid: str,
        gpu_uuids: list[str],
        granted_mib: int,
        cuda_visible_devices: str,
        info: dict[str, Any],
        token: str = "",
        lost: bool = False,
        error: RBrokerError | None = None,
        gpu_indices: list[int] | None = None,
        gpu_total_mib: list[int] | None = None,
        gpu_total_override: list[str] | None = None,
        over_grant: dict[str, Any] | None = None,
        over_grant_error: OverGrantWarning | None = None,
        socket: str | None = None,
    ) -> None:
        self.lease_id = lease_id
        self.gpu_uuid = gpu_uuid
        self.gpu_uuids = gpu_uuids
        self.granted_mib = granted_mib
        self.cuda_visible_devices = cuda_visible_devices
        self.info = info
        self.token = token
        self.lost = lost
        self.error = error
        self.gpu_indices = gpu_indices
        self.gpu_total_mib = gpu_total_mib
        self.gpu_total_override = [] if gpu_total_override is None else gpu_total_override
        self.over_grant = over_grant
        self.over_grant_error = over_grant_error
        self.socket = socket

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__match_args__)

    @reprlib.recursive_repr()
    def __repr__(self) -> str:
        shown = ", ".join(
            f"{name}={getattr(self, name)!r}"
            for name in self.__match_args__
            if name not in self._HIDDEN
        )
        return f"{self.__class__.__qualname__}({shown})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Lease)
        return self._values() == other._values()

    def cuda_env(self, form: str = "auto") -> dict[str, str]:
        """Environment variables that make this lease's GPUs a process's CUDA devices.

        `form`: `auto` (an index with `CUDA_DEVICE_ORDER=PCI_BUS_ID` where that is
        unambiguous, the UUID for MIG slices), `index` or `uuid`; e.g.
        `{"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}`.

        Raises:
            ValueError: an unknown form, or `index` where no index names the GPU (MIG).
        """
        return cuda_env(self.gpu_uuids, self.gpu_indices, form)

    def check(self) -> None:
        """Raise the heartbeat's error if the lease was lost (expired, broker gone), or the
        `OverGrantWarning` a warning filter turned into an error (once per episode)."""
        if self.lost and self.error is not None:
            raise self.error
        error, self.over_grant_error = self.over_grant_error, None
        if error is not None:
            raise error

    def resize(self, mib: int, *, wait_s: float = 0.0) -> Lease:
        """Change the grant to `mib` MiB on each of the lease's GPUs; the lease keeps its id,
        owner and descriptions (docs/architecture.md §3).

        Shrinking takes effect at once (waiting requests may be admitted in the freed room).
        Growing is admitted like a new request on the same GPUs, behind the requests already
        waiting there, and waits up to `wait_s` seconds (0: only if there is room now).
        Runs on a connection of its own, so heartbeats go on while it waits. Returns self,
        with `granted_mib` and `info` updated.

        Raises:
            InvalidParams: `mib` below 1 or absurdly large (`data`: requested, min, max).
            CapacityUnavailable / WaitTimeout: no room for the growth now / within `wait_s`.
            Infeasible: the GPU can never hold `mib`. LeaseExpired / LeaseNotFound: the lease
                ended. NotLeaseOwner: another user's lease. ResizePending (code
                `resize_pending`): another resize of it is still waiting.
        """
        with Client(self.socket) as client:
            result = client.resize(self.lease_id, mib, wait_s=wait_s, timeout_s=wait_s + 30.0)
        self.info = dict(result["lease"])
        self.granted_mib = int(self.info["granted_mib"])
        return self


def note_over_grant(lease: Lease, data: dict[str, Any]) -> None:
    """An `over_grant` event for `lease` (on the heartbeat thread): keep its numbers and
    warn with `OverGrantWarning`; a filter that makes it an error keeps the error for
    `lease.check()` and the end of the `with` block instead of raising on this thread."""
    lease.over_grant = dict(data)
    message = (
        f"lease {lease.lease_id} uses {fmt_mib(int(data.get('over_mib', 0)))} MiB more than "
        f"its grant of {fmt_mib(lease.granted_mib)} MiB on {data.get('gpu_uuid')} "
        f"(observed {fmt_mib(int(data.get('observed_mib', 0)))} MiB for "
        f"{float(data.get('over_s', 0)):.0f} s); rbroker does not stop it: cap the framework "
        "(lease.limit_torch(), lease.memory_fraction, ...) or lease.resize() the grant"
    )
    try:
        warnings.warn(OverGrantWarning(message, dict(data)), stacklevel=2)
    except OverGrantWarning as exc:
        lease.over_grant_error = exc
