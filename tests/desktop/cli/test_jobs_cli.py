"""`rbroker jobs` (issue 6): a table with progress bars, items per second and an ETA from
the observed rate; `--json`, `--active`, `--watch`; exit 69 without a broker. Run as a real
`python -m rbroker jobs` process against a real broker."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SINGLE_24G, BrokerProcess, short_tmp, start_broker
from tests.desktop.jobhelp import declare, job_of

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

ENV = dict(os.environ)


@pytest.fixture(scope="module")
def broker() -> Iterator[BrokerProcess]:
    bp = start_broker(SINGLE_24G)
    yield bp
    bp.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def jobs(broker: BrokerProcess) -> Iterator[dict[str, str]]:
    """A running job with a total (20 % done), one without a total, one succeeded, and
    one stalled (its declarer went away)."""
    with broker.client() as gone:
        stalled = declare(gone, purpose="declarer went away", total_items=40)
        gone.call("job.report", job_id=stalled["job_id"], chunk_id="a", completed=10)
    with broker.client() as c:
        with_total = declare(c, purpose="embed with a total", total_items=1000, workers=3)
        no_total = declare(c, purpose="count without a total")
        done = declare(c, purpose="already finished", total_items=10)
        c.call("job.report", job_id=with_total["job_id"], chunk_id="a", completed=100, failed=5)
        c.call("job.report", job_id=no_total["job_id"], chunk_id="a", completed=12345, failed=6)
        c.call("job.report", job_id=done["job_id"], chunk_id="a", completed=10)
        c.call("job.update", job_id=done["job_id"], state="succeeded")
        time.sleep(1.2)
        c.call("job.report", job_id=with_total["job_id"], chunk_id="b", completed=95)
        yield {
            "with_total": with_total["job_id"],
            "no_total": no_total["job_id"],
            "done": done["job_id"],
            "stalled": stalled["job_id"],
        }


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rbroker", "jobs", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
    )


def _row(out: str, job_id: str) -> list[str]:
    """The plain row's cells for `job_id` (stdout is a pipe): job, owner, purpose, state,
    progress, done, failed, items/s, ETA, project, workers, handler."""
    for line in out.splitlines():
        if job_id in line:
            return re.split(r"\s{2,}", line.strip())
    raise AssertionError(f"{job_id} not in:\n{out}")


def test_table_shows_progress_rate_and_eta(broker: BrokerProcess, jobs: dict[str, str]) -> None:
    out = _cli("--socket", broker.socket)
    assert out.returncode == 0, out.stderr
    for title in ("owner", "progress", "items/s", "ETA", "handler", "workers"):
        assert title in out.stdout
    cells = _row(out.stdout, jobs["with_total"])
    listed = json.loads(_cli("--socket", broker.socket, "--json").stdout)
    owner = next(j["owner"] for j in listed if j["job_id"] == jobs["with_total"])
    assert cells[1] == owner  # the OS user who declared it, as --json says
    assert cells[3] == "running"
    assert cells[10] == "0/3"  # no worker leases, 3 workers allocated
    assert cells[4] == "20.0 %"
    assert (cells[5], cells[6]) == ("195", "5")
    rate = float(cells[7])
    assert 5 < rate < 170  # 200 items since the declaration, at least 1.2 s ago
    eta = re.fullmatch(r"(\d+) (s|min)", cells[8])
    assert eta is not None, cells[8]
    eta_s = int(eta.group(1)) * (60 if eta.group(2) == "min" else 1)
    assert abs(eta_s - 800 / rate) <= (2 if eta.group(2) == "s" else 31)

    cells = _row(out.stdout, jobs["no_total"])
    assert cells[4:7] == ["no total", "12345", "6"]
    assert cells[8] == "—"  # no total: no ETA

    cells = _row(out.stdout, jobs["stalled"])
    assert cells[3] == "stalled"
    assert cells[4] == "25.0 %"
    assert cells[8] == "—"  # nothing moves: no ETA

    cells = _row(out.stdout, jobs["done"])
    assert cells[3] == "succeeded"
    assert cells[4] == "100.0 %"
    assert cells[8] == "—"  # finished: no ETA


def test_json_has_the_rate_and_an_eta_from_it(broker: BrokerProcess, jobs: dict[str, str]) -> None:
    out = _cli("--socket", broker.socket, "--json")
    assert out.returncode == 0, out.stderr
    by_id = {j["job_id"]: j for j in json.loads(out.stdout)}
    assert set(jobs.values()) <= set(by_id)
    j = by_id[jobs["with_total"]]
    assert (j["completed_items"], j["failed_items"], j["total_items"]) == (195, 5, 1000)
    rate, eta = j["items_per_s"], j["eta_s"]
    assert 5 < rate < 170
    assert eta == pytest.approx(800 / rate, rel=0.01, abs=0.2)
    assert by_id[jobs["no_total"]]["eta_s"] is None
    assert by_id[jobs["done"]]["eta_s"] is None and by_id[jobs["done"]]["state"] == "succeeded"
    for job in by_id.values():  # privacy: no pids, commands or environment on the wire
        assert not {"pid", "holder", "cmdline", "env"} & set(job)


def test_rate_of_a_job_that_stops_reporting_falls_and_its_eta_grows(
    broker: BrokerProcess, jobs: dict[str, str]
) -> None:
    with broker.client() as c:
        first = job_of(c, jobs["with_total"])
        time.sleep(0.5)
        later = job_of(c, jobs["with_total"])
    assert later["items_per_s"] < first["items_per_s"]
    assert later["eta_s"] > first["eta_s"]


def test_a_fresh_job_has_no_rate_yet(broker: BrokerProcess) -> None:
    with broker.client() as c:
        job = declare(c, total_items=100)
        answer = c.call("job.report", job_id=job["job_id"], chunk_id="a", completed=50)
        # reported within milliseconds of the declaration: no absurd items/s, no ETA
        assert answer["job"]["items_per_s"] is None and answer["job"]["eta_s"] is None
        c.call("job.update", job_id=job["job_id"], state="cancelled", reason="test over")


def test_active_hides_finished_jobs(broker: BrokerProcess, jobs: dict[str, str]) -> None:
    out = _cli("--socket", broker.socket, "--active", "--json")
    ids = {j["job_id"] for j in json.loads(out.stdout)}
    assert jobs["with_total"] in ids and jobs["done"] not in ids


def _watch(broker: BrokerProcess, sigint_ignored: bool = False) -> subprocess.Popen[str]:
    """`rbroker jobs --watch` on `broker`, its output piped; `sigint_ignored`: started as a
    non-interactive shell starts a background job, with SIGINT ignored."""
    return subprocess.Popen(
        [sys.executable, "-m", "rbroker", "jobs", "--socket", broker.socket, "--watch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        if sigint_ignored
        else None,
    )


@pytest.mark.parametrize("sigint_ignored", [False, True], ids=["default", "sigint-ignored"])
def test_watch_ends_cleanly_on_ctrl_c(
    broker: BrokerProcess, jobs: dict[str, str], sigint_ignored: bool
) -> None:
    """Also when started with SIGINT ignored (a script's background job): before, `rbroker
    jobs --watch` then never ended on SIGINT ("until Ctrl-C")."""
    proc = _watch(broker, sigint_ignored)
    try:
        time.sleep(2.0)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert jobs["with_total"] in out


def test_no_broker_exits_69(short_dir: Path) -> None:
    out = _cli("--socket", str(short_dir / "none.sock"))
    assert out.returncode == 69
    assert "no rbroker broker" in out.stderr


@pytest.mark.parametrize("after_s", [0.0, 0.5, 1.0, 1.9])
def test_ctrl_c_at_any_moment_never_prints_a_traceback(
    broker: BrokerProcess, jobs: dict[str, str], after_s: float
) -> None:
    """Ctrl-C can land anywhere in the watch loop (a fetch, printing, the pause, closing):
    exit 0 or 130, never a KeyboardInterrupt traceback. (During the interpreter's own start,
    before rbroker's code runs, Python itself prints one: out of reach.)"""
    proc = _watch(broker)
    assert proc.stdout is not None
    proc.stdout.readline()  # the first table is out: rbroker's code runs
    time.sleep(after_s)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=20)
    assert proc.returncode in (0, 130), err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_watch_reconnects_when_the_broker_restarts() -> None:
    """Before: `[Errno 32] Broken pipe` and the end of the watch. Now a lost broker is one
    line on stderr, then the tables go on from the restarted broker (same socket and data
    dir, so the job is still there)."""
    root = short_tmp()
    first = start_broker(SINGLE_24G, root=root)
    restarted: BrokerProcess | None = None
    try:
        with first.client() as c:
            job = declare(c, purpose="survives a broker restart", total_items=10)
        proc = _watch(first)
        assert proc.stdout is not None and proc.stderr is not None
        try:
            assert "Jobs (1)" in proc.stdout.readline()
            first.stop(signal.SIGKILL)
            lost = proc.stderr.readline()
            assert lost.startswith("rbroker jobs: broker not answering, trying again every 1 s")
            restarted = start_broker(SINGLE_24G, root=root)
            back = proc.stderr.readline()
            assert back == "rbroker jobs: the broker answers again\n"
            seen = ""
            deadline = time.monotonic() + 20
            while job["job_id"] not in seen and time.monotonic() < deadline:
                seen += proc.stdout.readline()
            assert job["job_id"] in seen
            assert proc.poll() is None, "the watch ended"
        finally:
            proc.send_signal(signal.SIGINT)
            _out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert "Traceback" not in err and "Broken pipe" not in err
    finally:
        for bp in (first, restarted):
            if bp is not None:
                bp.stop(signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)
