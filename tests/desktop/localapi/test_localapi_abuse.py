"""Hostile local clients: a broker's memory, file handles and answers stay bounded, and only
its own user may change what it does for everyone.

Figures measured before the bounds existed (issue "hostile clients"): one client sending
`leases.list` with ended leases and never reading grew the broker from 59 MiB to about 1 GiB
while other clients' lease cycles took 7–9 s; 1 030 connections that each sent half a line
made the broker refuse everyone at a 1 024-file limit; any local user could pause
admissions; a lone surrogate in a request id left the request unanswered. The tests on
the `broker` fixture run on both event loops the broker may use (`rbroker.base.eventloop`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from rbroker.localapi.server import (
    LINE_TIMEOUT_S,
    MAX_CONNECTIONS_PER_USER,
    MAX_UNSENT_BYTES,
    UNSENT_DROP_AFTER_S,
)
from tests.conftest import GPU0, SINGLE_24G, BrokerProcess, wait_until
from tests.desktop.conftest import LOOPS, RawConnection, start_simulated_broker
from tests.os_users import OsUser, open_to_everyone, run_as

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

PARAMS: dict[str, Any] = {"project": "tests", "session": "abuse", "purpose": "hostile clients"}


@pytest.fixture(params=LOOPS)
def broker(
    request: pytest.FixtureRequest, broker_factory: Callable[..., BrokerProcess]
) -> BrokerProcess:
    """A broker on each event loop it may use (see the module docstring)."""
    bp = broker_factory(SINGLE_24G, env={"RBROKER_EVENT_LOOP": request.param})
    with bp.client() as c:
        assert c.status()["event_loop"] == request.param
    return bp


def _cycle_ms(c: Any) -> float:
    start = time.perf_counter()
    lease = c.call("lease.acquire", mib=256, **PARAMS)["lease"]
    c.call("lease.renew", lease_id=lease["lease_id"])
    c.call("lease.release", lease_id=lease["lease_id"])
    return (time.perf_counter() - start) * 1000


def test_a_client_that_does_not_read_costs_a_bounded_amount_and_is_dropped(
    broker: BrokerProcess,
) -> None:
    with broker.client() as c:
        for _ in range(500):  # the ended-lease history makes every answer large
            _cycle_ms(c)
        answer_bytes = len(json.dumps(c.call("leases.list", include_ended=True)))
    assert answer_bytes > 150_000, answer_bytes

    proc = psutil.Process(broker.proc.pid)
    rss_before = proc.memory_info().rss
    abuser = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abuser.connect(broker.socket)
    request = (
        json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "leases.list",
                "params": {"include_ended": True},
            }
        ).encode()
        + b"\n"
    )

    def hammer() -> None:  # sends 4 000 requests (~0.8 GB of answers) and never reads
        with contextlib.suppress(OSError):  # dropped by the broker
            abuser.sendall(request * 4000)

    sender = threading.Thread(target=hammer, daemon=True)
    sender.start()
    peak = rss_before
    cycles: list[float] = []
    with broker.client() as c:
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            cycles.append(_cycle_ms(c))
            peak = max(peak, proc.memory_info().rss)
    grown_mib = (peak - rss_before) / 2**20
    # At most MAX_UNSENT_BYTES wait unsent, plus one answer being built and the requests
    # read but not yet answered (1 024 at most, small).
    assert grown_mib < 4 * MAX_UNSENT_BYTES / 2**20 + 24, (grown_mib, answer_bytes)
    assert len(cycles) > 20
    assert statistics.median(cycles) < 50, sorted(cycles)

    # Its answers stay unsent, so the broker drops it after UNSENT_DROP_AFTER_S.
    abuser.settimeout(UNSENT_DROP_AFTER_S + 15)
    got_end = False
    end = time.monotonic() + UNSENT_DROP_AFTER_S + 15
    try:
        while time.monotonic() < end:
            if not abuser.recv(1 << 20):
                got_end = True
                break
            time.sleep(0.5)  # read slowly: still far behind what it asked for
    except ConnectionResetError:
        got_end = True
    abuser.close()
    sender.join(5)
    assert got_end
    assert "does not read" in broker.log()
    with broker.client() as c:  # and the broker serves on
        _cycle_ms(c)


def test_a_request_with_a_lone_surrogate_is_answered(
    broker: BrokerProcess, raw_connect: Callable[[str], RawConnection]
) -> None:
    conn = raw_connect(broker.socket)
    conn.send_line(
        b'{"jsonrpc":"2.0","id":"\\ud800","method":"hello","params":{"protocol_version":1}}'
    )
    answer = conn.read_message()
    assert answer["id"] == "\ud800"
    assert answer["result"]["protocol_version"] == 1

    conn.send_line(b'{"jsonrpc":"2.0","id":7,"method":"\\udfffhello"}')
    answer = conn.read_message()
    assert answer["id"] == 7
    assert answer["error"]["data"]["name"] == "method_not_found"
    assert answer["error"]["data"]["method"] == "\udfffhello"
    assert conn.hello()["protocol_version"] == 1  # the connection stays usable


def test_a_half_sent_line_times_out_and_an_idle_connection_does_not(
    broker: BrokerProcess, raw_connect: Callable[[str], RawConnection]
) -> None:
    idle = raw_connect(broker.socket)
    half = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    half.connect(broker.socket)
    half.settimeout(LINE_TIMEOUT_S + 10)
    start = time.monotonic()
    half.sendall(b'{"jsonrpc":"2.0","id":1,"meth')
    data = b""
    while chunk := half.recv(65536):
        data += chunk
    elapsed = time.monotonic() - start
    half.close()
    assert LINE_TIMEOUT_S - 0.5 <= elapsed <= LINE_TIMEOUT_S + 5, elapsed
    error = json.loads(data.splitlines()[0])["error"]
    assert error["data"]["name"] == "invalid_request"
    assert "incomplete request line" in error["message"]
    # A connection that sent nothing at all is a client between requests: it stays.
    assert idle.hello()["protocol_version"] == 1


def _stall_connections(path: str, count: int, hold_s: float) -> dict[str, int]:
    """As another user: open `count` connections, send half a line on each, hold them."""
    kept: list[socket.socket] = []
    refused = 0
    names: set[str] = set()
    for _ in range(count):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.sendall(b'{"jsonrpc":"2.0","id":1,')
        kept.append(s)
    # Collect refusals until none has come for 2 s (the broker accepts at its own pace).
    import selectors

    waiting = selectors.DefaultSelector()  # epoll: select() stops at fd 1 024
    for s in kept:
        waiting.register(s, selectors.EVENT_READ)
    while ready := waiting.select(2.0):
        for key, _ in ready:
            data = key.fileobj.recv(65536)  # type: ignore[union-attr]
            if data:
                names.add(json.loads(data.splitlines()[0])["error"]["data"]["name"])
            refused += 1
            waiting.unregister(key.fileobj)
    time.sleep(hold_s)
    for s in kept:
        s.close()
    return {"refused": refused, "kept": count - refused, "names": len(names)} | {
        f"name:{n}": 1 for n in names
    }


def test_stalled_connections_of_one_user_do_not_lock_out_another_at_1024_files(
    broker: BrokerProcess, other_user: OsUser
) -> None:
    subprocess.run(["prlimit", "--pid", str(broker.proc.pid), "--nofile=1024:1024"], check=True)
    open_to_everyone(Path(broker.socket).parent, broker.socket)
    result: dict[str, Any] = {}

    def attack() -> None:
        result.update(run_as(other_user, _stall_connections, broker.socket, 1100, 4.0))

    attacker = threading.Thread(target=attack)
    attacker.start()
    wait_until(
        lambda: (
            sum(1 for c in psutil.Process(broker.proc.pid).net_connections("unix"))
            >= MAX_CONNECTIONS_PER_USER
        ),
        timeout_s=30,
    )
    with broker.client(timeout_s=5) as c:  # the test's own user still gets in
        assert _cycle_ms(c) < 5_000
    attacker.join(60)
    assert result["kept"] == MAX_CONNECTIONS_PER_USER, result
    assert result["refused"] == 1100 - MAX_CONNECTIONS_PER_USER, result
    assert result.get("name:too_many_connections") == 1, result
    assert f"refusing connections of {other_user.name}" in broker.log()


def _calls(path: str, calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    conn = RawConnection(path)
    try:
        return [conn.request(method, params) for method, params in calls]
    finally:
        conn.close()


ADMIN_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("broker.pause", {"paused": True}),
    ("sim.set", {"gpu_uuid": GPU0, "used_mib": 20000}),
    ("sim.stall", {"seconds": 0.1}),
]


def test_only_the_brokers_own_user_may_pause_or_change_the_simulation(
    broker: BrokerProcess, other_user: OsUser
) -> None:
    open_to_everyone(Path(broker.socket).parent, broker.socket)
    answers = run_as(
        other_user,
        _calls,
        broker.socket,
        [
            *ADMIN_CALLS,
            ("lease.acquire", {"mib": 1024, **PARAMS}),  # leasing is for everyone
            ("sim.allocate", {"mib": 512}),  # as is using memory, like a CUDA allocation
        ],
    )
    for (method, _), answer in zip(ADMIN_CALLS, answers, strict=False):
        assert answer["error"]["data"]["name"] == "not_allowed", answer
        assert answer["error"]["data"]["method"] == method
        message = answer["error"]["message"]
        assert other_user.name in message and "the broker's own user" in message
    assert answers[3]["result"]["lease"]["owner"] == other_user.name
    assert answers[4]["result"]["pid_mib"] == 512
    with broker.client() as c:
        assert not c.call("broker.status")["paused"]
        assert c.call("broker.pause", paused=True) == {"paused": True}
        assert c.call("broker.pause", paused=False) == {"paused": False}


def test_members_of_the_admin_group_may_pause(
    broker_factory: Callable[..., BrokerProcess], other_user: OsUser
) -> None:
    from tests.os_users import create_group

    group = create_group(f"{other_user.name}-adm")
    try:
        subprocess.run(["usermod", "-aG", group, other_user.name], check=True)
        bp = broker_factory(SINGLE_24G, extra_args=["--admin-group", group])
        open_to_everyone(Path(bp.socket).parent, bp.socket)
        answers = run_as(other_user, _calls, bp.socket, [("broker.pause", {"paused": True})])
        assert answers[0]["result"] == {"paused": True}
        with bp.client() as c:
            assert c.call("broker.status")["paused"]
    finally:
        subprocess.run(["groupdel", group], capture_output=True)


def test_an_unknown_admin_group_is_refused_at_start(tmp_path: Path) -> None:
    import sys

    if sys.platform == "win32":
        pytest.skip("Unix groups")
    proc = start_simulated_broker(tmp_path, "--admin-group", "no-such-group-rbt")
    assert proc.returncode == 2, proc.stderr
    assert "no-such-group-rbt" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["jobs"],
        ["top", "--once"],
        ["release", "3f2a"],
        ["run", "--mib", "64", "--", "true"],
    ],
    ids=["status", "jobs", "top", "release", "run"],
)
def test_commands_at_the_connection_cap_say_so_in_one_line_and_exit_2(
    broker: BrokerProcess, command: list[str]
) -> None:
    """A user at the per-user connection cap who runs a command is told why in one line
    (it printed a NotAllowed traceback), exit 2 as for every refusal: the broker is there
    and says no, which is not 69, no broker."""
    held = []
    try:
        for _ in range(MAX_CONNECTIONS_PER_USER):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(broker.socket)
            held.append(s)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "rbroker",
                *command[:1],
                "--socket",
                broker.socket,
                *command[1:],
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "1000"},
        )
    finally:
        for s in held:
            s.close()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert f"{MAX_CONNECTIONS_PER_USER} at most" in done.stderr
