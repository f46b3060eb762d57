"""The FLAKY list (tests/flaky.py): a test that fails once and passes on its rerun is named
with its first failure and does not fail the run; one that fails twice fails the run and is
not named a flake. Each case is a real pytest run in a child process, with and without xdist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

ROOT = Path(__file__).resolve().parents[1]

TESTS = textwrap.dedent(
    """
    from pathlib import Path

    def test_steady():
        assert True

    def test_flaky_once():
        mark = Path(__file__).with_name("failed-once")
        if not mark.exists():
            mark.write_text("x")
            print("first attempt's own output")
            assert 1 == 2, "the first attempt fails"

    def test_always_fails():
        assert False, "fails every time"
    """
)


def _run(tmp_path: Path, *args: str) -> tuple[int, str, list[dict[str, str]]]:
    (tmp_path / "test_cases.py").write_text(TESTS)
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.flaky"]\n')
    flaky_file = tmp_path / "flaky.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "RBROKER_FLAKY_FILE": str(flaky_file),
    }
    command = [sys.executable, "-m", "pytest", "-c", os.devnull, "--rootdir", str(tmp_path)]
    command += ["-p", "no:cacheprovider", "-p", "no:randomly", "--reruns", "1", *args]
    proc = subprocess.run(
        [*command, str(tmp_path / "test_cases.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    rows = []
    if flaky_file.exists():
        rows = [json.loads(line) for line in flaky_file.read_text().splitlines()]
    return proc.returncode, proc.stdout + proc.stderr, rows


@pytest.mark.parametrize("workers", [["-n", "0"], ["-n", "2"]], ids=["one-process", "xdist"])
def test_a_test_that_passes_on_its_rerun_is_listed_and_one_that_fails_twice_is_not(
    tmp_path: Path, workers: list[str]
) -> None:
    rc, out, rows = _run(tmp_path, *workers)
    assert rc == 1, out  # test_always_fails failed twice: the run is red
    assert "FLAKY (1): failed once, passed on the rerun" in out, out
    assert "FLAKY test_cases.py::test_flaky_once" in out, out
    assert "the first attempt fails" in out, out  # the first failure's output is shown
    assert "FLAKY test_cases.py::test_always_fails" not in out, out
    assert "1 failed" in out and "2 passed" in out, out
    assert [r["nodeid"] for r in rows] == ["test_cases.py::test_flaky_once"]
    assert "first attempt's own output" in rows[0]["first_failure"]


def test_a_run_without_flakes_prints_no_flaky_section(tmp_path: Path) -> None:
    (tmp_path / "failed-once").write_text("x")  # test_flaky_once passes at once
    rc, out, rows = _run(tmp_path, "-n", "0", "-k", "not always")
    assert rc == 0, out
    assert "FLAKY" not in out and rows == []


def test_a_long_first_failure_keeps_its_last_lines_and_says_how_many_were_left_out() -> None:
    """The terminal and the flaky file (which `.ci/run`'s summary prints whole) get the same
    trimmed text: the last FIRST_FAILURE_LINES lines after one line counting the rest."""
    from tests.flaky import FIRST_FAILURE_LINES, _last_lines

    short = "\n".join(f"line {i}" for i in range(FIRST_FAILURE_LINES))
    assert _last_lines(short) == short
    long = "\n".join(f"line {i}" for i in range(FIRST_FAILURE_LINES + 5))
    kept = _last_lines(long).splitlines()
    assert kept[0] == "... (5 lines above left out)"
    assert kept[1:] == [f"line {i}" for i in range(5, FIRST_FAILURE_LINES + 5)]
