"""The Windows-only ways a command cannot reach or start a broker say so in one line, with
the exit code of the user guide's table, as on Linux: a broker's address that is no pipe name (a
file path: 2, asking for `\\\\.\\pipe\\NAME`), nothing listens at the pipe (69), the pipe's
name is held by another broker or program (1), another broker holds the computer's lock
(3), the pipe refuses this account (69, `not allowed`), the service's pipe is served by a
process that is not LocalSystem (69, nothing sent to it). Real `rbroker` processes on real
named pipes.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.windows.cli import assert_one_line, rbroker_cli

pytestmark = pytest.mark.skipif(
    sys.platform != "win32", reason="Windows only: named pipes, their access lists and owners"
)

SERVICE_PIPE = r"\\.\pipe\rbroker"
START_S = 120


def new_pipe() -> str:
    return rf"\\.\pipe\rbroker-test-{uuid.uuid4().hex[:12]}"


class PipeBroker:
    """`rbroker broker --simulate` on a named pipe, as a subprocess, until `stop()`."""

    def __init__(self, address: str, data_dir: Path, lock: str = "per-socket") -> None:
        self.address = address
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "rbroker", "broker", "--simulate", "--socket", address),
                *("--machine-lock", lock, "--data-dir", str(data_dir)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "COLUMNS": "1000"},
        )
        self.output: list[str] = []
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(START_S) or self.proc.poll() is not None:
            self.stop()
            raise AssertionError(f"broker on {address} did not start:\n{''.join(self.output)}")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            if "listening on" in line:
                self._ready.set()
        self._ready.set()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # TerminateProcess
        self.proc.wait(60)
        self._reader.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture
def pipe_broker(tmp_path: Path) -> Iterator[PipeBroker]:
    broker = PipeBroker(new_pipe(), tmp_path / "data")
    yield broker
    broker.stop()


def test_status_when_nothing_listens_at_the_pipe() -> None:
    address = new_pipe()
    done = rbroker_cli("status", "--socket", address)
    assert_one_line(done, 69, "rbroker status: no rbroker broker at", address, "rbroker broker")


def test_jobs_and_release_when_nothing_listens_at_the_pipe() -> None:
    address = new_pipe()
    assert_one_line(rbroker_cli("jobs", "--socket", address), 69, address)
    assert_one_line(rbroker_cli("release", "abc123", "--socket", address), 69, address)


@pytest.mark.parametrize("given", ["option", "environment"])
def test_a_broker_address_that_is_no_pipe_name_is_a_usage_error(
    tmp_path: Path, given: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Unix-style `--socket FILE` (or `RBROKER_SOCKET=FILE`) on Windows: exit 2 naming the
    address and the pipe form to give, before anything starts (CreateNamedPipe said only
    'The filename, directory name, or volume label syntax is incorrect', exit 19)."""
    path = str(tmp_path / "x.sock")
    args = ["broker", "--simulate", "--data-dir", str(tmp_path / "d")]
    if given == "option":
        done = rbroker_cli(*args, "--socket", path)
        source = "--socket"
    else:
        monkeypatch.setenv("RBROKER_SOCKET", path)
        done = rbroker_cli(*args)
        source = "$RBROKER_SOCKET"
    assert_one_line(done, 2, f"{source}: {path} is not a named pipe", r"give \\.\pipe\NAME")
    assert not (tmp_path / "d").exists()  # refused before the data dir was made


def test_a_pipe_name_with_a_backslash_in_its_name_is_a_usage_error(tmp_path: Path) -> None:
    address = new_pipe() + r"\sub"
    done = rbroker_cli("broker", "--simulate", "--socket", address, "--data-dir", str(tmp_path))
    assert_one_line(done, 2, f"--socket: {address}: a pipe's NAME cannot contain a backslash")


def test_the_pipe_server_refuses_a_file_path_naming_it() -> None:
    """Any broker started in-process (the tray's) meets the same rule as the CLI's."""
    from rbroker.transport.pipe_windows import NotAPipeName, serve_pipe

    async def handler(*_: object) -> None:
        raise AssertionError("never served")

    with pytest.raises(NotAPipeName, match=r"C:\\x\\b\.sock is not a named pipe"):
        asyncio.run(serve_pipe(r"C:\x\b.sock", handler, 65536))


def test_a_pipe_name_in_use_is_refused(pipe_broker: PipeBroker, tmp_path: Path) -> None:
    """Another broker on the same pipe under another machine lock (as two simulated brokers
    may run): the name is taken, the second one exits 1 and the first keeps serving."""
    done = rbroker_cli(
        "broker", "--simulate", "--socket", pipe_broker.address,
        "--machine-lock", f"other-{uuid.uuid4().hex[:8]}", "--data-dir", str(tmp_path / "d2"),
    )  # fmt: skip
    assert_one_line(
        done, 1, f"the pipe {pipe_broker.address} exists already", "not starting a second one"
    )
    assert pipe_broker.proc.poll() is None
    assert rbroker_cli("status", "--socket", pipe_broker.address).returncode == 0


def test_a_second_broker_under_the_same_lock_is_refused_naming_the_first(
    pipe_broker: PipeBroker, tmp_path: Path
) -> None:
    done = rbroker_cli(
        "broker", "--simulate", "--socket", pipe_broker.address,
        "--machine-lock", "per-socket", "--data-dir", str(tmp_path / "d2"),
    )  # fmt: skip
    assert_one_line(
        done,
        3,
        "another rbroker broker is already running on this computer",
        f"pid {pipe_broker.proc.pid}",
        f"socket {pipe_broker.address}",
    )


@pytest.mark.wine_gap("FILE_FLAG_FIRST_PIPE_INSTANCE is ignored: a second first instance is made")
def test_a_name_taken_between_the_look_and_the_creation_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The look for an existing name (WaitNamedPipe) can lose a race; the first instance's
    FILE_FLAG_FIRST_PIPE_INSTANCE then refuses the taken name."""
    import _winapi

    from rbroker.transport import pipe_windows
    from rbroker.transport.base import BrokerAlreadyRunning

    address = new_pipe()
    squatter = _winapi.CreateNamedPipe(  # unlimited instances: only the flag can refuse
        address,
        _winapi.PIPE_ACCESS_DUPLEX,
        _winapi.PIPE_WAIT,
        _winapi.PIPE_UNLIMITED_INSTANCES,
        65536,
        65536,
        0,
        0,
    )
    monkeypatch.setattr(pipe_windows, "_name_exists", lambda _address: False)  # lost the race

    async def serve() -> None:
        async def handler(*_: object) -> None:
            return None

        server = await pipe_windows.serve_pipe(address, handler, 65536)
        await server.close()  # only reached where the flag is ignored

    try:
        with pytest.raises(BrokerAlreadyRunning, match="exists already"):
            asyncio.run(serve())
    finally:
        _winapi.CloseHandle(squatter)


@pytest.mark.wine_gap("a pipe's access list is stored but not enforced: every open succeeds")
def test_a_pipe_that_refuses_this_account_says_not_allowed() -> None:
    """A pipe whose access list admits LocalSystem alone: the client's open is denied, and
    `rbroker status` says it is not allowed there (69), not that nothing listens."""
    import _winapi

    from rbroker.transport.pipe_windows import _SecurityAttributes

    address = new_pipe()
    security = _SecurityAttributes("D:P(A;;GA;;;SY)")
    handle = _winapi.CreateNamedPipe(
        address,
        _winapi.PIPE_ACCESS_DUPLEX | _winapi.FILE_FLAG_OVERLAPPED,
        _winapi.PIPE_WAIT,
        1,
        65536,
        65536,
        0,
        security.address,
    )
    waiting = _winapi.ConnectNamedPipe(handle, overlapped=True)
    try:
        done = rbroker_cli("status", "--socket", address, timeout_s=60)
        assert_one_line(done, 69, f"not allowed to use the broker at {address}", "administrator")
    finally:
        waiting.cancel()
        _winapi.CloseHandle(handle)
        security.close()


def test_the_service_pipe_served_by_another_account_is_refused(tmp_path: Path) -> None:
    """A broker of this account on the service's pipe, where clients require LocalSystem:
    the client reads the server's account before it sends anything and refuses (69), naming
    the pid and both accounts. (On Windows a standard user cannot create this name while the
    service runs; here nothing else holds it.)"""
    try:
        squatter = PipeBroker(SERVICE_PIPE, tmp_path / "data")
    except AssertionError as exc:
        if "exists already" in str(exc):
            pytest.skip("an rbroker service runs on this computer")
        raise
    try:
        done = rbroker_cli("status", "--socket", SERVICE_PIPE, timeout_s=60)
        assert_one_line(
            done,
            69,
            f"the pipe {SERVICE_PIPE} is served by pid {squatter.proc.pid}",
            "not S-1-5-18",
            "nothing was sent to it",
        )
    finally:
        squatter.stop()
