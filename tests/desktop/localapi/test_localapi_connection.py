"""The local API's connection behaviour (architecture.md §5): concurrent requests on one connection,
ids, notifications, events, who the caller is, and the socket file itself."""

from __future__ import annotations

import getpass
import json
import os
import select
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

import rbroker
from tests.conftest import SINGLE_24G, BrokerProcess, short_tmp, start_broker, wait_until
from tests.desktop.conftest import RawConnection, WorkerProcess

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

PARAMS: dict[str, Any] = {"project": "tests", "session": "conn", "purpose": "connection behaviour"}


def test_a_waiting_acquire_does_not_hold_up_the_connection(
    broker: BrokerProcess,
    raw_connect: Callable[[str], RawConnection],
    worker: Callable[..., WorkerProcess],
) -> None:
    with broker.client() as c:
        # held by another process: behind this process's own lease the wait would be
        # refused at once (architecture.md §3)
        held = worker("hold_lease", broker.socket, "20000", "blocker", "0").read_line()
        assert held.startswith("granted "), held
        blocker = {"lease_id": held.split()[1]}
        conn = raw_connect(broker.socket)
        waiting_id = conn.send_request("lease.acquire", {"mib": 8000, "wait_s": 30, **PARAMS})
        wait_until(lambda: len(c.leases()["queue"]) == 1)
        # Later requests on the same connection are answered while the acquire waits.
        assert conn.hello()["owner"] == getpass.getuser()
        listed = conn.request("leases.list", {})
        assert len(listed["result"]["queue"]) == 1
        c.call("lease.release", lease_id=blocker["lease_id"])
        answer = conn.read_answer(waiting_id)
        assert answer["result"]["lease"]["granted_mib"] == 8000


def test_answers_carry_the_request_id(
    broker: BrokerProcess, raw_connect: Callable[[str], RawConnection]
) -> None:
    conn = raw_connect(broker.socket)
    for request_id in ("abc-1", 0, 2**40):
        conn.send_line(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "method": "hello",
                    "params": {"protocol_version": 1},
                }
            ).encode()
        )
        answer = conn.read_message()
        assert answer["id"] == request_id
        assert answer["result"]["protocol_version"] == 1


def test_a_notification_gets_no_answer(
    broker: BrokerProcess, raw_connect: Callable[[str], RawConnection]
) -> None:
    conn = raw_connect(broker.socket)
    conn.send_line(b'{"jsonrpc":"2.0","method":"hello","params":{"protocol_version":1}}')
    answer = conn.request("broker.status", {})
    assert "result" in answer  # the first message back answers the status request
    conn.sock.settimeout(0.3)
    with pytest.raises(TimeoutError):
        conn.read_message()


def test_events_are_pushed_to_subscribers(
    broker: BrokerProcess, raw_connect: Callable[[str], RawConnection]
) -> None:
    conn = raw_connect(broker.socket)
    assert conn.request("events.subscribe", {})["result"] == {"subscribed": True}
    with broker.client() as c:
        lease = c.call("lease.acquire", mib=1024, **PARAMS)["lease"]
        c.call("lease.release", lease_id=lease["lease_id"])
    seen: list[tuple[str, str]] = []
    while ("active" not in [s for _, s in seen]) or ("released" not in [s for _, s in seen]):
        msg = conn.read_message()
        assert msg["method"] == "event" and "id" not in msg
        params = msg["params"]
        if params["kind"] == "lease" and params["data"]["lease_id"] == lease["lease_id"]:
            seen.append((params["kind"], params["data"]["state"]))
    assert seen == [("lease", "active"), ("lease", "released")]


def test_sdk_client_collects_events(broker: BrokerProcess) -> None:
    with broker.client() as watcher, broker.client() as c:
        watcher.subscribe()
        c.call("lease.acquire", mib=1024, **PARAMS)
        event = None
        for _ in range(50):
            event = watcher.wait_event(timeout_s=2)
            if event and event["kind"] == "lease":
                break
        assert event is not None and event["kind"] == "lease"
        assert event["data"]["state"] == "active"


def test_the_owner_comes_from_the_connection_not_the_request(
    broker: BrokerProcess, raw_connect: Callable[[str], RawConnection]
) -> None:
    conn = raw_connect(broker.socket)
    answer = conn.request("lease.acquire", {"mib": 1024, "owner": "root", **PARAMS})
    assert answer["error"]["data"]["name"] == "invalid_params"  # no such field to forge
    lease = conn.request("lease.acquire", {"mib": 1024, **PARAMS})["result"]["lease"]
    assert lease["owner"] == getpass.getuser()


def test_socket_file_is_not_world_accessible(broker: BrokerProcess) -> None:
    mode = stat.S_IMODE(os.stat(broker.socket).st_mode)
    assert mode & 0o007 == 0, oct(mode)
    assert stat.S_ISSOCK(os.stat(broker.socket).st_mode)


def test_a_second_broker_on_the_same_socket_refuses_and_leaves_the_first(
    broker: BrokerProcess,
) -> None:
    root = short_tmp()
    (root / "scenario.toml").write_text(SINGLE_24G)
    second = subprocess.run(
        [
            *(sys.executable, "-m", "rbroker", "broker", "--simulate", str(root / "scenario.toml")),
            *("--socket", broker.socket, "--data-dir", str(root / "data")),
            # a lock of its own: past the machine lock to the socket's own check
            *("--machine-lock", f"rbroker-test-{os.getpid()}-same-socket"),
        ],
        capture_output=True,
        timeout=60,
    )
    assert second.returncode == 1
    assert b"already" in second.stderr
    with broker.client() as c:
        assert c.hello()["simulated"] is True
    assert broker.proc.poll() is None


def test_a_stale_socket_file_is_replaced() -> None:
    root = short_tmp()
    path = root / "broker.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: what a crashed broker leaves behind
    assert path.exists()
    bp = start_broker(SINGLE_24G, root=root)
    try:
        with rbroker.Client(bp.socket) as c:
            assert c.hello()["protocol_version"] == 1
    finally:
        bp.stop()
    assert not path.exists(), "a stopped broker removes its socket file"


def _hung_up(sock: socket.socket) -> bool:
    """True once the peer closed `sock`, without reading what is still buffered in it."""
    poller = select.poll()
    poller.register(sock, select.POLLHUP | getattr(select, "POLLRDHUP", 0))
    return any(ev & (select.POLLHUP | getattr(select, "POLLRDHUP", 0)) for _, ev in poller.poll(0))


@pytest.mark.skipif(not hasattr(select, "poll"), reason="needs poll()")
def test_a_subscriber_that_never_reads_is_dropped(broker: BrokerProcess) -> None:
    """Events for a subscriber that does not read pile up in the broker; past a bound the
    broker drops that connection instead of growing without end, and serves everyone else.

    Either of two bounds drops it, whichever comes first, and the log names which: the
    events queued for it (`MAX_EVENT_BACKLOG`), or its unsent bytes held past the limit for
    `UNSENT_DROP_AFTER_S` (on a busy machine the events come slower than those 10 s: the
    test asked for the first only and failed there)."""
    sub = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sub.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sub.connect(broker.socket)
        sub.sendall(b'{"jsonrpc":"2.0","id":1,"method":"events.subscribe","params":{}}\n')
        started = time.monotonic()
        with broker.client() as c:
            while not _hung_up(sub):
                assert time.monotonic() - started < 120, "the silent subscriber was never dropped"
                for _ in range(100):
                    lease = c.call("lease.acquire", mib=1024, wait_s=5, **PARAMS)["lease"]
                    c.call("lease.release", lease_id=lease["lease_id"])
            assert c.hello()["protocol_version"] == 1
        said = broker.log()
        backlog = "does not read its events" in said
        unsent = "answer bytes unsent for" in said and "the client does not read" in said
        assert backlog or unsent, said[-2000:]
        assert broker.proc.poll() is None
    finally:
        sub.close()


def test_a_client_that_never_reads_its_answers_meets_backpressure(broker: BrokerProcess) -> None:
    """Requests sent without reading the answers: the broker stops reading that connection
    (so the sender's writes block) instead of queueing answers without bound, and keeps
    serving everyone else."""
    flood = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        flood.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        flood.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        flood.connect(broker.socket)
        flood.settimeout(1.0)
        batch = b'{"jsonrpc":"2.0","id":1,"method":"gpus.list","params":{}}\n' * 100
        sent, started = 0, time.monotonic()
        with pytest.raises(TimeoutError):
            while time.monotonic() - started < 30:
                flood.sendall(batch)
                sent += 100
        assert sent < 100_000, sent
        with broker.client(timeout_s=5) as c:
            t = time.monotonic()
            c.hello()
            assert time.monotonic() - t < 1.0
    finally:
        flood.close()
    assert broker.proc.poll() is None
