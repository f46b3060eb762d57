"""`rbroker.lease(..., on_idle=...)` and `rbroker.alease(..., on_idle=...)` (issue 42;
docs/architecture.md §3 "Idle"), against a broker process whose `[idle] idle_after_s` is half
a second: a lease whose processes use no GPU is told once (the `idle_notice` event on its own
connection): the SDK logs it as a warning and calls `on_idle` with the event's data (for
`alease`, on the event loop: a function called there, an async function run as a task)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from threading import get_ident
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


def _idle_broker(broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> BrokerProcess:
    config = tmp_path / "broker.toml"
    config.write_text("[idle]\nidle_after_s = 0.5\n")
    return broker_factory(SINGLE_24G, extra_args=["--config", str(config)])


def test_alease_calls_a_function_on_idle_on_the_event_loop(
    broker_factory: Callable[..., BrokerProcess],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`rbroker.alease(..., on_idle=f)`: `f` gets the same data, once, on the loop's thread."""
    bp = _idle_broker(broker_factory, tmp_path)
    told: list[tuple[dict[str, Any], int]] = []

    async def main() -> tuple[str, int]:
        async with rbroker.alease(
            1000, socket=bp.socket, ttl_s=1.0, on_idle=lambda d: told.append((d, get_ident()))
        ) as lease:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not told:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # more heartbeats: still told once
        return lease.lease_id, get_ident()

    with caplog.at_level("WARNING", logger="rbroker._lease"):
        lease_id, loop_thread = asyncio.run(main())
    ((data, thread),) = told
    assert thread == loop_thread
    assert data["lease_id"] == lease_id and data["notice"] == "idle"
    assert data["idle_s"] >= 0.5
    (record,) = [r for r in caplog.records if getattr(r, "rbroker_idle_notice", False)]
    assert record.getMessage() == f"rbroker: {data['message']}"


def test_alease_runs_an_async_on_idle_as_a_task_and_logs_its_failure(
    broker_factory: Callable[..., BrokerProcess],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An async `on_idle` runs on the loop; an exception it raises is logged, and the lease
    is held on as if nothing had happened."""
    bp = _idle_broker(broker_factory, tmp_path)
    told: list[dict[str, Any]] = []

    async def on_idle(data: dict[str, Any]) -> None:
        await asyncio.sleep(0)
        told.append(data)
        raise RuntimeError("the caller's handler failed")

    async def main() -> str:
        async with rbroker.alease(1000, socket=bp.socket, ttl_s=1.0, on_idle=on_idle) as lease:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not told:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            lease.check()  # still held
        return lease.lease_id

    with caplog.at_level("WARNING", logger="rbroker._lease"):
        lease_id = asyncio.run(main())
    (data,) = told
    assert data["lease_id"] == lease_id and data["notice"] == "idle"
    (failed,) = [r for r in caplog.records if r.getMessage() == "on_idle callback failed"]
    assert failed.exc_info is not None and "handler failed" in str(failed.exc_info[1])
