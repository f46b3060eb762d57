"""`rbroker demo` starts an embedded coordinator (SQLite in its temp dir, 127.0.0.1), enrolls
its broker, prints the fleet URL and a viewer token, and its summary says what the
coordinator saw; everything it started is gone afterwards."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import finish
from tests.e2e.conftest import py_env


@pytest.mark.slow
def test_demo_reports_what_the_coordinator_saw() -> None:
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rbroker", "demo", "--no-live", "--simulate", "--seconds", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=py_env(COLUMNS="200"),
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    first_after_s = time.monotonic() - started
    rest, err = finish(proc, 240)  # the lines `first` buffered past itself included
    out = first + rest
    assert proc.returncode == 0, out + err
    # it says what it does at once (before: 20-35 s of silence while it set up), and while
    # it sets up a line comes at least every 3 s
    assert first.startswith("rbroker demo: a local broker, 8 worker processes"), first
    assert first_after_s < 2.0 + 1.5, first_after_s  # 2 s, plus the interpreter's start
    assert "Setting up a coordinator on SQLite" in out and "Starting the broker" in out
    head = re.search(
        r"coordinator: (http://127\.0\.0\.1:\d+)\s+fleet: (\S+)\s+viewer token: (rbv_\S+)", out
    )
    assert head, out
    url, fleet_url, token = head.groups()
    assert fleet_url == url + "/api/v1/fleet"
    saw = re.search(r"coordinator \((\S+), group (\S+)\) saw:", out)
    assert saw and saw.group(1) == url, out
    line = re.search(r"demo-computer: online, (\d+) GPUs .*?(\d+) signed reports applied", out)
    assert line, out
    assert int(line.group(1)) >= 1 and int(line.group(2)) >= 1
    assert re.search(r"at most [1-9]\d* leases", out), out
    job = re.search(r"  job (\S+): succeeded, (\d+) completed \+ (\d+) failed of (\d+)", out)
    assert job and int(job.group(2)) + int(job.group(3)) == int(job.group(4)), out
    assert f"Authorization: Bearer {token}" in out
    assert "(the coordinator stops with the demo; --keep keeps it up)" in out
    # the crash's times, measured from the kill: never negative
    freed = re.search(r"lease of \S+ freed (-?\d+) ms after the kill", out)
    assert freed and int(freed.group(1)) >= 0, out
    later = re.search(r"its lease was freed (-?\d+) ms later", out)
    assert later and int(later.group(1)) >= 0, out
    assert not re.search(r"-\d+ ms", out), out
    # a waiting request is told when, not only why: its estimate and how close it came
    told = re.search(
        r"broker said likely in ~(\d+) s; granted after ([\d.]+) s: [\d.]+ s (later|sooner) "
        r"than told",
        out,
    )
    assert told, out
    # from the durations its workers declared (nothing is put in the broker's store first)
    assert "the queue's estimates come from the holders' declared durations" in out, out
    assert re.search(r"likely in ~\d+ s \(because \d+ leases? of .* declared to end", out), out
    # the embedded coordinator ended with the demo
    with pytest.raises(httpx.HTTPError):
        httpx.get(url + "/healthz", timeout=2)


@pytest.mark.slow
def test_demo_keep_leaves_the_coordinator_up_until_ctrl_c() -> None:
    """`--keep`: after the summary the printed fleet command works until Ctrl-C, which then
    stops the broker and the coordinator and exits with the checks' code (0), not 130."""
    cmd = [sys.executable, "-m", "rbroker", "demo", "--no-live", "--simulate", "--seconds", "10"]
    proc = subprocess.Popen(
        [*cmd, "--keep"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=py_env(COLUMNS="200"),
    )
    try:
        assert proc.stdout is not None
        out = ""
        deadline = time.monotonic() + 240
        while "web view:" not in out:
            line = proc.stdout.readline()
            assert line and time.monotonic() < deadline, out
            out += line
        web = re.search(
            r"web view: open (http://127\.0\.0\.1:\d+)/ in a browser and sign in with the "
            r"viewer token (rbv_\S+)",
            out,
        )
        assert web, out
        page = httpx.get(web.group(1) + "/signin", timeout=10)
        assert page.status_code == 200 and "token" in page.text.lower(), page.text[:300]
        fleet = re.search(r"fleet: curl -H 'Authorization: Bearer (rbv_\S+)' (\S+)", out)
        assert fleet, out
        assert "the coordinator stops with the demo" not in out
        token, fleet_url = fleet.groups()
        answer = httpx.get(fleet_url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert answer.status_code == 200, answer.text
        assert [c["name"] for c in answer.json()["computers"]] == ["demo-computer"]
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out + rest
        assert "broker and coordinator stopped" in rest
    finally:
        proc.kill()
        proc.wait(10)
    with pytest.raises(httpx.HTTPError):
        httpx.get(fleet_url, timeout=2)
