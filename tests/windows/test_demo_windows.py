"""`rbroker demo --seconds 10 --no-live` on Windows, to its summary: the demo's broker on a
named pipe, its workers and its job started without `preexec_fn` (each in a Job object that
ends with the demo), one worker ended by TerminateProcess mid-run, the embedded coordinator
receiving the broker's signed reports, and nothing left running afterwards.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import httpx
import psutil
import pytest

pytestmark = pytest.mark.skipif(
    sys.platform != "win32", reason="Windows only: named pipes, Job objects, TerminateProcess"
)


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.mark.slow
def test_demo_runs_to_its_summary_on_windows() -> None:
    before = _descendants()
    done = subprocess.run(
        [sys.executable, "-m", "rbroker", "demo", "--no-live", "--simulate", "--seconds", "10"],
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="replace",
        timeout=420,
        env={**os.environ, "COLUMNS": "200", "PYTHONIOENCODING": "utf-8"},
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "Traceback" not in out + done.stderr, out + done.stderr
    assert "rbroker demo summary" in out, out
    granted = re.search(r"leases granted: (\d+) of (\d+) requests", out)
    assert granted and int(granted.group(1)) == int(granted.group(2)) > 0, out
    crash = re.search(r"crash: worker \S+ killed with TerminateProcess while holding", out)
    assert crash, out
    later = re.search(r"its lease was freed (\d+) ms later", out)
    assert later, out
    assert "never exceeded available" in out, out
    job = re.search(r"parallel job \S+ \(.*?\): succeeded, .*exactly the counts", out)
    assert job, out
    head = re.search(r"coordinator: (http://127\.0\.0\.1:\d+)", out)
    assert head, out
    reports = re.search(r"demo-computer: online, (\d+) GPUs .*?(\d+) signed reports applied", out)
    assert reports and int(reports.group(2)) >= 1, out
    # everything the demo started ended with it: its coordinator no longer answers, and no
    # process of the demo's is left among this test's descendants
    with pytest.raises(httpx.HTTPError):
        httpx.get(head.group(1) + "/healthz", timeout=2)
    assert _descendants() - before == set()
