"""`broker.pause`: new admissions stop while paused, existing leases are untouched."""

from __future__ import annotations

import pytest

import rbroker
from tests.conftest import BrokerProcess


def test_pause_blocks_new_admissions_and_resume_admits(broker: BrokerProcess) -> None:
    with broker.client() as c:
        with rbroker.lease(
            1024, project="vision", session="s1", purpose="before pause", socket=broker.socket
        ) as held:
            assert c.call("broker.pause", paused=True) == {"paused": True}
            assert c.status()["paused"] is True
            with (
                pytest.raises(rbroker.CapacityUnavailable, match="paused"),
                rbroker.lease(
                    1024, project="vision", session="s2", purpose="paused", socket=broker.socket
                ),
            ):
                pass
            assert [x["lease_id"] for x in c.leases()["leases"]] == [held.lease_id]
            assert c.call("broker.pause", paused=False) == {"paused": False}
        with rbroker.lease(
            1024, project="vision", session="s3", purpose="after resume", socket=broker.socket
        ) as lease:
            assert lease.granted_mib == 1024
        assert c.status()["paused"] is False


def test_pause_needs_a_boolean(broker: BrokerProcess) -> None:
    with broker.client() as c, pytest.raises(rbroker.InvalidParams, match="paused"):
        c.call("broker.pause", paused="yes")
