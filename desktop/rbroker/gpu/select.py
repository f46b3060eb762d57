"""Choose the telemetry source: real NVML, or simulation only when asked for.

rbroker never simulates on its own: a broker that invented GPUs where NVML failed would grant
leases against memory that does not exist, on a computer whose real GPU is in use. Without
`--simulate` the broker reads real NVML; when `nvmlInit` fails it starts fail-closed (see
`rbroker.broker.service.Broker.start`) and retries.

The real library is reached through `rbroker.gpu.nvml` alone (`real_gateway`, which on
Windows first finds `nvml.dll`); here it is given the per-process memory of the "GPU Process
Memory" counters for where NVML says None (WDDM, `rbroker.gpu.wddm`), and the per-process
utilization of the "GPU Engine" counters beside NVML's (which WDDM often lacks).
"""

from __future__ import annotations

import sys
from pathlib import Path

from rbroker.gpu.fake_nvml import FakeNvml
from rbroker.gpu.nvml import NvmlGateway, real_gateway
from rbroker.gpu.wddm import process_memory_source, process_utilization_source


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
        gateway = real_gateway()
        if sys.platform == "win32":
            gateway.process_memory_factory = process_memory_source
            gateway.process_utilization_factory = process_utilization_source
        return gateway, None
    fake = FakeNvml(scenario)
    return NvmlGateway(fake, source="simulated"), fake
