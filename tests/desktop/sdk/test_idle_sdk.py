"""`rbroker.lease(..., on_idle=...)` (issue 42; docs/architecture.md §3 "Idle"), against a
broker process whose `[idle] idle_after_s` is half a second: a lease whose processes use no
GPU is told once (the `idle_notice` event on its own connection): the SDK logs it as a
warning and calls `on_idle` with the event's data."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import rbroker
from tests.conftest import SINGLE_24G, BrokerProcess

pytestmark = pytest.mark.contract  # it starts processes of its own


def test_an_idle_lease_is_told_once_through_on_idle_and_a_warning(
    broker_factory: Callable[..., BrokerProcess],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("[idle]\nidle_after_s = 0.5\n")
    bp = broker_factory(SINGLE_24G, extra_args=["--config", str(config)])
    told: list[dict[str, Any]] = []
    with (
        caplog.at_level("WARNING", logger="rbroker._lease"),
        rbroker.lease(1000, socket=bp.socket, ttl_s=1.0, on_idle=told.append) as lease,
    ):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not told:
            time.sleep(0.05)
        time.sleep(1.0)  # more heartbeats: still told once
    (data,) = told
    assert data["lease_id"] == lease.lease_id and data["notice"] == "idle"
    assert data["idle_s"] >= 0.5
    (record,) = [r for r in caplog.records if getattr(r, "rbroker_idle_notice", False)]
    assert record.getMessage() == f"rbroker: {data['message']}"
    assert f"lease {lease.lease_id} is idle" in record.getMessage()
