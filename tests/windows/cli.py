"""`rbroker` as a Windows test runs it: a child `python -m rbroker`, its one-line refusals, and
a Windows broker's report as the coordinator shows it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from rbroker.demo.coordinator import LocalCoordinator
from tests.conftest import wait_until


def rbroker_cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m rbroker ARGS` to its end, output captured through pipes (a Windows python
    under Wine needs them), wide enough that rich folds no table cell."""
    return subprocess.run(
        [sys.executable, "-m", "rbroker", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "COLUMNS": "1000"},
        check=False,
    )


def assert_one_line(done: subprocess.CompletedProcess[str], code: int, *parts: str) -> str:
    """The process exited `code` with exactly one line on stderr, holding every part; the
    line."""
    err = done.stderr.strip()
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert len(err.splitlines()) == 1, err
    for part in parts:
        assert part in err, (part, err)
    return err


def wait_until_reported(
    coordinator: LocalCoordinator, name: str, broker: subprocess.Popen[bytes], log: Path
) -> dict[str, Any]:
    """The fleet's view of computer `name` once the coordinator has applied a report of it
    (at most 90 s); fails at once, with the broker's log, if the broker exits meanwhile."""

    def reported() -> dict[str, Any] | None:
        assert broker.poll() is None, log.read_text(errors="replace")
        computers = {c["name"]: c for c in coordinator.fleet()["computers"]}
        computer = computers.get(name)
        return computer if computer and computer["reports_applied"] > 0 else None

    computer = wait_until(reported, timeout_s=90, interval_s=0.5)
    assert isinstance(computer, dict)
    return computer
