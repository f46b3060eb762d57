"""The single NVML gateway: the only module that calls pynvml (architecture.md §6).

It takes a pynvml-shaped library object — the real `pynvml` module from nvidia-ml-py
(`real_gateway`, `real_nvml_available`), or the simulated one from `rbroker.gpu.fake_nvml` —
so simulation runs this same code path.

What it does for the broker:
- lazy `nvmlInit` under a lock, GPUs and MIG slices enumerated and keyed by UUID;
- memory through `nvmlDeviceGetMemoryInfo` v2, falling back to v1 when v2 is missing;
  `device_used = total - free` in both (v2's `reserved` is neither free nor usable);
- compute and graphics process lists, read before and after the memory read, keeping the
  smaller value per pid; values that are None (WDDM), pid 0, pids ≥ 2^32−1 or larger than
  the GPU become *unknown*, and so do all of them when real NVML is read from a container's
  own pid namespace (its pids are the host's);
- every NVML error turned into a `TelemetryError` carrying a `TelemetryState` and a reason
  name, never a raw NVMLError;
- per-process SM utilization since the previous sample (`nvmlDeviceGetProcessUtilization`),
  joined, where a per-process utilization source is given (on Windows the "GPU Engine"
  counters: `rbroker.gpu.wddm`), with that source's, or unknown (None) wherever neither can
  be read: it never fails a sample;
- where NVML says None (WDDM), the memory a per-process source reports (on Windows the
  "GPU Process Memory" counters: `rbroker.gpu.wddm`); a pid no source knows stays unknown;
- `AsyncSampler`: at most one call in flight per GPU, run off the event loop, with a
  deadline, so a hung driver never blocks the caller.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pynvml

from rbroker.base.proctime import process_clock_s
from rbroker.gpu.nvml_discovery import NvmlNotFound, preload_windows_nvml
from rbroker.gpu.types import GpuInfo, GpuSample, ProcessSample, TelemetryState

log = logging.getLogger(__name__)

MIB = 1024 * 1024
_PID_LIMIT = 2**32 - 1

# NVML return codes (nvml.h); duplicated as plain ints so the fake need not match names.
_ERR_NOT_SUPPORTED = 3
_ERR_NO_PERMISSION = 4
_ERR_NOT_FOUND = 6
_ERR_DRIVER_NOT_LOADED = 9
_ERR_TIMEOUT = 10
_ERR_LIBRARY_NOT_FOUND = 12
_ERR_FUNCTION_NOT_FOUND = 13
_ERR_GPU_IS_LOST = 15
_ERR_RESET_REQUIRED = 16
_ERR_VERSION_MISMATCH = 18
_ERR_ARGUMENT_VERSION_MISMATCH = 25
_ERR_GPU_NOT_FOUND = 28
_ERR_UNKNOWN = 999

_REASONS: dict[int, str] = {
    1: "uninitialized",
    2: "invalid_argument",
    _ERR_NOT_SUPPORTED: "not_supported",
    _ERR_NO_PERMISSION: "no_permission",
    _ERR_NOT_FOUND: "not_found",
    _ERR_DRIVER_NOT_LOADED: "driver_not_loaded",
    _ERR_TIMEOUT: "timeout",
    _ERR_LIBRARY_NOT_FOUND: "library_not_found",
    _ERR_FUNCTION_NOT_FOUND: "function_not_found",
    _ERR_GPU_IS_LOST: "gpu_lost",
    _ERR_RESET_REQUIRED: "reset_required",
    _ERR_VERSION_MISMATCH: "version_mismatch",
    _ERR_ARGUMENT_VERSION_MISMATCH: "argument_version_mismatch",
    _ERR_GPU_NOT_FOUND: "gpu_lost",
    _ERR_UNKNOWN: "unknown_error",
}


NVML_LIBRARY = "nvml.dll" if sys.platform == "win32" else "libnvidia-ml"
"""What the NVML library is called on this OS (in messages)."""

_REASON_WORDS: dict[str, str] = {
    "version_mismatch": "the NVIDIA driver and its NVML library have different versions "
    "(NVML error 18; usual after a driver upgrade until the computer restarts)",
    "library_not_found": f"the NVML library ({NVML_LIBRARY}) is not installed or cannot be "
    "loaded (NVML error 12)",
    "driver_not_loaded": "the NVIDIA kernel driver is not loaded (NVML error 9)",
    "no_permission": "this account may not use NVML (NVML error 4)",
    "unknown_error": "NVML failed with an unknown error (999)",
    "gpu_lost": "the GPU fell off the bus or is lost (NVML error 15)",
    "timeout": "the NVML call did not answer in time",
    "not_supported": "the query is not supported on this GPU (NVML error 3)",
    "used_unknown": "neither the GPU nor its processes report the memory in use (the memory "
    "query is not supported and per-process memory is unknown); a capacity override cannot "
    "help: lease this GPU only where its driver reports per-process memory",
}


def describe(reason: str) -> str:
    """A telemetry failure reason (`version_mismatch`, `library_not_found`, ...) in words."""
    return _REASON_WORDS.get(reason, f"NVML failed ({reason.replace('_', ' ')})")


class TelemetryError(Exception):
    """A GPU could not be read. `state` is the resulting telemetry state, `reason` a name
    such as `gpu_lost`, `version_mismatch`, `not_supported`, `timeout`; `words`, when given,
    says it for people better than `describe(reason)` (e.g. where nvml.dll was looked for)."""

    def __init__(
        self, state: TelemetryState, reason: str, detail: str = "", words: str = ""
    ) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.state = state
        self.reason = reason
        self.words = words


def _nvml_code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


INITIAL_PID_NAMESPACE_INODE = 0xEFFFFFFC
"""Inode number of the Linux kernel's initial pid namespace (`PROC_PID_INIT_INO` in
include/linux/proc_ns.h): `/proc/self/ns/pid` has it only outside every container."""


def in_child_pid_namespace(ns_path: str = "/proc/self/ns/pid") -> bool:
    """True unless this process provably runs in the initial pid namespace (Linux).

    NVML lists the pids of the initial namespace; in any other (a container, even one that
    mounted its own /proc so that `NSpid` shows a single entry) they name other processes
    or none, so per-process figures cannot be attributed. Where the namespace cannot be
    read, that doubt counts as "another namespace". False on other systems.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        return os.stat(ns_path).st_ino != INITIAL_PID_NAMESPACE_INODE
    except OSError:
        return True


_PROCESS_CALLS = {
    "compute": (
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetComputeRunningProcesses_v2",
    ),
    "graphics": (
        "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
    ),
}
"""pynvml's process-list calls, newest first (`NvmlGateway._process_records`)."""

_NO_INSTANCE = 0xFFFFFFFF
_MAX_INSTANCE_ID = 0xFF


def records_garbled(records: Iterable[Any]) -> bool:
    """True when a process list cannot be NVML's records as this pynvml reads them.

    When the driver writes records of another size than pynvml's `nvmlProcessInfo_v2_t`
    (24 bytes: pid, usedGpuMemory, gpuInstanceId, computeInstanceId), every record after the
    first is read across two of the driver's (nvitop#75): instance ids that are neither
    "none" (0xFFFFFFFF) nor a MIG id (< 256: NVML counts GPU and compute instances in single
    digits) come out, since they hold the next record's pid or memory. One such record makes
    the whole list suspect, as a shifted record may also look plausible. (Bad pids alone, 0
    or past 2^32 − 2, are skipped one by one in `_processes`: drivers report such records
    beside sane ones.)
    """
    for rec in records:
        for name in ("gpuInstanceId", "computeInstanceId"):
            value = getattr(rec, name, _NO_INSTANCE)
            if isinstance(value, int) and value != _NO_INSTANCE and value > _MAX_INSTANCE_ID:
                return True
    return False


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlGateway:
    """Synchronous, thread-safe access to one NVML library (real or simulated).

    Args:
        lib: the `pynvml` module or an object with the same functions and `NVMLError`.
        source: `"nvml"` or `"simulated"`, reported by the broker as `telemetry_source`.

    `clock` (monotonic seconds) stamps samples; the broker sets it to its own clock.

    All methods raise `TelemetryError`, never an NVMLError.
    """

    def __init__(self, lib: Any, source: str = "nvml") -> None:
        self.lib = lib
        self.source = source
        self.clock: Callable[[], float] = time.monotonic
        self.capacity_overrides_mib: dict[str, int] = {}
        # called before nvmlInit (Windows: find nvml.dll); may raise TelemetryError
        self.before_init: Callable[[], None] | None = None
        # `{uuid: PCI bus id} -> source` of per-process MiB where NVML says None (WDDM)
        self.process_memory_factory: (
            Callable[[Mapping[str, str]], Callable[[str, Iterable[int]], dict[int, int]] | None]
            | None
        ) = None
        self.process_memory: Callable[[str, Iterable[int]], dict[int, int]] | None = None
        # `{uuid: PCI bus id} -> source` of per-process utilization beside NVML's (WDDM)
        self.process_utilization_factory: (
            Callable[[Mapping[str, str]], Callable[[str], dict[int, int] | None] | None] | None
        ) = None
        self.process_utilization: Callable[[str], dict[int, int] | None] | None = None
        self._mapped_bus_ids: dict[str, str] | None = None
        self._lock = threading.Lock()
        self._initialised = False
        self._handles: dict[str, Any] = {}
        self._v2_missing: set[str] = set()
        # per list kind, the process-list calls still to use, newest first
        self._process_calls: dict[str, list[str]] = {}
        self._garbled_logged: set[str] = set()
        # per GPU, the newest utilization sample seen (NVML's CPU timestamp, microseconds)
        self._utilization_seen: dict[str, int] = {}
        self._utilization_logged: set[tuple[str, str]] = set()
        # NVML seen from another pid namespace than the initial one: its pids are foreign
        # (the simulated driver plays the host's driver, so the rule holds for it too)
        self.foreign_pids = in_child_pid_namespace()

    def _error(self, exc: BaseException, what: str) -> TelemetryError:
        code = _nvml_code(exc)
        reason = _REASONS.get(code, f"nvml_error_{code}") if code is not None else "internal"
        if code in (_ERR_GPU_IS_LOST, _ERR_GPU_NOT_FOUND, _ERR_NOT_FOUND):
            state = TelemetryState.LOST
        else:
            state = TelemetryState.UNAVAILABLE
        return TelemetryError(state, reason, f"{what}: {exc}")

    def _ensure_init(self) -> None:
        if self._initialised:
            return
        with self._lock:
            if self._initialised:
                return
            if self.before_init is not None:
                self.before_init()
            try:
                self.lib.nvmlInit()
            except self.lib.NVMLError as exc:
                raise self._error(exc, "nvmlInit") from None
            self._initialised = True

    def shutdown(self) -> None:
        """Call `nvmlShutdown` if initialised; errors are logged, not raised."""
        with self._lock:
            if self._initialised:
                try:
                    self.lib.nvmlShutdown()
                except self.lib.NVMLError as exc:  # pragma: no cover - best effort
                    log.warning("nvmlShutdown failed: %s", exc)
                self._initialised = False
                self._handles.clear()

    def enumerate(self) -> list[GpuInfo]:
        """List the capacity units: every GPU, or its MIG slices when MIG mode is on.

        Raises:
            TelemetryError: NVML cannot be initialised or the devices cannot be listed.
        """
        self._ensure_init()
        lib = self.lib
        found: list[GpuInfo] = []
        try:
            count = lib.nvmlDeviceGetCount()
            for index in range(count):
                handle = lib.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(lib.nvmlDeviceGetUUID(handle))
                name = _text(lib.nvmlDeviceGetName(handle))
                slices = self._mig_slices(handle, index, name)
                if slices:
                    found.extend(slices)
                else:
                    self._handles[uuid] = handle
                    found.append(GpuInfo(uuid=uuid, index=index, name=name))
        except lib.NVMLError as exc:
            raise self._error(exc, "enumerate") from None
        if self.process_memory_factory is not None or self.process_utilization_factory is not None:
            bus_ids = self._bus_ids()
            if bus_ids != self._mapped_bus_ids:  # first time, or GPUs came or went
                if self.process_memory_factory is not None:
                    self.process_memory = self.process_memory_factory(bus_ids)
                if self.process_utilization_factory is not None:
                    self.process_utilization = self.process_utilization_factory(bus_ids)
                self._mapped_bus_ids = bus_ids
        return found

    def _bus_ids(self) -> dict[str, str]:
        """`{uuid: PCI bus id}` of the whole GPUs enumerated (what counters map by)."""
        out: dict[str, str] = {}
        for uuid, handle in self._handles.items():
            try:
                out[uuid] = _text(self.lib.nvmlDeviceGetPciInfo(handle).busId)
            except (self.lib.NVMLError, AttributeError):
                continue  # MIG slices and libraries without the query: no mapping
        return out

    def _mig_slices(self, handle: Any, index: int, name: str) -> list[GpuInfo]:
        lib = self.lib
        try:
            current, _pending = lib.nvmlDeviceGetMigMode(handle)
            if not current:
                return []
            slots = lib.nvmlDeviceGetMaxMigDeviceCount(handle)
        except (lib.NVMLError, AttributeError):
            return []  # no MIG support on this GPU or this library
        slices: list[GpuInfo] = []
        for slot in range(slots):
            try:
                mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except lib.NVMLError:
                continue  # empty slot
            uuid = _text(lib.nvmlDeviceGetUUID(mig))
            self._handles[uuid] = mig
            slices.append(GpuInfo(uuid=uuid, index=index, name=f"{name} MIG slice {slot}"))
        return slices

    def _handle(self, uuid: str) -> Any:
        handle = self._handles.get(uuid)
        if handle is None:
            handle = self.lib.nvmlDeviceGetHandleByUUID(uuid)
            self._handles[uuid] = handle
        return handle

    def _process_records(self, kind: str, handle: Any) -> list[Any]:
        """The records of one process list, through the newest of pynvml's calls that this
        driver has: pynvml's unversioned call asks for the `_v3` function, which a driver
        before R510 lacks (pynvml then raises `NVMLLibraryMismatchError`, not an NVMLError,
        or FUNCTION_NOT_FOUND); the `_v2` call is tried next and, once it answers, kept.

        Raises:
            NVMLError: the driver's error, or FUNCTION_NOT_FOUND when it has no such call.
        """
        lib = self.lib
        names = self._process_calls.setdefault(kind, list(_PROCESS_CALLS[kind]))
        mismatch = getattr(lib, "NVMLLibraryMismatchError", None)
        missing: tuple[type[BaseException], ...] = (mismatch,) if mismatch else ()
        while names:
            fn = getattr(lib, names[0], None)
            try:
                if fn is None:
                    raise lib.NVMLError(_ERR_FUNCTION_NOT_FOUND)
                return list(fn(handle))
            except missing:
                pass
            except lib.NVMLError as exc:
                if _nvml_code(exc) != _ERR_FUNCTION_NOT_FOUND or len(names) == 1:
                    raise
            log.info("NVML has no %s; using the next version", names[0])
            names.pop(0)
        raise lib.NVMLError(_ERR_FUNCTION_NOT_FOUND)

    def _processes(self, handle: Any) -> tuple[dict[int, ProcessSample], bool]:
        """The processes listed on `handle` and whether the list is known at all: a compute
        list that is not supported or not permitted (MIG slices, some containers) leaves
        per-process memory unknown, while the GPU itself stays usable; so does a list whose
        records do not look like NVML's (`records_garbled`)."""
        lib = self.lib
        out: dict[int, ProcessSample] = {}
        known = True
        for kind in ("compute", "graphics"):
            try:
                records = self._process_records(kind, handle)
            except lib.NVMLError as exc:
                code = _nvml_code(exc)
                if code in (_ERR_NOT_SUPPORTED, _ERR_FUNCTION_NOT_FOUND, _ERR_NO_PERMISSION):
                    if kind == "compute":
                        known = False  # graphics lists are often absent: that is no doubt
                    continue
                raise
            if records_garbled(records):
                if kind not in self._garbled_logged:
                    self._garbled_logged.add(kind)
                    log.warning(
                        "NVML's %s process list does not look like NVML's records (a driver "
                        "whose record size this pynvml does not know): per-process memory "
                        "is unknown",
                        kind,
                    )
                known = False
                continue
            for rec in records:
                pid = getattr(rec, "pid", 0)
                raw = getattr(rec, "usedGpuMemory", None)
                if not isinstance(pid, int) or pid <= 0 or pid >= _PID_LIMIT:
                    continue  # garbage record: its memory is inside device_used anyway
                mib = -(-raw // MIB) if isinstance(raw, int) and raw >= 0 else None
                prev = out.get(pid)
                if prev is not None:  # listed as compute and graphics: same context
                    mib = max(prev.used_mib or 0, mib or 0) if (prev.used_mib or mib) else None
                out[pid] = ProcessSample(pid=pid, used_mib=mib, kind=kind)
        return out, known

    def _utilization(self, uuid: str, handle: Any) -> dict[int, int] | None:
        """`{pid: percent}` of the processes that ran on `uuid` since the previous sample:
        NVML's (`_nvml_utilization`) joined with the per-process source's
        (`process_utilization`, on Windows the "GPU Engine" counters), a pid's percent the
        larger of the two; either alone where the other is unknown; None when both are.

        Joined rather than one chosen: under WDDM NVML often answers NOT_SUPPORTED, or
        NOT_FOUND (read `{}`) while the process works, and a process busy by either count
        is busy (a busy lease is never called idle). Never raises."""
        nvml = self._nvml_utilization(uuid, handle)
        if self.process_utilization is None:
            return nvml
        try:
            counted = self.process_utilization(uuid)
        except Exception as exc:  # a source must not fail a sample: unknown
            log.debug("GPU %s: per-process utilization source failed: %s", uuid, exc)
            counted = None
        if counted is None:
            return nvml
        counted = {p: min(100, u) for p, u in counted.items() if 0 < p < _PID_LIMIT and u > 0}
        if nvml is None:
            if (uuid, "counters") not in self._utilization_logged:
                self._utilization_logged.add((uuid, "counters"))
                log.info("GPU %s: per-process utilization from its counters, not NVML", uuid)
            return counted
        return {p: max(nvml.get(p, 0), counted.get(p, 0)) for p in nvml.keys() | counted.keys()}

    def _nvml_utilization(self, uuid: str, handle: Any) -> dict[int, int] | None:
        """`{pid: SM percent}` of the processes that ran kernels on `handle` since the
        previous call for `uuid` (NVML keeps a short buffer of samples; each answer starts
        after the newest timestamp seen), or None when it cannot be read. NVML answers
        NOT_FOUND when no process has a newer sample: that is `{}`, nothing busy. Never
        raises: every error (NOT_SUPPORTED on MIG slices and pre-Maxwell GPUs, no
        permission, a library without the call) is unknown, logged once per GPU and reason."""
        lib = self.lib
        fn = getattr(lib, "nvmlDeviceGetProcessUtilization", None)
        reason = "function_not_found"
        if fn is not None:
            try:
                records = list(fn(handle, self._utilization_seen.get(uuid, 0)))
            except lib.NVMLError as exc:
                code = _nvml_code(exc)
                if code == _ERR_NOT_FOUND:
                    return {}
                reason = _REASONS.get(code, f"nvml_error_{code}") if code else "internal"
            except Exception as exc:  # a library failing otherwise (pynvml mismatch): unknown
                reason = type(exc).__name__
            else:
                out: dict[int, int] = {}
                newest = self._utilization_seen.get(uuid, 0)
                for rec in records:
                    pid, util = getattr(rec, "pid", 0), getattr(rec, "smUtil", 0)
                    stamp = getattr(rec, "timeStamp", 0)
                    if isinstance(stamp, int):
                        newest = max(newest, stamp)
                    if not isinstance(pid, int) or pid <= 0 or pid >= _PID_LIMIT:
                        continue
                    if isinstance(util, int) and 0 < util <= 100:
                        out[pid] = max(out.get(pid, 0), util)
                self._utilization_seen[uuid] = newest
                return out
        if (uuid, reason) not in self._utilization_logged:
            self._utilization_logged.add((uuid, reason))
            log.info("GPU %s: per-process utilization unknown (%s)", uuid, reason)
        return None

    def _memory(self, uuid: str, handle: Any) -> tuple[int, int, str]:
        lib = self.lib
        v2_error = None
        if uuid not in self._v2_missing:
            try:
                mem = lib.nvmlDeviceGetMemoryInfo(handle, version=lib.nvmlMemory_v2)
                return int(mem.total), int(mem.free), "v2"
            except lib.NVMLError as exc:
                if _nvml_code(exc) not in (
                    _ERR_FUNCTION_NOT_FOUND,
                    _ERR_ARGUMENT_VERSION_MISMATCH,
                    _ERR_NOT_SUPPORTED,
                ):
                    raise
                v2_error = exc
        mem = lib.nvmlDeviceGetMemoryInfo(handle)
        if v2_error is not None:  # remembered only once v1 works: else nothing is missing
            log.info("GPU %s: NVML memory v2 unavailable (%s); using v1", uuid, v2_error)
            self._v2_missing.add(uuid)
        return int(mem.total), int(mem.free), "v1"

    def read(self, uuid: str) -> GpuSample:
        """Read one GPU: process lists, memory, process lists again.

        Returns:
            A `GpuSample` in MiB (total rounded down, used rounded up: cautious both ways).

        Raises:
            TelemetryError: `LOST` for a lost or vanished GPU, `UNKNOWN_CAPACITY` when the
                memory query is not supported, `UNAVAILABLE` for every other NVML error.
        """
        self._ensure_init()
        lib = self.lib
        started = self.clock()
        started_proc_s = process_clock_s()
        try:
            handle = self._handle(uuid)
            before, known_before = self._processes(handle)
            try:
                total_b, free_b, api = self._memory(uuid, handle)
            except lib.NVMLError as exc:
                override = self.capacity_overrides_mib.get(uuid)
                if _nvml_code(exc) == _ERR_NOT_SUPPORTED and override:
                    listed, listed_known = self._processes(handle)
                    if not listed_known or any(p.used_mib is None for p in listed.values()):
                        # Neither the device nor its processes say what is used: unknown is
                        # never 0 (that would grant past what is free).
                        raise TelemetryError(
                            TelemetryState.UNKNOWN_CAPACITY,
                            "used_unknown",
                            "the memory query is not supported and the memory of its "
                            "processes is unknown, so the memory in use cannot be known; "
                            "lease this GPU only where its driver reports per-process memory",
                        ) from None
                    used = sum(p.used_mib or 0 for p in listed.values())
                    total_b, free_b, api = (
                        override * MIB,
                        max(0, override - used) * MIB,
                        "override",
                    )
                elif _nvml_code(exc) == _ERR_NOT_SUPPORTED:
                    raise TelemetryError(
                        TelemetryState.UNKNOWN_CAPACITY,
                        "not_supported",
                        "the memory query is not supported on this GPU",
                    ) from None
                else:
                    raise
            after, known_after = self._processes(handle)
            processes_known = known_before and known_after and not self.foreign_pids
            utilization = self._utilization(uuid, handle) if processes_known else None
        except lib.NVMLError as exc:
            self._handles.pop(uuid, None)
            raise self._error(exc, f"read {uuid}") from None
        total_mib = total_b // MIB
        used_mib = -(-max(0, total_b - free_b) // MIB)
        procs: list[ProcessSample] = []
        for pid, late in after.items():
            early = before.get(pid)
            mib: int | None
            if early is None:
                mib = 0  # appeared mid-sample: may be missing from device_used; attribute 0
            elif early.used_mib is None or late.used_mib is None:
                mib = None
            else:
                mib = min(early.used_mib, late.used_mib)
            if mib is not None and mib > total_mib:
                mib = None  # garbage: larger than the GPU
            if self.foreign_pids:
                mib = None  # another pid namespace's pid: unknown (device_used has it)
            procs.append(ProcessSample(pid, mib, late.kind))
        unknown = [p.pid for p in procs if p.used_mib is None]
        if unknown and self.process_memory is not None and not self.foreign_pids:
            counted = self.process_memory(uuid, unknown)
            procs = [
                ProcessSample(p.pid, counted[p.pid], p.kind)
                if p.used_mib is None and 0 <= counted.get(p.pid, -1) <= total_mib
                else p
                for p in procs
            ]
        return GpuSample(
            uuid=uuid,
            total_mib=total_mib,
            device_used_mib=used_mib,
            processes=tuple(procs),
            memory_api=api,
            started_at=started,
            finished_at=self.clock(),
            started_proc_s=started_proc_s,
            processes_known=processes_known,
            utilization=utilization,
        )

    def driver_version(self) -> str:
        """The driver version string, or `"unknown"`."""
        try:
            self._ensure_init()
            return _text(self.lib.nvmlSystemGetDriverVersion())
        except (TelemetryError, self.lib.NVMLError, AttributeError):
            return "unknown"


class AsyncSampler:
    """Reads GPUs off the event loop: one worker thread per GPU, one call in flight per GPU.

    `sample(uuid)` awaits the in-flight read if one is running, else starts one; it gives up
    after `deadline_s` with `TelemetryError(STALE, "timeout")` while the hung call keeps its
    thread (it cannot be cancelled) and no second call is started until it returns.
    """

    def __init__(self, gateway: NvmlGateway, deadline_s: float = 1.5) -> None:
        self.gateway = gateway
        self.deadline_s = deadline_s
        self._executors: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
        self._inflight: dict[str, tuple[float, concurrent.futures.Future[GpuSample]]] = {}

    def busy(self, uuid: str) -> bool:
        """True while a read of `uuid` is still running (possibly hung)."""
        entry = self._inflight.get(uuid)
        return entry is not None and not entry[1].done()

    async def sample(self, uuid: str) -> GpuSample:
        """Read `uuid` within the deadline. Raises `TelemetryError`."""
        entry = self._inflight.get(uuid)
        if entry is None or entry[1].done():
            executor = self._executors.get(uuid)
            if executor is None:
                executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=f"nvml-{uuid[:12]}"
                )
                self._executors[uuid] = executor
            entry = (time.monotonic(), executor.submit(self.gateway.read, uuid))
            self._inflight[uuid] = entry
        started, fut = entry
        remaining = max(0.0, started + self.deadline_s - time.monotonic())
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), remaining)
        except TimeoutError:
            raise TelemetryError(
                TelemetryState.STALE,
                "timeout",
                f"NVML call running for {time.monotonic() - started:.1f} s",
            ) from None

    def close(self) -> None:
        """Stop the worker threads without waiting for hung calls."""
        for executor in self._executors.values():
            executor.shutdown(wait=False, cancel_futures=True)
        self._executors.clear()


# -- the real library (nvidia-ml-py) ---------------------------------------------------------
def _find_windows_nvml() -> None:
    """Load nvml.dll from where Windows drivers put it, or fail with where it looked.

    Raises:
        TelemetryError: no nvml.dll found (state and reason from `NvmlNotFound`).
    """
    try:
        where = preload_windows_nvml(pynvml)
    except NvmlNotFound as exc:
        raise TelemetryError(exc.state, exc.reason, str(exc), words=str(exc)) from None
    log.info("NVML library: %s", where)


def real_gateway() -> NvmlGateway:
    """A gateway over the real NVML, whether or not it initialises now (its calls then raise
    `TelemetryError`). On Windows it first finds nvml.dll (`rbroker.gpu.nvml_discovery`)."""
    gateway = NvmlGateway(pynvml, source="nvml")
    if sys.platform == "win32":
        gateway.before_init = _find_windows_nvml
    return gateway


def real_nvml_available() -> bool:
    """True when the real NVML library initialises (an NVIDIA driver is present); it is shut
    down again before returning."""
    try:
        if sys.platform == "win32":
            preload_windows_nvml(pynvml)
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError, NvmlNotFound):
        return False
    with contextlib.suppress(pynvml.NVMLError):
        pynvml.nvmlShutdown()
    return True
