"""Worker: take a lease, use simulated memory on the granted GPU, hold both until killed.

Usage: lease_worker.py SOCKET MIB PROJECT SESSION PURPOSE [USE_MIB] [ANY EXTRA ARGS...]
Extra arguments are ignored: tests plant secret-looking ones that must never leave the
computer. Prints `granted LEASE_ID GPU_UUID PID` once the lease is granted and the memory
is in use, or `error CODE` if refused.
"""

from __future__ import annotations

import os
import sys
import time

import rbroker


def main() -> int:
    socket_path, mib, project, session, purpose = sys.argv[1:6]
    use = int(sys.argv[6]) if len(sys.argv) > 6 and sys.argv[6].isdigit() else 0
    try:
        with (
            rbroker.lease(
                int(mib),
                project=project,
                session=session,
                purpose=purpose,
                wait_s=30,
                socket=socket_path,
            ) as lease,
            rbroker.Client(socket_path) as sim,
        ):
            if use:
                sim.sim_allocate(use, gpu_uuid=lease.gpu_uuid)
            print(f"granted {lease.lease_id} {lease.gpu_uuid} {os.getpid()}", flush=True)
            while True:
                time.sleep(3600)
    except rbroker.RBrokerError as exc:
        print(f"error {exc.code}", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
