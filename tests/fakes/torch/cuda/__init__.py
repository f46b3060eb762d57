"""`torch.cuda` of the stand-in: devices with `FAKE_TORCH_TOTAL_BYTES` (comma separated per
device) of memory; `set_per_process_memory_fraction` is recorded."""

from __future__ import annotations

import os
from dataclasses import dataclass

from torch import record


@dataclass
class _Properties:
    name: str
    total_memory: int


def _totals() -> list[int]:
    return [int(t) for t in os.environ["FAKE_TORCH_TOTAL_BYTES"].split(",")]


def device_count() -> int:
    return len(_totals())


def get_device_properties(device: int) -> _Properties:
    return _Properties("Fake GPU", _totals()[device])


def set_per_process_memory_fraction(fraction: float, device: int = 0) -> None:
    if not 0 <= fraction <= 1:
        raise ValueError(f"invalid fraction {fraction}")
    if device >= device_count():
        raise RuntimeError(f"invalid device {device}")
    record("set_per_process_memory_fraction", fraction=fraction, device=device)
