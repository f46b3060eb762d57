"""Choose the telemetry source: real NVML, or simulation only when asked for.

rbroker never simulates on its own: a broker that invented GPUs where NVML failed would grant
leases against memory that does not exist, on a computer whose real GPU is in use. Without
`--simulate` the broker reads real NVML; when `nvmlInit` fails it starts fail-closed (see
`rbroker.broker.service.Broker.start`) and retries.
"""

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
    """Build the gateway: simulated only when `simulate`, else real NVML (even when it does
    not initialise now: the broker then fails closed and retries).

    Returns:
        `(gateway, fake)`; `fake` is the simulated library (for `sim.*` methods) or None.

    Raises:
        rbroker.gpu.scenario.ScenarioError: the scenario file is invalid.
    """
    if not simulate:
        return NvmlGateway(pynvml, source="nvml"), None
    fake = FakeNvml(scenario)
    return NvmlGateway(fake, source="simulated"), fake
