"""End-to-end fixtures: a real coordinator process and real brokers reporting to it.

`coordinator_factory(**settings)` runs `python -m rbroker_server setup` and `serve` on a free
127.0.0.1 port with SQLite in a temporary directory; settings (small freshness thresholds)
are written into its config.toml before it starts. `uplink_broker(coordinator, name)`
enrolls a fresh data dir with `rbroker enroll ... --key-file` (test machines have no OS
keyring) and starts a real broker process on it. Everything started is stopped at teardown.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import SINGLE_24G, BrokerProcess, short_tmp, start_broker

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def py_env(**extra: str) -> dict[str, str]:
    """The environment for child Python processes: the repository importable (`tests.`),
    and a terminal width that keeps rich from wrapping messages that tests look for."""
    env = {**os.environ, "COLUMNS": "1000", **extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    return env


def rbroker_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run `python -m rbroker ARGS...` and return the finished process (text output)."""
    return subprocess.run(
        [sys.executable, "-m", "rbroker", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or py_env(),
        check=False,
    )


def server_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `python -m rbroker_server ARGS...` and return the finished process."""
    return subprocess.run(
        [sys.executable, "-m", "rbroker_server", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=py_env(),
        check=False,
    )


@dataclass
class CoordinatorProcess:
    """A coordinator set up in `data_dir`; `start()` serves it as a separate process."""

    data_dir: Path
    port: int
    token: str
    first_code: str
    group: str = "default"
    ca_file: str | None = None
    """The CA of a coordinator set up with `--self-signed` (served over HTTPS)."""
    database_url: str = ""
    """Empty: SQLite at `db_path`."""
    host: str = "127.0.0.1"
    proc: subprocess.Popen[bytes] | None = None
    prefix: list[str] = field(default_factory=list)
    """Command prefix (e.g. `ip netns exec NAME`) to run `serve` somewhere else."""

    @property
    def url(self) -> str:
        return f"{'https' if self.ca_file else 'http'}://{self.host}:{self.port}"

    @property
    def verify(self) -> ssl.SSLContext | bool:
        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else True

    @property
    def db_path(self) -> Path:
        return self.data_dir / "rbroker-server.db"

    @property
    def log_path(self) -> Path:
        return self.data_dir / f"serve-{self.port}.log"

    def start(self, wait: bool = True) -> None:
        """Serve (again, after `stop()`) and wait for `/healthz`."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    *self.prefix,
                    sys.executable,
                    "-m",
                    "rbroker_server",
                    "serve",
                    "--data-dir",
                    str(self.data_dir),
                    "--host",
                    "0.0.0.0" if self.prefix else self.host,
                    "--port",
                    str(self.port),
                    "--log-level",
                    "warning",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=py_env(),
            )
        if wait and not self.prefix:
            self.wait_healthy()

    def wait_healthy(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"coordinator exited:\n{self.log_path.read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                if (
                    httpx.get(self.url + "/healthz", timeout=2, verify=self.verify).status_code
                    == 200
                ):
                    return
            time.sleep(0.1)
        raise RuntimeError(f"coordinator did not answer:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def second(self) -> CoordinatorProcess:
        """Another serving process on the same data dir and database, on its own port."""
        other = dataclasses.replace(self, port=free_port(), proc=None, prefix=[])
        other.start()
        return other

    def _admin(self, action: Callable[[Any, Any], str]) -> str:
        from rbroker_server import db
        from rbroker_server.admin import service as admin

        engine = db.make_engine(self.database_url or f"sqlite:///{self.db_path.as_posix()}")
        try:
            return action(admin, engine)
        finally:
            engine.dispose()

    def new_code(self) -> str:
        """A fresh one-time enrollment code for this group (what `rbroker-server
        enroll-code create` makes)."""
        return self._admin(lambda admin, e: admin.create_enroll_code(e, self.group, 600).text)

    def new_group(self, name: str) -> CoordinatorProcess:
        """This same coordinator seen through a new group: its own viewer token and codes
        (`stop()` on it stops nothing)."""

        def make(admin: Any, engine: Any) -> str:
            admin.create_group(engine, name)
            return str(admin.create_token(engine, name, "test").text)

        token = self._admin(make)
        view = dataclasses.replace(self, token=token, group=name, first_code="", proc=None)
        view.first_code = view.new_code()
        return view

    def get(self, path: str, token: str | None = None) -> httpx.Response:
        return httpx.get(
            self.url + path,
            headers={"Authorization": f"Bearer {token or self.token}"},
            timeout=10,
            verify=self.verify,
        )

    def fleet(self) -> dict[str, Any]:
        r = self.get("/api/v1/fleet")
        assert r.status_code == 200, r.text
        return dict(r.json())

    def computer(self, computer_id: str) -> dict[str, Any]:
        r = self.get(f"/api/v1/computers/{computer_id}")
        assert r.status_code == 200, r.text
        return dict(r.json())


def setup_coordinator(
    root: Path,
    port: int | None = None,
    tls: bool = False,
    database_url: str = "",
    **settings: Any,
) -> CoordinatorProcess:
    """`rbroker-server setup` in `root/coordinator` (with `tls`: a generated CA and
    certificate for 127.0.0.1), then `settings` written to config.toml."""
    data_dir = root / "coordinator"
    port = port or free_port()
    done = server_cli(
        "setup",
        "--data-dir",
        str(data_dir),
        "--bind",
        "127.0.0.1",
        "--public-hostname",
        "127.0.0.1",
        "--port",
        str(port),
        "--non-interactive",
        *(["--self-signed"] if tls else []),
        *(["--database-url", database_url] if database_url else []),
    )
    assert done.returncode == 0, done.stderr
    token = re.search(r"viewer token:\s+(rbv_\S+)", done.stdout)
    code = re.search(r"enrollment code:\s+(rbe_\S+)", done.stdout)
    assert token and code, done.stdout
    config = data_dir / "config.toml"
    lines = config.read_text().splitlines()
    for key, value in settings.items():
        lines = [ln for ln in lines if not ln.startswith(f"{key} =")]
        lines.append(f"{key} = {value!r}")
    config.write_text("\n".join(lines) + "\n")
    ca = re.search(r"TLS CA \(copy to computers\): (\S+)", done.stdout)
    assert bool(ca) == tls, done.stdout
    return CoordinatorProcess(
        data_dir,
        port,
        token.group(1),
        code.group(1),
        ca_file=ca.group(1) if ca else None,
        database_url=database_url,
    )


@pytest.fixture
def coordinator_factory(tmp_path: Path) -> Iterator[Callable[..., CoordinatorProcess]]:
    """`coordinator_factory(tls=False, **settings)` → a serving CoordinatorProcess (SQLite in
    tmp; with `tls`, HTTPS with a generated CA that brokers pin at enrollment)."""
    started: list[CoordinatorProcess] = []

    def factory(start: bool = True, tls: bool = False, **settings: Any) -> CoordinatorProcess:
        c = setup_coordinator(tmp_path / f"c{len(started)}", tls=tls, **settings)
        started.append(c)
        if start:
            c.start()
        return c

    yield factory
    for c in started:
        c.stop()


@pytest.fixture(scope="session")
def shared_coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorProcess]:
    """One coordinator process with default settings for the tests that do not stop it."""
    c = setup_coordinator(tmp_path_factory.mktemp("shared"))
    c.start()
    yield c
    c.stop()


@pytest.fixture
def coordinator(
    shared_coordinator: CoordinatorProcess, request: pytest.FixtureRequest
) -> CoordinatorProcess:
    """The shared coordinator seen through a fresh group of this test's own (default
    settings: a computer is stale after 3 report intervals, 15 s)."""
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[-40:].strip("-")
    return shared_coordinator.new_group(f"g-{name}")


def enroll_cli(
    url: str,
    code: str,
    data_dir: Path,
    name: str,
    *extra: str,
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """`rbroker enroll URL CODE --name NAME --data-dir DIR EXTRA...`."""
    return rbroker_cli(
        "enroll", url, code, "--name", name, "--data-dir", str(data_dir), *extra,
        env=env, timeout=timeout,
    )  # fmt: skip


@dataclass
class UplinkBroker:
    """A broker process enrolled at a coordinator."""

    name: str
    computer_id: str
    broker: BrokerProcess

    def status(self) -> dict[str, Any]:
        with self.broker.client() as c:
            return dict(c.status())

    def link(self) -> dict[str, Any]:
        return dict(self.status()["coordinator"])


@pytest.fixture
def uplink_broker() -> Iterator[Callable[..., UplinkBroker]]:
    """`uplink_broker(coordinator, name, scenario=SINGLE_24G, env=None)` → an enrolled,
    running broker (key in a 0600 file). All are killed at teardown."""
    started: list[BrokerProcess] = []

    def factory(
        coordinator: CoordinatorProcess,
        name: str,
        scenario: str = SINGLE_24G,
        env: dict[str, str] | None = None,
        url: str | None = None,
    ) -> UplinkBroker:
        root = short_tmp()
        ca = ["--ca-file", coordinator.ca_file] if coordinator.ca_file else []
        done = enroll_cli(
            url or coordinator.url, coordinator.new_code(), root / "data", name, "--key-file", *ca
        )
        assert done.returncode == 0, done.stderr
        computer_id = json.loads((root / "data" / "uplink.json").read_text())["computer_id"]
        bp = start_broker(scenario, root=root, env=env)
        started.append(bp)
        return UplinkBroker(name, computer_id, bp)

    yield factory
    for bp in started:
        bp.stop(signal.SIGKILL)


def by_name(fleet: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The fleet's computers by name."""
    return {c["name"]: c for c in fleet["computers"]}


WORKER = Path(__file__).parent / "lease_worker.py"


@dataclass
class Worker:
    """A `lease_worker.py` process holding a lease."""

    proc: subprocess.Popen[str]
    lease_id: str
    gpu_uuid: str
    pid: int

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def lease_worker() -> Iterator[Callable[..., Worker]]:
    """`lease_worker(broker, mib, project, session, purpose, use_mib=0, extra=(), env=None)`
    → a Worker once its lease is granted. All are killed at teardown."""
    started: list[Worker] = []

    def factory(
        broker: BrokerProcess,
        mib: int,
        project: str,
        session: str,
        purpose: str,
        use_mib: int = 0,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> Worker:
        args = [broker.socket, str(mib), project, session, purpose, str(use_mib), *extra]
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), *args],
            stdout=subprocess.PIPE,
            text=True,
            env=py_env(**(env or {})),
        )
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        if not line or line[0] != "granted":
            proc.kill()
            proc.wait(5)
            proc.stdout.close()
            raise AssertionError(f"worker not granted: {line}")
        w = Worker(proc, line[1], line[2], int(line[3]))
        started.append(w)
        return w

    yield factory
    for w in started:
        w.stop()
