"""Root-safe paths and a broker that stays reachable (architecture.md §5), in one process.

The socket's mode and group are set without acting through a name another user could have
swapped (bound in a private directory, renamed into place); a privileged broker refuses a
directory another user owns or can write; the lease database never follows a symbolic link;
a removed socket file is bound again within 2 s; the system broker's authority files are put
back when removed; a client that finds no socket while the system broker lives says so.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import rbroker
from rbroker.client.paths import ENV_SOCKET
from rbroker.transport.safe_paths import UnsafePath, check_private_path
from rbroker.transport.system_paths import ENV_SYSTEM_SOCKET
from rbroker_protocol.files import private_sqlite
from tests.conftest import short_tmp

pytestmark = [
    pytest.mark.contract,
    pytest.mark.skipif(sys.platform == "win32", reason="Unix sockets and modes"),
]
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's authority")
as_root = pytest.mark.skipif(
    sys.platform == "win32" or os.geteuid() != 0, reason="the checks of a broker run as root"
)


@pytest.fixture
def root() -> Iterator[Path]:
    made = short_tmp()
    yield made
    shutil.rmtree(made, ignore_errors=True)


class _Echo(asyncio.Protocol):
    """Answers the first line with itself and closes (a `rbroker.transport.base.Handler`'s
    protocol)."""

    def __init__(self, _peer_of: object, _limit: int) -> None:
        self.got = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got += data
        if b"\n" in self.got:
            self.transport.write(self.got[: self.got.index(b"\n") + 1])  # type: ignore[attr-defined]
            self.transport.close()


def _ask(address: str) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(address)
        s.sendall(b"ping\n")
        return s.recv(100)


# --- the socket's mode and group ------------------------------------------------------


@as_root
def test_the_socket_replaces_a_planted_symlink_and_never_changes_its_target(root: Path) -> None:
    """Before: after bind, chmod and chown by name followed a symlink swapped in meanwhile
    (a root file 0600 became 0666). Now the mode comes from the umask at bind and the group
    is set in a private directory before the rename: the link's target keeps its mode."""
    from rbroker.transport.unix import bind_in_place

    secret = root / "secret"
    secret.write_text("root's")
    secret.chmod(0o600)
    address = root / "broker.sock"
    address.symlink_to(secret)
    sock = bind_in_place(str(address), 0o666, 4321)
    try:
        st = os.lstat(address)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o666 and st.st_gid == 4321
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and secret.stat().st_gid == 0
        assert sorted(p.name for p in root.iterdir()) == ["broker.sock", "secret"]  # no leftover
    finally:
        sock.close()


def test_the_socket_has_its_mode_from_the_start(root: Path) -> None:
    from rbroker.transport.unix import bind_in_place

    for mode in (0o660, 0o666):
        address = root / f"s{mode:o}.sock"
        sock = bind_in_place(str(address), mode, -1)
        sock.close()
        assert stat.S_IMODE(os.lstat(address).st_mode) == mode


def test_the_socket_listens_before_its_path_appears(root: Path) -> None:
    """Before: the socket file was renamed into place and only then listened on, so a
    client that found the path in between was refused (seen as a failed start under load).
    Now a client that finds the path connects even before the server loop runs."""
    from rbroker.transport.unix import bind_in_place

    address = root / "broker.sock"
    sock = bind_in_place(str(address), 0o660, -1)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(5)
            client.connect(str(address))  # queued in the backlog, not refused
    finally:
        sock.close()


# --- directories a privileged broker refuses ------------------------------------------


@as_root
def test_root_refuses_a_directory_others_can_write_or_own(root: Path) -> None:
    shared = root / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UnsafePath, match=r"other users can write in it \(mode 0777\)") as bad:
        check_private_path(shared / "inner")  # named from the top: the writable one
    assert bad.value.filename == str(shared)
    theirs = root / "theirs"
    theirs.mkdir()
    os.chown(theirs, 4321, 4321)
    with pytest.raises(UnsafePath, match="belongs to uid 4321") as bad:
        check_private_path(theirs)
    assert bad.value.filename == str(theirs)
    linked = root / "linked"
    linked.symlink_to(root)
    with pytest.raises(UnsafePath, match="symbolic link"):
        check_private_path(linked)
    check_private_path(root / "mine" / "data")  # /tmp is sticky: the rest is root's


@as_root
def test_a_broker_run_as_root_refuses_a_socket_dir_others_can_write_in_one_line(
    root: Path,
) -> None:
    import subprocess

    shared = root / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "rbroker", "broker", "--simulate"),
            *("--socket", str(shared / "b.sock"), "--data-dir", str(root / "data")),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 11, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(shared) in lines[0] and "other users can write" in lines[0]
    assert list(shared.iterdir()) == []
    data = root / "data2"
    data.mkdir()
    os.chown(data, 4321, 4321)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "rbroker", "broker", "--simulate"),
            *("--socket", str(root / "b.sock"), "--data-dir", str(data)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 11, done.stderr
    assert str(data) in done.stderr and "belongs to uid 4321" in done.stderr
    assert list(data.iterdir()) == []


def test_the_database_never_follows_a_symlink(root: Path) -> None:
    """Before: `broker.sqlite3` as a link to another file had that file overwritten."""
    target = root / "victim"
    target.write_bytes(b"")
    data = root / "data"
    data.mkdir(mode=0o700)
    for name in ("broker.sqlite3", "broker.sqlite3-wal"):
        link = data / name
        link.symlink_to(target)
        with pytest.raises(OSError, match="symbolic link") as bad:
            private_sqlite(data / "broker.sqlite3")
        assert bad.value.filename == str(link)
        link.unlink()
    assert target.read_bytes() == b""
    private_sqlite(data / "broker.sqlite3")  # and without links it is made, 0600
    assert stat.S_IMODE((data / "broker.sqlite3").stat().st_mode) == 0o600


# --- availability ---------------------------------------------------------------------


def test_a_removed_socket_file_is_back_within_2_s(root: Path) -> None:
    """Before: systemd-tmpfiles or `rm -rf /run/rbroker` left a running broker unreachable
    for good. The transport checks its file every second and binds it again."""
    from rbroker.transport.unix import serve_unix

    address = str(root / "run" / "broker.sock")

    async def scenario() -> float:
        server = await serve_unix(address, _Echo, 65536)
        try:
            loop = asyncio.get_running_loop()
            assert await loop.run_in_executor(None, _ask, address) == b"ping\n"
            shutil.rmtree(root / "run")  # the directory too, as `rm -rf /run/rbroker`
            removed = time.monotonic()
            while not os.path.exists(address):
                assert time.monotonic() - removed < 5, "the socket did not come back"
                await asyncio.sleep(0.02)
            back_s = time.monotonic() - removed
            assert await loop.run_in_executor(None, _ask, address) == b"ping\n"
            assert stat.S_IMODE(os.lstat(address).st_mode) == 0o660
            return back_s
        finally:
            await server.close()

    back_s = asyncio.run(scenario())
    assert back_s <= 2.0, f"the socket came back after {back_s:.2f} s"
    assert not os.path.exists(address)  # close() removed the file it made


@linux
def test_the_system_authority_names_its_holder_and_comes_back_when_removed(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rbroker.hosting.authority import LOCK_FILE, SystemAuthority
    from rbroker.transport.base import MachineLockHeld
    from rbroker.transport.system_holder import HOLDER_FILE, read_system_holder

    run = root / "run"
    monkeypatch.setenv(ENV_SYSTEM_SOCKET, str(run / "broker.sock"))
    held = SystemAuthority.acquire(str(run / "broker.sock"))
    try:
        assert stat.S_IMODE(os.stat(run / LOCK_FILE).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(run / HOLDER_FILE).st_mode) == 0o644
        holder = read_system_holder()
        assert holder is not None and holder.pid == os.getpid()
        assert holder.socket == str(run / "broker.sock")
        with pytest.raises(MachineLockHeld, match=rf"system broker is running .*pid {os.getpid()}"):
            SystemAuthority.acquire(str(run / "other.sock"), run)
        shutil.rmtree(run)
        assert read_system_holder() is None
        held.keep()  # what the broker's keeper does every second
        assert read_system_holder() is not None
        os.unlink(run / HOLDER_FILE)
        held.keep()
        assert read_system_holder() is not None
    finally:
        held.release()
    assert read_system_holder() is None
    assert (run / LOCK_FILE).exists() and not (run / HOLDER_FILE).exists()


@linux
def test_a_holder_file_of_a_dead_process_names_nobody(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import subprocess

    from rbroker.base.proctime import holder_clock
    from rbroker.transport.system_holder import HOLDER_FILE, read_system_holder

    child = subprocess.Popen(["sleep", "30"])
    try:
        import psutil

        from rbroker.base.proctime import start_s

        started = start_s(psutil.Process(child.pid))
        run = root / "run"
        run.mkdir(mode=0o755)
        said = {"user": "x", "pid": child.pid, "start_s": started, "socket": "/x"}
        said["boot_id"] = holder_clock()
        (run / HOLDER_FILE).write_text(json.dumps(said))
        assert read_system_holder(run) is not None  # the control: alive, it counts
        (run / HOLDER_FILE).write_text(json.dumps({**said, "start_s": started - 5}))
        assert read_system_holder(run) is None  # a reused pid is not the holder
        (run / HOLDER_FILE).write_text(json.dumps(said))
    finally:
        child.kill()
        child.wait()
    assert read_system_holder(run) is None  # its process is gone


@linux
def test_a_client_that_finds_no_socket_but_a_live_system_broker_says_it_runs(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: "no rbroker broker ...; start one with `rbroker broker`", which then exited 3."""
    from rbroker.hosting.authority import SystemAuthority, user_name

    sock = str(root / "run" / "broker.sock")
    monkeypatch.setenv(ENV_SYSTEM_SOCKET, sock)
    monkeypatch.delenv(ENV_SOCKET, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(root))
    held = SystemAuthority.acquire(sock)
    try:
        with pytest.raises(rbroker.BrokerUnavailable) as gone:
            rbroker.Client(timeout_s=2)
        text = str(gone.value)
        me = f"user {user_name(os.geteuid())}, pid {os.getpid()}, socket {sock}"
        assert f"the system broker runs ({me})" in text
        assert "within 2 s" in text and "do not start another broker" in text
    finally:
        held.release()
    with pytest.raises(rbroker.BrokerUnavailable) as gone:
        rbroker.Client(timeout_s=2)
    assert "start one with `rbroker broker`" in str(gone.value)
