"""`rbroker run --mib N -- CMD...`: hold a lease while CMD runs (DESIGN §3).

Sets `CUDA_VISIBLE_DEVICES` (an index with `CUDA_DEVICE_ORDER=PCI_BUS_ID`, or the UUID for
MIG slices; `--cuda-devices` chooses, see `rbroker._cuda`) and `RBROKER_LEASE_ID` in CMD's
environment, forwards SIGINT/SIGTERM/SIGHUP to it, releases the lease when it exits, and
exits with its code (128 + N when it was killed by signal N). The command line itself never
leaves this process: the lease's session and purpose default to the program's name only.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
from types import FrameType

from rich.console import Console

import rbroker

EX_USAGE = 2
EX_UNAVAILABLE = 69  # sysexits.h: no broker
EX_TEMPFAIL = 75  # sysexits.h: no room now / within --wait


def run_command(args: argparse.Namespace) -> int:
    """Run `args.cmd` under a lease; returns the exit code described in the module doc."""
    console = Console(stderr=True)
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        console.print(
            "rbroker run: give the command after --, e.g. rbroker run --mib 8192 -- python train.py"
        )
        return EX_USAGE
    program = os.path.basename(cmd[0]) or "command"
    try:
        ctx = rbroker.lease(
            args.mib,
            project=args.project,
            session=args.session or program,
            purpose=args.purpose or f"run {program}",
            wait_s=args.wait,
            gpus=args.gpus,
            gpu_uuid=args.gpu_uuid,
            ttl_s=args.ttl,
            socket=args.socket,
        )
        lease = ctx.__enter__()
    except rbroker.BrokerUnavailable as exc:
        console.print(f"rbroker run: {exc}")
        return EX_UNAVAILABLE
    except rbroker.CapacityUnavailable as exc:
        console.print(f"rbroker run: {exc}")
        return EX_TEMPFAIL
    except rbroker.RBrokerError as exc:
        console.print(f"rbroker run: {exc}")
        return EX_USAGE
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    child: subprocess.Popen[bytes] | None = None
    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {}

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    try:
        env = dict(os.environ)
        try:
            env.update(lease.cuda_env(getattr(args, "cuda_devices", "auto")))
        except ValueError as exc:
            console.print(f"rbroker run: {exc}", soft_wrap=True, markup=False)
            return EX_USAGE
        env["RBROKER_LEASE_ID"] = lease.lease_id
        for sig in forwarded:
            previous[sig] = signal.signal(sig, forward)
        try:
            child = subprocess.Popen(cmd, env=env)
        except OSError as exc:
            console.print(f"rbroker run: cannot start {program}: {exc.strerror}")
            return 127 if isinstance(exc, FileNotFoundError) else 126
        code = child.wait()
        return 128 - code if code < 0 else code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        ctx.__exit__(None, None, None)
