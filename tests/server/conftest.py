"""Coordinator fixtures: a real uvicorn server on 127.0.0.1 with a free port, real HTTP.

`coordinator` runs once on a fresh SQLite file and once on a fresh PostgreSQL schema when
`RBROKER_TEST_PG_URL` is set (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test);
the schema is dropped afterwards, also when the test fails, and the database is created
for the session when it does not exist (`tests.pg`). `coordinator_factory(**settings)`
makes more, with settings changed (small freshness thresholds, short history windows).
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nacl.signing
import pytest
import sqlalchemy as sa
import uvicorn
from sqlalchemy.engine import Engine

from rbroker_protocol import signing
from rbroker_protocol.reports import ReportPayload
from rbroker_server.admin import operations as admin
from rbroker_server.app import create_app
from rbroker_server.db import engine as db
from rbroker_server.settings import Settings
from tests.fakes.reports import payload
from tests.pg import PG_ENV, pg_base_url, pg_url, scratch_schema

__all__ = ["PG_ENV", "pg_base_url", "pg_url"]  # pg_base_url: a fixture for these tests


@dataclass
class EnrolledComputer:
    """A computer enrolled through the API, holding its private key."""

    coordinator: Coordinator
    id: str
    key: nacl.signing.SigningKey
    group: str
    run_id: str = "run-1"
    seq: int = 0

    def envelope(
        self,
        p: ReportPayload | bytes | None = None,
        *,
        seq: int | None = None,
        run_id: str | None = None,
    ) -> dict[str, Any]:
        run_id = run_id or self.run_id
        if seq is None:
            self.seq += 1
            seq = self.seq
        if p is None:
            p = payload(run_id=run_id)
        raw = p if isinstance(p, bytes) else p.to_bytes()
        return signing.sign_report(self.key, self.id, run_id, seq, raw)

    def send(self, envelope: dict[str, Any] | bytes) -> httpx.Response:
        body = envelope if isinstance(envelope, bytes) else signing.encode_envelope(envelope)
        return self.coordinator.http.post(
            "/api/v1/reports", content=body, headers={"content-type": "application/json"}
        )

    def report(self, p: ReportPayload | None = None, **kw: Any) -> httpx.Response:
        return self.send(self.envelope(p, **kw))

    def signed_headers(self, method: str, path: str, **kw: Any) -> dict[str, str]:
        return signing.sign_request(
            self.key, self.id, method, path, kw.pop("timestamp", int(time.time())), **kw
        )

    def get(self, path: str) -> httpx.Response:
        return self.coordinator.http.get(path, headers=self.signed_headers("GET", path))


@dataclass
class Coordinator:
    """A running coordinator: its base URL, settings, an HTTP client and its database."""

    url: str
    settings: Settings
    engine: Engine
    http: httpx.Client
    backend: str
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None
    _proc: subprocess.Popen[bytes] | None = None
    tokens: dict[str, str] = field(default_factory=dict)

    def group(self, name: str) -> str:
        """Create group `name` with a viewer token (kept in `tokens[name]`)."""
        admin.create_group(self.engine, name)
        self.tokens[name] = admin.create_token(self.engine, name, "test").text
        return name

    def viewer(self, group: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.tokens[group]}"}

    def enroll(self, group: str, name: str = "lab-1") -> EnrolledComputer:
        code = admin.create_enroll_code(self.engine, group, 600).text
        key = nacl.signing.SigningKey.generate()
        r = self.http.post(
            "/api/v1/enroll",
            json={"code": code, "name": name, "public_key": signing.public_key_b64(key)},
        )
        assert r.status_code == 201, r.text
        return EnrolledComputer(self, r.json()["computer_id"], key, group)

    def fleet(self, group: str) -> dict[str, Any]:
        r = self.http.get("/api/v1/fleet", headers=self.viewer(group))
        assert r.status_code == 200, r.text
        return r.json()

    def computer(self, group: str, computer_id: str) -> dict[str, Any]:
        r = self.http.get(f"/api/v1/computers/{computer_id}", headers=self.viewer(group))
        assert r.status_code == 200, r.text
        return r.json()

    def row(self, computer_id: str) -> Any:
        from rbroker_server.db.models import Computer

        table = Computer.__table__  # type: ignore[attr-defined]
        with self.engine.connect() as conn:
            return conn.execute(sa.select(table).where(table.c.id == computer_id)).one()

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(15)
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        self.http.close()


def _serve(app: Any) -> tuple[uvicorn.Server, threading.Thread, str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # as `rbroker-server serve` without trusted proxies: the peer is the connection's
    # address (uvicorn's default would believe X-Forwarded-For from 127.0.0.1)
    config = uvicorn.Config(
        app, log_config=None, log_level="warning", lifespan="on", proxy_headers=False
    )
    server = uvicorn.Server(config)

    def run() -> None:
        try:
            server.run(sockets=[sock])
        finally:
            sock.close()

    thread = threading.Thread(target=run, name=f"coordinator-{port}", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("coordinator did not start")
        time.sleep(0.01)
    return server, thread, url


def start_coordinator(settings: Settings, backend: str) -> Coordinator:
    """A coordinator serving `settings` on a free port (stop it, dispose of its engine)."""
    engine = db.make_engine(settings.db_url)
    server, thread, url = _serve(create_app(settings, engine=engine))
    c = Coordinator(url, settings, engine, httpx.Client(base_url=url, timeout=30), backend)
    c._server, c._thread = server, thread
    return c


def start_coordinator_process(settings: Settings, backend: str, log_path: Path) -> Coordinator:
    """A `rbroker-server serve` process of its own on `settings` (saved as the config of
    their data directory; HTTP on 127.0.0.1 and a free port), its output in `log_path`:
    what only a process shows (its own health counters, its own event loop). Each process
    of one test may share the data directory: the port is given on the command line."""
    settings.save()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    cmd = [sys.executable, "-m", "rbroker_server", "serve", "--data-dir", str(settings.data_dir)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*cmd, "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    http = httpx.Client(base_url=url, timeout=30)
    deadline = time.monotonic() + 60
    while True:
        try:
            if http.get("/healthz").status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            http.close()
            raise RuntimeError(f"coordinator process did not start: {log_path.read_text()}")
        time.sleep(0.1)
    engine = db.make_engine(settings.db_url)
    return Coordinator(url, settings, engine, http, backend, _proc=proc)


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    """The database the coordinator runs on (PostgreSQL only with RBROKER_TEST_PG_URL)."""
    if request.param == "postgresql" and pg_url() is None:
        pytest.skip(f"PostgreSQL variant: set {PG_ENV} (e.g. postgresql+psycopg://…/test)")
    return str(request.param)


@pytest.fixture
def database_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, empty database: a SQLite file, or a new PostgreSQL schema dropped afterwards
    (also when the test fails)."""
    if backend == "sqlite":
        yield f"sqlite:///{(tmp_path / 'data' / 'rbroker-server.db').as_posix()}"
        return
    with scratch_schema(request.getfixturevalue("pg_base_url"), "rbt") as url:
        yield url


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """An engine on `database_url` (each backend), upgraded to the newest revision."""
    e = db.make_engine(database_url)
    db.upgrade(e)
    yield e
    e.dispose()


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file at the newest schema revision, migrated once per pytest process; the
    coordinators of `coordinator_factory` start from a copy of it (their own upgrade then
    finds nothing to do). `tests/server/test_migrations.py` keeps running the real upgrade
    from an empty database."""
    path = tmp_path_factory.mktemp("schema") / "migrated.db"
    engine = db.make_engine(f"sqlite:///{path.as_posix()}")
    try:
        db.upgrade(engine)
    finally:
        engine.dispose()
    return path


@pytest.fixture
def coordinator_factory(
    database_url: str, backend: str, tmp_path: Path, migrated_sqlite: Path
) -> Iterator[Callable[..., Coordinator]]:
    """`coordinator_factory(**settings_changes)` → a running Coordinator on a fresh database
    (all of one test's coordinators share it; a SQLite one starts as a copy of
    `migrated_sqlite`); `process=True`: a `rbroker-server serve` process of its own (a test
    that starts one is marked `contract`). All are stopped at teardown."""
    started: list[Coordinator] = []
    if backend == "sqlite":
        target = Path(database_url.removeprefix("sqlite:///"))
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(migrated_sqlite, target)

    def factory(*, process: bool = False, **changes: Any) -> Coordinator:
        settings = Settings(data_dir=tmp_path / "data", database_url=database_url, **changes)
        if process:  # its own `rbroker-server serve`
            log_path = tmp_path / f"coordinator-{len(started)}.log"
            c = start_coordinator_process(settings, backend, log_path)
        else:
            c = start_coordinator(settings, backend)
        started.append(c)
        return c

    yield factory
    for c in started:
        c.stop()
        c.engine.dispose()


@pytest.fixture
def coordinator(coordinator_factory: Callable[..., Coordinator]) -> Coordinator:
    """A coordinator with default settings on a fresh database."""
    return coordinator_factory()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def dumps(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def wait_until_true(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll `predicate` until true, or fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(0.05)
