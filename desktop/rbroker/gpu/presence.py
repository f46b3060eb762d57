"""Is there an NVIDIA GPU on this computer at all, whatever NVML says?

When `nvmlInit` fails, the broker must tell "no NVIDIA GPU here" (start with no GPUs and say
how to try rbroker with `--simulate`) from "a GPU exists but NVML fails" (start fail-closed
and retry: after an unattended driver upgrade NVML answers `version mismatch` until the
next reboot, and on Jetson boards the device nodes exist without libnvidia-ml). The answer
comes from the OS, never from NVML: device nodes, the driver's /proc entries and PCI
vendor ids on Linux; the driver's DLLs on Windows.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

NVIDIA_PCI_VENDOR = "0x10de"
"""PCI vendor id of NVIDIA (the PCI-SIG vendor list)."""

_DISPLAY_CLASSES = ("0x0300", "0x0302")  # VGA-compatible and 3D controllers (PCI class codes)


def nvidia_device_present(root: Path = Path("/")) -> bool:
    """True when the OS shows an NVIDIA GPU: `/dev/nvidia[0-9]*`, `/dev/nvidiactl`,
    `/dev/nvhost-*` or `/dev/nvgpu` (Jetson), a directory in `/proc/driver/nvidia/gpus`,
    or a PCI display or 3D controller with vendor 0x10de under `/sys/bus/pci/devices`.

    `root` lets tests point at a prepared directory tree. On Windows: the driver's
    `nvapi64.dll` or `nvml.dll` in System32.
    """
    if sys.platform == "win32":
        system32 = Path(os.environ.get("SYSTEMROOT", r"C:\Windows")) / "System32"
        return any((system32 / name).exists() for name in ("nvapi64.dll", "nvml.dll"))
    dev = root / "dev"
    for pattern in ("nvidia[0-9]*", "nvidiactl", "nvhost-*", "nvgpu"):
        if any(dev.glob(pattern)):
            return True
    gpus = root / "proc" / "driver" / "nvidia" / "gpus"
    if gpus.is_dir() and any(gpus.iterdir()):
        return True
    pci = root / "sys" / "bus" / "pci" / "devices"
    if pci.is_dir():
        for device in pci.iterdir():
            try:
                vendor = (device / "vendor").read_text().strip()
                klass = (device / "class").read_text().strip()
            except OSError:
                continue
            if vendor == NVIDIA_PCI_VENDOR and klass[:6] in _DISPLAY_CLASSES:
                return True
    return False
