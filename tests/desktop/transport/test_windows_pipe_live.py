"""The Windows named-pipe transport for real (issue 13, item 3): a broker served on a pipe
by the service's hosting loop, 200 simultaneous clients, the exclusive first instance, the
caller's user from its token, and a client refusing a pipe whose server runs as another
account than the service's. Windows only: the Windows job of .github/workflows/ci.yml runs
these; elsewhere they skip.
"""

from __future__ import annotations

import asyncio
import dataclasses
import getpass
import os
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import rbroker
from rbroker.hosting.machine_lock import PER_SOCKET
from rbroker.hosting.service_windows import ServiceOptions, serve_until, service_config
from rbroker.transport.pipe_security import SERVICE_PIPE

pytestmark = pytest.mark.skipif(sys.platform != "win32", reason="needs Windows named pipes")

CLIENTS = 200


@pytest.fixture
def pipe_broker(tmp_path: Path) -> Iterator[str]:
    address = rf"\\.\pipe\rbroker-test-{uuid.uuid4().hex[:12]}"
    config = service_config({}, ServiceOptions(data_dir=tmp_path / "data", simulate=True))
    config = dataclasses.replace(config, socket_path=Path(address), machine_lock=PER_SOCKET)
    loop = asyncio.new_event_loop()  # the proactor loop on Windows
    stop = asyncio.Event()
    ready = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            loop.run_until_complete(serve_until(config, stop, ready.set))
        except BaseException as exc:  # reported by the test below
            failed.append(exc)
            ready.set()

    thread = threading.Thread(target=run)
    thread.start()
    assert ready.wait(60) and not failed, failed
    yield address
    loop.call_soon_threadsafe(stop.set)
    thread.join(60)
    loop.close()


def test_a_client_is_served_and_owns_its_lease(pipe_broker: str) -> None:
    with rbroker.Client(pipe_broker, timeout_s=30) as c:
        assert len(c.gpus()) == 2
        with rbroker.lease(
            1024, socket=pipe_broker, project="ci", session="pipe-owner", purpose="pipe test"
        ):
            (lease,) = c.leases()["leases"]
    # the owner comes from the client's token (DOMAIN\name), never from the request
    assert lease["owner"].lower().endswith("\\" + getpass.getuser().lower())


def test_the_brokers_own_account_may_pause_it(pipe_broker: str) -> None:
    # the caller's SID from its token equals the broker's: the administrative methods work
    with rbroker.Client(pipe_broker, timeout_s=30) as c:
        c.call("broker.pause", paused=True)
        c.call("broker.pause", paused=False)


def test_200_simultaneous_clients_are_all_answered(pipe_broker: str) -> None:
    start = threading.Barrier(CLIENTS)

    def one(_n: int) -> int:
        start.wait(60)
        with rbroker.Client(pipe_broker, timeout_s=60) as c:
            return len(c.gpus())

    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(one, range(CLIENTS)))
    assert answers == [2] * CLIENTS  # none refused with "all pipe instances are busy"


def test_the_first_instance_is_exclusive(pipe_broker: str, tmp_path: Path) -> None:
    from rbroker.transport.base import BrokerAlreadyRunning
    from rbroker.transport.pipe_windows import serve_pipe

    async def second() -> None:
        async def handler(*_: object) -> None:
            return None

        await serve_pipe(pipe_broker, handler, 65536)

    with pytest.raises(BrokerAlreadyRunning, match="exists already"):
        asyncio.run(second())


def test_client_refuses_a_service_pipe_not_served_by_localsystem() -> None:
    import _winapi

    try:  # this account squats the service's name (where no service runs)
        handle = _winapi.CreateNamedPipe(
            SERVICE_PIPE,
            _winapi.PIPE_ACCESS_DUPLEX | _winapi.FILE_FLAG_FIRST_PIPE_INSTANCE,
            _winapi.PIPE_WAIT,
            1,
            65536,
            65536,
            0,
            0,
        )
    except OSError:
        pytest.skip("an rbroker service runs on this computer")

    def accept() -> None:
        # The client checks the server's account and hangs up before it sends a
        # byte, so the connect may end with "pipe closed" (ERROR_NO_DATA, 232) or
        # "pipe connected" (535); both are what this squatter expects.
        try:
            _winapi.ConnectNamedPipe(handle, False)
        except OSError as exc:
            if exc.winerror not in (232, 535):
                raise

    acceptor = threading.Thread(target=accept, daemon=True)
    try:
        acceptor.start()
        with pytest.raises(rbroker.BrokerUnavailable) as err:
            rbroker.Client(SERVICE_PIPE, timeout_s=10)
        assert "not S-1-5-18" in str(err.value) and "nothing was sent" in str(err.value)
        acceptor.join(timeout=10)
        assert not acceptor.is_alive(), "the squatter's connect never returned"
    finally:
        _winapi.CloseHandle(handle)
    assert os.name == "nt"
