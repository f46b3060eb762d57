"""Choose the telemetry source: real NVML when a driver answers, otherwise simulation."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import pynvml

from rbroker.gpu.fake_nvml import FakeNvml
from rbroker.gpu.nvml import NvmlGateway

log = logging.getLogger(__name__)


def real_nvml_available() -> bool:
    """True when the real NVML library initialises (an NVIDIA driver is present)."""
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError):
        return False
    with contextlib.suppress(pynvml.NVMLError):
        pynvml.nvmlShutdown()
    return True


def open_gateway(
    simulate: bool, scenario: Path | None = None
) -> tuple[NvmlGateway, FakeNvml | None]:
    """Build the gateway: simulated when `simulate` or when no NVML driver answers.

    Returns:
        `(gateway, fake)`; `fake` is the simulated library (for `sim.*` methods) or None.

    Raises:
        rbroker.gpu.scenario.ScenarioError: the scenario file is invalid.
    """
    if not simulate and real_nvml_available():
        return NvmlGateway(pynvml, source="nvml"), None
    fake = FakeNvml(scenario)
    return NvmlGateway(fake, source="simulated"), fake
