"""Worker: report a range of chunks to a job, concurrently with other reporters.

Usage: job_reporter.py SOCKET JOB_ID FIRST LAST REPEAT
Connects, prints `ready`, waits for a line on stdin (so that every reporter starts at
once), then reports chunks FIRST..LAST (inclusive) in a shuffled order, each REPEAT
times in a row. Chunk n always carries completed = n % 7 + 1, failed = n % 3, so any
reporter that sends chunk n sends the same counts. Prints `new N duplicate D` at the end.
"""

from __future__ import annotations

import random
import sys

import rbroker


def counts(n: int) -> tuple[int, int]:
    """The counts every reporter sends for chunk n."""
    return n % 7 + 1, n % 3


def main() -> int:
    socket_path, job_id = sys.argv[1], sys.argv[2]
    first, last, repeat = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    chunks = list(range(first, last + 1))
    random.shuffle(chunks)
    new = duplicate = 0
    with rbroker.Client(socket_path) as client:
        print("ready", flush=True)
        sys.stdin.readline()
        for n in chunks:
            completed, failed = counts(n)
            for _ in range(repeat):
                result = client.call(
                    "job.report",
                    job_id=job_id,
                    chunk_id=f"chunk-{n:04d}",
                    completed=completed,
                    failed=failed,
                )
                if result["duplicate"]:
                    duplicate += 1
                else:
                    new += 1
    print(f"new {new} duplicate {duplicate}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
