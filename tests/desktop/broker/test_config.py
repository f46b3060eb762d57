"""The per-user caps are the broker's flags (`--max-waiting-per-user`, `--max-leases-per-user`,
`--max-jobs-per-user`; docs/architecture.md §5): a real broker process takes them, refuses
past them with the named code, and refuses a cap below 1 in one line (exit 2)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest

import rbroker
from rbroker.demo.processes import broker_address
from tests.conftest import BrokerProcess, short_tmp

pytestmark = pytest.mark.contract  # it starts processes or servers of its own


def test_a_job_cap_set_by_flag_is_kept(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory(extra_args=["--max-jobs-per-user", "2"])
    with broker.client() as c:
        for n in range(2):
            c.call("job.declare", project="p", purpose=f"job {n}", handler="h", total_items=1)
        with pytest.raises(rbroker.RBrokerError) as refused:
            c.call("job.declare", project="p", purpose="job 2", handler="h", total_items=1)
    assert refused.value.code == "too_many_jobs"
    assert "(2 at most)" in refused.value.message


def test_the_job_history_bounds_set_by_flag_are_kept(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory(
        extra_args=["--max-finished-jobs-per-user", "1", "--max-chunks-per-user", "2"]
    )
    with broker.client() as c:
        for n in range(2):
            job = c.call("job.declare", project="p", purpose=f"job {n}", handler="h")["job"]
            c.call("job.update", job_id=job["job_id"], state="cancelled", reason="done")
        listed = c.call("jobs.list", include_finished=True)
        assert [j["purpose"] for j in listed["jobs"]] == ["job 1"]
        assert (listed["finished_kept_per_user"], listed["finished_dropped"]) == (1, 1)
        job_id = c.call("job.declare", project="p", purpose="chunks", handler="h")["job"]["job_id"]
        for n in range(2):
            c.call("job.report", job_id=job_id, chunk_id=f"c{n}", completed=1, failed=0)
        with pytest.raises(rbroker.RBrokerError) as refused:
            c.call("job.report", job_id=job_id, chunk_id="c2", completed=1, failed=0)
    assert refused.value.code == "too_many_chunks"


@pytest.mark.parametrize(
    "flag",
    [
        "--max-waiting-per-user",
        "--max-leases-per-user",
        "--max-finished-jobs-per-user",
        "--max-chunks-per-user",
    ],
)
def test_a_cap_below_one_is_refused_in_one_line(flag: str) -> None:
    root = short_tmp()
    done = subprocess.run(
        [sys.executable, "-m", "rbroker", "broker", "--simulate", flag, "0", "--socket",
         broker_address(root), "--data-dir", str(root / "data")],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "must be 1 or more, got 0" in lines[0], done.stderr
