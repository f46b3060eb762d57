"""Worker: use simulated GPU memory the way a training process would, with or without a lease.

Usage: sim_worker.py SOCKET [--before MIB] [--lease MIB [--adopt]] [--after MIB] [--child MIB]
  --before: allocate MIB before asking for a lease (memory already in use)
  --lease:  take a lease of MIB through the SDK (with --adopt: adopt what is held)
  --after:  allocate MIB once the lease is granted
  --child:  start a child process that allocates MIB itself (a descendant of this one)
Prints `granted LEASE_ID` (when leasing), then `ready`, then holds everything until killed.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time

import rbroker

CHILD = """
import os, sys, time, rbroker
parent = os.getppid()
with rbroker.Client(sys.argv[1]) as c:
    c.sim_allocate(int(sys.argv[2]), gpu_uuid=sys.argv[3])
    print("child-ready", flush=True)
    while os.getppid() == parent:  # end with the parent
        time.sleep(0.1)
"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("socket")
    p.add_argument("--before", type=int)
    p.add_argument("--lease", type=int)
    p.add_argument("--adopt", action="store_true")
    p.add_argument("--after", type=int)
    p.add_argument("--child", type=int)
    p.add_argument("--gpu", default="GPU-5a1e0000-0000-0000-0000-000000000001")
    args = p.parse_args()
    with contextlib.ExitStack() as stack:
        sim = stack.enter_context(rbroker.Client(args.socket))
        if args.before:
            sim.sim_allocate(args.before, gpu_uuid=args.gpu)
        if args.lease:
            lease = stack.enter_context(
                rbroker.lease(
                    args.lease,
                    project="tests",
                    session="sim-worker",
                    purpose="use simulated memory",
                    adopt=args.adopt,
                    gpu_uuid=args.gpu,
                    wait_s=30,
                    socket=args.socket,
                )
            )
            print(f"granted {lease.lease_id}", flush=True)
        if args.after:
            sim.sim_allocate(args.after, gpu_uuid=args.gpu)
        if args.child:
            child = subprocess.Popen(
                [sys.executable, "-u", "-c", CHILD, args.socket, str(args.child), args.gpu],
                stdout=subprocess.PIPE,
            )
            assert child.stdout is not None
            assert child.stdout.readline().strip() == b"child-ready"
            stack.callback(child.kill)
        print("ready", flush=True)
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
