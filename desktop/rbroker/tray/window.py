"""The main window: This computer (GPUs, leases, queue, jobs), Fleet, Settings.

The window only displays what it is given (`apply_snapshot`, `set_broker_down`,
`set_fleet`) and reports what the user asks for through signals; it never calls the broker
or the network itself, so it never blocks on them.
"""

from __future__ import annotations

import threading
from typing import Any

from PySide6.QtCore import QObject, QSortFilterProxyModel, Qt, Signal
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QFormLayout,
    QFrame,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMainWindow,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QStackedWidget,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from rbroker.tray.fleet import FleetSource, FleetUnavailable, freshness_text
from rbroker.tray.icons import app_icon
from rbroker.tray.models import (
    SORT_ROLE,
    FleetModel,
    JobsModel,
    LeasesModel,
    QueueModel,
    RecordTableModel,
)
from rbroker.tray.settings import TraySettings
from rbroker.tray.state import STATE_TEXT, Snapshot, TrayState, age_text, derive_state
from rbroker.tray.widgets import Badge, BadgeDelegate, GpuCard, ProgressDelegate

BANNER_STYLES = {
    "error": "background: #fde7e4; color: #8c1d18; border: 1px solid #f2b8b1;",
    "warn": "background: #fff4d6; color: #6b4e00; border: 1px solid #f0d68a;",
    "info": "background: #e7f0fd; color: #1b3f7a; border: 1px solid #b8cff5;",
}


def make_table(model: RecordTableModel, stretch: int | None = None) -> QTableView:
    """A read-only, sortable table of `model` (sorting by `SORT_ROLE`)."""
    proxy = QSortFilterProxyModel(model)
    proxy.setSourceModel(model)
    proxy.setSortRole(SORT_ROLE)
    view = QTableView()
    view.setModel(proxy)
    view.setSortingEnabled(True)
    view.sortByColumn(-1, Qt.SortOrder.AscendingOrder)
    view.setAlternatingRowColors(True)
    view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    view.setWordWrap(False)
    view.verticalHeader().hide()
    view.verticalHeader().setDefaultSectionSize(26)
    header = view.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    header.setStretchLastSection(stretch is None)
    if stretch is not None:
        header.setSectionResizeMode(stretch, QHeaderView.ResizeMode.Stretch)
    view.setTextElideMode(Qt.TextElideMode.ElideMiddle)
    return view


def titled(title: str, widget: QWidget, empty_text: str) -> tuple[QGroupBox, QLabel]:
    """A group box holding `widget` and an "empty" line shown when it has no rows."""
    box = QGroupBox(title)
    layout = QVBoxLayout(box)
    layout.setContentsMargins(8, 6, 8, 8)
    empty = QLabel(empty_text)
    empty.setStyleSheet("color: palette(mid); padding: 4px;")
    empty.setWordWrap(True)
    empty.setVisible(bool(empty_text))
    layout.addWidget(empty)
    layout.addWidget(widget)
    return box, empty


class GpuList(QWidget):
    """`GpuCard`s in `columns` columns, rebuilt only when the set of GPUs changes."""

    def __init__(self, columns: int = 1, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.columns = columns
        self.grid = QGridLayout(self)
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.grid.setSpacing(8)
        self.cards: dict[str, GpuCard] = {}
        self.empty = QLabel("No GPUs reported.")
        self.empty.setStyleSheet("color: palette(mid);")
        self.grid.addWidget(self.empty, 0, 0)

    def set_gpus(self, gpus: list[dict[str, Any]]) -> None:
        uuids = [str(g.get("uuid")) for g in gpus]
        if uuids != list(self.cards):
            for card in self.cards.values():
                card.setParent(None)
                card.deleteLater()
            self.cards = {}
            for i, uuid in enumerate(uuids):
                card = GpuCard()
                self.cards[uuid] = card
                self.grid.addWidget(card, 1 + i // self.columns, i % self.columns)
        for g in gpus:
            self.cards[str(g.get("uuid"))].set_gpu(g)
        self.empty.setVisible(not gpus)


def gpu_labels(gpus: list[dict[str, Any]]) -> dict[str, str]:
    return {str(g.get("uuid")): f"GPU {g.get('index', '?')}" for g in gpus}


class LocalTab(QWidget):
    """This computer: broker line, GPU cards, leases, the queue with reasons, jobs."""

    pause_toggled = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(10, 10, 10, 10)
        outer.setSpacing(8)
        top = QHBoxLayout()
        self.broker_line = QLabel("Connecting to the broker…")
        self.broker_line.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.pause_box = QCheckBox("Pause new admissions")
        self.pause_box.setToolTip(
            "While paused, new requests wait (with the reason 'paused'); leases already "
            "granted keep running."
        )
        self.pause_box.toggled.connect(self._on_pause)
        top.addWidget(self.broker_line, 1)
        top.addWidget(self.pause_box)
        outer.addLayout(top)

        self.gpu_list = GpuList()
        outer.addWidget(self.gpu_list)

        self.leases = LeasesModel(self)
        self.queue = QueueModel(self)
        self.jobs = JobsModel(self)
        self.leases_view = make_table(self.leases, stretch=LeasesModel.PURPOSE)
        self.queue_view = make_table(self.queue, stretch=QueueModel.REASON)
        self.queue_view.setWordWrap(True)
        self.queue_view.verticalHeader().setSectionResizeMode(
            QHeaderView.ResizeMode.ResizeToContents
        )
        self.jobs_view = make_table(self.jobs, stretch=JobsModel.PROGRESS)
        self.jobs_view.setItemDelegateForColumn(JobsModel.PROGRESS, ProgressDelegate(self))
        self.leases_box, self.leases_empty = titled(
            "Leases", self.leases_view, "No leases: nothing holds GPU memory through rbroker."
        )
        self.queue_box, self.queue_empty = titled("Waiting", self.queue_view, "Nothing is waiting.")
        self.jobs_box, self.jobs_empty = titled("Jobs", self.jobs_view, "No jobs declared.")
        split = QSplitter(Qt.Orientation.Vertical)
        split.setChildrenCollapsible(False)
        for box in (self.leases_box, self.queue_box, self.jobs_box):
            split.addWidget(box)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        split.setStretchFactor(2, 2)
        outer.addWidget(split, 1)
        self._updating = False
        self.origin = ""

    def _on_pause(self, on: bool) -> None:
        if not self._updating:
            self.pause_toggled.emit(on)

    def apply(self, snap: Snapshot) -> None:
        status = snap.status
        bits = [
            f"Broker {status.get('version', '?')}" + (f" ({self.origin})" if self.origin else "")
        ]
        if snap.simulated:
            bits.append("<b>simulated GPUs</b>")
        else:
            bits.append(f"telemetry {status.get('telemetry_source', '?')}")
        bits.append(f"up {age_text(status.get('uptime_s'))}")
        bits.append(f"coordinator: {snap.coordinator_link}")
        self.broker_line.setText(" · ".join(bits))
        self._updating = True
        self.pause_box.setEnabled(True)
        self.pause_box.setChecked(snap.paused)
        self._updating = False
        self.gpu_list.set_gpus(snap.gpus)
        labels = gpu_labels(snap.gpus)
        for model in (self.leases, self.queue):
            model.set_gpu_labels(labels)
        self.leases.set_rows(snap.leases, snap.taken_at)
        self.queue.set_rows(snap.queue, snap.taken_at)
        self.jobs.set_rows(snap.jobs or [], snap.taken_at)
        self._counts(snap)

    def _counts(self, snap: Snapshot) -> None:
        n, q = len(snap.leases), len(snap.queue)
        self.leases_box.setTitle(f"Leases ({n})")
        self.queue_box.setTitle(f"Waiting ({q})")
        self.leases_empty.setVisible(n == 0)
        self.leases_view.setVisible(n > 0)
        self.queue_empty.setVisible(q == 0)
        self.queue_view.setVisible(q > 0)
        if snap.jobs is None:
            self.jobs_box.setTitle("Jobs")
            self.jobs_empty.setText(
                "This broker does not report jobs yet (no jobs.list); jobs appear here once "
                "it does."
            )
            self.jobs_empty.show()
            self.jobs_view.hide()
        else:
            self.jobs_box.setTitle(f"Jobs ({len(snap.jobs)})")
            self.jobs_empty.setText("No jobs declared.")
            self.jobs_empty.setVisible(not snap.jobs)
            self.jobs_view.setVisible(bool(snap.jobs))

    def set_down(self) -> None:
        self.pause_box.setEnabled(False)
        self.broker_line.setText("Broker not running")


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
        self.status_line = QLabel()
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
        self.detail_title = QLabel()
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

    def set_computers(self, computers: list[dict[str, Any]]) -> None:
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


class SettingsTab(QWidget):
    """Coordinator and enrollment, headroom, start at login."""

    saved = Signal(object)  # TraySettings
    enroll_requested = Signal(str, str)  # url, code
    autostart_toggled = Signal(bool)

    def __init__(self, settings: TraySettings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        outer = QVBoxLayout(self)
        outer.setContentsMargins(10, 10, 10, 10)

        coord = QGroupBox("Coordinator")
        form = QFormLayout(coord)
        self.url = QLineEdit(settings.coordinator_url)
        self.url.setPlaceholderText("https://coordinator.example.org")
        self.code = QLineEdit()
        self.code.setPlaceholderText("one-time enrollment code from your admin")
        self.enroll_button = QPushButton("Enroll this computer")
        self.enroll_button.clicked.connect(
            lambda: self.enroll_requested.emit(self.url.text().strip(), self.code.text().strip())
        )
        self.enroll_state = QLabel("")
        self.enroll_state.setWordWrap(True)
        self.link_state = QLabel("unknown (no broker)")
        self.link_state.setWordWrap(True)
        self.link_state.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        form.addRow("Coordinator URL", self.url)
        form.addRow("Enrollment code", self.code)
        form.addRow("", self.enroll_button)
        form.addRow("", self.enroll_state)
        form.addRow("Link", self.link_state)
        outer.addWidget(coord)

        broker = QGroupBox("This computer's broker")
        bform = QFormLayout(broker)
        self.headroom = QSpinBox()
        self.headroom.setRange(0, 1024 * 1024)
        self.headroom.setSingleStep(256)
        self.headroom.setSuffix(" MiB")
        self.headroom.setSpecialValueText("default: max(512 MiB, 5 % of the GPU)")
        self.headroom.setValue(settings.headroom_mib or 0)
        self.headroom_note = QLabel(
            "Memory kept free on every GPU. Applies to the broker this app starts, from its "
            "next start."
        )
        self.headroom_note.setWordWrap(True)
        self.headroom_note.setStyleSheet("color: palette(mid);")
        bform.addRow("Headroom", self.headroom)
        bform.addRow("", self.headroom_note)
        outer.addWidget(broker)

        start = QGroupBox("Start")
        sl = QVBoxLayout(start)
        self.autostart = QCheckBox("Start rbroker at login")
        self.autostart.toggled.connect(self._on_autostart)
        self.autostart_note = QLabel()
        self.autostart_note.setWordWrap(True)
        self.autostart_note.setStyleSheet("color: palette(mid);")
        sl.addWidget(self.autostart)
        sl.addWidget(self.autostart_note)
        outer.addWidget(start)

        row = QHBoxLayout()
        row.addStretch(1)
        self.save_button = QPushButton("Save")
        self.save_button.clicked.connect(self._save)
        self.message = QLabel()
        row.addWidget(self.message)
        row.addWidget(self.save_button)
        outer.addLayout(row)
        outer.addStretch(1)
        self._updating = False

    def set_link(self, coordinator: dict[str, Any]) -> None:
        """Show the broker's coordinator link state (`broker.status().coordinator`)."""
        link = str(coordinator.get("link") or "not enrolled")
        bits = [link]
        if coordinator.get("computer_id"):
            bits.append(f"computer {coordinator['computer_id']}")
        if coordinator.get("url"):
            bits.append(str(coordinator["url"]))
        if coordinator.get("detail"):
            bits.append(str(coordinator["detail"]))
        self.link_state.setText(" · ".join(bits))

    def set_autostart(self, on: bool, where: str) -> None:
        self._updating = True
        self.autostart.setChecked(on)
        self._updating = False
        self.autostart_note.setText(where)

    def _on_autostart(self, on: bool) -> None:
        if not self._updating:
            self.autostart_toggled.emit(on)

    def _save(self) -> None:
        value = self.headroom.value()
        self.settings = TraySettings(
            coordinator_url=self.url.text().strip(), headroom_mib=value or None
        )
        self.saved.emit(self.settings)


class MainWindow(QMainWindow):
    """The tray's window. `close_to_tray`: closing hides the window (the tray icon stays);
    without a tray the window is minimised instead, so it stays reachable."""

    def __init__(self, settings: TraySettings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("rbroker")
        self.setWindowIcon(app_icon())
        self.resize(1180, 860)
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(8, 8, 8, 8)
        self.banner = QLabel()
        self.banner.setWordWrap(True)
        self.banner.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.banner.hide()
        layout.addWidget(self.banner)
        self.tabs = QTabWidget()
        self.local = LocalTab()
        self.fleet = FleetTab()
        self.settings_tab = SettingsTab(settings)
        self.tabs.addTab(self.local, "This computer")
        self.tabs.addTab(self.fleet, "Fleet")
        self.tabs.addTab(self.settings_tab, "Settings")
        layout.addWidget(self.tabs)
        self.setCentralWidget(central)
        self.state = TrayState.BROKER_DOWN
        self.close_to_tray = False
        self.quitting = False
        self.broker_note = ""
        self.set_broker_down("connecting to the broker")

    # -- what the window shows ------------------------------------------------------------------
    def show_banner(self, text: str, kind: str = "info") -> None:
        if not text:
            self.banner.hide()
            return
        self.banner.setText(text)
        self.banner.setStyleSheet(
            f"QLabel {{ {BANNER_STYLES[kind]} border-radius: 4px; padding: 6px 10px; }}"
        )
        self.banner.show()

    def apply_snapshot(self, snap: Snapshot) -> None:
        self.state = derive_state(snap)
        self.local.apply(snap)
        notes: list[tuple[str, str]] = []
        if self.broker_note:
            notes.append((self.broker_note, "info"))
        if self.state is TrayState.TELEMETRY:
            notes.append(
                (
                    "GPU telemetry problem: requests on the affected GPU wait until telemetry "
                    "recovers; its last known values are shown.",
                    "error",
                )
            )
        if snap.paused:
            notes.append(("New admissions are paused: new requests wait.", "warn"))
        if snap.simulated:
            notes.append(("Simulated GPUs: no NVIDIA driver is used.", "info"))
        kind = "info"
        for _, k in notes:
            if k == "error" or (k == "warn" and kind == "info"):
                kind = k
        self.show_banner("  ·  ".join(t for t, _ in notes), kind)
        self.setWindowTitle(f"rbroker — {STATE_TEXT[self.state]}")

    def set_broker_down(self, message: str) -> None:
        self.state = TrayState.BROKER_DOWN
        self.local.set_down()
        self.show_banner(
            f"Broker not running — {message.rstrip('. ')}. The window updates by itself once a "
            "broker "
            "answers (start one with `rbroker broker`, or let this app start it).",
            "error",
        )
        self.setWindowTitle("rbroker — broker not running")

    def closeEvent(self, event: QCloseEvent) -> None:
        if self.quitting:
            event.accept()
            return
        event.ignore()
        if self.close_to_tray:
            self.hide()
        else:
            self.showMinimized()

    def bring_to_front(self) -> None:
        self.showNormal()
        self.raise_()
        self.activateWindow()


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
