"""The Linux system broker (`rbroker broker --system`) shared by real OS users (issue 13).

The broker runs as its own system account, as packaging/linux/rbroker-broker.service runs it,
with an allowed group; the clients are real OS users made with useradd, who find the broker
through the system address (`RBROKER_SYSTEM_SOCKET` points it into this test's directory, so
the test runs beside a real system broker). Needs root; skips cleanly without it.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import rbroker
from rbroker.client.paths import ENV_SOCKET, FOUND_SYSTEM
from rbroker.hosting.machine_lock import acquire_machine_lock
from rbroker.transport.system_paths import ENV_SYSTEM_SOCKET
from rbroker.transport.unix import LISTEN_BACKLOG
from tests.conftest import short_tmp
from tests.os_users import REPO, OsUser, create_user, python_as, remove_user, run_as

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


@dataclass
class SystemBroker:
    """A running `rbroker broker --system` as the account `service` (group `group`)."""

    proc: subprocess.Popen[bytes]
    socket: str
    data_dir: Path
    root: Path
    service: OsUser
    group: str
    lock: str
    command: list[str]

    def start_again(self) -> subprocess.Popen[bytes]:
        return _spawn(self.command)


def _spawn(cmd: list[str]) -> subprocess.Popen[bytes]:
    """`cmd` (runuser, which forks the broker and waits) in a process group of its own, so
    that `_stop` ends the broker with it."""
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd="/", start_new_session=True
    )


def _wait_answering(proc: subprocess.Popen[bytes], sock: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            out = proc.stdout.read().decode() if proc.stdout else ""
            raise AssertionError(f"system broker exited with {proc.returncode}:\n{out}")
        try:
            with rbroker.Client(sock, timeout_s=2):
                return
        except rbroker.BrokerUnavailable:
            assert time.monotonic() < deadline, "the system broker did not answer"
            time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (runuser hands it to the broker), SIGKILL after 20 s; then SIGKILL to what is
    left of a `_spawn`ed command's process group: killing runuser alone (or runuser killed
    by a test) leaves the broker running."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(5)
    if proc.stdout:
        proc.stdout.close()


def _broker_command(service: OsUser, root: Path, group: str, lock: str) -> list[str]:
    python = python_as(service.name)
    if python is None:
        pytest.skip("this interpreter cannot be run by another user")
    return [
        "runuser", "-u", service.name, "--", "env", f"PYTHONPATH={REPO}",
        f"{ENV_SYSTEM_SOCKET}={root / 'run' / 'broker.sock'}", *python,
        "broker", "--system", "--simulate", "--allowed-group", group,
        "--data-dir", str(root / "data"), "--machine-lock", lock,
    ]  # fmt: skip


@pytest.fixture
def users() -> Iterator[dict[str, OsUser]]:
    """The broker's own account (`service`, its group the allowed one), `alice` and `bob` in
    that group, `carol` outside it."""
    made = {name: create_user(f"rb{name[:2]}") for name in ("service", "alice", "bob", "carol")}
    try:
        for name in ("alice", "bob"):
            subprocess.run(
                ["usermod", "-aG", made["service"].name, made[name].name],
                check=True,
                capture_output=True,
            )
        yield made
    finally:
        for user in made.values():
            remove_user(user)


@pytest.fixture
def system_broker(
    users: dict[str, OsUser], monkeypatch: pytest.MonkeyPatch
) -> Iterator[SystemBroker]:
    """`rbroker broker --system --allowed-group <service's group>` as `service`, its socket
    dir and data dir made as systemd's RuntimeDirectory= and StateDirectory= make them."""
    service = users["service"]
    root = short_tmp()
    os.chmod(root, 0o755)
    for sub, mode in (("run", 0o755), ("data", 0o750)):
        (root / sub).mkdir(mode=mode)
        os.chown(root / sub, service.uid, service.gid)
    sock = str(root / "run" / "broker.sock")
    monkeypatch.setenv(ENV_SYSTEM_SOCKET, sock)  # inherited by the users' forked clients
    monkeypatch.delenv(ENV_SOCKET, raising=False)
    lock = f"rbroker-systest-{os.getpid()}-{root.name}"
    cmd = _broker_command(service, root, service.name, lock)
    proc = _spawn(cmd)
    try:
        _wait_answering(proc, sock)
        yield SystemBroker(proc, sock, root / "data", root, service, service.name, lock, cmd)
    finally:
        _stop(proc)
        shutil.rmtree(root, ignore_errors=True)


# --- what the users run (in a child process dropped to their account) --------------------


def _hold_and_look(me: str, shared: str, peer: str) -> dict[str, Any]:
    """Lease through the system broker (found by discovery), publish the lease id, wait for
    `peer`'s, then list the leases and try to renew and release `peer`'s lease."""
    out: dict[str, Any] = {}
    with rbroker.Client(timeout_s=30) as c:
        out["found_by"] = c.found_by
        lease = c.call("lease.acquire", mib=1024, project="shared", session=me, purpose="test")
        mine = lease["lease"]["lease_id"]
        Path(shared, f"{me}.id").write_text(mine)
        theirs_file = Path(shared, f"{peer}.id")
        deadline = time.monotonic() + 60
        while not theirs_file.exists():
            assert time.monotonic() < deadline, f"{peer} never leased"
            time.sleep(0.05)
        theirs = theirs_file.read_text()
        out["owners"] = {x["lease_id"]: x["owner"] for x in c.leases()["leases"]}
        out["mine"], out["theirs"] = mine, theirs
        for method in ("lease.renew", "lease.release"):
            try:
                c.call(method, lease_id=theirs)
                out[method] = "ok"
            except rbroker.RBrokerError as exc:
                out[method] = exc.code
        Path(shared, f"{me}.done").write_text("")
        while not Path(shared, f"{peer}.done").exists():  # hold mine until both looked
            assert time.monotonic() < deadline, f"{peer} never finished"
            time.sleep(0.05)
        out["still_mine"] = [x["state"] for x in c.leases()["leases"] if x["lease_id"] == mine]
    return out


def _try_connect(sock: str | None) -> dict[str, Any]:
    started = time.monotonic()
    try:
        with rbroker.Client(sock, timeout_s=10) as c:
            c.gpus()
        return {"connected": True}
    except rbroker.BrokerUnavailable as exc:
        return {"code": exc.code, "message": str(exc), "took_s": time.monotonic() - started}


# --- the tests ------------------------------------------------------------------------


def test_the_socket_and_the_data_dir_are_as_the_service_makes_them(
    system_broker: SystemBroker,
) -> None:
    st = os.stat(system_broker.socket)
    assert st.st_uid == system_broker.service.uid
    assert st.st_gid == system_broker.service.gid  # the allowed group
    assert st.st_mode & 0o777 == 0o660
    assert (system_broker.data_dir / "broker.sqlite3").exists()


def test_two_users_share_one_system_broker_and_cannot_touch_each_others_leases(
    system_broker: SystemBroker, users: dict[str, OsUser]
) -> None:
    shared = system_broker.root / "exchange"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    results: dict[str, Any] = {}
    errors: list[BaseException] = []

    def as_user(me: str, peer: str) -> None:
        try:
            results[me] = run_as(users[me], _hold_and_look, me, str(shared), peer, timeout_s=90)
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=as_user, args=("alice", "bob")),
        threading.Thread(target=as_user, args=("bob", "alice")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    alice, bob = results["alice"], results["bob"]
    for me, seen, name in ((alice, bob, "alice"), (bob, alice, "bob")):
        assert me["found_by"] == FOUND_SYSTEM
        assert me["owners"][me["mine"]] == users[name].name  # owner from SO_PEERCRED
        other = "bob" if name == "alice" else "alice"
        assert me["owners"][me["theirs"]] == users[other].name  # everyone sees all leases
        assert me["lease.renew"] == "not_lease_owner"
        assert me["lease.release"] == "not_lease_owner"
        assert me["still_mine"] == ["active"]  # the other's attempts changed nothing
        assert me["theirs"] == seen["mine"]


def test_a_user_outside_the_allowed_group_is_refused_clearly_and_at_once(
    system_broker: SystemBroker, users: dict[str, OsUser]
) -> None:
    # the socket's mode keeps carol out: permission denied at connect, said in words
    out = run_as(users["carol"], _try_connect, None)
    assert out["code"] == "not_allowed", out
    assert f"not allowed to use the broker at {system_broker.socket}" in out["message"]
    assert repr(system_broker.group) in out["message"]
    assert out["took_s"] < 5
    # with the socket opened to everyone, the broker's own check at connect refuses her
    os.chmod(system_broker.socket, 0o666)
    out = run_as(users["carol"], _try_connect, system_broker.socket)
    assert out["code"] == "not_allowed", out
    assert f"not allowed to use the broker at {system_broker.socket}" in out["message"]
    assert users["carol"].name in out["message"] and system_broker.group in out["message"]
    rule = (  # the words match the rule: root may connect too
        f"only its own user ({system_broker.service.name}), root and the members of the group "
        f"{system_broker.group!r} may, not {users['carol'].name}"
    )
    assert rule in out["message"], out["message"]
    with rbroker.Client(system_broker.socket) as as_root:  # root, outside the group
        assert as_root.hello()
    assert out["took_s"] < 5
    assert run_as(users["alice"], _try_connect, system_broker.socket) == {"connected": True}
    # and the command line says it in one line, exit 2 as for every refusal: the broker is
    # there and says no (69 is for no broker at all)
    os.chmod(system_broker.socket, 0o660)
    python = python_as(users["carol"].name)
    assert python is not None
    for command in (["status"], ["run", "--mib", "64", "--", "true"]):
        done = subprocess.run(
            [
                *("runuser", "-u", users["carol"].name, "--", "env", f"PYTHONPATH={REPO}"),
                *(f"{ENV_SYSTEM_SOCKET}={system_broker.socket}", "COLUMNS=1000", *python),
                *command,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        assert done.returncode == 2, (command, done.stderr)
        assert f"not allowed to use the broker at {system_broker.socket}" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_another_users_second_system_broker_names_the_running_one_not_the_data_dir(
    system_broker: SystemBroker, users: dict[str, OsUser]
) -> None:
    """Before: `rbroker broker --system --simulate` as alice exited 11 "Permission denied"
    on the data dir alice cannot write. Right: exit 3 naming the running broker (the lock is
    taken before any data-dir check)."""
    alice = users["alice"]
    python = python_as(alice.name)
    assert python is not None
    done = subprocess.run(
        [
            *("runuser", "-u", alice.name, "--", "env", f"PYTHONPATH={REPO}"),
            f"{ENV_SYSTEM_SOCKET}={system_broker.socket}",
            *python,
            *("broker", "--system", "--simulate", "--data-dir", str(system_broker.data_dir)),
            *("--machine-lock", system_broker.lock),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert done.returncode == 3, done.stderr
    assert "Permission denied" not in done.stderr
    assert f"user {system_broker.service.name}, pid " in done.stderr
    assert f"socket {system_broker.socket}" in done.stderr
    # and a broker of hers on real GPUs cannot step aside with a lock of its own
    mine = short_tmp()
    try:
        os.chown(mine, alice.uid, alice.gid)
        own_lock = subprocess.run(
            [
                *("runuser", "-u", alice.name, "--", "env", f"PYTHONPATH={REPO}", *python),
                *("broker", "--machine-lock", "x", "--socket", str(mine / "x.sock")),
                *("--data-dir", str(mine / "dx")),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        assert own_lock.returncode == 2, own_lock.stderr
        assert "--machine-lock" in own_lock.stderr and "real GPUs" in own_lock.stderr
        assert not (mine / "dx").exists() and not (mine / "x.sock").exists()
    finally:
        shutil.rmtree(mine, ignore_errors=True)


def test_a_second_broker_refuses_while_the_system_broker_runs_and_starts_after_sigkill(
    system_broker: SystemBroker, users: dict[str, OsUser]
) -> None:
    pid = system_broker.proc.pid
    holder = f"user {system_broker.service.name}, pid "
    # a per-user broker of root, and a second system broker of the service account
    root_dir = short_tmp()
    per_user = subprocess.run(
        [
            *(sys.executable, "-m", "rbroker", "broker", "--simulate"),
            *("--socket", str(root_dir / "b.sock"), "--data-dir", str(root_dir / "data")),
            *("--machine-lock", system_broker.lock),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    shutil.rmtree(root_dir, ignore_errors=True)
    assert per_user.returncode == 3, per_user.stderr
    assert holder in per_user.stderr and f"socket {system_broker.socket}" in per_user.stderr
    second = system_broker.start_again()
    assert second.wait(60) == 3
    text = second.stdout.read().decode() if second.stdout else ""
    assert holder in text and f"socket {system_broker.socket}" in text, text
    _stop(second)
    # runuser's child is the broker: kill it, not runuser
    broker_pid = _only_child(pid)
    os.kill(broker_pid, signal.SIGKILL)
    system_broker.proc.wait(10)
    killed = time.monotonic()
    acquire_machine_lock(system_broker.lock, "/probe.sock", "probe").release()
    assert time.monotonic() - killed < 1.0  # nothing stale to wait out
    assert os.path.exists(system_broker.socket)  # a stale socket file, left behind
    third = system_broker.start_again()
    try:
        _wait_answering(third, system_broker.socket)
        with rbroker.Client(system_broker.socket) as c:
            assert c.gpus()
    finally:
        _stop(third)


def _only_child(pid: int) -> int:
    import psutil

    kids = psutil.Process(pid).children(recursive=True)
    pythons = [k for k in kids if "rbroker" in " ".join(k.cmdline())]
    return pythons[-1].pid if pythons else pid


def test_a_system_broker_whose_data_dir_is_not_writable_refuses_naming_it(
    users: dict[str, OsUser],
) -> None:
    service = users["service"]
    root = short_tmp()
    os.chmod(root, 0o755)
    try:
        (root / "run").mkdir()
        os.chown(root / "run", service.uid, service.gid)
        (root / "data").mkdir(mode=0o755)  # root's: the service account cannot write it
        cmd = _broker_command(service, root, service.name, f"rbroker-systest-{root.name}")
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd="/")
        assert done.returncode == 11, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and str(root / "data") in lines[0], done.stderr
        assert "Permission denied" in lines[0]
        assert not (root / "run" / "broker.sock").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_200_simultaneous_clients_are_all_answered(system_broker: SystemBroker) -> None:
    """200 connections queued before the broker accepts any, then 200 hellos: every one is
    answered; none is refused for a full listen backlog."""
    assert LISTEN_BACKLOG >= 200
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    assert somaxconn >= 200, f"net.core.somaxconn is {somaxconn}: raise it to 200 or more"
    clients: list[socket.socket] = []
    refused = 0
    # closed whatever fails: a socket left to the collector is a ResourceWarning, an error in
    # whichever later test the collector runs in
    with contextlib.ExitStack() as closing:
        sel = closing.enter_context(selectors.DefaultSelector())
        for _ in range(200):
            s = closing.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            s.setblocking(False)
            try:
                s.connect(system_broker.socket)
            except BlockingIOError:  # the backlog is full: no listener slot for this one
                refused += 1
                continue
            clients.append(s)
        assert refused == 0
        hello = b'{"jsonrpc":"2.0","id":1,"method":"hello","params":{"protocol_version":1}}\n'
        for s in clients:
            s.setblocking(True)
            s.sendall(hello)
            s.setblocking(False)
        answered = 0
        buffers: dict[socket.socket, bytes] = {}
        for s in clients:
            sel.register(s, selectors.EVENT_READ)
            buffers[s] = b""
        deadline = time.monotonic() + 60
        while buffers and time.monotonic() < deadline:
            for key, _ in sel.select(1.0):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                chunk = s.recv(65536)
                buffers[s] += chunk
                if b"\n" in buffers[s] or not chunk:
                    assert b'"result"' in buffers[s], buffers[s][:200]
                    answered += 1
                    sel.unregister(s)
                    del buffers[s]
    assert answered == 200


def test_a_tray_hosted_broker_refuses_while_the_system_broker_runs(
    system_broker: SystemBroker,
) -> None:
    import dataclasses

    from rbroker.hosting.embedded import EmbeddedBroker
    from rbroker.hosting.host import make_config
    from rbroker.transport.base import MachineLockHeld

    root = short_tmp()
    try:
        config = make_config(str(root / "t.sock"), root / "data", True, None, None)
        embedded = EmbeddedBroker(dataclasses.replace(config, machine_lock=system_broker.lock))
        embedded.start()
        assert not embedded.wait_ready(30)
        assert isinstance(embedded.error, MachineLockHeld)
        assert f"user {system_broker.service.name}" in str(embedded.error)
        assert f"socket {system_broker.socket}" in str(embedded.error)
        embedded.stop()
        assert not (root / "t.sock").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_an_allowed_group_that_does_not_exist_is_refused_at_start() -> None:
    root = short_tmp()
    try:
        done = subprocess.run(
            [
                *(sys.executable, "-m", "rbroker", "broker", "--system", "--simulate"),
                *("--allowed-group", "no-such-group-rbt", "--data-dir", str(root / "data")),
                *("--socket", str(root / "b.sock"), "--machine-lock", f"rbt-{root.name}"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert "--allowed-group: no OS group named 'no-such-group-rbt'" in done.stderr
        assert not (root / "b.sock").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)
