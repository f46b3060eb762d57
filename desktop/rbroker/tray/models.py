"""Qt table models of the tray: leases, the queue, jobs and the fleet's computers.

Each model holds plain dicts as the local API (or the fleet source) gives them, typed by its
row type (`RecordTableModel[R]`: `rbroker_protocol.results`'s TypedDicts, and the fleet's
mirrors in `rbroker.tray.fleet`), has one column list, and is updated with `set_rows()`: when
the same records come back in the same order only the changed cells are announced
(`dataChanged`, so selections survive the live updates); otherwise the model is reset
(`beginResetModel`/`endResetModel`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt

from rbroker.base.display import fmt_mib, idle_words, short_uuid
from rbroker.tray.fleet import FleetComputer, FleetGpu, FleetJob, FleetLease, freshness_text
from rbroker.tray.plain import clean, tool_tip
from rbroker.tray.state import age_text
from rbroker.tray.wording import idle_tip
from rbroker_protocol.eta import eta_words
from rbroker_protocol.results import GpuView, JobView, ListedLease, QueuedRequest

GpuRow = GpuView | FleetGpu
"""A GPU as the tray shows it: the local broker's (`gpus.list`) or a fleet computer's."""
LeaseRow = ListedLease | FleetLease
"""A lease as `LeasesModel` shows it: the local broker's (`leases.list`) or a fleet
computer's."""
JobRow = JobView | FleetJob
"""A job as `JobsModel` shows it: the local broker's (`jobs.list`) or a fleet computer's."""

R = TypeVar("R", bound=Mapping[str, Any])
"""A model's row type."""
R_contra = TypeVar("R_contra", bound=Mapping[str, Any], contravariant=True)

ROW_ROLE = Qt.ItemDataRole.UserRole
"""The row's record (a dict)."""
SORT_ROLE = Qt.ItemDataRole.UserRole + 1
"""A value that sorts naturally (numbers as numbers)."""
PROGRESS_ROLE = Qt.ItemDataRole.UserRole + 2
"""For progress columns: (done, failed, total or None)."""
BADGE_ROLE = Qt.ItemDataRole.UserRole + 3
"""For badge columns: the state word that picks the badge colour."""

_LEFT = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
_RIGHT = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter

Index = QModelIndex | QPersistentModelIndex


@dataclass(frozen=True)
class Column(Generic[R_contra]):
    """One column: its header, how a record shows in it, and how it sorts."""

    header: str
    text: Callable[[R_contra], str]
    sort: Callable[[R_contra], Any] | None = None
    right: bool = False
    tooltip: Callable[[R_contra], str] | None = None


def _s(key: str) -> Callable[[Mapping[str, Any]], str]:
    """A column's text: the record's `key` as text (any record that may have it)."""
    return lambda r: str(r.get(key) or "")


def _mib(value: Any) -> str:
    return fmt_mib(int(value)) if isinstance(value, int | float) else "–"


def _right(
    header: str,
    text: Callable[[R], str],
    sort: Callable[[R], Any],
    tooltip: Callable[[R], str] | None = None,
) -> Column[R]:
    """A right-aligned (numeric) column that sorts by `sort`."""
    return Column(header, text, sort=sort, right=True, tooltip=tooltip)


REQUEST_COLUMNS: tuple[Column[Mapping[str, Any]], ...] = (
    Column("Owner", _s("owner")),
    Column("Project", _s("project")),
    Column("Session", _s("session")),
    Column("Purpose", _s("purpose")),
)
"""The columns a lease and a waiting request share, first in both tables: who asked, for what
(the description fields of `lease.acquire`)."""


def runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """Ascending `indices` as runs of consecutive ones, (first, last) inclusive:
    [1, 2, 3, 7, 9, 10] → [(1, 3), (7, 7), (9, 10)]."""
    out: list[tuple[int, int]] = []
    for i in indices:
        if out and out[-1][1] == i - 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def changed_box(
    old: Sequence[Sequence[object]], new: Sequence[Sequence[object]]
) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The smallest ((first row, first column), (last row, last column)) around every cell
    that differs between two tables of the same shape; None when none does."""
    rows = [i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b]
    if not rows:
        return None
    cols = [j for i in rows for j, (x, y) in enumerate(zip(old[i], new[i], strict=True)) if x != y]
    return (rows[0], min(cols)), (rows[-1], max(cols))


class RecordTableModel(QAbstractTableModel, Generic[R]):
    """A read-only table of records (dicts of type `R`) with a fixed column list."""

    columns: tuple[Column[R], ...] = ()

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self._rows: list[R] = []
        self._keys: list[Hashable] = []
        self._shown: list[list[tuple[object, ...]]] = []
        self.now = time.time()
        self.gpu_labels: dict[str, str] = {}

    # -- updates -----------------------------------------------------------------------------
    def key(self, row: R) -> Hashable:
        """What identifies a record across updates."""
        return id(row)

    def set_rows(self, rows: Sequence[R], now: float | None = None) -> None:
        """Replace the records; `now` (Unix seconds) is the time ages are measured against."""
        self.now = time.time() if now is None else now
        new = list(rows)
        keys = [self.key(r) for r in new]
        if keys == self._keys and new:
            old = self._rows
            self._rows = new
            last = len(self.columns) - 1
            if self._time_dependent:
                # every row's ages moved: one signal around the cells whose text, tool tip or
                # sort value changed (a view and its sorting proxy handle each signal on its
                # own; the columns that did not move are neither repainted nor sorted again)
                shown, self._shown = self._shown, [self._cells(r) for r in new]
                box = changed_box(shown, self._shown)
                if box is not None:
                    (r0, c0), (r1, c1) = box
                    self.dataChanged.emit(self.index(r0, c0), self.index(r1, c1))
                return
            # one signal per run of changed rows: a view handles each signal on its own
            # (issue 44: a signal per row of 50 leases was most of a shown tray's CPU)
            changed = [i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b]
            for first, end in runs(changed):
                self.dataChanged.emit(self.index(first, 0), self.index(end, last))
            return
        self.beginResetModel()
        self._rows = new
        self._keys = keys
        self._shown = [self._cells(r) for r in new] if self._time_dependent else []
        self.endResetModel()

    _time_dependent = False
    """True where a row's cells change with the clock (`now`): then what each cell shows is
    kept (`_shown`) to announce only the cells that changed."""

    def _cells(self, row: R) -> list[tuple[object, ...]]:
        """What a view reads of each of `row`'s cells: its text, tool tip and sort value."""
        return [
            (c.text(row), c.tooltip(row) if c.tooltip else None, c.sort(row) if c.sort else None)
            for c in self.columns
        ]

    def set_gpu_labels(self, labels: dict[str, str]) -> None:
        """Names to show for GPU UUIDs (e.g. `GPU 0`)."""
        if labels != self.gpu_labels:
            self.gpu_labels = dict(labels)
            if self._time_dependent:
                self._shown = [self._cells(r) for r in self._rows]
            if self._rows:
                self.dataChanged.emit(
                    self.index(0, 0), self.index(len(self._rows) - 1, len(self.columns) - 1)
                )

    def gpu_label(self, uuid: str | None) -> str:
        if not uuid:
            return "any"
        return self.gpu_labels.get(uuid) or short_uuid(uuid)

    def row(self, i: int) -> R:
        return self._rows[i]

    @property
    def rows(self) -> list[R]:
        return list(self._rows)

    # -- QAbstractTableModel --------------------------------------------------------------------
    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.columns)

    def headerData(
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> Any:
        if orientation == Qt.Orientation.Horizontal and 0 <= section < len(self.columns):
            if role == Qt.ItemDataRole.DisplayRole:
                return self.columns[section].header
            if role == Qt.ItemDataRole.TextAlignmentRole:
                return int(_RIGHT if self.columns[section].right else _LEFT)
        return None

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not (0 <= index.row() < len(self._rows)):
            return None
        if not (0 <= index.column() < len(self.columns)):
            return None
        record = self._rows[index.row()]
        col = self.columns[index.column()]
        if role == Qt.ItemDataRole.DisplayRole:
            return clean(col.text(record))
        if role == Qt.ItemDataRole.ToolTipRole:  # Qt reads tool tips as HTML when they look so
            return tool_tip(col.tooltip(record) if col.tooltip else col.text(record))
        if role == Qt.ItemDataRole.TextAlignmentRole:
            return int(_RIGHT if col.right else _LEFT)
        if role == ROW_ROLE:
            return record
        if role == SORT_ROLE:
            return col.sort(record) if col.sort else col.text(record)
        return self.extra_data(record, index.column(), role)

    def extra_data(self, record: R, column: int, role: int) -> Any:
        """Model-specific roles (progress, badges)."""
        return None


class RequestTableModel(RecordTableModel[R]):
    """A table of requests for GPU memory: `REQUEST_COLUMNS`, then the model's own
    (`own_columns()`); ages and expiries move with the clock."""

    OWNER, PROJECT, SESSION, PURPOSE = range(len(REQUEST_COLUMNS))
    _time_dependent = True

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.columns = (*REQUEST_COLUMNS, *self.own_columns())

    def own_columns(self) -> tuple[Column[R], ...]:
        """The columns after the shared ones."""
        return ()


class LeasesModel(RequestTableModel[LeaseRow]):
    """Active leases: owner, project, session, purpose, MiB, GPU, state, age, expires in."""

    MIB, GPU, STATE, AGE, EXPIRES = range(len(REQUEST_COLUMNS), len(REQUEST_COLUMNS) + 5)

    def own_columns(self) -> tuple[Column[LeaseRow], ...]:
        return (
            _right(
                "MiB",
                lambda r: _mib(r.get("granted_mib")),
                lambda r: int(r.get("granted_mib") or 0),
                tooltip=self._mib_tooltip,
            ),
            Column(
                "GPU",
                lambda r: (
                    ", ".join(self.gpu_label(u) for u in r.get("gpu_uuids") or [])
                    or self.gpu_label(r.get("gpu_uuid"))
                ),
                tooltip=lambda r: ", ".join(r.get("gpu_uuids") or [r.get("gpu_uuid") or ""]),
            ),
            Column("State", self._state_text, tooltip=self._state_tooltip),
            _right("Age", lambda r: age_text(self._age(r)), lambda r: self._age(r) or 0.0),
            _right(
                "Expires in",
                lambda r: age_text(r.get("expires_in_s")),
                lambda r: float(r.get("expires_in_s") or 0.0),
            ),
        )

    def key(self, row: LeaseRow) -> Hashable:
        return row.get("lease_id") or id(row)

    def _age(self, r: LeaseRow) -> float | None:
        granted = r.get("granted_at")
        return max(0.0, self.now - float(granted)) if granted else None

    @staticmethod
    def _state_text(r: LeaseRow) -> str:
        """`active`, or its idleness as `rbroker status` says it (`idle 2 h 10 min`,
        `idle: unknown`: `idle_words`), then `· over grant` where it uses more than granted."""
        idle = idle_words(r.get("idle_state"), r.get("idle_s"))
        state = idle or str(r.get("state", ""))
        return state + (" · over grant" if r.get("over_grant") else "")

    @classmethod
    def _state_tooltip(cls, r: LeaseRow) -> str:
        """The state, and for an idle lease or one whose idleness is unknown what that
        means (`idle_tip`)."""
        idle = idle_words(r.get("idle_state"), r.get("idle_s"))
        text = cls._state_text(r)
        return f"{text}\n{idle_tip(r.get('idle_state'))}" if idle else text

    @staticmethod
    def _mib_tooltip(r: LeaseRow) -> str:
        observed = r.get("observed_mib") or {}
        used = sum(int(v) for v in observed.values())
        return f"{_mib(r.get('granted_mib'))} MiB granted, {fmt_mib(used)} MiB in use now"


class QueueModel(RequestTableModel[QueuedRequest]):
    """Waiting requests with the reason (and the numbers) they wait."""

    MIB, GPU, WAITING, AHEAD, REASON = range(len(REQUEST_COLUMNS), len(REQUEST_COLUMNS) + 5)

    def own_columns(self) -> tuple[Column[QueuedRequest], ...]:
        return (
            _right(
                "MiB",
                self._mib_text,
                lambda r: int(r.get("mib") or 0) * int(r.get("gpus") or 1),
            ),
            Column("GPU", lambda r: self.gpu_label(r.get("gpu_uuid"))),
            _right(
                "Waiting",
                lambda r: age_text(r.get("waiting_s")),
                lambda r: float(r.get("waiting_s") or 0.0),
            ),
            _right("Ahead", lambda r: str(r.get("ahead", 0)), lambda r: int(r.get("ahead") or 0)),
            Column("Reason", self._reason, tooltip=lambda r: str(r.get("reason") or "")),
        )

    def key(self, row: QueuedRequest) -> Hashable:
        return row.get("request_id") or id(row)

    @staticmethod
    def _mib_text(r: QueuedRequest) -> str:
        gpus = int(r.get("gpus") or 1)
        text = _mib(r.get("mib"))
        return f"{gpus} × {text}" if gpus > 1 else text

    def _reason(self, r: QueuedRequest) -> str:
        """The estimate of when it will fit (the wording of every face:
        `rbroker_protocol.eta`), then why it waits, with the GPUs' names."""
        text = str(r.get("reason") or "").removeprefix("waiting: ")
        for uuid, label in self.gpu_labels.items():
            text = text.replace(short_uuid(uuid), label)
        eta = eta_words(r)
        return f"{eta} — {text}" if eta else text


class JobsModel(RecordTableModel[JobRow]):
    """Parallel jobs (docs/architecture.md §4) with their progress (drawn as bars by the
    view)."""

    PROJECT, PURPOSE, HANDLER, WORKERS, STATE, DONE, FAILED, PROGRESS = range(8)

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.columns = (
            Column("Project", _s("project")),
            Column("Purpose", _s("purpose")),
            Column("Handler", _s("handler")),
            Column(
                "Workers",
                lambda r: str(r.get("workers", "")),
                sort=lambda r: int(r.get("workers") or 0),
                right=True,
            ),
            Column("State", _s("state")),
            Column(
                "Done",
                self._done_text,
                sort=lambda r: int(r.get("completed_items") or 0),
                right=True,
            ),
            Column(
                "Failed",
                lambda r: fmt_mib(int(r.get("failed_items") or 0)),
                sort=lambda r: int(r.get("failed_items") or 0),
                right=True,
            ),
            Column("Progress", self._progress_text, sort=self._fraction, tooltip=self._done_text),
        )

    def key(self, row: JobRow) -> Hashable:
        return row.get("job_id") or id(row)

    @staticmethod
    def _fraction(r: JobRow) -> float:
        total = r.get("total_items")
        done = int(r.get("completed_items") or 0) + int(r.get("failed_items") or 0)
        return min(1.0, done / total) if total else 0.0

    @staticmethod
    def _done_text(r: JobRow) -> str:
        done = int(r.get("completed_items") or 0)
        total = r.get("total_items")
        return f"{fmt_mib(done)} / {fmt_mib(int(total))}" if total else fmt_mib(done)

    @classmethod
    def _progress_text(cls, r: JobRow) -> str:
        if not r.get("total_items"):
            return "total unknown"
        return f"{cls._fraction(r):.0%}"

    def extra_data(self, record: JobRow, column: int, role: int) -> Any:
        if role == PROGRESS_ROLE and column == self.PROGRESS:
            total = record.get("total_items")
            return (
                int(record.get("completed_items") or 0),
                int(record.get("failed_items") or 0),
                int(total) if total else None,
            )
        return None


def _fleet_available(r: FleetComputer) -> int:
    return sum(int(g.get("available_mib") or 0) for g in r.get("gpus") or [])


class FleetModel(RecordTableModel[FleetComputer]):
    """The group's computers with a freshness badge and what each is doing."""

    NAME, FRESHNESS, GPUS, LEASES, JOBS, AVAILABLE = range(6)
    _ORDER: ClassVar[dict[str, int]] = {"online": 0, "stale": 1, "offline": 2}

    def __init__(self, parent: Any = None) -> None:
        super().__init__(parent)
        self.columns = (
            Column("Computer", lambda r: str(r.get("name") or r.get("computer_id") or "")),
            Column(
                "Status",
                freshness_text,
                sort=lambda r: (
                    self._ORDER.get(r.get("freshness", "offline"), 3),
                    float(r.get("last_seen_age_s") or 0.0),
                ),
            ),
            Column(
                "GPUs",
                lambda r: str(len(r.get("gpus") or [])),
                sort=lambda r: len(r.get("gpus") or []),
                right=True,
                tooltip=lambda r: "\n".join(
                    f"GPU {g.get('index', '?')}: {g.get('name', '')}" for g in r.get("gpus") or []
                ),
            ),
            Column(
                "Leases",
                lambda r: str(len(r.get("leases") or [])),
                sort=lambda r: len(r.get("leases") or []),
                right=True,
            ),
            Column(
                "Jobs",
                lambda r: str(len(r.get("jobs") or [])),
                sort=lambda r: len(r.get("jobs") or []),
                right=True,
            ),
            Column(
                "Available MiB",
                lambda r: fmt_mib(_fleet_available(r)),
                sort=_fleet_available,
                right=True,
            ),
        )

    def key(self, row: FleetComputer) -> Hashable:
        return row.get("computer_id") or id(row)

    def extra_data(self, record: FleetComputer, column: int, role: int) -> Any:
        if role == BADGE_ROLE and column == self.FRESHNESS:
            return str(record.get("freshness") or "offline")
        return None
