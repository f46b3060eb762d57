"""Pipelined requests (`Client.call_nowait`, issue 31): the SDK's renewals are not waited for,
and a refused one still reaches its holder: passed to `on_failed` as soon as it is read, and
raised by the next call.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import rbroker
from tests.conftest import BrokerProcess, wait_until

PARAMS: dict[str, Any] = {"mib": 1024, "project": "tests", "session": "pipelined", "purpose": "t"}


def test_a_pipelined_renewal_renews_and_the_next_call_gets_its_own_answer(
    broker: BrokerProcess,
) -> None:
    with broker.client() as c:
        failed: list[tuple[str, Exception]] = []
        c.on_failed = lambda method, exc: failed.append((method, exc))
        lease = c.call("lease.acquire", ttl_s=30, **PARAMS)["lease"]
        time.sleep(0.2)
        c.call_nowait("lease.renew", lease_id=lease["lease_id"])
        released = c.call("lease.release", lease_id=lease["lease_id"])["lease"]
        assert released["lease_id"] == lease["lease_id"] and released["state"] == "released"
        assert failed == []


def test_a_refused_pipelined_renewal_is_raised_by_the_next_call(broker: BrokerProcess) -> None:
    with broker.client() as c:
        failed: list[tuple[str, Exception]] = []
        c.on_failed = lambda method, exc: failed.append((method, exc))
        c.call_nowait("lease.renew", lease_id="lease-000000000000")
        with pytest.raises(rbroker.LeaseNotFound):
            c.call("broker.status")
        assert [m for m, _ in failed] == ["lease.renew"]
        assert isinstance(failed[0][1], rbroker.LeaseNotFound)
        assert c.call("broker.status")["version"]  # raised once; the connection goes on


def test_a_refused_pipelined_renewal_ends_a_wait_on_the_connection(broker: BrokerProcess) -> None:
    """The SDK's heartbeat thread waits on the connection between renewals: a refusal read
    there is reported at once (the holder marks its lease lost)."""
    with broker.client() as c:
        failed: list[str] = []
        c.on_failed = lambda method, exc: failed.append(method)
        c.call_nowait("lease.renew", lease_id="lease-000000000000")
        started = time.monotonic()
        assert c.wait_until_closed(10.0) is False  # not closed: a failure to look at
        assert time.monotonic() - started < 5.0
        assert failed == ["lease.renew"]


def test_an_sdk_lease_ended_elsewhere_is_lost(broker: BrokerProcess) -> None:
    """Another connection of the same process ends the lease: its holder learns that it is
    lost, by the `lease_ended` event or by its next renewal's refusal, whichever it reads
    first (its renewals are pipelined every ttl/3)."""
    with rbroker.lease(1024, ttl_s=1.0, socket=broker.socket, project="tests") as lease:
        with broker.client() as admin:
            ended = admin.call("lease.release", lease_id=lease.lease_id)["lease"]
            assert ended["state"] == "released"
        wait_until(lambda: lease.lost, timeout_s=5)
        assert isinstance(lease.error, rbroker.RBrokerError)
