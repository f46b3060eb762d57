"""The tray's table models, tested without a view (and with pytest-qt's model tester)."""

from __future__ import annotations

import copy
from typing import Any

from PySide6.QtCore import Qt
from pytestqt.modeltest import ModelTester
from pytestqt.qtbot import QtBot

from rbroker.demo.fleet import demo_fleet
from rbroker.tray.models import (
    BADGE_ROLE,
    PROGRESS_ROLE,
    ROW_ROLE,
    SORT_ROLE,
    FleetModel,
    JobsModel,
    LeasesModel,
    QueueModel,
    changed_box,
    runs,
)

GPU0 = "GPU-5a1e0000-0000-0000-0000-000000000001"
NOW = 1_800_000_000.0

LEASES: list[dict[str, Any]] = [
    {
        "lease_id": "lease-a",
        "owner": "maria",
        "project": "vision",
        "session": "run-42",
        "purpose": "fine-tune ViT-B",
        "granted_mib": 8192,
        "gpu_uuid": GPU0,
        "gpu_uuids": [GPU0],
        "state": "active",
        "granted_at": NOW - 125,
        "expires_in_s": 27.4,
        "observed_mib": {GPU0: 6000},
        "over_grant": False,
    },
    {
        "lease_id": "lease-b",
        "owner": "tom",
        "project": "nlp",
        "session": "embed",
        "purpose": "embed tickets",
        "granted_mib": 1024,
        "gpu_uuid": GPU0,
        "gpu_uuids": [GPU0],
        "state": "active",
        "granted_at": NOW - 5,
        "expires_in_s": 12.0,
        "observed_mib": {GPU0: 1500},
        "over_grant": True,
    },
]

QUEUE: list[dict[str, Any]] = [
    {
        "request_id": 7,
        "state": "queued",
        "mib": 20480,
        "gpus": 1,
        "gpu_uuid": None,
        "owner": "li",
        "project": "genai",
        "session": "sdxl",
        "purpose": "SDXL LoRA",
        "waiting_s": 95.2,
        "ahead": 0,
        "reason": "waiting: GPU-5a1e00…0001 has 7 211 MiB available (24 576 total − 1 229 "
        "headroom − 12 300 in use − 3 836 granted not yet allocated); 20 480 requested",
    },
    {
        "request_id": 8,
        "mib": 4096,
        "gpus": 2,
        "gpu_uuid": None,
        "owner": "li",
        "project": "genai",
        "session": "s2",
        "purpose": "two GPUs",
        "waiting_s": 3,
        "ahead": 1,
        "reason": "waiting: new admissions are paused",
    },
]

JOBS: list[dict[str, Any]] = [
    {
        "job_id": "job-1",
        "project": "nlp",
        "purpose": "embed corpus",
        "handler": "embed.encode_batch",
        "total_items": 100_000,
        "completed_items": 61_000,
        "failed_items": 1_000,
        "workers": 4,
        "state": "running",
    },
    {
        "job_id": "job-2",
        "project": "vision",
        "purpose": "caption",
        "handler": "caption.run",
        "total_items": None,
        "completed_items": 1_500,
        "failed_items": 0,
        "workers": 1,
        "state": "running",
    },
]


def cell(model: Any, row: int, col: int, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
    return model.data(model.index(row, col), role)


def test_models_pass_the_qt_model_tester(qtbot: QtBot, qtmodeltester: ModelTester) -> None:
    for model, rows in (
        (LeasesModel(), LEASES),
        (QueueModel(), QUEUE),
        (JobsModel(), JOBS),
        (FleetModel(), demo_fleet(NOW)),
    ):
        qtmodeltester.check(model)  # empty
        model.set_rows(rows, NOW)
        qtmodeltester.check(model)
        model.set_rows([*rows[1:], rows[0]], NOW)  # reordered: reset
        qtmodeltester.check(model)
        model.set_rows([], NOW)
        qtmodeltester.check(model)


def test_leases_model_shows_every_column_a_person_reads() -> None:
    model = LeasesModel()
    model.set_gpu_labels({GPU0: "GPU 0"})
    model.set_rows(LEASES, NOW)
    assert model.rowCount() == 2 and model.columnCount() == 9
    headers = [model.headerData(c, Qt.Orientation.Horizontal) for c in range(9)]
    assert headers == [
        "Owner",
        "Project",
        "Session",
        "Purpose",
        "MiB",
        "GPU",
        "State",
        "Age",
        "Expires in",
    ]
    assert [cell(model, 0, c) for c in range(9)] == [
        "maria",
        "vision",
        "run-42",
        "fine-tune ViT-B",
        "8 192",
        "GPU 0",
        "active",
        "2 min",
        "27 s",
    ]
    assert cell(model, 1, LeasesModel.STATE) == "active · over grant"
    assert cell(model, 0, LeasesModel.MIB, SORT_ROLE) == 8192
    assert cell(model, 0, LeasesModel.MIB, Qt.ItemDataRole.ToolTipRole) == (
        "8 192 MiB granted, 6 000 MiB in use now"
    )
    assert cell(model, 0, LeasesModel.GPU, Qt.ItemDataRole.ToolTipRole) == GPU0
    assert cell(model, 1, 0, ROW_ROLE)["lease_id"] == "lease-b"
    assert cell(model, 0, LeasesModel.MIB, Qt.ItemDataRole.TextAlignmentRole) & int(
        Qt.AlignmentFlag.AlignRight
    )
    assert model.data(model.index(5, 0)) is None


def test_same_records_announce_changed_cells_not_a_reset(qtbot: QtBot) -> None:
    model = LeasesModel()
    model.set_rows(LEASES, NOW)
    changed = copy.deepcopy(LEASES)
    changed[1]["expires_in_s"] = 29.0
    with (
        qtbot.assertNotEmitted(model.modelReset),
        qtbot.waitSignal(model.dataChanged) as blocker,
    ):
        model.set_rows(changed, NOW + 1)
    assert blocker.args is not None
    assert cell(model, 1, LeasesModel.EXPIRES) == "29 s"
    with qtbot.waitSignal(model.modelReset):
        model.set_rows(changed[:1], NOW + 2)
    assert model.rowCount() == 1


def test_runs_of_consecutive_rows() -> None:
    assert runs([]) == []
    assert runs([4]) == [(4, 4)]
    assert runs([1, 2, 3, 7, 9, 10]) == [(1, 3), (7, 7), (9, 10)]


def changes(model: Any) -> list[tuple[int, int, int, int]]:
    """The (first row, first column, last row, last column) of each `dataChanged` from now."""
    seen: list[tuple[int, int, int, int]] = []
    model.dataChanged.connect(
        lambda a, b, *_: seen.append((a.row(), a.column(), b.row(), b.column()))
    )
    return seen


def test_changed_rows_are_announced_in_runs_and_moved_ages_in_one_signal() -> None:
    jobs = JobsModel()
    rows = [{**JOBS[i % 2], "job_id": f"job-{i}"} for i in range(5)]
    jobs.set_rows(rows, NOW)
    seen = changes(jobs)
    jobs.set_rows(copy.deepcopy(rows), NOW + 5)  # the same records: nothing to repaint
    assert seen == []
    changed = copy.deepcopy(rows)
    for i in (0, 1, 3):
        changed[i]["completed_items"] = 99
    jobs.set_rows(changed, NOW + 10)
    last = jobs.columnCount() - 1
    assert seen == [(0, 0, 1, last), (3, 0, 3, last)]
    assert cell(jobs, 3, JobsModel.DONE) == cell(jobs, 1, JobsModel.DONE)

    leases = LeasesModel()  # its ages move with the clock: one signal around what moved
    leases.set_rows(LEASES, NOW)
    seen = changes(leases)
    leases.set_rows(copy.deepcopy(LEASES), NOW)
    assert seen == []
    leases.set_rows(copy.deepcopy(LEASES), NOW + 5)
    age, n = LeasesModel.AGE, len(LEASES)
    assert seen == [(0, age, n - 1, age)]
    renewed = copy.deepcopy(LEASES)
    renewed[-1]["expires_in_s"] = 3.0
    renewed[0]["observed_mib"] = {GPU0: 1}  # the MiB cell's tool tip
    seen.clear()
    leases.set_rows(renewed, NOW + 5)
    assert seen == [(0, LeasesModel.MIB, n - 1, LeasesModel.EXPIRES)]
    assert cell(leases, n - 1, LeasesModel.EXPIRES) == "3 s"
    seen.clear()
    leases.set_gpu_labels({GPU0: "GPU 7"})  # every cell, then the next change only
    assert seen == [(0, 0, n - 1, leases.columnCount() - 1)]
    seen.clear()
    leases.set_rows(renewed, NOW + 5)
    assert seen == []


def test_changed_box() -> None:
    assert changed_box([], []) is None
    assert changed_box([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 5, 6]]) is None
    assert changed_box([[1, 2, 3], [4, 5, 6]], [[1, 0, 3], [4, 5, 6]]) == ((0, 1), (0, 1))
    assert changed_box([[1, 2, 3], [4, 5, 6]], [[1, 2, 0], [0, 5, 6]]) == ((0, 0), (1, 2))


def test_queue_model_shows_the_reason_with_gpu_names() -> None:
    model = QueueModel()
    model.set_gpu_labels({GPU0: "GPU 0"})
    model.set_rows(QUEUE, NOW)
    reason = cell(model, 0, QueueModel.REASON)
    assert reason.startswith("GPU 0 has 7 211 MiB available (24 576 total")
    assert cell(model, 0, QueueModel.REASON, Qt.ItemDataRole.ToolTipRole) == QUEUE[0]["reason"]
    assert cell(model, 0, QueueModel.GPU) == "any"
    assert cell(model, 0, QueueModel.WAITING) == "1 min"
    assert cell(model, 1, QueueModel.MIB) == "2 × 4 096"
    assert cell(model, 1, QueueModel.AHEAD) == "1"
    assert cell(model, 1, QueueModel.REASON) == "new admissions are paused"


def test_queue_model_says_when_it_will_likely_fit_before_the_reason() -> None:
    model = QueueModel()
    model.set_gpu_labels({GPU0: "GPU 0"})
    rows = [
        {**QUEUE[0], "eta_s": 420.0, "eta_reason": "1 lease of vision likely ends by then"},
        {**QUEUE[1], "eta_s": None, "eta_reason": "the leases ahead have no history"},
    ]
    model.set_rows(rows, NOW)
    assert cell(model, 0, QueueModel.REASON).startswith(
        "likely in ~7 min (because 1 lease of vision likely ends by then) — GPU 0 has 7 211 MiB"
    )
    assert cell(model, 1, QueueModel.REASON) == (
        "no estimate yet (the leases ahead have no history) — new admissions are paused"
    )


def test_jobs_model_gives_progress_for_the_bar() -> None:
    model = JobsModel()
    model.set_rows(JOBS, NOW)
    assert cell(model, 0, JobsModel.PROGRESS) == "62%"
    assert cell(model, 0, JobsModel.PROGRESS, PROGRESS_ROLE) == (61_000, 1_000, 100_000)
    assert cell(model, 0, JobsModel.DONE) == "61 000 / 100 000"
    assert cell(model, 0, JobsModel.FAILED) == "1 000"
    assert cell(model, 1, JobsModel.PROGRESS) == "total unknown"
    assert cell(model, 1, JobsModel.PROGRESS, PROGRESS_ROLE) == (1_500, 0, None)
    assert cell(model, 0, JobsModel.STATE, PROGRESS_ROLE) is None


def test_fleet_model_freshness_badges_and_totals() -> None:
    model = FleetModel()
    model.set_rows(demo_fleet(NOW), NOW)
    names = [cell(model, r, FleetModel.NAME) for r in range(model.rowCount())]
    assert names == ["lab-ws-01", "render-02", "gpu-box-03", "laptop-anna"]
    status = [cell(model, r, FleetModel.FRESHNESS) for r in range(4)]
    assert status == [
        "online",
        "online",
        "stale · last known 7 min ago",
        "offline · last seen 3 h 10 min ago",
    ]
    assert [cell(model, r, FleetModel.FRESHNESS, BADGE_ROLE) for r in range(4)] == [
        "online",
        "online",
        "stale",
        "offline",
    ]
    assert cell(model, 2, FleetModel.GPUS) == "4"
    assert cell(model, 0, FleetModel.LEASES) == "2"
    assert cell(model, 0, FleetModel.JOBS) == "2"
    assert cell(model, 1, FleetModel.AVAILABLE) == "83"
    assert cell(model, 3, FleetModel.FRESHNESS, SORT_ROLE) > cell(
        model, 2, FleetModel.FRESHNESS, SORT_ROLE
    )
