"""Worker (real GPU only): take a lease, then allocate GPU memory inside it with PyTorch.

Usage: cuda_alloc.py SOCKET LEASE_MIB ALLOC_MIB
Prints `granted LEASE_ID GPU_UUID`, then `context MIB` (what NVML lists for this process
once the CUDA context exists, before the allocation; -1 when NVML does not list it), then
`allocated MIB`, then waits for a line on stdin and releases the lease.
CUDA_VISIBLE_DEVICES is set to the granted GPU before torch is imported.
"""

from __future__ import annotations

import os
import sys

import pynvml

import rbroker


def _listed_mib(uuid: str) -> int:
    """MiB NVML lists for this pid on `uuid` (-1: not listed, e.g. another pid namespace)."""
    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
    for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if proc.pid == os.getpid() and isinstance(proc.usedGpuMemory, int):
            return int(proc.usedGpuMemory) // (1024 * 1024)
    return -1


def main() -> int:
    socket_path, lease_mib, alloc_mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with rbroker.lease(
        lease_mib,
        project="tests",
        session="real-gpu",
        purpose="allocate inside a lease",
        socket=socket_path,
    ) as lease:
        print(f"granted {lease.lease_id} {lease.gpu_uuid}", flush=True)
        os.environ["CUDA_VISIBLE_DEVICES"] = lease.cuda_visible_devices
        import torch

        pynvml.nvmlInit()
        torch.zeros(1, device="cuda")  # creates the CUDA context
        torch.cuda.synchronize()
        print(f"context {_listed_mib(lease.gpu_uuid)}", flush=True)
        block = torch.empty(alloc_mib * 1024 * 1024, dtype=torch.uint8, device="cuda")
        block.fill_(1)
        torch.cuda.synchronize()
        print(f"allocated {alloc_mib}", flush=True)
        sys.stdin.readline()
        del block
    return 0


if __name__ == "__main__":
    sys.exit(main())
