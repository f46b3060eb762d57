"""Worker: one job worker process driven line by line, on its own lease linked to the job.

Usage: job_chunk_worker.py SOCKET JOB_ID MIB
Reads commands from stdin, one per line: `CHUNK_ID N` runs a chunk of N items through
`rbroker.ChunkTask` (the first one takes the lease) and prints `reported CHUNK_ID`;
`CHUNK_ID N hang` prints `inside CHUNK_ID` and never returns (to be killed mid-chunk).
MIB 0 means no lease.
"""

from __future__ import annotations

import sys
import time

import rbroker


def work(items: list[int]) -> None:
    """Every item completes, unless the chunk is marked to hang."""
    if items and items[0] < 0:
        print(f"inside {HANGING}", flush=True)
        while True:
            time.sleep(3600)


HANGING = ""


def main() -> int:
    global HANGING
    socket_path, job_id, mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ref = rbroker.JobRef(job_id, socket_path, "tests", "job worker for the tests", mib or None)
    task = rbroker.ChunkTask(ref, work)
    print("ready", flush=True)
    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        chunk_id, n = parts[0], int(parts[1])
        if parts[2:] == ["hang"]:
            HANGING = chunk_id
            task(chunk_id, [-1] * n)
        else:
            task(chunk_id, list(range(n)))
            print(f"reported {chunk_id}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
