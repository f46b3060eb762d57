"""No state of a connection keeps a closed peer's requests alive (architecture.md §5).

Found before: a user pipelined 1 024 waiting `lease.acquire`s on one connection, closed the
socket and kept the process alive: the connection was at `MAX_IN_FLIGHT`, its reading
paused, so the close was never seen and all 1 024 stayed queued (300 s, until the process
exited), ahead of other users' requests; request 1 025 and later got no answer at all. Now a
line past the cap is answered `too_many_in_flight` at once and reading goes on; while
reading pauses for answers the peer does not read, its close fails the pending write.
Served on this OS's transport (a Unix socket; the named pipe on Windows).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any

import pytest

from rbroker.localapi.server import MAX_IN_FLIGHT
from rbroker.transport.base import Stream
from tests.desktop.localapi.served import ServedApi, served_api

pytestmark = pytest.mark.contract

ACQUIRE: dict[str, Any] = {
    "mib": 64,
    "wait_s": 300,
    "project": "tests",
    "session": "closed-peer",
    "purpose": "a peer that closes",
}


def _acquire(request_id: int) -> bytes:
    msg = {"jsonrpc": "2.0", "id": request_id, "method": "lease.acquire", "params": ACQUIRE}
    return json.dumps(msg).encode() + b"\n"


def _queued(served: ServedApi) -> int:
    return len(served.call(lambda: served.api.broker.leases_view(False))["queue"])


def _wait_for(what: Any, timeout_s: float) -> float:
    """Seconds until `what()` is true (AssertionError after `timeout_s`)."""
    start = time.monotonic()
    while not what():
        assert time.monotonic() - start < timeout_s, f"not within {timeout_s} s"
        time.sleep(0.02)
    return time.monotonic() - start


def _read(conn: Stream) -> dict[str, Any]:
    answer = json.loads(conn.readline())
    assert isinstance(answer, dict)
    return answer


def test_past_the_in_flight_cap_lines_are_refused_and_a_close_ends_the_queue() -> None:
    excess = 40
    with served_api(max_waiting_per_user=4 * MAX_IN_FLIGHT) as served:
        served.call(lambda: served.api.broker.set_paused(True))  # every acquire waits
        conn = served.connect()
        closed = False
        try:
            total = MAX_IN_FLIGHT + excess
            conn.write(b"".join(_acquire(i) for i in range(total)))
            refused = [_read(conn) for _ in range(excess)]
            assert [a["id"] for a in refused] == list(range(MAX_IN_FLIGHT, total))
            error = refused[0]["error"]
            assert error["data"] == {"name": "too_many_in_flight", "limit": MAX_IN_FLIGHT}
            assert str(MAX_IN_FLIGHT) in error["message"] and "\n" not in error["message"]
            assert _queued(served) == MAX_IN_FLIGHT
            # the connection is still read, and a renew is served past the cap: its answer
            # is the lease's own (none such here), not too_many_in_flight
            conn.write(
                b'{"jsonrpc":"2.0","id":"r","method":"lease.renew","params":'
                b'{"lease_id":"lease-none"}}\n'
            )
            assert _read(conn)["error"]["data"]["name"] != "too_many_in_flight"

            conn.close()  # this process lives on
            closed = True
            _wait_for(lambda: _queued(served) == 0, 2.0)
            _wait_for(lambda: not served.api._connections, 2.0)
        finally:
            if not closed:
                conn.close()


def _call(
    conn: Stream, request_id: str, method: str, params: dict[str, Any], others: list[Any]
) -> dict[str, Any]:
    """The answer to this request; answers to earlier ones read meanwhile go to `others`."""
    msg = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    conn.write(json.dumps(msg).encode() + b"\n")
    while (answer := _read(conn))["id"] != request_id:
        others.append(answer)
    return answer


def test_at_the_in_flight_cap_renew_release_and_cancel_are_still_served() -> None:
    """A connection with `MAX_IN_FLIGHT` waiting requests keeps its granted lease alive, ends
    it, and cancels a waiting request: the cap refuses only what would wait (an acquire)."""
    with served_api(max_waiting_per_user=4 * MAX_IN_FLIGHT) as served:
        conn = served.connect()
        try:
            others: list[Any] = []
            granted = _call(conn, "g", "lease.acquire", ACQUIRE, others)
            lease_id = granted["result"]["lease"]["lease_id"]
            served.call(lambda: served.api.broker.set_paused(True))  # every acquire waits
            conn.write(b"".join(_acquire(i) for i in range(MAX_IN_FLIGHT)))
            _wait_for(lambda: _queued(served) == MAX_IN_FLIGHT, 30.0)
            refused = _call(conn, "over", "lease.acquire", ACQUIRE, others)
            assert refused["error"]["data"]["name"] == "too_many_in_flight"

            renewed = _call(conn, "renew", "lease.renew", {"lease_id": lease_id}, others)
            assert renewed["result"]["lease"]["lease_id"] == lease_id, renewed
            view = served.call(lambda: served.api.broker.leases_view(False))
            first = view["queue"][0]["request_id"]
            cancelled = _call(conn, "cancel", "request.cancel", {"request_id": first}, others)
            assert cancelled["result"]["request"]["request_id"] == first, cancelled
            released = _call(conn, "release", "lease.release", {"lease_id": lease_id}, others)
            assert released["result"]["lease"]["lease_id"] == lease_id, released
            assert _queued(served) == MAX_IN_FLIGHT - 1
            assert [a["error"]["data"]["name"] for a in others] == ["cancelled"]
        finally:
            conn.close()


def test_a_peer_that_does_not_read_and_closes_is_noticed() -> None:
    # answers the peer does not read hold its reading back; its close must still end it
    with served_api(max_unsent_bytes=64 * 1024) as served:
        served.call(lambda: served.api.broker.set_paused(True))
        conn = served.connect()
        closed = False
        try:
            conn.write(_acquire(1))
            _wait_for(lambda: _queued(served) == 1, 10.0)
            views = b'{"jsonrpc":"2.0","id":2,"method":"leases.list"}\n' * 2000

            def send() -> None:  # blocks once the broker stops reading; ends at the close
                with contextlib.suppress(OSError):
                    conn.write(views)  # about 1 MB of answers, never read

            sender = threading.Thread(target=send, daemon=True)
            sender.start()

            def held_back() -> bool:
                conns = served.call(lambda: list(served.api._connections))
                return any(c.unsent_bytes() >= 64 * 1024 for c in conns)

            _wait_for(held_back, 10.0)
            conn.close()
            closed = True
            _wait_for(lambda: _queued(served) == 0, 2.0)
            sender.join(10)
        finally:
            if not closed:
                conn.close()
