"""Worker: the command run under `rbroker run`; reports what it sees, then ends as told.

Usage: report_env.py OUT_FILE HOW
Writes a JSON object to OUT_FILE: CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER and
RBROKER_LEASE_ID (null when unset), its own pid and, when RBROKER_SOCKET is set, the
broker's active leases at that moment.
HOW: an integer exit code; `kill9` (die by SIGKILL); `sleep` (print `ready`, then sleep
until a signal ends the process).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import rbroker


def main() -> int:
    out, how = Path(sys.argv[1]), sys.argv[2]
    report: dict[str, object] = {
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cuda_device_order": os.environ.get("CUDA_DEVICE_ORDER"),
        "lease_id": os.environ.get("RBROKER_LEASE_ID"),
        "pid": os.getpid(),
    }
    socket_path = os.environ.get("RBROKER_SOCKET")
    if socket_path:
        with rbroker.Client(socket_path) as c:
            report["active_leases"] = c.leases()["leases"]
    out.write_text(json.dumps(report))
    if how == "kill9":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "sleep":
        print("ready", flush=True)
        while True:
            time.sleep(3600)
    return int(how)


if __name__ == "__main__":
    sys.exit(main())
