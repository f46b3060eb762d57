"""Worker: take a lease through the SDK, then resize it with `Lease.resize()` to each size
that arrives as a line on stdin; hold it until killed.

Usage: resize_on_line.py SOCKET MIB
Prints `granted LEASE_ID` once granted and `resized MIB` after each resize (or `error CODE`).
"""

from __future__ import annotations

import sys

import rbroker


def main() -> int:
    socket_path, mib = sys.argv[1], int(sys.argv[2])
    with rbroker.lease(
        mib,
        project="tests",
        session="resize-on-line",
        purpose="resize the lease when told",
        socket=socket_path,
    ) as lease:
        print(f"granted {lease.lease_id}", flush=True)
        for line in sys.stdin:
            try:
                lease.resize(int(line))
                print(f"resized {lease.granted_mib}", flush=True)
            except rbroker.RBrokerError as exc:
                print(f"error {exc.code}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
