"""Simulated GPUs for tests: the scenario TOML that `rbroker broker --simulate` and the
in-process harness read (`rbroker.gpu.scenario`, architecture.md §6), built from arguments
instead of written out by hand.

    scenario(gpu(GPU0), gpu(GPU1, total_mib=8192))
    scenario(gpu(GPU0, per_process_memory=False, processes=[(4000, 10240)]))

Tests of the scenario file itself (its errors, every field) keep their TOML written out."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

GPU0 = "GPU-5a1e0000-0000-0000-0000-000000000001"
GPU1 = "GPU-5a1e0000-0000-0000-0000-000000000002"

Value = str | int | float | bool


def _toml(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string for the text tests use
    return repr(value)


def _table(header: str, fields: Mapping[str, Value | None]) -> str:
    lines = [header]
    lines += [f"{key} = {_toml(value)}" for key, value in fields.items() if value is not None]
    return "\n".join(lines) + "\n"


def gpu(
    uuid: str = GPU0,
    *,
    total_mib: int = 24576,
    processes: Iterable[tuple[int, int | None] | tuple[int, int | None, str]] = (),
    utilization: Mapping[int, int] | None = None,
    **fields: Value | None,
) -> str:
    """One `[[gpu]]` block: `uuid`, `total_mib` (MiB), any other field of
    `rbroker.gpu.scenario.SimGpu` by name (`name`, `used_mib`, `reserved_mib`,
    `memory_api`, `per_process_memory`, `error`, ...; `None` leaves it out), and the
    processes the driver lists as `(pid, used_mib)` or `(pid, used_mib, kind)` (`used_mib`
    `None`: not reported), and `utilization`: `{pid: SM percent}` of listed processes (what
    `nvmlDeviceGetProcessUtilization` answers; a pid not listed is not in its answer)."""
    text = _table("[[gpu]]", {"uuid": uuid, "total_mib": total_mib, **fields})
    for pid, used_mib, *kind in processes:
        text += "\n" + _table(
            "[[gpu.process]]",
            {
                "pid": pid,
                "used_mib": used_mib,
                "kind": kind[0] if kind else None,
                "sm_util": (utilization or {}).get(pid),
            },
        )
    return text


def scenario(
    *gpus: str,
    timers: Mapping[str, Value] | None = None,
    nvml: Mapping[str, Value] | None = None,
) -> str:
    """A scenario file's text: the `gpu(...)` blocks in order (the first is index 0), then
    the `[timers]` and `[nvml]` tables when given."""
    parts = list(gpus)
    if timers:
        parts.append(_table("[timers]", timers))
    if nvml:
        parts.append(_table("[nvml]", nvml))
    return "\n".join(parts)
