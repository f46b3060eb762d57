"""A client on the standard library's json (in a quick start, `rbroker.base.lazy.quick_start`:
what the short command-line clients use to start faster; issue 44) talks to a broker as one
on orjson does: the same answers, the same typed errors, a lease granted, renewed
(pipelined) and released."""

from __future__ import annotations

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
        assert (fast._encode, fast._decode) == (jsonrpc.encode, jsonrpc.decode)
    lazy.quick_start()
    with broker.client() as plain:
        assert (plain._encode, plain._decode) == (framing.encode, framing.decode)


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
