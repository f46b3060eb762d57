"""Worker: take a lease through the SDK, say so on stdout, then hold it until killed.

Usage: hold_lease.py SOCKET MIB SESSION WAIT_S [TTL_S [GPU_UUID]]
GPU_UUID pins the lease to that GPU. Prints `granted LEASE_ID GPU_UUID` once the lease is
granted, or `error CODE` if refused.
"""

from __future__ import annotations

import sys
import time

import rbroker


def main() -> int:
    socket_path, mib, session, wait_s = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    ttl_s = float(sys.argv[5]) if len(sys.argv) > 5 else 30.0  # the SDK's default
    gpu_uuid = sys.argv[6] if len(sys.argv) > 6 else None
    try:
        with rbroker.lease(
            mib,
            project="tests",
            session=session,
            purpose="hold a lease until killed",
            wait_s=float(wait_s),
            socket=socket_path,
            ttl_s=ttl_s,
            gpu_uuid=gpu_uuid,
        ) as lease:
            print(f"granted {lease.lease_id} {lease.gpu_uuid}", flush=True)
            while True:
                time.sleep(3600)
    except rbroker.RBrokerError as exc:
        print(f"error {exc.code}", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
