"""Choose the telemetry source: real NVML, or simulation only when asked for.

rbroker never simulates on its own: a broker that invented GPUs where NVML failed would grant
leases against memory that does not exist, on a computer whose real GPU is in use. Without
`--simulate` the broker reads real NVML; when `nvmlInit` fails it starts fail-closed (see
`rbroker.broker.service.Broker.start`) and retries.

On Windows the real gateway first finds `nvml.dll` (`rbroker.gpu.nvml_discovery`) and reads
per-process memory from the "GPU Process Memory" counters where NVML says None (WDDM,
`rbroker.gpu.wddm`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path

import pynvml

from rbroker.gpu.fake_nvml import FakeNvml
from rbroker.gpu.nvml import NvmlGateway, TelemetryError
from rbroker.gpu.nvml_discovery import NvmlNotFound, preload_windows_nvml
from rbroker.gpu.wddm import process_memory_source

log = logging.getLogger(__name__)


def real_nvml_available() -> bool:
    """True when the real NVML library initialises (an NVIDIA driver is present)."""
    try:
        if sys.platform == "win32":
            preload_windows_nvml(pynvml)
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError, NvmlNotFound):
        return False
    with contextlib.suppress(pynvml.NVMLError):
        pynvml.nvmlShutdown()
    return True


def _find_windows_nvml() -> None:
    """Load nvml.dll from where Windows drivers put it, or fail with where it looked."""
    try:
        where = preload_windows_nvml(pynvml)
    except NvmlNotFound as exc:
        raise TelemetryError(exc.state, exc.reason, str(exc), words=str(exc)) from None
    log.info("NVML library: %s", where)


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
        gateway = NvmlGateway(pynvml, source="nvml")
        if sys.platform == "win32":
            gateway.before_init = _find_windows_nvml
            gateway.process_memory_factory = process_memory_source
        return gateway, None
    fake = FakeNvml(scenario)
    return NvmlGateway(fake, source="simulated"), fake
