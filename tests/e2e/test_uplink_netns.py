"""Two brokers with their own network addresses (network namespaces joined by veth pairs to
the coordinator's namespace): cutting one computer's link makes only that computer stale.

Needs root and iproute2 (`ip netns`). All addresses live only inside the namespaces this
test creates, and everything it creates is removed at the end. Where the machine does not
allow namespaces, the test is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import rbroker
from tests.conftest import SINGLE_24G, BrokerProcess, short_tmp, wait_until
from tests.e2e.conftest import by_name, py_env, setup_coordinator

STALE_AFTER_S = 10.0
SUBNET = "10.77"
"""Test addresses: 10.77.1.0/24 (lab-a ↔ coordinator), 10.77.2.0/24 (lab-b ↔ coordinator)."""


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False, timeout=20)


def _must(*args: str) -> None:
    done = _ip(*args)
    assert done.returncode == 0, f"ip {' '.join(args)}: {done.stderr}"


@pytest.fixture
def namespaces() -> Iterator[dict[str, str]]:
    """Three fresh namespaces (coordinator, lab-a, lab-b) with veth links lab-x ↔ coordinator.

    Yields `{"coord": ns, "lab-a": ns, "lab-b": ns, "lab-a-if": link, "lab-b-if": link}`.
    """
    if sys.platform != "linux" or shutil.which("ip") is None:
        pytest.skip("needs Linux with iproute2 (`ip`)")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = "rbt" + secrets.token_hex(3)
    names = {"coord": f"{tag}c", "lab-a": f"{tag}a", "lab-b": f"{tag}b"}
    made: list[str] = []
    try:
        for ns in names.values():
            done = _ip("netns", "add", ns)
            if done.returncode != 0:
                pytest.skip(
                    f"this machine does not allow network namespaces: {done.stderr.strip()}"
                )
            made.append(ns)
        for i, lab in enumerate(("lab-a", "lab-b"), start=1):
            coord_if, lab_if = f"{tag}c{i}", f"{tag}l{i}"
            done = _ip(
                "link", "add", coord_if, "netns", names["coord"], "type", "veth",
                "peer", "name", lab_if, "netns", names[lab],
            )  # fmt: skip
            if done.returncode != 0:
                pytest.skip(f"this machine does not allow veth pairs: {done.stderr.strip()}")
            _must("-n", names["coord"], "addr", "add", f"{SUBNET}.{i}.1/24", "dev", coord_if)
            _must("-n", names[lab], "addr", "add", f"{SUBNET}.{i}.2/24", "dev", lab_if)
            _must("-n", names["coord"], "link", "set", coord_if, "up")
            _must("-n", names[lab], "link", "set", lab_if, "up")
            names[f"{lab}-if"] = lab_if
        for ns in made:
            _must("-n", ns, "link", "set", "lo", "up")
        yield names
    finally:
        for ns in made:
            _ip("netns", "pids", ns)  # (informational; processes are ended by their fixtures)
            _ip("netns", "del", ns)


def _start_broker_in(ns: str, root: Path) -> BrokerProcess:
    """`ip netns exec NS python -m rbroker broker --simulate ...`, answering on its Unix
    socket (a file, reachable from any network namespace)."""
    scenario = root / "scenario.toml"
    scenario.write_text(textwrap.dedent(SINGLE_24G))
    sock = str(root / "broker.sock")
    log_path = root / "broker.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "rbroker", "broker",
             "--simulate", str(scenario), "--socket", sock, "--data-dir", str(root / "data"), "-v"],
            stdout=log, stderr=subprocess.STDOUT, env=py_env(),
        )  # fmt: skip
    bp = BrokerProcess(proc, sock, root / "data", scenario, log_path)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited:\n{bp.log()}")
        try:
            with rbroker.Client(sock, timeout_s=2):
                return bp
        except rbroker.BrokerUnavailable:
            time.sleep(0.1)
    bp.stop(signal.SIGKILL)
    raise RuntimeError(f"broker did not answer:\n{bp.log()}")


def _enroll_in(ns: str, url: str, code: str, data: Path, name: str) -> str:
    """Enroll from inside `ns` (retrying while the coordinator starts); the computer id."""
    deadline = time.monotonic() + 60
    while True:
        done = subprocess.run(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "rbroker", "enroll", url, code,
             "--name", name, "--data-dir", str(data), "--key-file"],
            capture_output=True, text=True, env=py_env(COLUMNS="200"), timeout=60, check=False,
        )  # fmt: skip
        if done.returncode == 0:
            return str(json.loads((data / "uplink.json").read_text())["computer_id"])
        # not listening yet: refused ("nothing accepts connections"), or not reached at all
        # (rbroker.uplink.errors words them apart); any other refusal is the answer
        starting = ("cannot reach", "nothing accepts connections")
        if not any(s in done.stderr for s in starting) or time.monotonic() > deadline:
            raise AssertionError(done.stderr)
        time.sleep(0.5)


@pytest.mark.slow
def test_cutting_one_link_makes_only_that_computer_stale(
    namespaces: dict[str, str], tmp_path: Path
) -> None:
    coordinator = setup_coordinator(tmp_path, stale_after_s=STALE_AFTER_S)
    coordinator.prefix = ["ip", "netns", "exec", namespaces["coord"]]
    started: list[Callable[[], Any]] = []
    try:
        coordinator.start()
        started.append(coordinator.stop)
        reader = coordinator.second()  # the same database, served on 127.0.0.1 here
        started.append(reader.stop)
        brokers: dict[str, BrokerProcess] = {}
        for i, lab in enumerate(("lab-a", "lab-b"), start=1):
            root = short_tmp()
            url = f"http://{SUBNET}.{i}.1:{coordinator.port}"
            _enroll_in(namespaces[lab], url, coordinator.new_code(), root / "data", lab)
            brokers[lab] = _start_broker_in(namespaces[lab], root)
            started.append(lambda b=brokers[lab]: b.stop(signal.SIGKILL))

        def states() -> dict[str, str]:
            return {n: c["freshness"]["state"] for n, c in by_name(reader.fleet()).items()}

        wait_until(lambda: states() == {"lab-a": "online", "lab-b": "online"}, timeout_s=30)

        _must("-n", namespaces["lab-a"], "link", "set", namespaces["lab-a-if"], "down")
        cut_at = time.monotonic()
        wait_until(lambda: states()["lab-a"] == "stale", timeout_s=STALE_AFTER_S + 15)
        took = time.monotonic() - cut_at
        print(f"netns: lab-a stale {took:.1f} s after its link was cut")
        fleet = by_name(reader.fleet())
        assert fleet["lab-b"]["freshness"]["state"] == "online"
        assert fleet["lab-a"]["gpus"][0]["total_mib"] == 24576  # last known values kept
        with brokers["lab-a"].client() as c:
            assert c.status()["coordinator"]["link"].startswith("retrying since ")
        with brokers["lab-b"].client() as c:
            assert c.status()["coordinator"]["link"] == "ok"
        applied = fleet["lab-b"]["reports_applied"]
        wait_until(  # lab-b keeps reporting while lab-a is cut off
            lambda: by_name(reader.fleet())["lab-b"]["reports_applied"] > applied, timeout_s=10
        )
        assert states() == {"lab-a": "stale", "lab-b": "online"}

        _must("-n", namespaces["lab-a"], "link", "set", namespaces["lab-a-if"], "up")
        back_at = time.monotonic()
        wait_until(lambda: states() == {"lab-a": "online", "lab-b": "online"}, timeout_s=20)
        print(f"netns: lab-a online {time.monotonic() - back_at:.1f} s after the link returned")
    finally:
        for stop in reversed(started):
            with contextlib.suppress(Exception):
                stop()
