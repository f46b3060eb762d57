"""Worker: as another OS user, hold a lease and queue a request that cannot fit yet.

Usage: hold_and_wait_as.py UID SOCKET HOLD_MIB WAIT_MIB
Drops to UID, takes a lease of HOLD_MIB with the SDK (heartbeats on), prints `held LEASE_ID`,
then asks for WAIT_MIB with wait_s 600 on another connection (an amount that other users'
leases keep out, not its own: behind its own lease it would be refused at once) and prints
what became of each:
`lost REASON` when the held lease is ended by someone else, `waiter CODE MESSAGE` when the
waiting request ends with an error. Exits after both or after 60 s.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import rbroker
import rbroker.transport.unix  # the client's end, loaded on connect

# `import rbroker` loads its names on first use: load them while still root, since the
# interpreter of a test run may live in a home only root can read
for _name in rbroker.__all__:
    getattr(rbroker, _name)


def main() -> int:
    uid, socket_path = int(sys.argv[1]), sys.argv[2]
    hold_mib, wait_mib = int(sys.argv[3]), int(sys.argv[4])
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    done = threading.Event()

    def wait() -> None:
        try:
            with rbroker.Client(socket_path, timeout_s=120) as c:
                c.call(
                    "lease.acquire", mib=wait_mib, wait_s=600, project="p", session="waiter",
                    purpose="waits for room",
                )  # fmt: skip
            print("waiter granted", flush=True)
        except rbroker.RBrokerError as exc:
            print(f"waiter {exc.code} {exc}", flush=True)
        done.set()

    with rbroker.lease(
        mib=hold_mib, socket=socket_path, project="p", session="holder", purpose="holds"
    ) as lease:
        print(f"held {lease.lease_id}", flush=True)
        threading.Thread(target=wait, daemon=True).start()
        deadline = time.monotonic() + 60
        while not lease.lost and time.monotonic() < deadline:
            time.sleep(0.05)
        if lease.lost:
            print(f"lost {lease.error}", flush=True)
        done.wait(max(0.0, deadline - time.monotonic()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
