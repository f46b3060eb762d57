"""A simulated NVML library with the shape of `pynvml`, driven by a scenario file (architecture.md
§6).

Simulation replaces the *library*, not the adapter: `NvmlGateway(FakeNvml(...))` runs the
same code as with real NVML. Errors are raised as real `pynvml.NVMLError` instances with the
real codes. The scenario file is re-read whenever its modification time changes; runtime
changes from `sim.set` are kept on top of it, and `allocate`/`free` add memory to a live pid
(what a CUDA allocation would do) which disappears when that process exits.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pynvml

from rbroker.base.proctime import start_s
from rbroker.gpu.scenario import ScenarioError, SimGpu, init_error, load_scenario

log = logging.getLogger(__name__)

MIB = 1024 * 1024

NVMLError = pynvml.NVMLError
nvmlMemory_v2 = pynvml.nvmlMemory_v2

_ERROR_CODES = {
    "gpu_lost": pynvml.NVML_ERROR_GPU_IS_LOST,
    "unknown": pynvml.NVML_ERROR_UNKNOWN,
    "version_mismatch": pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    "no_permission": pynvml.NVML_ERROR_NO_PERMISSION,
    "not_supported": pynvml.NVML_ERROR_NOT_SUPPORTED,
    "library_not_found": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    "driver_not_loaded": pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
}


@dataclass(frozen=True, slots=True)
class _UtilizationSample:
    """pynvml's `c_nvmlProcessUtilizationSample_t`: percent over NVML's sampling period,
    `timeStamp` the CPU time of the sample in microseconds."""

    pid: int
    timeStamp: int  # pynvml's field names
    smUtil: int
    memUtil: int = 0
    encUtil: int = 0
    decUtil: int = 0


@dataclass(frozen=True, slots=True)
class _Handle:
    uuid: str


@dataclass(slots=True)
class _Memory:
    total: int
    free: int
    used: int
    reserved: int = 0
    version: int = 0


@dataclass(frozen=True, slots=True)
class _PciInfo:
    busId: str  # pynvml's field name


@dataclass(slots=True)
class _Process:
    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


class FakeNvml:
    """The pynvml functions rbroker uses, answered from a scenario.

    Args:
        scenario_path: TOML file (architecture.md §6), re-read when its mtime changes; None for the
            built-in default (two empty 24 GiB GPUs).

    Raises:
        ScenarioError: at construction, when the file is invalid. A later invalid rewrite
            is logged and the previous scenario kept.
    """

    NVMLError = pynvml.NVMLError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(self, scenario_path: Path | None = None) -> None:
        self.scenario_path = scenario_path
        self._lock = threading.RLock()
        self._mtime_ns: int | None = None
        self._file_gpus: list[SimGpu] = load_scenario(scenario_path)
        self._init_error = ""
        if scenario_path is not None:
            self._mtime_ns = scenario_path.stat().st_mtime_ns
            self._init_error = init_error(scenario_path.read_text(encoding="utf-8"))
        self._overrides: dict[str, dict[str, Any]] = {}
        # (uuid, pid) -> [mib, process create time]
        self._allocations: dict[tuple[str, int], list[float]] = {}
        # (uuid, pid) -> SM percent set at runtime (`set_utilization`), over the scenario's
        self._utilization: dict[tuple[str, int], int] = {}
        self._initialised = False

    # -- scenario -----------------------------------------------------------------------
    def _reload_if_changed(self) -> None:
        if self.scenario_path is None:
            return
        try:
            mtime = self.scenario_path.stat().st_mtime_ns
        except OSError:
            return
        if mtime == self._mtime_ns:
            return
        self._mtime_ns = mtime
        try:
            self._file_gpus = load_scenario(self.scenario_path)
            self._init_error = init_error(self.scenario_path.read_text(encoding="utf-8"))
            log.info("scenario %s re-read: %d GPUs", self.scenario_path, len(self._file_gpus))
        except ScenarioError as exc:
            log.error("scenario rewrite ignored, keeping the previous one: %s", exc)

    def gpus(self) -> list[SimGpu]:
        """The simulated GPUs now: the file's, with `sim.set` changes applied."""
        with self._lock:
            self._reload_if_changed()
            return [
                g.with_changes(**self._overrides[g.uuid]) if g.uuid in self._overrides else g
                for g in self._file_gpus
            ]

    def _gpu(self, handle: Any) -> SimGpu:
        if not isinstance(handle, _Handle):
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for gpu in self.gpus():
            if gpu.uuid == handle.uuid:
                return gpu
        raise NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    def _enter(self, handle: Any) -> SimGpu:
        """Common prologue of per-GPU calls: initialised check, delay, injected error."""
        if not self._initialised:
            raise NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        gpu = self._gpu(handle)
        started = time.monotonic()
        while gpu.delay_s > 0 and time.monotonic() - started < gpu.delay_s:
            time.sleep(min(0.05, gpu.delay_s))
            gpu = self._gpu(handle)  # a rewrite or sim.set can end the hang
        if gpu.error:
            raise NVMLError(_ERROR_CODES[gpu.error])
        return gpu

    # -- simulation controls --------------------------------------------------------------
    def set_gpu(self, uuid: str, **changes: Any) -> SimGpu:
        """Change a simulated GPU at runtime (`sim.set`); returns the resulting GPU.

        Raises:
            KeyError: no simulated GPU has `uuid`.
            ScenarioError: a changed value is invalid.
        """
        with self._lock:
            current = {g.uuid: g for g in self.gpus()}
            if uuid not in current:
                raise KeyError(uuid)
            result = current[uuid].with_changes(**changes)
            self._overrides.setdefault(uuid, {}).update(changes)
            return result

    def allocate(self, uuid: str, pid: int, mib: int) -> int:
        """Attribute `mib` more MiB to live process `pid` on `uuid`; returns its total there.

        Raises:
            KeyError: unknown GPU.
            ProcessLookupError: `pid` is not running.
        """
        try:
            proc = psutil.Process(pid)
            create_time = start_s(proc)
            if proc.status() == psutil.STATUS_ZOMBIE:
                raise ProcessLookupError(pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            raise ProcessLookupError(pid) from None
        with self._lock:
            if uuid not in {g.uuid for g in self.gpus()}:
                raise KeyError(uuid)
            entry = self._allocations.get((uuid, pid))
            if entry is None or entry[1] != create_time:
                entry = [0, create_time]
                self._allocations[(uuid, pid)] = entry
            entry[0] += mib
            return int(entry[0])

    def free(self, uuid: str, pid: int, mib: int | None = None) -> int:
        """Undo `mib` MiB (all when None) of `pid`'s simulated memory; returns what is left."""
        with self._lock:
            entry = self._allocations.get((uuid, pid))
            if entry is None:
                return 0
            entry[0] = 0 if mib is None else max(0, entry[0] - mib)
            if entry[0] == 0:
                del self._allocations[(uuid, pid)]
                return 0
            return int(entry[0])

    def set_utilization(self, uuid: str, pid: int, sm_util: int) -> None:
        """Make `pid` show `sm_util` percent SM utilization on `uuid` from now on (over what
        the scenario says; 0: it shows none), as a kernel running there would.

        Raises:
            KeyError: unknown GPU.
            ValueError: `sm_util` outside 0..100.
        """
        if not 0 <= sm_util <= 100:
            raise ValueError(f"sm_util must be 0..100 percent, got {sm_util}")
        with self._lock:
            if uuid not in {g.uuid for g in self.gpus()}:
                raise KeyError(uuid)
            self._utilization[(uuid, pid)] = sm_util

    def _live_allocations(self, uuid: str) -> dict[int, int]:
        out: dict[int, int] = {}
        with self._lock:
            for (gpu_uuid, pid), (mib, create_time) in list(self._allocations.items()):
                if gpu_uuid != uuid:
                    continue
                try:
                    proc = psutil.Process(pid)
                    alive = start_s(proc) == create_time and proc.status() != psutil.STATUS_ZOMBIE
                except psutil.Error:
                    alive = False  # an exited process's CUDA context is gone
                if alive:
                    out[pid] = int(mib)
                else:
                    del self._allocations[(gpu_uuid, pid)]
        return out

    # -- the pynvml surface ----------------------------------------------------------------
    def nvmlInit(self) -> None:
        with self._lock:
            self._reload_if_changed()
            if self._init_error:
                raise NVMLError(_ERROR_CODES[self._init_error])
        self._initialised = True

    def nvmlShutdown(self) -> None:
        self._initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return "simulated"

    def nvmlDeviceGetCount(self) -> int:
        if not self._initialised:
            raise NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        return len(self.gpus())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        gpus = self.gpus()
        if not 0 <= index < len(gpus):
            raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(gpus[index].uuid)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> _Handle:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        if text not in {g.uuid for g in self.gpus()}:
            raise NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(text)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle).name

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        gpu = self._gpu(handle)
        return [g.uuid for g in self.gpus()].index(gpu.uuid)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> _PciInfo:
        """Simulated GPU number i sits at PCI bus i + 1 (`00000000:01:00.0` first)."""
        return _PciInfo(f"00000000:{self.nvmlDeviceGetIndex(handle) + 1:02X}:00.0")

    def nvmlDeviceGetMigMode(self, handle: Any) -> tuple[int, int]:
        raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _used_mib(self, gpu: SimGpu) -> int:
        """Device-level used MiB, v1 sense (reserved included)."""
        if gpu.device_used_mib is not None:
            return gpu.device_used_mib
        listed = sum(p.used_mib or 0 for p in gpu.processes)
        allocated = sum(self._live_allocations(gpu.uuid).values())
        return min(gpu.total_mib, gpu.reserved_mib + gpu.used_mib + listed + allocated)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> _Memory:
        gpu = self._enter(handle)
        if gpu.memory_api == "not_supported":
            raise NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        used = self._used_mib(gpu)
        total_b, used_b = gpu.total_mib * MIB, used * MIB
        if version:
            if gpu.memory_api == "v1":
                raise NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            reserved = min(gpu.reserved_mib, used) * MIB
            return _Memory(total_b, total_b - used_b, used_b - reserved, reserved, version)
        return _Memory(total_b, total_b - used_b, used_b)

    def _process_list(self, handle: Any, kind: str) -> list[_Process]:
        gpu = self._enter(handle)
        if gpu.process_list_error:
            raise NVMLError(_ERROR_CODES[gpu.process_list_error])
        procs: dict[int, int | None] = {
            p.pid: (p.used_mib * MIB if p.used_mib is not None else None)
            for p in gpu.processes
            if p.kind == kind
        }
        if kind == "compute":
            for pid, mib in self._live_allocations(gpu.uuid).items():
                prev = procs.get(pid) or 0
                procs[pid] = prev + mib * MIB
        if not gpu.per_process_memory:
            return [_Process(pid, None) for pid in procs]
        return [_Process(pid, used) for pid, used in procs.items()]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[_Process]:
        return self._process_list(handle, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[_Process]:
        return self._process_list(handle, "graphics")

    def nvmlDeviceGetProcessUtilization(
        self, handle: Any, timeStamp: int
    ) -> list[_UtilizationSample]:
        """One sample per process that used the SMs (`sm_util` > 0 in the scenario or by
        `set_utilization`), stamped now (microseconds) and so newer than any `timeStamp`
        already seen. As NVML: NOT_FOUND when no process has a sample newer than
        `timeStamp`, the GPU's `utilization_error` when it has one."""
        gpu = self._enter(handle)
        if gpu.utilization_error:
            raise NVMLError(_ERROR_CODES[gpu.utilization_error])
        busy = {p.pid: p.sm_util for p in gpu.processes if p.sm_util}
        with self._lock:
            for (uuid, pid), util in self._utilization.items():
                if uuid == gpu.uuid:
                    busy[pid] = util
        now_us = max(int(time.time() * 1_000_000), timeStamp + 1)
        samples = [_UtilizationSample(pid, now_us, util) for pid, util in busy.items() if util]
        if not samples:
            raise NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return samples
