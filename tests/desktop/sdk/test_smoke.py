"""Smoke test: a real broker process grants and releases a lease over its socket."""

from __future__ import annotations

import rbroker
from tests.conftest import GPU0, BrokerProcess


def test_lease_round_trip(broker: BrokerProcess) -> None:
    with rbroker.lease(
        8192, project="vision", session="run-1", purpose="fine-tune ViT-B", socket=broker.socket
    ) as lease:
        assert lease.gpu_uuid == GPU0
        assert lease.granted_mib == 8192
        with broker.client() as c:
            active = c.leases()["leases"]
            assert [item["lease_id"] for item in active] == [lease.lease_id]
    with broker.client() as c:
        assert c.leases()["leases"] == []
