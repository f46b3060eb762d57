"""Worker: take a lease, then fork a child that keeps the lease's connection open.

Usage: fork_and_hold.py SOCKET MIB
Prints `granted LEASE_ID GPU_UUID`, then `child PID`. The child inherits the socket and
sleeps for 60 s (or until killed), so killing this process leaves the connection open.
"""

from __future__ import annotations

import os
import sys
import time

import rbroker


def main() -> int:
    socket_path, mib = sys.argv[1], int(sys.argv[2])
    client = rbroker.Client(socket_path)
    result = client.call(
        "lease.acquire", mib=mib, project="tests", session="forked", purpose="outlive holder"
    )
    print(f"granted {result['lease']['lease_id']} {result['lease']['gpu_uuid']}", flush=True)
    pid = os.fork()
    if pid == 0:  # the child: keep the inherited socket open, never speak on it
        os.setsid()
        time.sleep(60)
        os._exit(0)
    print(f"child {pid}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
