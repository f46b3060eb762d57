"""The demo's parallel job: a process pool that reports per chunk, each worker on a lease.

Run by `rbroker demo` as `python -m rbroker.cli.demo_job --socket S`. Items whose number
is a multiple of 17 "fail", so the progress shows failures too; `expected_counts()` gives
what the broker must end up with.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import ctypes
import signal
import sys
import time

import rbroker

CHUNKS = 24
ITEMS_PER_CHUNK = 50
WORKERS = 3
WORKER_MIB = 1024


def encode_batch(items: list[int]) -> tuple[int, int]:
    """Pretend to embed a batch: ~0.7 s of work; multiples of 17 fail."""
    time.sleep(0.7)
    failed = sum(1 for i in items if i % 17 == 0)
    return len(items) - failed, failed


def _die_with_parent() -> None:
    """Pool workers end with this process even when it is killed (Linux)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def expected_counts() -> tuple[int, int]:
    """(completed, failed) over every chunk."""
    items = range(CHUNKS * ITEMS_PER_CHUNK)
    failed = sum(1 for i in items if i % 17 == 0)
    return len(items) - failed, failed


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when every chunk was reported."""
    p = argparse.ArgumentParser(prog="rbroker-demo-job")
    p.add_argument("--socket", required=True)
    args = p.parse_args(argv)
    with rbroker.job(
        project="search",
        purpose="embed support tickets with e5-small",
        handler="embed.encode_batch",
        total_items=CHUNKS * ITEMS_PER_CHUNK,
        workers=WORKERS,
        socket=args.socket,
    ) as job:
        task = job.task(encode_batch, mib=WORKER_MIB)
        with concurrent.futures.ProcessPoolExecutor(WORKERS, initializer=_die_with_parent) as pool:
            futures = [
                pool.submit(
                    task,
                    f"chunk-{n:03d}",
                    list(range(n * ITEMS_PER_CHUNK, (n + 1) * ITEMS_PER_CHUNK)),
                )
                for n in range(CHUNKS)
            ]
            for future in futures:
                future.result()
    return 0


if __name__ == "__main__":
    sys.exit(main())
