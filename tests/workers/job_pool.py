"""Worker: a parallel job run by a process pool, each pool worker on its own lease.

Usage: job_pool.py SOCKET KIND CHUNKS ITEMS_PER_CHUNK WORKERS MIB GO_FILE [warm]
KIND is `futures` (concurrent.futures.ProcessPoolExecutor, fork on Linux) or `mp`
(multiprocessing.Pool, spawn start method). Declares the job with `rbroker.job(...)` and
prints `declared JOB_ID`. With `warm`, this process first runs chunk 0 itself (on its own
lease) and prints `warm`, before the pool forks. Every pool chunk waits until GO_FILE
exists (so the test can look at the running job); items whose number is a multiple of 13
fail. Prints `done` when every chunk returned, then leaves the `with` block (the job
succeeds).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import sys
import time

import rbroker


def process_chunk(items: list[int]) -> tuple[int, int]:
    """Wait for the go file (not in the `warm` run), then 'process' the items: multiples
    of 13 fail."""
    go = os.environ["JOB_POOL_GO"]
    while not os.environ.get("JOB_POOL_WARM") and not os.path.exists(go):
        time.sleep(0.02)
    failed = sum(1 for i in items if i % 13 == 0)
    return len(items) - failed, failed


def main() -> int:
    socket_path, kind = sys.argv[1], sys.argv[2]
    chunks, per_chunk, workers, mib = (int(a) for a in sys.argv[3:7])
    os.environ["JOB_POOL_GO"] = sys.argv[7]
    with rbroker.job(
        project="tests",
        purpose="pool job for the tests",
        handler="tests.process_chunk",
        total_items=chunks * per_chunk,
        workers=workers,
        socket=socket_path,
    ) as job:
        print(f"declared {job.job_id}", flush=True)
        task = job.task(process_chunk, mib=mib)
        work = [
            (f"chunk-{n:03d}", list(range(n * per_chunk, (n + 1) * per_chunk)))
            for n in range(chunks)
        ]
        if sys.argv[8:] == ["warm"]:
            os.environ["JOB_POOL_WARM"] = "1"
            task(*work.pop(0))
            del os.environ["JOB_POOL_WARM"]
            print("warm", flush=True)
        if kind == "futures":
            with concurrent.futures.ProcessPoolExecutor(workers) as executor:
                futures = [executor.submit(task, cid, items) for cid, items in work]
                for future in futures:
                    future.result()
        else:
            ctx = multiprocessing.get_context("spawn")
            pool = ctx.Pool(workers)
            try:
                pool.starmap(task, work)
            finally:
                pool.close()
                pool.join()
        print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
