"""The Settings tab of the main window: the coordinator enrollment (URL, one-time code, CA
file of a self-signed coordinator, key file where no OS keyring is usable, the enrollment in
force, enroll again with a new identity), the headroom of the broker this app starts, and
start at login.

Like the rest of the window it only displays what it is given and reports what the user asks
for through signals (`enroll_requested`, `saved`, `autostart_toggled`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from rbroker.tray.plain import PlainLabel
from rbroker.tray.settings import TraySettings
from rbroker.tray.wording import gui_text
from rbroker_protocol.results import CoordinatorLink

if TYPE_CHECKING:
    from rbroker.uplink.config import UplinkConfig


@dataclass(frozen=True)
class EnrollRequest:
    """What the Settings tab asks the app to enroll with (`rbroker enroll`'s inputs):
    coordinator URL, one-time code, CA file of a self-signed coordinator (or empty), key in
    a file instead of the OS keyring, and a new identity for a computer already enrolled."""

    url: str
    code: str
    ca_file: str = ""
    key_file: bool = False
    new_identity: bool = False


def ask_yes_no(parent: QWidget, title: str, text: str) -> bool:
    """A modal Yes/No question (No is the default)."""
    answer = QMessageBox.question(
        parent,
        title,
        text,
        QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
        QMessageBox.StandardButton.No,
    )
    return answer == QMessageBox.StandardButton.Yes


def pick_pem_file(parent: QWidget, start: str) -> str:
    """A file dialog for the coordinator's CA certificate; "" when cancelled."""
    path, _ = QFileDialog.getOpenFileName(
        parent,
        "The coordinator's CA certificate (tls/ca.pem)",
        start,
        "PEM certificates (*.pem *.crt *.cer);;All files (*)",
    )
    return str(path)


class SettingsTab(QWidget):
    """Coordinator and enrollment (URL, code, CA file with a picker, key file where no
    keyring is usable, the enrollment in force, enroll again), headroom, start at login.

    `confirm(parent, title, text) -> bool` and `pick_file(parent, start) -> path` are the
    dialogs (replaceable, e.g. by tests)."""

    saved = Signal(object)  # TraySettings
    enroll_requested = Signal(object)  # EnrollRequest
    autostart_toggled = Signal(bool)

    def __init__(self, settings: TraySettings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        self.confirm: Callable[[QWidget, str, str], bool] = ask_yes_no
        self.pick_file: Callable[[QWidget, str], str] = pick_pem_file
        self.enrolled = False
        outer = QVBoxLayout(self)
        outer.setContentsMargins(10, 10, 10, 10)

        coord = QGroupBox("Coordinator")
        form = QFormLayout(coord)
        self.enrollment = PlainLabel("Not enrolled.")
        self.enrollment.setWordWrap(True)
        self.enrollment.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.url = QLineEdit(settings.coordinator_url)
        self.url.setPlaceholderText("https://coordinator.example.org:8787")
        self.code = QLineEdit()
        self.code.setPlaceholderText("one-time enrollment code from your admin")
        self.ca_file = QLineEdit()
        self.ca_file.setPlaceholderText("only for a self-signed coordinator: its tls/ca.pem")
        self.ca_button = QPushButton("Choose…")
        self.ca_button.clicked.connect(self._choose_ca)
        ca_row = QHBoxLayout()
        ca_row.addWidget(self.ca_file, 1)
        ca_row.addWidget(self.ca_button)
        self.key_file = QCheckBox("Keep the private key in a file in the broker's data directory")
        self.key_file.setChecked(True)
        self.key_file_note = PlainLabel()
        self.key_file_note.setWordWrap(True)
        self.key_file_note.setStyleSheet("color: palette(mid);")
        self.key_file.hide()
        self.key_file_note.hide()
        self.enroll_button = QPushButton("Enroll this computer")
        self.enroll_button.clicked.connect(lambda: self._request(new_identity=False))
        self.reenroll_button = QPushButton("Enroll again (new identity)…")
        self.reenroll_button.clicked.connect(self._reenroll)
        self.reenroll_button.hide()
        buttons = QHBoxLayout()
        buttons.addWidget(self.enroll_button)
        buttons.addWidget(self.reenroll_button)
        buttons.addStretch(1)
        self.enroll_state = PlainLabel("")
        self.enroll_state.setWordWrap(True)
        self.enroll_state.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.link_state = PlainLabel("unknown (no broker)")
        self.link_state.setWordWrap(True)
        self.link_state.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        form.addRow("Enrollment", self.enrollment)
        form.addRow("Coordinator URL", self.url)
        form.addRow("Enrollment code", self.code)
        form.addRow("CA file", ca_row)
        form.addRow("", self.key_file)
        form.addRow("", self.key_file_note)
        form.addRow("", buttons)
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
        self.headroom_note = PlainLabel(
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
        self.autostart_note = PlainLabel()
        self.autostart_note.setWordWrap(True)
        self.autostart_note.setStyleSheet("color: palette(mid);")
        sl.addWidget(self.autostart)
        sl.addWidget(self.autostart_note)
        outer.addWidget(start)

        row = QHBoxLayout()
        row.addStretch(1)
        self.save_button = QPushButton("Save")
        self.save_button.clicked.connect(self._save)
        self.message = PlainLabel()
        row.addWidget(self.message)
        row.addWidget(self.save_button)
        outer.addLayout(row)
        outer.addStretch(1)
        self._updating = False

    def set_link(self, coordinator: CoordinatorLink) -> None:
        """Show the broker's coordinator link state (`broker.status().coordinator`)."""
        link = str(coordinator.get("link") or "not enrolled")
        bits = [link]
        if coordinator.get("computer_id"):
            bits.append(f"computer {coordinator['computer_id']}")
        if coordinator.get("url"):
            bits.append(str(coordinator["url"]))
        if coordinator.get("detail"):
            bits.append(str(coordinator["detail"]))
        self.link_state.setText(gui_text(" · ".join(bits)))

    def set_enrollment(
        self, config: UplinkConfig | None, keyring_ok: bool = True, why: str = ""
    ) -> None:
        """Show the enrollment in force (`None`: not enrolled) and, when no OS keyring is
        usable (`keyring_ok` False, `why` says why), offer the key file."""
        self.enrolled = config is not None
        if config is None:
            self.enrollment.setText("Not enrolled.")
        else:
            where = (
                "a file in the data directory"
                if config.key_backend == "file"
                else ("the OS keyring")
            )
            self.enrollment.setText(
                f"Enrolled at {config.url} in group {config.group} as {config.name} "
                f"({config.computer_id}); private key in {where}"
                + (f"; CA file {config.ca_file}" if config.ca_file else "")
                + "."
            )
            if not self.url.text().strip():
                self.url.setText(config.url)
            if config.ca_file and not self.ca_file.text().strip():
                self.ca_file.setText(config.ca_file)
        self.enroll_button.setVisible(config is None)
        self.reenroll_button.setVisible(config is not None)
        self.key_file.setVisible(not keyring_ok)
        self.key_file_note.setVisible(not keyring_ok)
        if not keyring_ok:
            self.key_file_note.setText(
                f"There is no usable OS keyring here ({why}). The key file is readable by "
                "your user only."
            )

    def set_enroll_unknown(self, why: str) -> None:
        """The app does not know the broker's data directory: enrollment happens elsewhere."""
        self.enrollment.setText(why)
        self.enroll_button.setVisible(True)
        self.reenroll_button.hide()

    def _choose_ca(self) -> None:
        start = self.ca_file.text().strip() or str(Path.home())
        path = self.pick_file(self, start)
        if path:
            self.ca_file.setText(path)

    def _request(self, new_identity: bool) -> None:
        self.enroll_requested.emit(
            EnrollRequest(
                url=self.url.text().strip(),
                code=self.code.text().strip(),
                ca_file=self.ca_file.text().strip(),
                key_file=not self.key_file.isHidden() and self.key_file.isChecked(),
                new_identity=new_identity,
            )
        )

    def _reenroll(self) -> None:
        if not self.url.text().strip() or not self.code.text().strip():
            self.enroll_state.setText(
                "To enroll again, enter the coordinator URL and a new enrollment code first."
            )
            return
        if self.confirm(
            self,
            "Enroll again?",
            "This computer gets a new identity (a new key pair). The coordinator will show it "
            "as a new computer; the old entry stops receiving reports and can be revoked "
            "there. Continue?",
        ):
            self._request(new_identity=True)
        else:
            self.enroll_state.setText("Not enrolled again: cancelled.")

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
