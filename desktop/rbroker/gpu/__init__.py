"""GPU telemetry: the single NVML gateway and the simulated NVML library that can feed it.

Only this package imports `pynvml` (from the nvidia-ml-py distribution).
"""

from rbroker.gpu.types import GpuInfo, GpuSample, ProcessSample, TelemetryState

__all__ = ["GpuInfo", "GpuSample", "ProcessSample", "TelemetryState"]
