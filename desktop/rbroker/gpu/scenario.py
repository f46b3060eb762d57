"""The simulation scenario file (architecture.md §6): a TOML list of GPUs and their processes.

The format is a contract that tests and outside checks write; see `DEFAULT_SCENARIO`.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

MEMORY_APIS = ("v2", "v1", "not_supported")
ERRORS = ("", "gpu_lost", "unknown", "version_mismatch", "no_permission", "not_supported")
PROCESS_LIST_ERRORS = ("", "no_permission", "not_supported")
UTILIZATION_ERRORS = ("", "no_permission", "not_supported")
"""Values of a GPU's `utilization_error`: what `nvmlDeviceGetProcessUtilization` raises there
(`not_supported` is what NVML answers on a MIG slice and on GPUs before Maxwell)."""
INIT_ERRORS = ("", "version_mismatch", "library_not_found", "driver_not_loaded", "unknown")
"""Values of `[nvml] init_error`: what `nvmlInit` raises (a GPU exists, its NVML fails)."""

DEFAULT_SCENARIO = """\
# Two simulated 24 GiB GPUs, empty: what `rbroker broker --simulate` runs without a file.
[[gpu]]
name = "Simulated RTX 4090"
total_mib = 24576

[[gpu]]
name = "Simulated RTX 4090"
total_mib = 24576
"""


TIMERS = (
    "sample_interval_s",
    "tick_s",
    "holder_check_s",
    "stall_threshold_s",
    "max_sample_age_s",
    "nvml_deadline_s",
    "release_sample_gap_s",
    "reattach_grace_s",
    "lease_reattach_grace_s",
    "absence_confirm_s",
    "absence_confirm_samples",
    "nvml_retry_max_s",
    "enumerate_interval_s",
    "over_grant_grace_s",
)
"""Keys of the scenario's `[timers]` table: the `BrokerConfig` settings of the same names
(seconds; `absence_confirm_samples` a count). Only a simulated broker reads a scenario, so a
broker on real GPUs never runs on shortened timers; tests use the table to make a broker
process keep its rules on a shorter time scale."""


class ScenarioError(ValueError):
    """The scenario file is not valid; the message names the GPU position and the field."""


@dataclass(frozen=True, slots=True)
class SimProcess:
    """A process the simulated driver lists. `used_mib=None` is unknown. `sm_util` is its
    SM utilization in percent (0..100) as `nvmlDeviceGetProcessUtilization` reports it; 0 or
    None: it is not in that call's answer (NVML lists only processes that ran kernels)."""

    pid: int
    used_mib: int | None = None
    kind: str = "compute"
    sm_util: int | None = None


@dataclass(frozen=True, slots=True)
class SimGpu:
    """One simulated GPU, every field as in the scenario TOML (MiB, seconds)."""

    uuid: str
    name: str = "Simulated GPU"
    total_mib: int = 24576
    reserved_mib: int = 0
    used_mib: int = 0
    device_used_mib: int | None = None
    memory_api: str = "v2"
    per_process_memory: bool = True
    error: str = ""
    process_list_error: str = ""
    utilization_error: str = ""
    delay_s: float = 0.0
    processes: tuple[SimProcess, ...] = field(default_factory=tuple)

    def with_changes(self, **changes: Any) -> SimGpu:
        """A copy with `changes` applied and validated (used by `sim.set`)."""
        return _validate(replace(self, **changes), 0)


def default_uuid(position: int) -> str:
    """The UUID given to the GPU at `position` (0-based) when the file names none."""
    return f"GPU-5a1e0000-0000-0000-0000-{position + 1:012d}"


_TEXT_FIELDS = ("uuid", "name", "memory_api", "error", "process_list_error", "utilization_error")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _validate(gpu: SimGpu, position: int) -> SimGpu:
    for name in _TEXT_FIELDS:
        value = getattr(gpu, name)
        if not isinstance(value, str):
            raise ScenarioError(f"gpu #{position + 1}: {name} must be a string, got {value!r}")
    where = f"gpu #{position + 1} ({gpu.uuid})"
    if not gpu.name.strip():
        raise ScenarioError(f"{where}: name must not be empty")
    if not isinstance(gpu.per_process_memory, bool):
        raise ScenarioError(
            f"{where}: per_process_memory must be true or false, got {gpu.per_process_memory!r}"
        )
    for name in ("total_mib", "reserved_mib", "used_mib"):
        value = getattr(gpu, name)
        if not _is_int(value) or value < 0:
            raise ScenarioError(f"{where}: {name} must be a non-negative integer, got {value!r}")
    if gpu.total_mib <= 0:
        raise ScenarioError(f"{where}: total_mib must be positive")
    if gpu.device_used_mib is not None and (
        not _is_int(gpu.device_used_mib) or not 0 <= gpu.device_used_mib <= gpu.total_mib
    ):
        raise ScenarioError(f"{where}: device_used_mib must be within 0..{gpu.total_mib}")
    if gpu.memory_api not in MEMORY_APIS:
        raise ScenarioError(f"{where}: memory_api must be one of {MEMORY_APIS}")
    if gpu.error not in ERRORS:
        raise ScenarioError(f"{where}: error must be one of {ERRORS}")
    if gpu.process_list_error not in PROCESS_LIST_ERRORS:
        raise ScenarioError(f"{where}: process_list_error must be one of {PROCESS_LIST_ERRORS}")
    if gpu.utilization_error not in UTILIZATION_ERRORS:
        raise ScenarioError(f"{where}: utilization_error must be one of {UTILIZATION_ERRORS}")
    delay = gpu.delay_s
    if (
        not isinstance(delay, int | float)
        or isinstance(delay, bool)
        or not math.isfinite(delay)
        or delay < 0
    ):
        raise ScenarioError(f"{where}: delay_s must be a finite non-negative number, got {delay!r}")
    if not gpu.uuid.startswith(("GPU-", "MIG-")):
        raise ScenarioError(f"{where}: uuid must start with GPU- or MIG-")
    return gpu


def parse_scenario(text: str) -> list[SimGpu]:
    """Parse scenario TOML text into GPUs.

    Raises:
        ScenarioError: bad TOML, unknown keys, wrong types or impossible values.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"not valid TOML: {exc}") from None
    extra_tables = set(doc) - {"gpu", "nvml", "timers"}
    if extra_tables:
        raise ScenarioError(f"unknown top-level keys {sorted(extra_tables)}")
    _parse_timers(doc.get("timers", {}))
    nvml_raw = doc.get("nvml", {})
    if not isinstance(nvml_raw, dict) or set(nvml_raw) - {"init_error"}:
        raise ScenarioError("[nvml] takes only init_error")
    if nvml_raw.get("init_error", "") not in INIT_ERRORS:
        raise ScenarioError(f"[nvml] init_error must be one of {INIT_ERRORS}")
    gpus_raw = doc.get("gpu", [])
    if not isinstance(gpus_raw, list) or not gpus_raw:
        raise ScenarioError("scenario needs at least one [[gpu]] table")
    known = set(SimGpu.__dataclass_fields__) - {"processes"} | {"process"}
    gpus: list[SimGpu] = []
    for position, raw in enumerate(gpus_raw):
        if not isinstance(raw, dict):
            raise ScenarioError(f"gpu #{position + 1}: must be a [[gpu]] table, got {raw!r}")
        unknown = set(raw) - known
        if unknown:
            raise ScenarioError(f"gpu #{position + 1}: unknown keys {sorted(unknown)}")
        procs = []
        procs_raw = raw.get("process", [])
        if not isinstance(procs_raw, list) or not all(isinstance(p, dict) for p in procs_raw):
            raise ScenarioError(f"gpu #{position + 1}: process must be [[gpu.process]] tables")
        for p in procs_raw:
            extra = set(p) - {"pid", "used_mib", "kind", "sm_util"}
            if extra:
                raise ScenarioError(f"gpu #{position + 1}: unknown process keys {sorted(extra)}")
            if not _is_int(p.get("pid")) or p["pid"] < 0:
                raise ScenarioError(f"gpu #{position + 1}: process pid must be an integer")
            kind = p.get("kind", "compute")
            if kind not in ("compute", "graphics"):
                raise ScenarioError(f"gpu #{position + 1}: process kind must be compute|graphics")
            used = p.get("used_mib")
            if used is not None and (not _is_int(used) or used < 0):
                raise ScenarioError(
                    f"gpu #{position + 1}: process used_mib must be an integer >= 0, got {used!r}"
                )
            sm_util = p.get("sm_util")
            if sm_util is not None and (not _is_int(sm_util) or not 0 <= sm_util <= 100):
                raise ScenarioError(
                    f"gpu #{position + 1}: process sm_util must be an integer percent 0..100, "
                    f"got {sm_util!r}"
                )
            procs.append(SimProcess(pid=p["pid"], used_mib=used, kind=kind, sm_util=sm_util))
        fields = {k: v for k, v in raw.items() if k != "process"}
        fields.setdefault("uuid", default_uuid(position))
        try:
            gpu = SimGpu(**fields, processes=tuple(procs))
        except TypeError as exc:
            raise ScenarioError(f"gpu #{position + 1}: {exc}") from None
        gpus.append(_validate(gpu, position))
    uuids = [g.uuid for g in gpus]
    if len(set(uuids)) != len(uuids):
        raise ScenarioError("two GPUs share a uuid")
    return gpus


def _parse_timers(raw: object) -> dict[str, float]:
    """The `[timers]` table, checked: known keys, finite positive numbers (a whole count of
    at least 1 for `absence_confirm_samples`).

    Raises:
        ScenarioError: not a table, an unknown key or an impossible value (named).
    """
    if not isinstance(raw, dict):
        raise ScenarioError("[timers] must be a table")
    unknown = set(raw) - set(TIMERS)
    if unknown:
        raise ScenarioError(f"[timers]: unknown keys {sorted(unknown)}")
    timers: dict[str, float] = {}
    for key, value in raw.items():
        if key == "absence_confirm_samples":
            if not _is_int(value) or value < 1:
                raise ScenarioError(f"[timers]: {key} must be an integer >= 1, got {value!r}")
        elif (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ScenarioError(f"[timers]: {key} must be a positive number, got {value!r}")
        timers[key] = value
    return timers


def scenario_timers(path: Path | None) -> dict[str, float]:
    """The `[timers]` of the scenario file at `path` (`{}` without a file or a table), as
    `BrokerConfig` field → value.

    Raises:
        ScenarioError: the file cannot be read or is invalid (its path first, as
            `load_scenario`).
    """
    if path is None:
        return {}
    load_scenario(path)  # every check, with the file's path in the message
    return _parse_timers(tomllib.loads(path.read_text(encoding="utf-8")).get("timers", {}))


def init_error(text: str) -> str:
    """The scenario's `[nvml] init_error` ("" when absent); the text must already parse."""
    table = tomllib.loads(text).get("nvml", {})
    return str(table.get("init_error", "")) if isinstance(table, dict) else ""


def load_scenario(path: Path | None) -> list[SimGpu]:
    """Read and parse a scenario file; `None` gives `DEFAULT_SCENARIO`.

    Raises:
        ScenarioError: the file cannot be read or is invalid; the message starts with its
            path (`/x/s.toml: not valid TOML: ...`).
    """
    if path is None:
        return parse_scenario(DEFAULT_SCENARIO)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read it: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        return parse_scenario(text)
    except ScenarioError as exc:
        raise ScenarioError(f"{path}: {exc}") from None
