"""Worker: take a lease through the SDK, then keep the main thread CPU-bound.

Usage: cpu_bound_holder.py SOCKET MIB TTL_S SECONDS
Prints `granted LEASE_ID`, runs a pure-Python loop for SECONDS without ever yielding on
purpose, then prints `done lost=BOOL cpu_s=SECONDS` and releases the lease on exit.
"""

from __future__ import annotations

import sys
import time

import rbroker


def main() -> int:
    socket_path, mib, ttl_s, seconds = sys.argv[1], int(sys.argv[2]), *map(float, sys.argv[3:5])
    with rbroker.lease(
        mib,
        project="tests",
        session="cpu-bound",
        purpose="busy main thread",
        ttl_s=ttl_s,
        socket=socket_path,
    ) as lease:
        print(f"granted {lease.lease_id}", flush=True)
        cpu_start = time.process_time()
        end = time.monotonic() + seconds
        x = 0
        while time.monotonic() < end:
            for i in range(10_000):
                x = (x * 31 + i) % 1_000_003
        cpu_s = time.process_time() - cpu_start
        print(f"done lost={lease.lost} cpu_s={cpu_s:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
