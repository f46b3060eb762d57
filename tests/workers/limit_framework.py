"""Worker: hold a real lease through the SDK and cap a framework with it.

Usage: limit_framework.py SOCKET MIB GPUS WHICH ENV_FORM
(FAKE_TORCH_TOTAL_BYTES=lease: the torch stand-in's devices get the lease's GPUs' totals.)
WHICH: `torch` or `tensorflow`. ENV_FORM: `lease` (CUDA_VISIBLE_DEVICES from
`lease.cuda_env()` first) or `none` (left as it is). Prints one JSON line: the lease's id,
GPUs, totals and `memory_fraction`, what the limit call returned (or its error), and the
lease as the broker lists it after the call.
"""

from __future__ import annotations

import json
import os
import sys

import rbroker


def main() -> int:
    socket_path, mib, gpus, which, env_form = sys.argv[1:6]
    with rbroker.lease(
        int(mib), gpus=int(gpus), project="tests", session="limit", socket=socket_path
    ) as lease:
        if env_form == "lease":
            os.environ.update(lease.cuda_env())
        if os.environ.get("FAKE_TORCH_TOTAL_BYTES") == "lease" and lease.gpu_total_mib:
            # the stand-in's devices as large as the lease's GPUs, in the lease's order
            totals = [t * 2**20 for t in lease.gpu_total_mib]
            os.environ["FAKE_TORCH_TOTAL_BYTES"] = ",".join(str(t) for t in totals)
        out: dict[str, object] = {
            "lease_id": lease.lease_id,
            "gpu_uuids": lease.gpu_uuids,
            "gpu_total_mib": lease.gpu_total_mib,
            "memory_fraction": lease.memory_fraction,
            "memory_fractions": lease.memory_fractions,
        }
        try:
            out["result"] = lease.limit_torch() if which == "torch" else lease.limit_tensorflow()
        except (RuntimeError, ImportError) as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
        with rbroker.Client(socket_path) as c:
            out["listed"] = [x for x in c.leases()["leases"] if x["lease_id"] == lease.lease_id]
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
