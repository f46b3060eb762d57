"""A demo worker: lease GPU memory through the SDK, "allocate" it, hold it, release it.

Run by `rbroker demo` and the screenshot world as a real process: `python -m
rbroker.demo.worker --socket S --mib N --hold-s T --project P --session S --purpose TEXT`
(and optionally `--gpu-uuid`, `--use-mib` (default: N), `--steps`, `--wait-s`, `--ttl-s`,
`--announce`, which prints `granted` once the memory is in use). It declares its plan, the
hold, as the lease's expected duration (`expected_s`), so that requests waiting behind it
are told when it will likely end, as a real worker that knows its plan would. On a simulated
broker it makes its memory visible with `sim.allocate` (what a CUDA allocation would do), in
`steps` parts 0.25 s apart like a model loading layer by layer; on real GPUs it only holds
the lease.
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
    p.add_argument("--ttl-s", type=float, default=10.0)
    p.add_argument("--gpu-uuid", default=None)
    p.add_argument("--use-mib", type=int, default=None)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--announce", action="store_true")
    args = p.parse_args(argv)
    use = args.mib if args.use_mib is None else args.use_mib
    try:
        with (
            rbroker.lease(
                args.mib,
                gpu_uuid=args.gpu_uuid,
                project=args.project,
                session=args.session,
                purpose=args.purpose,
                wait_s=args.wait_s,
                ttl_s=args.ttl_s,
                socket=args.socket,
                expected_s=args.hold_s if args.hold_s > 0 else None,
            ) as lease,
            rbroker.Client(args.socket) as client,
        ):
            simulated = bool(client.server_info.get("simulated"))
            steps = max(1, args.steps)
            for i in range(steps):  # allocate gradually, like a model loading layer by layer
                share = use // steps + (use % steps if i == steps - 1 else 0)
                if simulated and share:
                    client.sim_allocate(share, lease.gpu_uuid)
                if args.announce and i == steps - 1:
                    print("granted", flush=True)
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
