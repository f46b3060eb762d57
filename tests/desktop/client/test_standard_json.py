"""A client on the standard library's json (in a quick start, `rbroker.base.lazy.quick_start`:
what the short command-line clients use to start faster; issue 44) talks to a broker as one
on orjson does: the same answers, the same typed errors, a lease granted, renewed
(pipelined) and released."""

from __future__ import annotations

import json
import socket
import sys
import threading
from pathlib import Path

import pytest

import rbroker
from rbroker.base import lazy
from rbroker_protocol import framing, jsonrpc
from rbroker_protocol.params import AcquireRequest
from tests.conftest import BrokerProcess

ACQUIRE: AcquireRequest = {
    "mib": 512,
    "project": "p",
    "session": "s",
    "purpose": "standard json",
    "ttl_s": 30.0,
}


def test_a_client_made_after_the_switch_uses_the_standard_library(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as a job: not a quick start (an earlier test's `rbroker.cli.main.main` may have made
    # this process one); restored after the test
    monkeypatch.setattr(lazy, "_quick", False)
    with broker.client() as fast:
        assert fast._encode is jsonrpc.encode
    lazy.quick_start()
    with broker.client() as plain:
        assert plain._encode is framing.encode


def test_the_standard_librarys_client_reads_what_orjsons_reads(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    def seen(
        client: rbroker.Client,
    ) -> tuple[object, ...]:  # what does not move while nothing changes
        gpus = [(g["uuid"], g["granted_mib"], g["available_mib"]) for g in client.gpus()]
        leases = [
            (x["lease_id"], x["granted_mib"], x["purpose"]) for x in client.leases()["leases"]
        ]
        return gpus, leases, client.live_bookings(), client.status()["version"]

    monkeypatch.setattr(lazy, "_quick", False)  # as a job; restored after the test
    with broker.client() as fast:
        held = fast.acquire(ACQUIRE)["lease"]  # held while both read
        expected = seen(fast)
        monkeypatch.setattr(lazy, "_quick", True)
        with broker.client() as plain:
            assert seen(plain) == expected
            assert expected[1] == [(held["lease_id"], 512, "standard json")]
            with pytest.raises(rbroker.LeaseNotFound):  # the typed error, read by json
                plain.renew("lease-000000000000")
            with pytest.raises(rbroker.InvalidParams, match="finite"):  # refused, not sent
                plain.call("lease.renew", lease_id="x", ttl_s=float("nan"))
            mine = plain.acquire(ACQUIRE)["lease"]
            plain.renew_nowait(mine["lease_id"])
            assert plain.release(mine["lease_id"])["lease"]["state"] == "released"


@pytest.mark.contract  # a peer on a real Unix socket
@pytest.mark.parametrize("quick", [False, True], ids=["orjson", "json"])
@pytest.mark.skipif(sys.platform == "win32", reason="a Unix socket peer")
def test_an_answer_nested_too_deeply_is_one_line_not_a_traceback(
    quick: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer at the socket that is not a broker answers with 1 100 nested lists (deeper
    than json reads, about 990, and orjson, 1 024, which then hands it to json): the client
    says it lost the broker, in one line."""
    monkeypatch.setattr(lazy, "_quick", quick)
    address = str(tmp_path / "peer.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address)
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                request_id = json.loads(line).get("id")
                deep = "[" * 1100 + "]" * 1100
                reply = f'{{"jsonrpc":"2.0","id":{json.dumps(request_id)},"result":{deep}}}\n'
                conn.sendall(reply.encode())

    peer = threading.Thread(target=answer, daemon=True)
    peer.start()
    try:
        with (
            pytest.raises(rbroker.BrokerUnavailable, match="nested too deeply"),
            rbroker.Client(address, timeout_s=5) as client,
        ):
            client.call("broker.status")
    finally:
        server.close()
