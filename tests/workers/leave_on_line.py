"""Worker: take a lease through the SDK, leave its `with` block when a line arrives on stdin,
then stay alive without it.

Usage: leave_on_line.py SOCKET MIB TTL_S
Prints `granted LEASE_ID` once granted, `left` after the block has exited.
"""

from __future__ import annotations

import sys
import time

import rbroker


def main() -> int:
    socket_path, mib, ttl_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    with rbroker.lease(
        mib,
        project="tests",
        session="leave-on-line",
        purpose="leave the lease while the broker is down",
        ttl_s=ttl_s,
        socket=socket_path,
    ) as lease:
        print(f"granted {lease.lease_id}", flush=True)
        sys.stdin.readline()
    print("left", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
