"""A demo worker: lease GPU memory through the SDK, "allocate" it, hold it, release it.

Run by `rbroker demo` as a real process: `python -m rbroker.cli.demo_worker --socket S
--mib N --hold-s T --project P --session S --purpose TEXT`. On a simulated broker it makes
its memory visible with `sim.allocate` (what a CUDA allocation would do); on real GPUs it
only holds the lease.
"""

from __future__ import annotations

import argparse
import sys
import time

import rbroker


def main(argv: list[str] | None = None) -> int:
    """Exit 0 after a full hold, 3 when the lease could not be had."""
    p = argparse.ArgumentParser(prog="rbroker-demo-worker")
    p.add_argument("--socket", required=True)
    p.add_argument("--mib", type=int, required=True)
    p.add_argument("--hold-s", type=float, default=5.0)
    p.add_argument("--project", required=True)
    p.add_argument("--session", required=True)
    p.add_argument("--purpose", required=True)
    p.add_argument("--wait-s", type=float, default=120.0)
    args = p.parse_args(argv)
    try:
        with (
            rbroker.lease(
                args.mib,
                project=args.project,
                session=args.session,
                purpose=args.purpose,
                wait_s=args.wait_s,
                ttl_s=10.0,
                socket=args.socket,
            ) as lease,
            rbroker.Client(args.socket) as client,
        ):
            simulated = bool(client.server_info.get("simulated"))
            steps = 4
            for i in range(steps):  # allocate gradually, like a model loading layer by layer
                if simulated:
                    share = args.mib // steps + (args.mib % steps if i == steps - 1 else 0)
                    client.sim_allocate(share, lease.gpu_uuid)
                time.sleep(0.25)
            time.sleep(max(0.0, args.hold_s - steps * 0.25))
            lease.check()
            if simulated:
                client.sim_free(gpu_uuid=lease.gpu_uuid)
    except rbroker.RBrokerError as exc:
        print(f"worker {args.session}: {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
