"""Worker: talk to a broker as another OS user (the test runs as root and drops to it).

Usage: as_other_user.py UID SOCKET LEASE_ID
Drops to UID (its group too), then prints one JSON object: `unavailable` (the message) when
it cannot connect; else `owner` (from hello), `lease.release`, `lease.renew` and
`lease.resize` (the error codes when it touches LEASE_ID) and `acquired_owner` (the owner of
a lease it takes itself).
"""

from __future__ import annotations

import json
import os
import sys

import rbroker
import rbroker.transport.unix  # the client's end, loaded on connect

# `import rbroker` loads its names on first use: load them while still root, since the
# interpreter of a test run may live in a home only root can read
for _name in rbroker.__all__:
    getattr(rbroker, _name)


def main() -> int:
    uid, socket_path, lease_id = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    out: dict[str, object] = {}
    try:
        with rbroker.Client(socket_path) as c:
            out["owner"] = c.hello()["owner"]
            for method, params in (
                ("lease.renew", {}),
                ("lease.release", {}),
                ("lease.resize", {"mib": 1024}),
            ):
                try:
                    c.call(method, lease_id=lease_id, **params)
                    out[method] = "ok"
                except rbroker.RBrokerError as exc:
                    out[method] = exc.code
            lease = c.call(
                "lease.acquire", mib=1024, project="tests", session="other", purpose="other user"
            )["lease"]
            out["acquired_owner"] = lease["owner"]
    except rbroker.BrokerUnavailable as exc:
        out["unavailable"] = exc.message
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
