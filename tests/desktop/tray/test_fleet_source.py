"""The Fleet tab's sources: the coordinator's fleet view adapted, and what an unenrolled or
unreachable computer gets (no network needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rbroker.tray.fleet import (
    FleetSource,
    FleetUnavailable,
    NotEnrolled,
    StaticFleet,
    UplinkFleet,
    freshness_text,
)
from rbroker.uplink.fleet import computers_from_fleet_view

FLEET_VIEW: dict[str, Any] = {
    "group": "vision-lab",
    "generated_at": "2026-11-30T09:00:00Z",
    "stale_after_s": 15.0,
    "offline_after_s": 600.0,
    "computers": [
        {
            "id": "c-1",
            "name": "lab-ws-01",
            "reported_name": "lab-ws-01",
            "freshness": {"state": "online", "age_s": 2.5, "text": "online"},
            "gpus": [{"uuid": "GPU-1", "index": 0, "total_mib": 24576, "state": "busy"}],
            "leases": [{"lease_id": "l-1", "gpu_uuids": ["GPU-1"], "granted_mib": 8192}],
            "queue": [],
            "jobs": [{"job_id": "j-1", "total_items": 10, "completed_items": 5}],
        },
        {
            "id": "c-2",
            "name": "",
            "reported_name": "render-02",
            "freshness": {"state": "stale", "age_s": 420.0, "text": "last known, 7 min ago"},
            "gpus": [],
            "leases": [],
            "queue": [],
            "jobs": [],
        },
        {
            "id": "c-3",
            "name": "never",
            "freshness": {"state": "offline", "age_s": None, "text": "never reported"},
        },
    ],
}


def test_fleet_view_becomes_computer_dicts() -> None:
    computers = computers_from_fleet_view(FLEET_VIEW)
    assert [c["computer_id"] for c in computers] == ["c-1", "c-2", "c-3"]
    first = computers[0]
    assert first["name"] == "lab-ws-01"
    assert first["freshness"] == "online" and first["last_seen_age_s"] == 2.5
    assert first["gpus"][0]["total_mib"] == 24576
    assert first["leases"][0]["granted_mib"] == 8192
    assert first["jobs"][0]["completed_items"] == 5
    assert computers[1]["name"] == "render-02"
    assert freshness_text(computers[1]) == "stale · last known 7 min ago"
    assert computers[2]["gpus"] == [] and freshness_text(computers[2]) == "offline"


def test_sources_follow_the_protocol() -> None:
    for source in (NotEnrolled(), StaticFleet([]), UplinkFleet(Path("/nonexistent"))):
        assert isinstance(source, FleetSource)
    assert not NotEnrolled().enrolled() and NotEnrolled().computers() == []
    assert StaticFleet(lambda: [{"computer_id": "x"}]).computers() == [{"computer_id": "x"}]


def test_uplink_fleet_not_enrolled(tmp_path: Path) -> None:
    assert not UplinkFleet(tmp_path).enrolled()


def test_uplink_fleet_enrolled_without_its_key_says_why(tmp_path: Path) -> None:
    (tmp_path / "uplink.json").write_text(
        json.dumps(
            {
                "url": "https://coordinator.invalid",
                "computer_id": "c-1",
                "group": "g",
                "name": "lab-ws-01",
                "key_backend": "file",
            }
        )
    )
    source = UplinkFleet(tmp_path, timeout_s=2)
    assert source.enrolled()
    with pytest.raises(FleetUnavailable, match="private key is missing"):
        source.computers()


def test_uplink_fleet_with_a_broken_config(tmp_path: Path) -> None:
    (tmp_path / "uplink.json").write_text("{not json")
    source = UplinkFleet(tmp_path)
    assert source.enrolled()
    with pytest.raises(FleetUnavailable, match="unreadable"):
        source.computers()
