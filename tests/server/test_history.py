"""Report history: one point per computer per step, pruned after the window, served."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta

import sqlalchemy as sa

from rbroker_server.db import maintenance
from rbroker_server.db.engine import utcnow
from tests.server.conftest import Coordinator, wait_until_true


def _count(c: Coordinator) -> int:
    with c.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM history_points")).scalar_one())


def test_history_is_downsampled_served_and_pruned(
    coordinator_factory: Callable[..., Coordinator],
) -> None:
    c = coordinator_factory(history_step_s=0.4, history_window_s=1.5, prune_interval_s=0.2)
    c.group("vision")
    pc = c.enroll("vision")
    sent = 0
    start = time.monotonic()
    while time.monotonic() - start < 1.2 or sent < 8:
        assert pc.report().json()["applied"]
        sent += 1
        time.sleep(0.05)
    elapsed = time.monotonic() - start
    r = c.http.get(f"/api/v1/computers/{pc.id}/history", headers=c.viewer("vision"))
    assert r.status_code == 200
    body = r.json()
    points = body["points"]
    assert body["step_s"] == 0.4 and body["window_s"] == 1.5
    # Downsampled: at most one point per step, far fewer than reports.
    assert 2 <= len(points) <= elapsed / 0.4 + 2
    assert len(points) < sent
    ats = [datetime.fromisoformat(p["at"]) for p in points]
    assert ats == sorted(ats) and len(set(ats)) == len(ats)
    assert points[0]["gpus"][0]["total_mib"] == 24576
    assert points[0]["leases"] == 0
    # The background task prunes everything once the window has passed.
    wait_until_true(lambda: _count(c) == 0, timeout_s=5)
    r = c.http.get(f"/api/v1/computers/{pc.id}/history", headers=c.viewer("vision"))
    assert r.json()["points"] == []


def test_prune_keeps_the_window(coordinator: Coordinator) -> None:
    coordinator.group("vision")
    pc = coordinator.enroll("vision")
    assert pc.report().json()["applied"]
    assert _count(coordinator) == 1
    window = coordinator.settings.history_window_s
    now = utcnow()
    assert maintenance.prune(coordinator.engine, coordinator.settings, now).history_points == 0
    later = now + timedelta(seconds=window + 120)
    assert maintenance.prune(coordinator.engine, coordinator.settings, later).history_points == 1
    assert _count(coordinator) == 0
