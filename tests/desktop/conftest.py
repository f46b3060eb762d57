"""Fixtures for desktop tests: a raw JSON-lines connection to a broker (no SDK in between)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SINGLE_24G, WORKER, short_tmp
from tests.desktop.inprocess import InProcessBroker, SleeperPool

#: The event loops a broker may run on (`rbroker.base.eventloop`): uvloop only where it exists.
LOOPS = ["asyncio"] if sys.platform == "win32" else ["uvloop", "asyncio"]

#: Environment variables a test may leave changed: pytest's own.
ENV_OF_PYTEST = frozenset({"PYTEST_CURRENT_TEST"})


@pytest.fixture(autouse=True)
def environment_kept() -> Iterator[None]:
    """Each test leaves the environment as it found it. A variable set on `os.environ`
    instead of through `monkeypatch` (or `monkeypatch.delenv` of one that was not set,
    which records nothing to put back, followed by a plain assignment) stays for every later
    test of the process, and those pass or fail by what ran before them (seen:
    RBROKER_SOCKET left by a discovery test). The test that changed it errors at teardown,
    naming the variables, and the environment is put back."""
    before = dict(os.environ)
    yield
    after = dict(os.environ)
    changed = sorted(
        name
        for name in before.keys() | after.keys()
        if before.get(name) != after.get(name) and name not in ENV_OF_PYTEST
    )
    if changed:
        for name in changed:
            if name in before:
                os.environ[name] = before[name]
            else:
                os.environ.pop(name, None)
        pytest.fail(
            f"the test left the environment changed: {', '.join(changed)} (set variables "
            "through monkeypatch, which puts them back)",
            pytrace=False,
        )


class RawConnection:
    """A Unix-socket connection speaking JSON-RPC lines by hand.

    `send_line` writes bytes as they are; `request` sends one request object and returns
    the answer object with the same id (notifications in between are skipped).
    """

    def __init__(self, path: str, timeout_s: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        self.sock.connect(path)
        self._buf = b""
        self._next_id = 1000

    def send_line(self, data: bytes) -> None:
        self.sock.sendall(data if data.endswith(b"\n") else data + b"\n")

    def read_message(self) -> dict[str, Any]:
        while b"\n" not in self._buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        msg = json.loads(line)
        assert isinstance(msg, dict), msg
        return msg

    def request(self, method: str, params: Any = None, **extra: Any) -> dict[str, Any]:
        """Send `{"jsonrpc": "2.0", "id": n, "method": ..., "params": ...}`; return the answer."""
        self._next_id += 1
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next_id, "method": method}
        if params is not None:
            msg["params"] = params
        msg.update(extra)
        self.send_line(json.dumps(msg).encode())
        return self.read_answer(self._next_id)

    def send_request(self, method: str, params: Any) -> int:
        """Send a request without waiting for its answer; return its id."""
        self._next_id += 1
        msg = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
        self.send_line(json.dumps(msg).encode())
        return self._next_id

    def read_answer(self, request_id: Any) -> dict[str, Any]:
        while True:
            msg = self.read_message()
            if msg.get("method") == "event":
                continue
            if msg.get("id") == request_id:
                return msg

    def hello(self) -> dict[str, Any]:
        answer = self.request("hello", {"protocol_version": 1, "client": "raw-test"})
        assert "result" in answer, answer
        return dict(answer["result"])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def start_simulated_broker(
    root: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `rbroker broker --simulate --socket ROOT/b.sock --data-dir ROOT/data ARGS` to its
    exit (30 s at most) with `env` added to this process's environment and 200 columns:
    for a broker that must refuse to start; returns the finished process (text output)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "rbroker",
            "broker",
            "--simulate",
            "--socket",
            str(root / "b.sock"),
            "--data-dir",
            str(root / "data"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {}), "COLUMNS": "200"},
    )


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short temporary directory (Unix socket paths are short), removed afterwards."""
    root = short_tmp()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def raw_connect() -> Iterator[Callable[[str], RawConnection]]:
    """`raw_connect(socket_path)` → RawConnection; all are closed at teardown."""
    opened: list[RawConnection] = []

    def connect(path: str) -> RawConnection:
        conn = RawConnection(path)
        opened.append(conn)
        return conn

    yield connect
    for conn in opened:
        conn.close()


class WorkerProcess:
    """A test worker script (tests/workers/NAME.py) run as a real process, line-buffered."""

    def __init__(
        self, name: str, *args: str, env: dict[str, str] | None = None, stdin: bool = False
    ) -> None:
        """`stdin=True`: a pipe on its stdin (`proc.stdin`), closed by `stop`."""
        script = Path(WORKER) / f"{name}.py"
        self.proc = subprocess.Popen(
            [sys.executable, "-u", str(script), *args],
            stdin=subprocess.PIPE if stdin else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def read_line(self) -> str:
        """The next stdout line (blocks; the pytest timeout bounds it)."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if not line:
            err = self.proc.stderr.read().decode() if self.proc.stderr else ""
            raise AssertionError(f"worker exited with {self.proc.wait()}: {err}")
        return line.strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def worker() -> Iterator[Callable[..., WorkerProcess]]:
    """`worker(name, *args, env=None, stdin=False)` → a started WorkerProcess; all killed at
    teardown."""
    started: list[WorkerProcess] = []

    def start(
        name: str, *args: str, env: dict[str, str] | None = None, stdin: bool = False
    ) -> WorkerProcess:
        w = WorkerProcess(name, *args, env=env, stdin=stdin)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


@pytest.fixture
def pool() -> Iterator[SleeperPool]:
    """Sleeping holder processes (`pool.spawn()` → process and its `Holder`), killed at
    teardown."""
    p = SleeperPool()
    yield p
    p.close()


@pytest.fixture
def make_inprocess(tmp_path: Path) -> Iterator[Callable[..., InProcessBroker]]:
    """`make_inprocess(scenario_text, **kw)` → an `InProcessBroker` (manual clock) on that
    scenario in the test's tmp dir, `kw` as `InProcessBroker` takes them (`persist`, config
    fields such as `headroom_mib`); every one made is closed at teardown."""
    made: list[InProcessBroker] = []

    def make(scenario_text: str, **kw: Any) -> InProcessBroker:
        scenario = tmp_path / f"scenario-{len(made)}.toml"
        scenario.write_text(scenario_text)
        data_dir = tmp_path / f"broker-{len(made)}"
        data_dir.mkdir()
        broker = InProcessBroker(scenario, data_dir, **kw)
        made.append(broker)
        return broker

    yield make
    for broker in made:
        broker.close()


@pytest.fixture
def h(make_inprocess: Callable[..., InProcessBroker]) -> InProcessBroker:
    """An in-process broker without a store on one empty 24 576 MiB GPU (`SINGLE_24G`,
    default headroom 1 229 MiB). A test file may define its own `h`."""
    return make_inprocess(SINGLE_24G, persist=False)
