"""The broker the tray runs in-process, and the reads the tray makes of any broker."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

import rbroker
from rbroker.demo.processes import broker_address
from rbroker.hosting.embedded import EmbeddedBroker
from rbroker.hosting.host import make_config
from rbroker.transport.base import BrokerAlreadyRunning
from rbroker.tray.link import read_snapshot
from tests.conftest import SINGLE_24G, BrokerProcess, short_tmp


def test_embedded_broker_serves_leases_and_stops_cleanly() -> None:
    root = short_tmp()
    scenario = root / "s.toml"
    scenario.write_text(SINGLE_24G)
    sock = broker_address(root, "b")  # a Unix socket in root, or a named pipe on Windows
    eb = EmbeddedBroker(make_config(sock, root / "data", True, scenario, 2048))
    eb.start()
    try:
        assert eb.wait_ready(20), eb.error
        assert eb.running and eb.simulated
        with rbroker.lease(1024, project="p", session="s", purpose="x", socket=sock) as lease:
            assert lease.granted_mib == 1024
        with rbroker.Client(sock) as c:
            assert c.gpus()[0]["headroom_mib"] == 2048
    finally:
        eb.stop()
    assert not eb.running
    if sys.platform != "win32":  # a pipe leaves no file behind
        assert not os.path.exists(sock)
    with pytest.raises(rbroker.BrokerUnavailable):
        rbroker.Client(sock)


def test_embedded_broker_reports_a_broker_already_running(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    failures: list[BaseException] = []
    eb = EmbeddedBroker(
        make_config(broker.socket, tmp_path, True, broker.scenario, None),
        on_failed=failures.append,
    )
    eb.start()
    assert not eb.wait_ready(20)
    assert isinstance(eb.error, BrokerAlreadyRunning)
    assert failures == [eb.error]
    eb.stop()
    with broker.client() as c:  # the running broker is left alone
        assert c.gpus()


def test_read_snapshot_from_a_real_broker(broker: BrokerProcess) -> None:
    with broker.client() as c:
        snap = read_snapshot(c)
    assert [g["uuid"] for g in snap.gpus] == ["GPU-5a1e0000-0000-0000-0000-000000000001"]
    assert snap.leases == [] and snap.queue == []
    assert snap.bookings is not None and snap.bookings["bookings"] == []
    assert snap.simulated and not snap.paused


class _OldBroker:
    """A client of a broker without `jobs.list` and `bookings.list`."""

    def __init__(self) -> None:
        self.jobs_calls = 0
        self.bookings_calls = 0

    def gpus(self) -> list[dict[str, Any]]:
        return []

    def leases(self) -> dict[str, Any]:
        return {"leases": [], "queue": []}

    def status(self) -> dict[str, Any]:
        return {}

    def jobs(self) -> list[dict[str, Any]]:
        self.jobs_calls += 1
        raise rbroker.InvalidParams("unknown method 'jobs.list'", "method_not_found")

    def bookings(self) -> dict[str, Any]:
        self.bookings_calls += 1
        raise rbroker.InvalidParams("unknown method 'bookings.list'", "method_not_found")


def test_a_broker_without_jobs_list_gives_no_jobs_and_is_not_asked_again() -> None:
    old = _OldBroker()
    missing: set[str] = set()
    snap = read_snapshot(old, missing)  # type: ignore[arg-type]
    assert snap.jobs is None and snap.bookings is None
    assert missing == {"jobs.list", "bookings.list"}
    read_snapshot(old, missing)  # type: ignore[arg-type]
    assert old.jobs_calls == 1 and old.bookings_calls == 1


def test_other_invalid_params_errors_are_not_swallowed() -> None:
    class Broken(_OldBroker):
        def jobs(self) -> list[dict[str, Any]]:
            raise rbroker.InvalidParams("bad", "invalid_params")

    with pytest.raises(rbroker.InvalidParams):
        read_snapshot(Broken())  # type: ignore[arg-type]
