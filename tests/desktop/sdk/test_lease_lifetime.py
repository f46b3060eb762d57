"""How leases end (architecture.md §3): TTL expiry, heartbeats, explicit release, connection
close."""

from __future__ import annotations

import time
from typing import Any

import pytest

import rbroker
from tests.conftest import BrokerProcess, wait_until

PARAMS: dict[str, Any] = {
    "mib": 4096,
    "project": "tests",
    "session": "lifetime",
    "purpose": "lease lifetime",
}


def _ended(c: rbroker.Client, lease_id: str) -> dict[str, Any] | None:
    for lease in c.leases(include_ended=True)["ended"]:
        if lease["lease_id"] == lease_id:
            return dict(lease)
    return None


def test_unrenewed_lease_expires_after_its_ttl(broker: BrokerProcess) -> None:
    with broker.client() as holder, broker.client() as observer:
        lease = holder.call("lease.acquire", ttl_s=2, **PARAMS)["lease"]
        granted_at = time.monotonic()
        assert lease["ttl_s"] == 2
        assert 1.5 < lease["expires_in_s"] <= 2.0
        time.sleep(1.5)
        assert [x["lease_id"] for x in observer.leases()["leases"]] == [lease["lease_id"]]
        ended = wait_until(lambda: _ended(observer, lease["lease_id"]), timeout_s=5)
        expired_after = time.monotonic() - granted_at
        assert isinstance(ended, dict)
        assert ended["state"] == "expired"
        assert "2 s" in ended["ended_reason"]
        assert 1.9 <= expired_after < 3.0, expired_after
        assert observer.leases()["leases"] == []
        with pytest.raises(rbroker.LeaseExpired) as late:
            holder.call("lease.renew", lease_id=lease["lease_id"])
        assert late.value.data["state"] == "expired"


def test_renewal_extends_by_ttl(broker: BrokerProcess) -> None:
    with broker.client() as holder:
        lease = holder.call("lease.acquire", ttl_s=2, **PARAMS)["lease"]
        for _ in range(4):
            time.sleep(1.0)
            renewed = holder.call("lease.renew", lease_id=lease["lease_id"])["lease"]
            assert renewed["state"] == "active"
            assert 1.8 < renewed["expires_in_s"] <= 2.0


def test_sdk_heartbeat_keeps_a_short_lease_alive(broker: BrokerProcess) -> None:
    with (
        broker.client() as observer,
        rbroker.lease(ttl_s=2, socket=broker.socket, **PARAMS) as lease,  # type: ignore[arg-type]
    ):
        deadline = time.monotonic() + 6.0
        while time.monotonic() < deadline:
            active = observer.leases()["leases"]
            assert [x["lease_id"] for x in active] == [lease.lease_id]
            assert active[0]["expires_in_s"] > 0.5
            lease.check()
            time.sleep(0.25)
        assert not lease.lost
    with broker.client() as observer:
        ended = _ended(observer, lease.lease_id)
        assert ended is not None and ended["state"] == "released"
        assert ended["ended_reason"] == "released by holder"


def test_explicit_release_frees_capacity(broker: BrokerProcess) -> None:
    with broker.client() as c:
        before = c.gpus()[0]["available_mib"]
        lease = c.call("lease.acquire", **PARAMS)["lease"]
        assert c.gpus()[0]["available_mib"] == before - 4096
        released = c.call("lease.release", lease_id=lease["lease_id"])["lease"]
        assert released["state"] == "released"
        assert c.leases()["leases"] == []
        # The release rule (architecture.md §2): its 4 096 unconfirmed MiB stay booked until a
        # sample that began after the release, asked for at once (≤ 20 ms) by the release.
        wait_until(lambda: c.gpus()[0]["available_mib"] == before, timeout_s=2.0)
        with pytest.raises(rbroker.LeaseNotFound):
            c.call("lease.release", lease_id=lease["lease_id"])


def test_closing_the_connection_releases_its_leases(broker: BrokerProcess) -> None:
    with broker.client() as observer:
        holder = broker.client()
        first = holder.call("lease.acquire", **PARAMS)["lease"]
        second = holder.call("lease.acquire", **PARAMS)["lease"]
        other = observer.call("lease.acquire", **PARAMS)["lease"]
        holder.close()
        wait_until(
            lambda: [x["lease_id"] for x in observer.leases()["leases"]] == [other["lease_id"]]
        )
        for lease_id in (first["lease_id"], second["lease_id"]):
            ended = _ended(observer, lease_id)
            assert ended is not None and ended["state"] == "released"
            assert ended["ended_reason"] == "holder connection closed"


@pytest.mark.parametrize("stall_s", [1.0, 3.0], ids=["shorter-than-ttl", "longer-than-ttl"])
def test_a_broker_stall_does_not_lose_an_sdk_lease(broker: BrokerProcess, stall_s: float) -> None:
    """The broker's loop blocks (sim.stall) longer than the heartbeat interval (ttl/3), and
    even longer than the TTL: the lease survives (one TTL of grace after a stall)."""
    with rbroker.lease(ttl_s=2, socket=broker.socket, **PARAMS) as lease:  # type: ignore[arg-type]
        with broker.client(timeout_s=30) as c:
            assert c.call("sim.stall", seconds=stall_s) == {"stalled_s": stall_s}
        time.sleep(2.5)  # heartbeats resume after the stall
        lease.check()
        assert not lease.lost
        with broker.client() as c:
            assert [x["lease_id"] for x in c.leases()["leases"]] == [lease.lease_id]
    with broker.client() as c:
        ended = _ended(c, lease.lease_id)
        assert ended is not None and ended["state"] == "released"
        assert ended["ended_reason"] == "released by holder"
