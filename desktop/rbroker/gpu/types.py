"""Plain value types for GPU telemetry, free of any NVML import."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class TelemetryState(StrEnum):
    """Health of a GPU's telemetry (architecture.md §2). Only `ok` allows admission."""

    OK = "ok"
    STALE = "stale"  # the last good sample is older than max_sample_age (slow or hung call)
    UNAVAILABLE = "unavailable"  # NVML errors (version mismatch, unknown, no permission, ...)
    LOST = "lost"  # NVML says the GPU is lost / fell off the bus
    UNKNOWN_CAPACITY = "unknown_capacity"  # memory query not supported, no configured override


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """A capacity unit found at enumeration: a whole GPU or a MIG slice.

    `index` is for display only: indices shift when a GPU disappears; `uuid` is the key.
    """

    uuid: str
    index: int
    name: str


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process the driver lists on a GPU. `used_mib=None` means unknown (counts as 0)."""

    pid: int
    used_mib: int | None
    kind: str  # "compute" | "graphics"


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One memory reading of a GPU, in MiB.

    `device_used_mib = total - free` (v2 'reserved' counts as used). `processes` holds the
    per-process readings; for each pid the smaller of the two process-list reads bracketing
    the memory read, so a process allocating or freeing mid-sample is never under-counted.
    `started_at` is the monotonic time the first NVML call of the sample began,
    `started_proc_s` the same instant on the clock of process start times
    (`rbroker.base.proctime.process_clock_s`, so that the two compare).
    `processes_known` is False when the driver's process list could not be read (not
    supported, not permitted, another pid namespace): per-process memory is then unknown.
    `utilization` maps pid → SM utilization in percent (1..100) of the processes NVML saw
    running kernels since the previous sample of the GPU (`nvmlDeviceGetProcessUtilization`);
    `{}` when it was read and none was busy, None when it is unknown (not supported, as on
    MIG slices; not permitted; the library lacks the call; another pid namespace; the
    process list unknown): never read as "idle".
    """

    uuid: str
    total_mib: int
    device_used_mib: int
    processes: tuple[ProcessSample, ...] = field(default_factory=tuple)
    memory_api: str = "v2"
    started_at: float = 0.0
    finished_at: float = 0.0
    started_proc_s: float = 0.0
    processes_known: bool = True
    utilization: dict[int, int] | None = None
