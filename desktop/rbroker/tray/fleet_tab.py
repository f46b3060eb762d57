"""The Fleet tab and its feed: the group's computers as a `FleetSource` reports them, read
on a worker thread so the window never waits on the network.
"""

from __future__ import annotations

import threading
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QSplitter,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from rbroker.tray.fleet import FleetComputer, FleetSource, FleetUnavailable, freshness_text
from rbroker.tray.models import FleetModel, JobsModel, LeasesModel
from rbroker.tray.panels import GpuList, gpu_labels, make_table, titled
from rbroker.tray.plain import PlainLabel
from rbroker.tray.widgets import Badge, BadgeDelegate, ProgressDelegate


class FleetTab(QWidget):
    """The group's computers (freshness badges) and, for the selected one, its GPUs, leases
    and jobs. Shows a "not enrolled" page until this computer joins a group."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.stack = QStackedWidget()
        outer = QVBoxLayout(self)
        outer.setContentsMargins(10, 10, 10, 10)
        outer.addWidget(self.stack)

        self.empty_page = QLabel(
            "<h3>This computer is not enrolled in a group</h3>"
            "<p>Enroll it to see what the group's other computers are doing: their GPUs, "
            "leases and jobs, with how fresh each report is.</p>"
            "<p>Get an enrollment code from your coordinator's admin, then use "
            "<b>Settings → Coordinator</b>, or run<br><code>rbroker enroll URL CODE</code>.</p>"
        )
        self.empty_page.setWordWrap(True)
        self.empty_page.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_page.setTextFormat(Qt.TextFormat.RichText)
        self.stack.addWidget(self.empty_page)

        page = QWidget()
        pl = QVBoxLayout(page)
        pl.setContentsMargins(0, 0, 0, 0)
        self.status_line = PlainLabel()
        self.status_line.setWordWrap(True)
        pl.addWidget(self.status_line)
        vsplit = QSplitter(Qt.Orientation.Vertical)
        vsplit.setChildrenCollapsible(False)
        self.computers = FleetModel(self)
        self.computers_view = make_table(self.computers, stretch=FleetModel.AVAILABLE)
        self.computers_view.setItemDelegateForColumn(FleetModel.FRESHNESS, BadgeDelegate(self))
        self.computers_view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.computers_view.selectionModel().currentRowChanged.connect(self._show_selected)
        box, _ = titled("Computers", self.computers_view, "")
        vsplit.addWidget(box)

        detail = QWidget()
        dl = QVBoxLayout(detail)
        dl.setContentsMargins(0, 4, 0, 0)
        head = QHBoxLayout()
        self.detail_title = PlainLabel()
        font = self.detail_title.font()
        font.setPointSizeF(font.pointSizeF() * 1.2)
        font.setBold(True)
        self.detail_title.setFont(font)
        self.detail_fresh = Badge()
        head.addWidget(self.detail_title)
        head.addWidget(self.detail_fresh)
        head.addStretch(1)
        dl.addLayout(head)
        self.gpu_list = GpuList(columns=2)
        gpus_holder = QWidget()
        gl = QVBoxLayout(gpus_holder)
        gl.setContentsMargins(0, 0, 0, 0)
        gl.addWidget(self.gpu_list)
        gl.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(gpus_holder)
        scroll.setMinimumHeight(130)
        self.gpu_scroll = scroll
        dl.addWidget(scroll, 3)
        self.leases = LeasesModel(self)
        self.jobs = JobsModel(self)
        self.leases_view = make_table(self.leases, stretch=LeasesModel.PURPOSE)
        self.jobs_view = make_table(self.jobs, stretch=JobsModel.PROGRESS)
        self.jobs_view.setItemDelegateForColumn(JobsModel.PROGRESS, ProgressDelegate(self))
        self.leases_box, self.leases_empty = titled("Leases", self.leases_view, "No leases.")
        self.jobs_box, self.jobs_empty = titled("Jobs", self.jobs_view, "No jobs.")
        tables = QSplitter(Qt.Orientation.Vertical)
        tables.setChildrenCollapsible(False)
        tables.addWidget(self.leases_box)
        tables.addWidget(self.jobs_box)
        tables.setStretchFactor(0, 1)
        tables.setStretchFactor(1, 1)
        tables.setSizes([300, 300])
        dl.addWidget(tables, 5)
        vsplit.addWidget(detail)
        vsplit.setStretchFactor(0, 1)
        vsplit.setStretchFactor(1, 3)
        vsplit.setSizes([170, 640])
        pl.addWidget(vsplit, 1)
        self.stack.addWidget(page)
        self._selected: str | None = None

    def set_not_enrolled(self) -> None:
        self.stack.setCurrentIndex(0)

    def set_computers(self, computers: list[FleetComputer]) -> None:
        self.stack.setCurrentIndex(1)
        online = sum(1 for c in computers if c.get("freshness") == "online")
        self.status_line.setText(
            f"{len(computers)} computers in the group, {online} online. Values of stale and "
            "offline computers are the last ones they reported."
        )
        self.status_line.setStyleSheet("")
        self.computers.set_rows(computers)
        ids = [c.get("computer_id") for c in computers]
        if self._selected not in ids and computers:
            self.computers_view.selectRow(0)
        self._show_selected()

    def set_error(self, message: str) -> None:
        self.stack.setCurrentIndex(1)
        self.status_line.setText(f"Cannot read the fleet now: {message}. Showing the last read.")
        self.status_line.setStyleSheet("color: #8c1d18;")

    def _show_selected(self, *_: Any) -> None:
        index = self.computers_view.currentIndex()
        proxy = self.computers_view.model()
        if not index.isValid():
            return
        row = proxy.mapToSource(index).row()  # type: ignore[attr-defined]
        c = self.computers.row(row)
        self._selected = c.get("computer_id")
        self.detail_title.setText(str(c.get("name") or c.get("computer_id")))
        self.detail_fresh.set_state(str(c.get("freshness") or "offline"), freshness_text(c))
        gpus = list(c.get("gpus") or [])
        self.gpu_list.set_gpus(gpus)
        self.gpu_scroll.setMaximumHeight(max(130, self.gpu_list.sizeHint().height() + 4))
        self.leases.set_gpu_labels(gpu_labels(gpus))
        leases = list(c.get("leases") or [])
        jobs = list(c.get("jobs") or [])
        self.leases.set_rows(leases)
        self.jobs.set_rows(jobs)
        self.leases_box.setTitle(f"Leases ({len(leases)})")
        self.jobs_box.setTitle(f"Jobs ({len(jobs)})")
        self.leases_empty.setVisible(not leases)
        self.leases_view.setVisible(bool(leases))
        self.jobs_empty.setVisible(not jobs)
        self.jobs_view.setVisible(bool(jobs))


class FleetFeed(QObject):
    """Reads a `FleetSource` on a worker thread; results come back as signals."""

    computers = Signal(list)
    failed = Signal(str)
    not_enrolled = Signal()

    def __init__(self, source: FleetSource, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.source = source
        self._busy = threading.Lock()
        self._again = False
        self._threads: list[threading.Thread] = []

    def refresh(self) -> None:
        """Read the source now (once more after the read in progress, if any)."""
        if not self._busy.acquire(blocking=False):
            self._again = True
            return
        self._again = False

        def run() -> None:
            try:
                if not self.source.enrolled():
                    self.not_enrolled.emit()
                    return
                self.computers.emit(self.source.computers())
            except FleetUnavailable as exc:
                self.failed.emit(str(exc))
            except Exception as exc:  # a broken source never takes the tray down
                self.failed.emit(f"{type(exc).__name__}: {exc}")
            finally:
                self._busy.release()
                if self._again:
                    self.refresh()

        t = threading.Thread(target=run, name="rbroker-tray-fleet", daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def join(self, timeout_s: float = 5.0) -> None:
        for t in self._threads:
            t.join(timeout_s)
