"""Worker: one client of the concurrent-admission test, for many rounds.

Usage: acquire_rounds.py SOCKET MIB
Prints `ready`, then obeys stdin lines: `go ROUND` opens a connection and asks for MIB with
wait_s 120 (prints `granted LEASE_ID` once granted, or `ended CODE` when the request ends
with an error); `close` closes that connection (its lease or waiting request ends with it)
and prints `closed`. Each round's request comes from this process alone, so the requests of
a round are twenty processes' (a process waiting behind its own lease would be refused).
"""

from __future__ import annotations

import sys
import threading

import rbroker


def main() -> int:
    socket_path, mib = sys.argv[1], int(sys.argv[2])
    print("ready", flush=True)
    client: rbroker.Client | None = None
    waiter: threading.Thread | None = None
    for line in sys.stdin:
        word, _, arg = line.strip().partition(" ")
        if word == "go":
            client = rbroker.Client(socket_path, timeout_s=150)

            def ask(c: rbroker.Client = client, round_no: str = arg) -> None:
                try:
                    lease = c.call(
                        "lease.acquire", mib=mib, project="tests",
                        session=f"round-{round_no}", purpose="concurrent admission", wait_s=120,
                    )["lease"]  # fmt: skip
                    print(f"granted {lease['lease_id']}", flush=True)
                except rbroker.RBrokerError as exc:
                    print(f"ended {exc.code}", flush=True)

            waiter = threading.Thread(target=ask, daemon=True)
            waiter.start()
        elif word == "close" and client is not None:
            client.close()
            if waiter is not None:
                waiter.join(10)
            client = waiter = None
            print("closed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
