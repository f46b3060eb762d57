"""Helpers for the parallel-job tests: declare a job, read it back, find its leases, and
run worker scripts with a pipe on stdin (the `script` fixture)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import rbroker
from tests.conftest import WORKER

FINISHED = ("succeeded", "failed", "cancelled")


def declare(client: rbroker.Client, **params: Any) -> dict[str, Any]:
    """`job.declare` with test defaults; the job's record."""
    base: dict[str, Any] = {
        "project": "tests",
        "purpose": "count chunks for the tests",
        "handler": "tests.count_chunk",
        "workers": 1,
    }
    base.update(params)
    return dict(client.call("job.declare", **base)["job"])


def job_of(client: rbroker.Client, job_id: str) -> dict[str, Any]:
    """The job's record from `jobs.list` (finished ones included)."""
    for job in client.call("jobs.list", include_finished=True)["jobs"]:
        if job["job_id"] == job_id:
            return dict(job)
    raise AssertionError(f"{job_id} not in jobs.list")


def leases_of(client: rbroker.Client, job_id: str) -> list[dict[str, Any]]:
    """Active leases whose `job_id` is this job."""
    return [x for x in client.call("leases.list")["leases"] if x.get("job_id") == job_id]


def counts(job: dict[str, Any]) -> tuple[int, int, int]:
    """(completed_items, failed_items, chunks_reported)."""
    return job["completed_items"], job["failed_items"], job["chunks_reported"]


class Script:
    """A tests/workers script run as a real process with pipes on stdin and stdout."""

    def __init__(self, name: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-u", str(WORKER / f"{name}.py"), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def read_line(self) -> str:
        """The next stdout line (blocks; the pytest timeout bounds it)."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if not line:
            err = self.proc.stderr.read().decode() if self.proc.stderr else ""
            raise AssertionError(f"script exited with {self.proc.wait()}: {err}")
        return line.strip()

    def wait(self, timeout_s: float = 60.0) -> int:
        """Close stdin and wait for the exit status."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        return self.proc.wait(timeout_s)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def script() -> Iterator[Callable[..., Script]]:
    """`script(name, *args)` → a started Script; all killed at teardown."""
    started: list[Script] = []

    def start(name: str, *args: str) -> Script:
        s = Script(name, *args)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()
