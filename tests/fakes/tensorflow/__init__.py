"""A stand-in for `tensorflow` that records `tf.config` calls (see tests/fakes/README.md):
`FAKE_TF_GPUS` physical GPUs."""

from __future__ import annotations

import json
import os
import types
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PhysicalDevice:
    name: str
    device_type: str


@dataclass(frozen=True)
class LogicalDeviceConfiguration:
    memory_limit: int | None = None


def _record(call: str, **args: Any) -> None:
    with open(os.environ["FAKE_FRAMEWORK_LOG"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"call": call, **args}) + "\n")


def list_physical_devices(device_type: str | None = None) -> list[PhysicalDevice]:
    n = int(os.environ.get("FAKE_TF_GPUS", "1"))
    return [PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(n)]


def set_logical_device_configuration(
    device: PhysicalDevice, logical_devices: list[LogicalDeviceConfiguration]
) -> None:
    _record(
        "set_logical_device_configuration",
        device=device.name,
        memory_limits=[c.memory_limit for c in logical_devices],
    )


config = types.SimpleNamespace(
    list_physical_devices=list_physical_devices,
    set_logical_device_configuration=set_logical_device_configuration,
    LogicalDeviceConfiguration=LogicalDeviceConfiguration,
)
__version__ = "0.0-fake"
