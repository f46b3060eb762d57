"""The command line on Windows, end to end: `rbroker broker --simulate` on a named pipe, an
SDK lease from a second process, `rbroker status`, `rbroker run` (exit code, Ctrl-Break,
its command ended with it), `rbroker release` and `rbroker jobs`.

Every process is real (`python -m rbroker …` children of the test), every connection a real
named pipe; only the GPU is simulated.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rbroker.base.children import kill_tree, spawn
from tests.conftest import GPU0, WORKER, BrokerProcess, wait_until
from tests.desktop.jobhelp import declare
from tests.windows.cli import assert_one_line, rbroker_cli

pytestmark = pytest.mark.skipif(
    sys.platform != "win32", reason="Windows only: named pipes, consoles, Job objects"
)

REPORT_ENV = str(Path(WORKER) / "report_env.py")
HOLD = """
import sys, rbroker
with rbroker.lease(int(sys.argv[2]), socket=sys.argv[1], project="win", session=sys.argv[3],
                   purpose="held by a second process") as lease:
    print(lease.lease_id, flush=True)
    sys.stdin.readline()
"""
"""A second Windows process holding a lease until a line (or EOF) arrives on its stdin."""


_STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _end_started() -> Iterator[None]:
    """Every process a test started here ends with the test, its pipes closed (an open pipe
    left to the garbage collector is a ResourceWarning in a later test)."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            kill_tree(proc)
        proc.wait(10)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _holder(broker: BrokerProcess, mib: int, session: str) -> tuple[subprocess.Popen[str], str]:
    """A second process holding `mib` MiB; returns it and its lease id."""
    proc: subprocess.Popen[str] = spawn(
        [sys.executable, "-c", HOLD, broker.socket, str(mib), session],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    _STARTED.append(proc)
    assert proc.stdout is not None
    lease_id = proc.stdout.readline().strip()
    assert lease_id, f"the holder exited with {proc.wait(10)}"
    return proc, lease_id


def _active(broker: BrokerProcess) -> list[dict[str, Any]]:
    with broker.client() as c:
        return list(c.leases()["leases"])


def _ended(broker: BrokerProcess, session: str) -> dict[str, Any] | None:
    with broker.client() as c:
        ended = c.leases(include_ended=True)["ended"]
    return next((e for e in ended if e["session"] == session), None)


def test_the_broker_listens_on_a_named_pipe(broker: BrokerProcess) -> None:
    assert re.fullmatch(r"\\\\\.\\pipe\\rbroker-broker-rbt-[\w-]+", broker.socket), broker.socket
    with broker.client() as c:
        (gpu,) = c.gpus()
    assert gpu["uuid"] == GPU0


def test_a_lease_from_a_second_process_is_its_own_and_ends_with_it(
    broker: BrokerProcess,
) -> None:
    proc, lease_id = _holder(broker, 2048, "second-process")
    try:
        (lease,) = _active(broker)
        assert lease["lease_id"] == lease_id
        assert lease["granted_mib"] == 2048
        assert lease["session"] == "second-process"
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # EOF: the holder leaves its `with` and releases
        assert proc.wait(30) == 0
    assert _active(broker) == []
    ended = _ended(broker, "second-process")
    assert ended is not None and ended["state"] == "released"


def test_a_killed_holder_s_lease_ends_with_its_pipe(broker: BrokerProcess) -> None:
    proc, _ = _holder(broker, 1024, "killed")
    kill_tree(proc)  # TerminateProcess: no cleanup in the holder
    proc.wait(10)
    wait_until(lambda: _active(broker) == [], timeout_s=20)
    ended = _ended(broker, "killed")  # the broker saw the pipe close (or the holder gone)
    assert ended is not None and ended["state"] in ("released", "holder_exited"), ended


def test_status_and_top_once_show_the_gpu_and_the_leases(broker: BrokerProcess) -> None:
    proc, lease_id = _holder(broker, 3072, "shown-by-status")
    try:
        done = rbroker_cli("status", "--socket", broker.socket)
        assert done.returncode == 0, done.stderr
        out = " ".join(done.stdout.split())
        assert GPU0 in out
        assert "shown-by-status" in out
        as_json = rbroker_cli("status", "--socket", broker.socket, "--json")
        assert as_json.returncode == 0, as_json.stderr
        view = json.loads(as_json.stdout)
        assert [lease["lease_id"] for lease in view["leases"]] == [lease_id]
        # rbroker top --once: one frame of the same reading, plain rows through a pipe
        top = rbroker_cli("top", "--once", "--socket", broker.socket)
        assert top.returncode == 0, top.stderr
        assert "\x1b[" not in top.stdout and "read at " in top.stdout, top.stdout
        assert "q or Ctrl-C quits" not in top.stdout, top.stdout  # one frame: it exits
        frame = " ".join(top.stdout.split())
        assert GPU0 in frame and lease_id in frame and "shown-by-status" in frame, frame
    finally:
        kill_tree(proc)
        proc.wait(10)


def test_status_and_top_without_a_broker_are_one_line_and_exit_69(tmp_path: Path) -> None:
    done = rbroker_cli("status", "--socket", r"\\.\pipe\rbroker-nobody-" + tmp_path.name)
    assert done.returncode == 69
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert r"\\.\pipe\rbroker-nobody-" in lines[0]
    top = rbroker_cli("top", "--once", "--socket", r"\\.\pipe\rbroker-nobody-" + tmp_path.name)
    assert_one_line(top, 69, "rbroker top: ", r"\\.\pipe\rbroker-nobody-")


def _run_args(broker: BrokerProcess, mib: int, session: str, *cmd: str) -> list[str]:
    return [
        sys.executable, "-m", "rbroker", "run", "--socket", broker.socket, "--mib", str(mib),
        "--project", "win", "--session", session, "--purpose", "rbroker run on Windows",
        "--", *cmd,
    ]  # fmt: skip


@pytest.mark.parametrize("code", [0, 3])
def test_run_holds_the_lease_while_the_command_runs_and_passes_its_code(
    broker: BrokerProcess, tmp_path: Path, code: int
) -> None:
    out = tmp_path / "report.json"
    env = {**os.environ, "RBROKER_SOCKET": broker.socket}
    done = subprocess.run(
        _run_args(broker, 4096, "run", sys.executable, REPORT_ENV, str(out), str(code)),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == code, done.stderr
    report = json.loads(out.read_text())
    (lease,) = report["active_leases"]  # held while the command ran
    assert lease["lease_id"] == report["lease_id"]
    assert lease["granted_mib"] == 4096
    assert _active(broker) == []
    ended = _ended(broker, "run")
    assert ended is not None and ended["state"] == "released"


def test_run_of_a_missing_program_is_one_line_and_exit_127(broker: BrokerProcess) -> None:
    done = subprocess.run(
        _run_args(broker, 1024, "missing", "no-such-program-rbroker.exe"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 127
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr
    assert "cannot start the command 'no-such-program-rbroker.exe'" in done.stderr
    assert _active(broker) == []


def _start_sleeping_run(
    broker: BrokerProcess, tmp_path: Path, session: str
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """`rbroker run` in its own console process group around a command that sleeps; returns
    it and the command's report once the command runs under the lease."""
    out = tmp_path / f"{session}.json"
    env = {**os.environ, "RBROKER_SOCKET": broker.socket}
    rb: subprocess.Popen[str] = subprocess.Popen(
        _run_args(broker, 2048, session, sys.executable, REPORT_ENV, str(out), "sleep"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        creationflags=subprocess.CREATE_NEW_PROCESS_GROUP,
    )
    _STARTED.append(rb)
    assert rb.stdout is not None
    line = rb.stdout.readline()
    assert line.strip() == "ready", line + rb.stdout.read()
    return rb, json.loads(out.read_text())


def _gone(pid: int) -> bool:
    import psutil

    return not psutil.pid_exists(pid)


@pytest.mark.wine_gap(
    "GenerateConsoleCtrlEvent: os.kill(pid, CTRL_BREAK_EVENT) fails for processes started "
    "without a shared console"
)
def test_ctrl_break_stops_the_command_and_the_lease_is_released(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """Ctrl-Break reaches `rbroker run`'s whole console process group: the command ends as
    it does on Ctrl-Break (Python: at once, STATUS_CONTROL_C_EXIT), `rbroker run` outlives
    it, releases the lease and exits with the command's code."""
    rb, report = _start_sleeping_run(broker, tmp_path, "ctrl-break")
    try:
        assert [lease["lease_id"] for lease in _active(broker)] == [report["lease_id"]]
        os.kill(rb.pid, signal.CTRL_BREAK_EVENT)
        code = rb.wait(30)
    finally:
        kill_tree(rb)
    assert code == 0xC000013A  # STATUS_CONTROL_C_EXIT: the command's own code
    wait_until(lambda: _gone(report["pid"]), timeout_s=10)
    ended = _ended(broker, "ctrl-break")
    assert ended is not None and ended["state"] == "released"


def test_the_command_ends_when_rbroker_run_is_killed(broker: BrokerProcess, tmp_path: Path) -> None:
    """TerminateProcess of `rbroker run` (no cleanup there) ends its command too (its Job
    object closes), and the lease ends with `rbroker run`'s pipe."""
    rb, report = _start_sleeping_run(broker, tmp_path, "run-killed")
    rb.kill()  # TerminateProcess of rbroker run alone
    rb.wait(10)
    wait_until(lambda: _gone(report["pid"]), timeout_s=10)
    wait_until(lambda: _active(broker) == [], timeout_s=20)


def test_release_ends_another_process_s_lease_by_prefix(broker: BrokerProcess) -> None:
    proc, lease_id = _holder(broker, 1024, "released-by-cli")
    try:
        done = rbroker_cli("release", "--socket", broker.socket, lease_id[:12])
        assert done.returncode == 0, done.stderr
        assert lease_id in done.stdout
        assert _active(broker) == []
        again = rbroker_cli("release", "--socket", broker.socket, lease_id)
        assert again.returncode == 2
        assert again.stderr.strip().count("\n") == 0 and "Traceback" not in again.stderr
        assert "rbroker release:" in again.stderr
    finally:
        kill_tree(proc)
        proc.wait(10)


def test_jobs_shows_a_job_s_progress(broker: BrokerProcess) -> None:
    with broker.client() as c:
        job = declare(c, purpose="embed on windows", total_items=200, workers=2)
        c.call("job.report", job_id=job["job_id"], chunk_id="a", completed=50)
        done = rbroker_cli("jobs", "--socket", broker.socket)
        assert done.returncode == 0, done.stderr
        row = next(line for line in done.stdout.splitlines() if job["job_id"] in line)
        assert "embed on windows" in row and "50" in row, row
        as_json = json.loads(rbroker_cli("jobs", "--socket", broker.socket, "--json").stdout)
    (seen,) = [j for j in as_json if j["job_id"] == job["job_id"]]
    assert (seen["completed_items"], seen["total_items"]) == (50, 200)
