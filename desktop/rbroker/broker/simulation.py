"""The `sim.*` methods of a simulated broker (`rbroker broker --simulate`, architecture.md §6):
one handler holding the fake NVML. Each change tells the broker that the GPU will report
something new (`Broker.memory_changed`), so no admission uses an older sample.

    sim.allocate {mib, gpu_uuid?}   → {gpu_uuid, pid_mib}
    sim.free {mib?, gpu_uuid?}      → {gpu_uuid, pid_mib}
    sim.set {gpu_uuid, ...fields}   → {gpu: {...}}
    sim.stall {seconds}             → {stalled_s}   blocks the event loop

Without `gpu_uuid`, the caller's GPU is the one of a lease bound to its connection or held
by its process, else the GPU of the lowest index.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from rbroker.broker.leases import Lease
from rbroker.broker.sampling import GpuSlot
from rbroker.gpu.fake_nvml import FakeNvml
from rbroker.gpu.scenario import ScenarioError
from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.results import SimMemoryResult, SimSetResult, SimStallResult

log = logging.getLogger(__name__)


class Simulation:
    """The `sim.*` handler of a broker on `fake` (its GPUs `slots`, its live `leases`)."""

    def __init__(
        self,
        fake: FakeNvml,
        slots: Mapping[str, GpuSlot],
        leases: Mapping[str, Lease],
        memory_changed: Callable[[str], None],
    ) -> None:
        self.fake = fake
        self._slots = slots
        self._leases = leases
        self._memory_changed = memory_changed

    def gpu_of(self, gpu_uuid: str | None, conn_id: int, pid: int) -> str:
        """The GPU a `sim.*` call means (see the module docstring).

        Raises:
            RpcError: `invalid_params` for an unknown `gpu_uuid`.
        """
        if gpu_uuid is not None:
            if gpu_uuid not in self._slots:
                raise RpcError(ErrorCode.INVALID_PARAMS, f"no GPU {gpu_uuid}", field="gpu_uuid")
            return gpu_uuid
        for lease in self._leases.values():
            if lease.conn_id == conn_id or lease.holder.pid == pid:
                return lease.gpu_uuid
        return min(self._slots.values(), key=lambda s: s.info.index).uuid

    def allocate(self, gpu_uuid: str | None, conn_id: int, pid: int, mib: int) -> SimMemoryResult:
        """`sim.allocate`: `mib` more MiB for process `pid`.

        Raises:
            RpcError: `invalid_params` (unknown GPU), `cancelled` (the process has exited).
        """
        uuid = self.gpu_of(gpu_uuid, conn_id, pid)
        try:
            total = self.fake.allocate(uuid, pid, mib)
        except ProcessLookupError:
            raise RpcError(ErrorCode.CANCELLED, "the calling process has exited") from None
        self._memory_changed(uuid)
        return {"gpu_uuid": uuid, "pid_mib": total}

    def free(
        self, gpu_uuid: str | None, conn_id: int, pid: int, mib: int | None
    ) -> SimMemoryResult:
        """`sim.free`: `mib` MiB (all when None) of process `pid`'s simulated memory."""
        uuid = self.gpu_of(gpu_uuid, conn_id, pid)
        left = self.fake.free(uuid, pid, mib)
        self._memory_changed(uuid)
        return {"gpu_uuid": uuid, "pid_mib": left}

    def set(self, gpu_uuid: str | None, conn_id: int, pid: int, **changes: Any) -> SimSetResult:
        """`sim.set`: change a simulated GPU's scenario fields, and with `process_utilization`
        ({pid: percent}) what its per-process utilization reports.

        Raises:
            RpcError: `invalid_params` (unknown GPU, a change the scenario refuses).
        """
        uuid = self.gpu_of(gpu_uuid, conn_id, pid)
        utilization: dict[int, int] = changes.pop("process_utilization", None) or {}
        try:
            gpu = self.fake.set_gpu(uuid, **changes)
            for busy_pid, percent in utilization.items():
                self.fake.set_utilization(uuid, busy_pid, percent)
        except (ScenarioError, KeyError, ValueError) as exc:
            raise RpcError(ErrorCode.INVALID_PARAMS, f"sim.set refused: {exc}") from None
        self._memory_changed(uuid)
        shown = {**changes, **({"process_utilization": utilization} if utilization else {})}
        return {"gpu": {"uuid": gpu.uuid, **shown}}

    def stall(self, seconds: float) -> SimStallResult:
        """`sim.stall`: block the event loop for `seconds` (what a stalled broker looks like)."""
        log.warning("sim.stall: blocking the event loop for %.1f s", seconds)
        time.sleep(seconds)  # deliberately on the loop thread
        return {"stalled_s": seconds}
