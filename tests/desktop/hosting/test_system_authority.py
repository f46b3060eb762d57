"""The system broker's authority, shared by real OS users (architecture.md §5).

No unprivileged user can keep the system broker down: its authority is a lock file in its
socket's directory that only root and its account can hold, so a user outside the allowed
group who binds the abstract name first changes nothing. A process holding the name without
answering is named by user and pid (or the line says how to find it), never as a broker. A
simulated broker with default flags takes nothing of the computer's. The broker, its clients
and their lines name a uid without a passwd entry by its number. Needs root, useradd and
runuser (CI runs as root); skips cleanly without them. The brokers' lock names are this
test's own, and the system socket's directory is the test's, so a real broker is never
touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import rbroker
from rbroker.hosting.authority import LOCK_FILE
from rbroker.hosting.machine_lock import ENV_LOCK
from rbroker.transport.system_paths import ENV_SYSTEM_SOCKET
from tests.conftest import short_tmp
from tests.desktop.hosting.test_system_broker import (
    SystemBroker,
    _broker_command,
    _spawn,
    _stop,
    _wait_answering,
    system_broker,  # noqa: F401 - a fixture
    users,  # noqa: F401 - a fixture
)
from tests.os_users import REPO, OsUser, python_as

pytestmark = [
    pytest.mark.contract,
    pytest.mark.skipif(
        not sys.platform.startswith("linux")
        or os.geteuid() != 0
        or shutil.which("useradd") is None
        or shutil.which("runuser") is None,
        reason="needs Linux, root, useradd and runuser to create the broker's and the users' "
        "accounts",
    ),
]

_SQUAT = (
    "import os, socket, sys, time; s = socket.socket(socket.AF_UNIX); s.bind('\\0' + sys.argv[1])"
    "; print(os.getpid(), flush=True); time.sleep(300)"
)


def _system_python(code: str) -> list[str]:
    """`python -c CODE` for an account that cannot reach this interpreter (it lives in
    root's home): the system's interpreter of the same version with this environment's
    packages added; skips where there is none."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/local/bin:/usr/bin")
    if system is None:
        pytest.skip(f"no system {version} another account can run")
    site = sysconfig.get_paths()["purelib"]
    return [system, "-c", f"import site; site.addsitedir({site!r}); {code}"]


_MODULE = (
    "import runpy, sys; sys.argv[0] = 'rbroker'; "
    "runpy.run_module('rbroker', run_name='__main__', alter_sys=True)"
)


class Squatter:
    """A process of `user` that binds `\\0name` and never listens on it."""

    def __init__(self, user: OsUser, name: str) -> None:
        self.proc = subprocess.Popen(
            ["runuser", "-u", user.name, "--", *_system_python(_SQUAT), name],
            stdout=subprocess.PIPE,
            text=True,
            cwd="/",
            start_new_session=True,  # runuser forks the squatter: `stop` kills the group
        )
        assert self.proc.stdout is not None
        self.pid = int(self.proc.stdout.readline())

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        if self.proc.stdout:
            self.proc.stdout.close()


@pytest.fixture
def dirs() -> Iterator[Path]:
    root = short_tmp()
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _as(user: OsUser, *args: str, env: dict[str, str] | None = None) -> list[str]:
    python = python_as(user.name)
    if python is None:
        pytest.skip("this interpreter cannot be run by another user")
    extra = [f"{k}={v}" for k, v in (env or {}).items()]
    return ["runuser", "-u", user.name, "--", "env", f"PYTHONPATH={REPO}", *extra, *python, *args]


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, cwd="/")


def _per_user(root: Path, lock: str, *prefix: str) -> list[str]:
    cmd = list(prefix) or [sys.executable, "-m", "rbroker"]
    return [*cmd, "broker", "--simulate", "--machine-lock", lock,
            "--socket", str(root / "b.sock"), "--data-dir", str(root / "data")]  # fmt: skip


def test_a_squatter_outside_the_group_cannot_keep_the_system_broker_down(
    users: dict[str, OsUser],  # noqa: F811
    dirs: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: carol bound `\\0rbroker-broker` first and the system broker exited 3 (and
    restart-looped under its unit). Now it starts, and every per-user broker refuses naming
    it, not carol; carol cannot touch its lock file."""
    service, carol = users["service"], users["carol"]
    for sub, mode in (("run", 0o755), ("data", 0o750)):
        (dirs / sub).mkdir(mode=mode)
        os.chown(dirs / sub, service.uid, service.gid)
    sock = str(dirs / "run" / "broker.sock")
    monkeypatch.setenv(ENV_SYSTEM_SOCKET, sock)
    lock = f"rbroker-authtest-{os.getpid()}-{dirs.name}"
    squatter = Squatter(carol, lock)
    proc = _spawn(_broker_command(service, dirs, service.name, lock))
    try:
        _wait_answering(proc, sock)
        with rbroker.Client(sock) as c:
            assert c.gpus()
        own = short_tmp()
        try:
            for name in (lock, f"{lock}-other"):  # the squatted name, and another one
                done = _run(_per_user(own, name))
                assert done.returncode == 3, done.stderr
                lines = done.stderr.strip().splitlines()
                assert len(lines) == 1, done.stderr
                assert "the system broker is running on this computer" in lines[0]
                assert f"user {service.name}, pid " in lines[0] and f"socket {sock}" in lines[0]
                assert carol.name not in lines[0]
        finally:
            shutil.rmtree(own, ignore_errors=True)
        lock_file = str(dirs / "run" / LOCK_FILE)
        probe = _run(["runuser", "-u", carol.name, "--",
                      *_system_python(f"open({lock_file!r}, 'rb')")])  # fmt: skip
        assert probe.returncode != 0 and "Permission denied" in probe.stderr
    finally:
        _stop(proc)
        squatter.stop()


def test_a_squatter_that_never_listens_is_named_by_user_and_pid_never_as_a_broker(
    users: dict[str, OsUser],  # noqa: F811
    dirs: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: "another rbroker broker is already running (user unknown, pid unknown, socket
    unknown)", while no broker ran."""
    carol, bob = users["carol"], users["bob"]
    monkeypatch.setenv(ENV_SYSTEM_SOCKET, str(dirs / "no-system" / "broker.sock"))
    lock = f"rbroker-authtest-{os.getpid()}-{dirs.name}"
    squatter = Squatter(carol, lock)
    try:
        mine = dirs / "root"
        done = _run(_per_user(mine, lock))
        assert done.returncode == 3, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert f"user {carol.name}, pid {squatter.pid}" in lines[0]
        assert "does not answer as a broker" in lines[0] and "no broker runs" in lines[0]
        assert "already running" not in lines[0] and "second one" not in lines[0]
        # bob cannot see carol's processes: the line says how to find the holder
        theirs = dirs / "bob"
        theirs.mkdir()
        os.chown(theirs, bob.uid, bob.gid)
        env = {ENV_SYSTEM_SOCKET: str(dirs / "no-system" / "broker.sock")}
        done = _run(_per_user(theirs, lock, *_as(bob, env=env)))
        assert done.returncode == 3, done.stderr
        assert f"ss -xlp | grep {lock}" in done.stderr, done.stderr
        assert "already running" not in done.stderr
    finally:
        squatter.stop()


def test_a_per_user_broker_refuses_while_the_system_broker_runs_whatever_its_lock_name(
    system_broker: SystemBroker,  # noqa: F811
) -> None:
    own = short_tmp()
    try:
        done = _run(_per_user(own, f"{system_broker.lock}-x"))
        assert done.returncode == 3, done.stderr
        assert "the system broker is running on this computer" in done.stderr
        assert f"user {system_broker.service.name}, pid " in done.stderr
        assert not (own / "data").exists()
    finally:
        shutil.rmtree(own, ignore_errors=True)


def test_a_simulated_broker_with_default_flags_is_not_blocked_by_the_system_broker(
    system_broker: SystemBroker,  # noqa: F811
) -> None:
    """Before: a default `rbroker broker --simulate` took the computer's lock (and blocked
    the system broker when it came first). Now it takes a lock of its own."""
    own = short_tmp()
    env = {k: v for k, v in os.environ.items() if k != ENV_LOCK}
    cmd = [sys.executable, "-m", "rbroker", "broker", "--simulate"]
    cmd += ["--socket", str(own / "b.sock"), "--data-dir", str(own / "data")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_answering(proc, str(own / "b.sock"))
        with rbroker.Client(system_broker.socket) as c:  # and the system broker still runs
            assert c.gpus()
    finally:
        _stop(proc)
        shutil.rmtree(own, ignore_errors=True)


def test_an_allowed_group_the_account_is_not_in_is_one_line_naming_it(
    users: dict[str, OsUser],  # noqa: F811
    dirs: Path,
) -> None:
    """Before: "Operation not permitted", naming no group."""
    alice, carol = users["alice"], users["carol"]
    mine = dirs / "alice"
    mine.mkdir()
    os.chown(mine, alice.uid, alice.gid)
    done = _run(
        _as(
            alice,
            "broker",
            "--simulate",
            "--allowed-group",
            carol.name,
            "--socket",
            str(mine / "b.sock"),
            "--data-dir",
            str(mine / "data"),
        )
    )
    assert done.returncode == 11, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"not a member of the group {carol.name!r}" in lines[0] and alice.name in lines[0]
    assert not (mine / "b.sock").exists()


_LEASE = (
    "import rbroker, sys; c = rbroker.Client(sys.argv[1]); print(c.call('lease.acquire', "
    "mib=512, project='p', session='s', purpose='uid test')['lease']['owner']); c.close()"
)


def test_a_uid_without_a_passwd_entry_is_named_by_its_number(dirs: Path) -> None:
    """Before: a broker run as a uid the passwd database does not know (a container's
    arbitrary uid) exited 70 with `KeyError: getpwuid()`."""
    uid = 61000 + os.getpid() % 1000
    import pwd

    with pytest.raises(KeyError):
        pwd.getpwuid(uid)
    home = dirs / "home"
    home.mkdir()
    os.chown(home, uid, uid)
    sock = str(home / "b.sock")
    setpriv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "env", "-i",
               f"HOME={home}", f"PYTHONPATH={REPO}", "PATH=/usr/bin:/bin"]  # fmt: skip
    rbroker_cmd = [*setpriv, *_system_python(_MODULE)]
    proc = subprocess.Popen(
        [*rbroker_cmd, "broker", "--simulate", "--socket", sock],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd="/",
    )
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(sock):
            if proc.poll() is not None:
                out = proc.stdout.read().decode() if proc.stdout else ""
                raise AssertionError(f"the broker exited with {proc.returncode}: {out}")
            assert time.monotonic() < deadline, "the broker did not start"
            time.sleep(0.05)
        leased = _run([*setpriv, *_system_python(_LEASE), sock])
        assert leased.returncode == 0, leased.stderr
        assert leased.stdout.strip() == str(uid)
        status = _run([*rbroker_cmd, "status", "--socket", sock])
        assert status.returncode == 0, status.stderr
        assert "Traceback" not in status.stderr
    finally:
        _stop(proc)
