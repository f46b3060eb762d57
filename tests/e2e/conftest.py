"""End-to-end fixtures: a real coordinator process and real brokers reporting to it.

`coordinator_factory(**settings)` runs `python -m rbroker_server setup` and `serve` on a free
127.0.0.1 port with SQLite in a temporary directory (through `rbroker.demo.coordinator`, the
one helper the demo, the screenshots and the benchmarks use too); settings (small freshness
thresholds) are written into its config.toml before it starts. `uplink_broker(coordinator, name)`
enrolls a fresh data dir with `rbroker enroll ... --key-file` (test machines have no OS
keyring) and starts a real broker process on it. Everything started is stopped at teardown.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rbroker.base.children import HARD_KILL
from rbroker.demo.coordinator import LocalCoordinator, run_module
from rbroker.demo.coordinator import server_cli as run_server_cli
from tests.conftest import SINGLE_24G, BrokerProcess, short_tmp, start_broker
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]


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
    return run_module("rbroker", *args, env=env or py_env(), timeout=timeout)


def server_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `python -m rbroker_server ARGS...` and return the finished process."""
    return run_server_cli(*args, env=py_env(), timeout=timeout)


@dataclass
class CoordinatorProcess(LocalCoordinator):
    """The shared coordinator helper (`rbroker.demo.coordinator`) plus what tests need:
    a second serving process, codes and groups made through the server's admin service."""

    def second(self) -> CoordinatorProcess:
        """Another serving process on the same data dir and database, on its own port."""
        other = dataclasses.replace(self, port=free_port(), proc=None, prefix=[])
        other.start()
        return other

    def _admin(self, action: Callable[[Any, Any], str]) -> str:
        from rbroker_server.admin import operations as admin
        from rbroker_server.db import engine as db

        engine = db.make_engine(self.database_url or f"sqlite:///{self.db_path.as_posix()}")
        try:
            return action(admin, engine)
        finally:
            engine.dispose()

    @property
    def db_path(self) -> Path:
        return self.data_dir / "rbroker-server.db"

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
    return CoordinatorProcess.setup(
        root / "coordinator",
        port=port,
        tls=tls,
        database_url=database_url,
        settings=settings,
        env=py_env(),
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
    """`uplink_broker(coordinator, name, scenario=SINGLE_24G, env=None,
    report_interval_s=None, extra_args=None)` → an enrolled, running broker (key in a 0600
    file; `extra_args` go to `rbroker broker`).
    `report_interval_s` is written into its `uplink.json` before it starts (the setting of
    `rbroker.uplink.config.UplinkConfig`; default 5 s), so a test can run the uplink's
    schedule on a shorter time scale. All are killed at teardown."""
    started: list[BrokerProcess] = []

    def factory(
        coordinator: CoordinatorProcess,
        name: str,
        scenario: str = SINGLE_24G,
        env: dict[str, str] | None = None,
        url: str | None = None,
        report_interval_s: float | None = None,
        extra_args: list[str] | None = None,
    ) -> UplinkBroker:
        root = short_tmp()
        ca = ["--ca-file", coordinator.ca_file] if coordinator.ca_file else []
        done = enroll_cli(
            url or coordinator.url, coordinator.new_code(), root / "data", name, "--key-file", *ca
        )
        assert done.returncode == 0, done.stderr
        if report_interval_s is not None:
            config = root / "data" / "uplink.json"
            saved = json.loads(config.read_text())
            config.write_text(json.dumps({**saved, "report_interval_s": report_interval_s}))
        computer_id = json.loads((root / "data" / "uplink.json").read_text())["computer_id"]
        bp = start_broker(scenario, root=root, env=env, extra_args=extra_args)
        started.append(bp)
        return UplinkBroker(name, computer_id, bp)

    yield factory
    for bp in started:
        bp.stop(HARD_KILL)  # SIGKILL; TerminateProcess on Windows


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
