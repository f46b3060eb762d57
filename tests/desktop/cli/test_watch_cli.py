"""`rbroker watch` (issue 42): waits until MiB could be granted to the caller now and says
where, taking nothing; a real `python -m rbroker` process against a real broker."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import rbroker
from tests.conftest import BrokerProcess

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

DESC = {"project": "vision", "purpose": "holds the GPU"}


def _watch(broker: BrokerProcess, *args: str) -> list[str]:
    return [sys.executable, "-m", "rbroker", "watch", "--socket", broker.socket, *args]


def test_watch_returns_when_the_memory_frees_and_says_where(broker: BrokerProcess) -> None:
    with rbroker.lease(20_000, socket=broker.socket, **DESC) as lease:
        timed_out = subprocess.run(
            _watch(broker, "--mib", "8000", "--timeout", "0.5"),
            capture_output=True,
            encoding="utf-8",
            timeout=60,
        )
        assert timed_out.returncode == 75, timed_out.stderr
        assert timed_out.stdout == ""
        said = timed_out.stderr.splitlines()
        assert said[0].startswith("watching: waiting: GPU-5a1e"), said
        assert "3 347 MiB available" in said[0]
        assert said[-1].startswith("rbroker watch: no room within 0.5 s; last waiting: GPU-")
        assert len(said) == 2, timed_out.stderr
        watch = subprocess.Popen(
            _watch(broker, "--mib", "8000"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            encoding="utf-8",
            env={**os.environ},
        )
        time.sleep(1.0)
        assert watch.poll() is None  # still watching: nothing freed yet
        with broker.client() as c:
            leases = c.leases()["leases"]
        assert [x["lease_id"] for x in leases] == [lease.lease_id]  # it took nothing
    out, err = watch.communicate(timeout=30)
    assert watch.returncode == 0, err
    assert out == "room now: GPU 0 has 23 347 MiB available for 8 000 MiB asked\n"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--mib", "0"], "--mib and --gpus must be 1 or more"),
        (["--mib", "100", "--timeout", "nan"], "--timeout 0 or more"),
        (["--mib", "99999999"], "mib: Input should be less than or equal to 16777216"),
        (["--mib", "24000"], "infeasible: 24 000 MiB requested"),
        (["--mib", "100", "--gpus", "3"], "infeasible: 3 GPUs requested"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    broker: BrokerProcess, args: list[str], said: str
) -> None:
    out = subprocess.run(_watch(broker, *args), capture_output=True, encoding="utf-8", timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    (line,) = out.stderr.strip("\n").splitlines()
    assert line.startswith("rbroker watch: ") and said in line, line
