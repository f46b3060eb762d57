"""Worker (real GPU only): take a lease, cap a framework at it, allocate past the cap.

Usage: capped_alloc.py SOCKET LEASE_MIB FRAMEWORK
FRAMEWORK `torch`: `lease.limit_torch()`, then half the grant (fits), then the whole grant
on top (past the cap). `jax`: run under `rbroker run` instead (see the test); here it reads
`XLA_PYTHON_CLIENT_MEM_FRACTION` from the lease before JAX starts and does the same.
Prints one JSON line: the fractions, whether the first allocation worked, the error the
second raised (its type name), and whether the lease was still active afterwards.
"""

from __future__ import annotations

import json
import os
import sys

import rbroker

MIB = 1024 * 1024


def main() -> int:
    socket_path, lease_mib, framework = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    out: dict[str, object] = {}
    with rbroker.lease(
        lease_mib, project="tests", session="capped", purpose="allocate past the cap",
        socket=socket_path,
    ) as lease:  # fmt: skip
        os.environ.update(lease.cuda_env())
        out["memory_fraction"] = lease.memory_fraction
        if framework == "torch":
            import torch

            out["fractions"] = lease.limit_torch()
            first = torch.empty(lease_mib // 2 * MIB, dtype=torch.uint8, device="cuda:0")
            out["first_ok"] = True
            try:
                second = torch.empty(lease_mib * MIB, dtype=torch.uint8, device="cuda:0")
                out["second_error"] = None
                del second
            except torch.cuda.OutOfMemoryError as exc:
                out["second_error"] = type(exc).__name__
                out["message"] = str(exc).splitlines()[0]
            del first
        else:
            os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{lease.memory_fraction:.6f}"
            import jax.numpy as jnp

            first = jnp.ones((lease_mib // 2 * MIB // 4,), dtype=jnp.float32)
            first.block_until_ready()
            out["first_ok"] = True
            try:
                second = jnp.ones((lease_mib * MIB // 4,), dtype=jnp.float32)
                second.block_until_ready()
                out["second_error"] = None
            except Exception as exc:  # jaxlib's XlaRuntimeError: RESOURCE_EXHAUSTED
                out["second_error"] = type(exc).__name__
                out["message"] = str(exc).splitlines()[0]
        with rbroker.Client(socket_path) as c:
            out["lease_active"] = any(
                x["lease_id"] == lease.lease_id and x["state"] == "active"
                for x in c.leases()["leases"]
            )
        lease.check()  # not lost
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
