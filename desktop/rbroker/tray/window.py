"""The main window: This computer (GPUs, leases, queue, jobs, bookings), Fleet, Settings (the tabs
in `fleet_tab` and `settings_tab`).

The window only displays what it is given (`apply_snapshot`, `set_broker_down`,
`set_fleet`) and reports what the user asks for through signals; it never calls the broker
or the network itself, so it never blocks on them.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QCloseEvent, QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QHeaderView,
    QMainWindow,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from rbroker.base.display import fmt_count
from rbroker.tray.bookings import BookingsPanel
from rbroker.tray.fleet_tab import FleetTab
from rbroker.tray.icons import app_icon
from rbroker.tray.models import (
    JobsModel,
    LeasesModel,
    QueueModel,
)
from rbroker.tray.panels import GpuList, gpu_labels, make_table, titled
from rbroker.tray.plain import PlainLabel
from rbroker.tray.settings import TraySettings
from rbroker.tray.settings_tab import SettingsTab
from rbroker.tray.state import STATE_TEXT, Snapshot, TrayState, age_text, derive_state
from rbroker.tray.widgets import ProgressDelegate

BANNER_STYLES = {
    "error": "background: #fde7e4; color: #8c1d18; border: 1px solid #f2b8b1;",
    "warn": "background: #fff4d6; color: #6b4e00; border: 1px solid #f0d68a;",
    "info": "background: #e7f0fd; color: #1b3f7a; border: 1px solid #b8cff5;",
}


class LocalTab(QWidget):
    """This computer: broker line, GPU cards, leases, the queue with reasons, jobs, and the
    next 24 hours of bookings per GPU (`rbroker.tray.bookings`). `me`: whose bookings are
    drawn as mine (the controller sets it to its notifier's user)."""

    pause_toggled = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(10, 10, 10, 10)
        outer.setSpacing(8)
        top = QHBoxLayout()
        self.broker_line = PlainLabel("Connecting to the broker…")
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
        self.bookings = BookingsPanel()
        self.bookings_box, self.bookings_empty = titled("Bookings", self.bookings, "No bookings.")
        split = QSplitter(Qt.Orientation.Vertical)
        split.setChildrenCollapsible(False)
        for box in (self.leases_box, self.queue_box, self.jobs_box, self.bookings_box):
            split.addWidget(box)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        split.setStretchFactor(2, 2)
        split.setStretchFactor(3, 2)
        outer.addWidget(split, 1)
        self._updating = False
        self.origin = ""
        self.me = ""

    def _on_pause(self, on: bool) -> None:
        if not self._updating:
            self.pause_toggled.emit(on)

    def apply(self, snap: Snapshot) -> None:
        status = snap.status
        bits = [
            f"Broker {status.get('version', '?')}" + (f" ({self.origin})" if self.origin else "")
        ]
        if snap.simulated:
            bits.append("simulated GPUs")
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
        if snap.bookings is not None:
            self.bookings.set_bookings(snap.bookings, snap.gpus, self.me)
        self._counts(snap)

    def _counts(self, snap: Snapshot) -> None:
        n, q = len(snap.leases), len(snap.queue)
        self.leases_box.setTitle(_title("Leases", n, snap.leases_left_out))
        self.queue_box.setTitle(_title("Waiting", q, snap.queue_left_out))
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
        if snap.bookings is None:
            self.bookings_box.setTitle("Bookings")
            self.bookings_empty.setText(
                "This broker does not take bookings yet (no bookings.list); they appear here "
                "once it does."
            )
            self.bookings_empty.show()
            self.bookings.hide()
        else:
            booked = snap.bookings.get("bookings") or []
            self.bookings_box.setTitle(
                _title("Bookings", len(booked), int(snap.bookings.get("others_left_out") or 0))
            )
            self.bookings_empty.setText(
                "No bookings: book GPU memory ahead with rbroker book; bookings show here on a "
                "24-hour timeline per GPU."
            )
            self.bookings_empty.setVisible(not booked)
            self.bookings.setVisible(bool(booked))

    def set_down(self) -> None:
        self.pause_box.setEnabled(False)
        self.broker_line.setText("Broker not running")


class MainWindow(QMainWindow):
    """The tray's window. `close_to_tray`: closing hides the window (the tray icon stays);
    without a tray the window is minimised instead, so it stays reachable."""

    shown = Signal()
    """The window came on screen (shown, or restored from minimized): what it shows is read
    again then, not on a timer while hidden."""

    def __init__(self, settings: TraySettings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("rbroker")
        self.setWindowIcon(app_icon())
        self.resize(1180, 860)
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(8, 8, 8, 8)
        self.banner = PlainLabel()
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

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self.shown.emit()

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


def _title(what: str, shown: int, left_out: int) -> str:
    """`Leases (3)`, or with entries of other users the broker did not list
    `Leases (2,000 shown, 1,500 more of other users)`."""
    if not left_out:
        return f"{what} ({fmt_count(shown)})"
    return f"{what} ({fmt_count(shown)} shown, {fmt_count(left_out)} more of other users)"
