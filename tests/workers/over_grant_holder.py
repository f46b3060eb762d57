"""Worker: hold a lease through the SDK, use more simulated memory than it grants, and
report the over-grant warning the SDK gives.

Usage: over_grant_holder.py SOCKET MIB ALLOCATE_MIB MODE
MODE `warn`: record warnings; once `lease.over_grant` is set, wait 3 s more (a second
warning would come in that time if the episode were reported twice), free the memory, and
print one JSON line: the event's numbers and the OverGrantWarning messages seen.
MODE `error`: `OverGrantWarning` made an error by a warning filter; call `lease.check()` until
it raises, print `raised <message>`, and end the `with` block normally (it must not raise
the same warning again).
"""

from __future__ import annotations

import json
import sys
import time
import warnings

import rbroker


def main() -> int:
    socket_path, mib, allocate, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("error" if mode == "error" else "always", rbroker.OverGrantWarning)
        with rbroker.lease(mib, project="tests", session="over", socket=socket_path) as lease:
            with rbroker.Client(socket_path) as c:
                c.sim_allocate(allocate)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if mode == "error":
                    try:
                        lease.check()
                    except rbroker.OverGrantWarning as exc:
                        print(f"raised {exc}", flush=True)
                        break
                elif lease.over_grant is not None:
                    break
                time.sleep(0.05)
            if mode == "warn":
                time.sleep(3.0)
                with rbroker.Client(socket_path) as c:
                    listed = c.leases()["leases"]
                    c.sim_free()
                found = [str(w.message) for w in seen if w.category is rbroker.OverGrantWarning]
                print(
                    json.dumps({"event": lease.over_grant, "warnings": found, "listed": listed}),
                    flush=True,
                )
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
