"""The demo's parallel jobs.

`python -m rbroker.demo.job --socket S` (what `rbroker demo` runs): a process pool that
reports per chunk, each worker on a lease. Items whose number is a multiple of 17 "fail",
so the progress shows failures too; `expected_counts()` gives what the broker must end up
with.

`python -m rbroker.demo.job --socket S --report PROJECT PURPOSE HANDLER TOTAL WORKERS SIZE
BURST` (what the screenshot world runs): a declared job that reports `BURST` chunks of
`SIZE` items at once (every ninth with one failure), then one every 8 s, and stays running.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import time

import rbroker
from rbroker.base.children import die_with_parent

CHUNKS = 24
ITEMS_PER_CHUNK = 50
WORKERS = 3
WORKER_MIB = 1024


def encode_batch(items: list[int]) -> tuple[int, int]:
    """Pretend to embed a batch: ~0.7 s of work; multiples of 17 fail."""
    time.sleep(0.7)
    failed = sum(1 for i in items if i % 17 == 0)
    return len(items) - failed, failed


def expected_counts() -> tuple[int, int]:
    """(completed, failed) over every chunk."""
    items = range(CHUNKS * ITEMS_PER_CHUNK)
    failed = sum(1 for i in items if i % 17 == 0)
    return len(items) - failed, failed


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when every chunk was reported."""
    p = argparse.ArgumentParser(prog="rbroker-demo-job")
    p.add_argument("--socket", required=True)
    p.add_argument("--report", nargs=7, metavar="ARG", help="a reporting-only job (see above)")
    args = p.parse_args(argv)
    if args.report:
        project, purpose, handler, total, workers, size, burst = args.report
        report_job(args.socket, project, purpose, handler, int(total), int(workers), int(size),
                   int(burst))  # fmt: skip
        return 0
    with rbroker.job(
        project="search",
        purpose="embed support tickets with e5-small",
        handler="embed.encode_batch",
        total_items=CHUNKS * ITEMS_PER_CHUNK,
        workers=WORKERS,
        socket=args.socket,
    ) as job:
        task = job.task(encode_batch, mib=WORKER_MIB)
        with concurrent.futures.ProcessPoolExecutor(WORKERS, initializer=die_with_parent) as pool:
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


def report_job(
    socket: str,
    project: str,
    purpose: str,
    handler: str,
    total: int,
    workers: int,
    size: int,
    burst: int,
    hold_s: float = 3600.0,
) -> None:
    """Declare a job and report chunks of `size` items (chunk n fails one item when
    n % 9 == 4): `burst` quickly, then one every 8 s; then hold the job `hold_s` seconds."""
    with rbroker.job(
        project=project,
        purpose=purpose,
        handler=handler,
        total_items=total,
        workers=workers,
        socket=socket,
    ) as job:
        n = 0
        while (n + 1) * size <= total:
            job.report(f"chunk-{n}", completed=size - (n % 9 == 4), failed=int(n % 9 == 4))
            n += 1
            time.sleep(0.01 if n < burst else 8.0)
        time.sleep(hold_s)


if __name__ == "__main__":
    sys.exit(main())
