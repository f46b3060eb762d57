"""One broker per computer: the machine-wide lock (architecture.md §5, issue 13).

Every test names its own lock (`rbroker-locktest-<pid>-<n>`), shared by the brokers of that
test only, so these tests run beside the rest of the suite and beside a real broker. The
brokers are real processes; the lock is the production one (an abstract Unix socket).
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import rbroker
from rbroker.demo.processes import SimulatedBroker
from rbroker.hosting.embedded import EmbeddedBroker
from rbroker.hosting.host import make_config
from rbroker.hosting.machine_lock import (
    DEFAULT_LOCK_NAME,
    ENV_LOCK,
    PER_SOCKET,
    acquire_machine_lock,
    ignored_lock_variable,
    lock_name,
    sees_system_broker,
)
from rbroker.transport.base import MachineLockHeld
from rbroker_protocol.startup import EXIT_BROKER_ALREADY_RUNNING
from tests.conftest import SINGLE_24G, short_tmp
from tests.os_users import REPO, OsUser, python_as

pytestmark = [
    pytest.mark.contract,
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="the abstract-socket lock is Linux's"
    ),
]

_counter = itertools.count()


@pytest.fixture
def lock() -> str:
    """A lock name for this test's brokers only."""
    return f"rbroker-locktest-{os.getpid()}-{next(_counter)}"


@pytest.fixture
def roots() -> Iterator[list[Path]]:
    made: list[Path] = []
    yield made
    for root in made:
        shutil.rmtree(root, ignore_errors=True)


def _broker(lock: str, roots: list[Path]) -> SimulatedBroker:
    root = short_tmp()
    roots.append(root)
    broker: SimulatedBroker = SimulatedBroker.start(SINGLE_24G, root, ["--machine-lock", lock])
    return broker


def _second(lock: str, roots: list[Path], *prefix: str) -> subprocess.CompletedProcess[str]:
    root = short_tmp()
    roots.append(root)
    if prefix:
        os.chmod(root, 0o777)
    cmd = [*prefix, "broker", "--simulate", "--machine-lock", lock]
    cmd += ["--socket", str(root / "b.sock"), "--data-dir", str(root / "data")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd="/")


def _rbroker_as(user: OsUser) -> list[str]:
    python = python_as(user.name)
    if python is None:
        pytest.skip("this interpreter cannot be run by another user")
    return ["runuser", "-u", user.name, "--", "env", f"PYTHONPATH={REPO}", *python]


# --- the name -------------------------------------------------------------------------


def test_a_simulated_broker_takes_a_lock_of_its_own_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: `rbroker broker --simulate` (and `rbroker tray --simulate`) with default flags
    took `rbroker-broker` and kept the computer's real broker from starting."""
    monkeypatch.delenv(ENV_LOCK, raising=False)
    sock = "/run/rbroker/broker.sock"
    assert lock_name(None, sock, simulated=False) == DEFAULT_LOCK_NAME == "rbroker-broker"
    assert lock_name(None, sock, simulated=True) == lock_name(PER_SOCKET, sock, simulated=True)
    assert lock_name(None, sock, simulated=True) != DEFAULT_LOCK_NAME
    assert not sees_system_broker(None, simulated=True)
    assert sees_system_broker(None, simulated=False)
    assert sees_system_broker(DEFAULT_LOCK_NAME, simulated=True)  # stands for a real one
    monkeypatch.setenv(ENV_LOCK, "site-lock")
    assert lock_name(None, "/x.sock", simulated=True) == "site-lock"
    assert sees_system_broker(None, simulated=True)
    assert lock_name("given", "/x.sock", simulated=True) == "given"  # the option wins


def test_a_broker_on_real_gpus_always_takes_the_computers_lock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: any name (option or variable) let a second broker run on real GPUs."""
    monkeypatch.setenv(ENV_LOCK, PER_SOCKET)
    assert lock_name(None, "/x.sock", simulated=False) == DEFAULT_LOCK_NAME  # ignored
    assert ignored_lock_variable(simulated=False) == PER_SOCKET
    assert ignored_lock_variable(simulated=True) is None
    assert lock_name(DEFAULT_LOCK_NAME, "/x.sock", simulated=False) == DEFAULT_LOCK_NAME
    for other in ("x", PER_SOCKET):
        with pytest.raises(ValueError, match="real GPUs always takes the computer's lock"):
            lock_name(other, "/x.sock", simulated=False)
    monkeypatch.setenv(ENV_LOCK, DEFAULT_LOCK_NAME)
    assert ignored_lock_variable(simulated=False) is None  # nothing to say


def test_per_socket_names_differ_by_socket_and_are_stable() -> None:
    a = lock_name(PER_SOCKET, "/tmp/a/broker.sock", simulated=True)
    assert a == lock_name(PER_SOCKET, "/tmp/a/broker.sock", simulated=True)
    assert a != lock_name(PER_SOCKET, "/tmp/b/broker.sock", simulated=True)
    assert a.startswith("rbroker-broker-") and a != DEFAULT_LOCK_NAME


@pytest.mark.parametrize("bad", ["a b", "x" * 81, "../etc", "a\0b"])
def test_a_bad_name_is_refused_with_the_rule(bad: str) -> None:
    with pytest.raises(ValueError, match="1 to 80 letters"):
        lock_name(bad, "/x.sock", simulated=True)


def test_the_cli_refuses_a_bad_name_with_exit_2(roots: list[Path]) -> None:
    done = _second("no spaces allowed", roots, sys.executable, "-m", "rbroker")
    assert done.returncode == 2, done.stderr
    assert "--machine-lock" in done.stderr and "1 to 80 letters" in done.stderr


def test_the_cli_refuses_another_name_without_simulate_with_exit_2(roots: list[Path]) -> None:
    root = short_tmp()
    roots.append(root)
    cmd = [sys.executable, "-m", "rbroker", "broker", "--machine-lock", "x"]
    cmd += ["--socket", str(root / "b.sock"), "--data-dir", str(root / "data")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 2, done.stderr
    assert "--machine-lock" in done.stderr and "real GPUs" in done.stderr
    assert "--simulate" in done.stderr
    assert not (root / "data").exists()  # refused before anything was made


_HOLD_THEN_START = """
import json, subprocess, sys
from rbroker.hosting.machine_lock import acquire_machine_lock
held = acquire_machine_lock("rbroker-broker", "/holder.sock", "holder")
done = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=60, cwd="/")
print(json.dumps({"rc": done.returncode, "stderr": done.stderr}))
"""


@pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0,
    reason="needs unshare and root for a network namespace of its own",
)
def test_a_broker_on_real_gpus_ignores_the_variable_and_says_so(
    roots: list[Path], other_user: OsUser
) -> None:
    """`RBROKER_BROKER_LOCK=x rbroker broker` (no --simulate) of another user, while the
    computer's lock is held: exit 3 naming the holder, the variable ignored in the log. In a
    network namespace of its own, so the computer's real lock is never touched."""
    prefix = _rbroker_as(other_user)
    root = short_tmp()
    roots.append(root)
    os.chown(root, other_user.uid, other_user.gid)
    broker = [*prefix, "broker", "--socket", str(root / "b.sock")]
    broker += ["--data-dir", str(root / "data")]
    broker[broker.index("env") + 1 : broker.index("env") + 1] = [f"{ENV_LOCK}=x"]
    done = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", _HOLD_THEN_START, *broker],
        capture_output=True,
        text=True,
        timeout=90,
        cwd="/",
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["rc"] == EXIT_BROKER_ALREADY_RUNNING == 3, result["stderr"]
    assert f"ignoring {ENV_LOCK}=x" in result["stderr"]
    assert "socket /holder.sock" in result["stderr"]
    assert not (root / "data").exists()  # the lock is taken before the data dir


# --- in one process -------------------------------------------------------------------


def test_a_held_lock_names_its_holder_and_is_free_after_release(lock: str) -> None:
    first = acquire_machine_lock(lock, "/run/x/broker.sock", "alice")
    try:
        with pytest.raises(MachineLockHeld) as held:
            acquire_machine_lock(lock, "/elsewhere.sock", getpass.getuser())
        holder = held.value.holder
        assert holder.pid == os.getpid()
        assert holder.user == getpass.getuser()  # from SO_PEERCRED, not from what it says
        assert holder.socket == "/run/x/broker.sock"
        assert f"pid {os.getpid()}" in str(held.value)
    finally:
        first.release()
    again = acquire_machine_lock(lock, "/elsewhere.sock", "bob")
    again.release()
    again.release()  # idempotent


# --- brokers as processes -------------------------------------------------------------


def test_a_second_broker_of_the_same_user_exits_3_naming_the_first(
    lock: str, roots: list[Path]
) -> None:
    first = _broker(lock, roots)
    try:
        done = _second(lock, roots, sys.executable, "-m", "rbroker")
        assert done.returncode == EXIT_BROKER_ALREADY_RUNNING == 3, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert f"user {getpass.getuser()}" in lines[0]
        assert f"pid {first.pid}" in lines[0]
        assert f"socket {first.socket}" in lines[0]
        with rbroker.Client(first.socket) as c:  # the first is left alone
            assert c.gpus()
    finally:
        first.terminate()


def test_a_tray_hosted_broker_refuses_while_one_runs(lock: str, roots: list[Path]) -> None:
    first = _broker(lock, roots)
    root = short_tmp()
    roots.append(root)
    try:
        config = make_config(str(root / "t.sock"), root / "data", True, None, None)
        config = dataclasses.replace(config, machine_lock=lock)
        embedded = EmbeddedBroker(config)
        embedded.start()
        assert not embedded.wait_ready(30)
        assert isinstance(embedded.error, MachineLockHeld)
        assert f"pid {first.pid}" in str(embedded.error)
        embedded.stop()
        assert not (root / "t.sock").exists()
    finally:
        first.terminate()


def test_after_sigkill_of_the_holder_the_next_broker_starts_at_once(
    lock: str, roots: list[Path]
) -> None:
    first = _broker(lock, roots)
    first.terminate(signal.SIGKILL)
    assert first.proc.returncode == -signal.SIGKILL
    started = time.monotonic()
    taken = acquire_machine_lock(lock, "/probe.sock", "probe")  # no stale lock to wait out
    free_after_s = time.monotonic() - started
    taken.release()
    assert free_after_s < 1.0, f"the lock was free only after {free_after_s:.2f} s"
    # the broker's own socket file is stale too: the next broker on it starts all the same
    root = Path(first.socket).parent
    assert Path(first.socket).exists()
    second: SimulatedBroker = SimulatedBroker.start(SINGLE_24G, root, ["--machine-lock", lock])
    try:
        with rbroker.Client(second.socket) as c:
            assert c.gpus()
    finally:
        second.terminate()


def test_another_users_broker_refuses_while_mine_runs(
    lock: str, roots: list[Path], other_user: OsUser
) -> None:
    prefix = _rbroker_as(other_user)
    first = _broker(lock, roots)
    try:
        done = _second(lock, roots, *prefix)
        assert done.returncode == 3, done.stderr
        assert f"user {getpass.getuser()}, pid {first.pid}" in done.stderr
    finally:
        first.terminate()


def test_a_live_lock_of_another_user_is_never_taken_over(
    lock: str, roots: list[Path], other_user: OsUser
) -> None:
    prefix = _rbroker_as(other_user)
    root = short_tmp()
    roots.append(root)
    os.chown(root, other_user.uid, other_user.gid)
    sock = str(root / "b.sock")
    cmd = [*prefix, "broker", "--simulate", "--machine-lock", lock, "--socket", sock]
    theirs = subprocess.Popen(
        [*cmd, "--data-dir", str(root / "data")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd="/",
        start_new_session=True,  # runuser forks the broker: the group is killed at the end
    )
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(sock):
            assert theirs.poll() is None, theirs.stderr.read() if theirs.stderr else ""
            assert time.monotonic() < deadline, "the other user's broker did not start"
            time.sleep(0.05)
        for _ in range(3):  # root is refused too, every time
            done = _second(lock, roots, sys.executable, "-m", "rbroker")
            assert done.returncode == 3, done.stderr
            assert f"user {other_user.name}" in done.stderr
            assert f"socket {sock}" in done.stderr
        with pytest.raises(MachineLockHeld):
            acquire_machine_lock(lock, "/probe.sock", "root")
        assert theirs.poll() is None  # and theirs still runs
    finally:
        theirs.send_signal(signal.SIGTERM)
        try:
            theirs.wait(20)
        except subprocess.TimeoutExpired:
            theirs.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(theirs.pid, signal.SIGKILL)  # the broker, were runuser gone before it
        theirs.wait(5)
        if theirs.stderr:
            theirs.stderr.close()
