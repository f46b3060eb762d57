"""`rbroker` as a Windows test runs it: a child `python -m rbroker`, and its one-line refusals."""

from __future__ import annotations

import os
import subprocess
import sys


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
