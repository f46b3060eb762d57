"""Widgets of the main window: the per-GPU capacity bar and card, and table delegates."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QPainter, QPainterPath, QPalette, QPen
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionProgressBar,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from rbroker.base.display import fmt_mib, short_uuid
from rbroker.tray.models import BADGE_ROLE, PROGRESS_ROLE, GpuRow
from rbroker.tray.plain import PlainLabel, tool_tip

LEASED = QColor("#2f6fdb")
RESERVED = QColor("#9cbcf2")
OTHERS = QColor("#e08a2c")
AVAILABLE = QColor("#3aa55d")
HEADROOM = QColor("#b9bec7")

BADGE_COLORS = {
    "ok": QColor("#3aa55d"),
    "online": QColor("#3aa55d"),
    "stale": QColor("#d49a1a"),
    "unknown_capacity": QColor("#d49a1a"),
    "unavailable": QColor("#d0453a"),
    "lost": QColor("#d0453a"),
    "offline": QColor("#7d838c"),
}

SEGMENTS: tuple[tuple[str, str, QColor], ...] = (
    ("leased", "in use by leases", LEASED),
    ("reserved", "granted, not yet in use", RESERVED),
    ("others", "in use by others", OTHERS),
    ("available", "available", AVAILABLE),
    ("headroom", "headroom", HEADROOM),
)


def split(gpu: GpuRow) -> dict[str, int]:
    """The bar's segments in MiB: leased, reserved (outstanding), others, available, headroom.

    They add up to total, except on an over-committed GPU, where the bar is scaled."""
    return {
        "leased": int(gpu.get("leased_in_use_mib") or 0),
        "reserved": int(gpu.get("outstanding_mib") or 0),
        "others": int(gpu.get("other_in_use_mib") or 0),
        "available": int(gpu.get("available_mib") or 0),
        "headroom": int(gpu.get("headroom_mib") or 0),
    }


class CapacityBar(QWidget):
    """A horizontal bar split into leases / granted-not-yet-used / others / available /
    headroom, proportional to the GPU's total."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.parts: dict[str, int] = {}
        self.total = 0
        self.stale = False
        self.setMinimumHeight(22)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:
        return QSize(420, 24)

    def set_gpu(self, gpu: GpuRow) -> None:
        self.parts = split(gpu)
        self.total = int(gpu.get("total_mib") or 0)
        self.stale = gpu.get("telemetry") != "ok"
        tip = "\n".join(f"{label}: {fmt_mib(self.parts[key])} MiB" for key, label, _ in SEGMENTS)
        self.setToolTip(tool_tip(f"{tip}\ntotal: {fmt_mib(self.total)} MiB"))
        self.update()

    def paintEvent(self, event: Any) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        r = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        clip = QPainterPath()
        clip.addRoundedRect(r, 5, 5)
        p.setClipPath(clip)
        p.fillRect(r, self.palette().color(QPalette.ColorRole.Base))
        scale_total = max(self.total, sum(self.parts.values()), 1)
        x = r.left()
        for key, _, color in SEGMENTS:
            w = r.width() * self.parts.get(key, 0) / scale_total
            if w <= 0:
                continue
            seg = QRectF(x, r.top(), w, r.height())
            p.fillRect(seg, color)
            if key in ("headroom", "reserved"):
                p.fillRect(seg, QBrush(color.darker(115), Qt.BrushStyle.BDiagPattern))
            x += w
        if self.stale:
            p.fillRect(r, QBrush(QColor(255, 255, 255, 110), Qt.BrushStyle.Dense4Pattern))
        p.setClipping(False)
        p.setPen(QPen(self.palette().color(QPalette.ColorRole.Mid), 1))
        p.drawRoundedRect(r, 5, 5)
        p.end()


class Badge(PlainLabel):
    """A small rounded label coloured by a state word (telemetry or freshness); plain text."""

    def set_state(self, word: str, text: str | None = None) -> None:
        color = BADGE_COLORS.get(word, QColor("#7d838c"))
        self.setText(text or word)
        self.setStyleSheet(
            f"QLabel {{ background: {color.name()}; color: white; border-radius: 8px;"
            " padding: 1px 8px; font-weight: 600; }"
        )


class GpuCard(QFrame):
    """One GPU: name, UUID, a telemetry badge, the capacity bar and its numbers."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setObjectName("gpuCard")
        self.gpu: GpuRow | None = None
        self.parts: dict[str, int] = {}
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 8, 10, 8)
        layout.setSpacing(6)
        head = QHBoxLayout()
        self.title = PlainLabel()
        font = self.title.font()
        font.setBold(True)
        self.title.setFont(font)
        self.badge = Badge()
        self.summary = PlainLabel()
        self.summary.setStyleSheet("color: palette(dark);")
        self.summary.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.summary.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        head.addWidget(self.title)
        head.addWidget(self.badge)
        head.addWidget(self.summary, 1)
        layout.addLayout(head)
        self.bar = CapacityBar()
        layout.addWidget(self.bar)
        self.legend = QLabel()
        self.legend.setObjectName("legend")
        self.legend.setWordWrap(True)
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        layout.addWidget(self.legend)
        self.reason = PlainLabel()
        self.reason.setWordWrap(True)
        self.reason.setStyleSheet("color: #b3261e;")
        self.reason.hide()
        layout.addWidget(self.reason)

    def set_gpu(self, gpu: GpuRow) -> None:
        self.gpu = gpu
        uuid = str(gpu.get("uuid", ""))
        self.title.setText(f"GPU {gpu.get('index', '?')} · {gpu.get('name', '')}")
        self.title.setToolTip(tool_tip(uuid))
        telemetry = str(gpu.get("telemetry", "unknown"))
        self.badge.set_state(telemetry, "telemetry ok" if telemetry == "ok" else telemetry)
        total = gpu.get("total_mib")
        n = int(gpu.get("leases") or 0)
        waiting = int(gpu.get("waiting") or 0)
        bits = [short_uuid(uuid), f"{n} lease{'s' if n != 1 else ''}"]
        if waiting:
            bits.append(f"{waiting} waiting")
        bits.append(f"{fmt_mib(int(total))} MiB total" if total is not None else "total unknown")
        self.summary.setText(" · ".join(bits))
        self.summary.setToolTip(tool_tip(uuid))
        self.bar.set_gpu(gpu)
        self.parts = split(gpu)
        items = [
            f'<span style="color:{color.name()}; font-size: large;">&#9632;</span>&nbsp;'
            + label.replace(" ", "&nbsp;")
            + f"&nbsp;<b>{fmt_mib(self.parts[key])}</b>&nbsp;MiB"
            for key, label, color in SEGMENTS
        ]
        self.legend.setText(" &nbsp;&nbsp;&nbsp; ".join(items))
        reason = str(gpu.get("telemetry_reason") or "")
        self.reason.setVisible(telemetry != "ok")
        self.reason.setText(
            f"Telemetry {telemetry}" + (f": {reason}" if reason else "") + ". Showing the last "
            "known values; new requests on this GPU wait until telemetry recovers."
        )

    def legend_text(self) -> str:
        """The numbers as plain text (what a person reads under the bar)."""
        return "  ".join(
            f"{label} {fmt_mib(self.parts.get(key, 0))} MiB" for key, label, _ in SEGMENTS
        )


class ProgressDelegate(QStyledItemDelegate):
    """Draws `PROGRESS_ROLE` (done, failed, total) as a progress bar with its text."""

    def paint(
        self,
        painter: QPainter,
        option: QStyleOptionViewItem,
        index: QModelIndex | QPersistentModelIndex,
    ) -> None:
        value = index.data(PROGRESS_ROLE)
        if not value:
            super().paint(painter, option, index)
            return
        done, failed, total = value
        bar = QStyleOptionProgressBar()
        bar.rect = option.rect.adjusted(3, 3, -3, -3)  # type: ignore[attr-defined]
        bar.minimum = 0
        bar.maximum = int(total) if total else 0  # 0..0 draws a busy bar
        bar.progress = min(int(total or 0), done + failed)
        bar.text = str(index.data(Qt.ItemDataRole.DisplayRole))
        bar.textVisible = True
        bar.state = QStyle.StateFlag.State_Enabled | QStyle.StateFlag.State_Horizontal
        bar.palette = option.palette  # type: ignore[attr-defined]
        style = option.widget.style() if option.widget else QApplication.style()  # type: ignore[attr-defined]
        style.drawControl(QStyle.ControlElement.CE_ProgressBar, bar, painter)


class BadgeDelegate(QStyledItemDelegate):
    """Draws `BADGE_ROLE` cells as a coloured pill with the cell's text."""

    def paint(
        self,
        painter: QPainter,
        option: QStyleOptionViewItem,
        index: QModelIndex | QPersistentModelIndex,
    ) -> None:
        word = index.data(BADGE_ROLE)
        if not word:
            super().paint(painter, option, index)
            return
        self.initStyleOption(option, index)
        style = option.widget.style() if option.widget else QApplication.style()  # type: ignore[attr-defined]
        text = option.text  # type: ignore[attr-defined]
        option.text = ""  # type: ignore[attr-defined]
        style.drawControl(QStyle.ControlElement.CE_ItemViewItem, option, painter, option.widget)  # type: ignore[attr-defined]
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        fm = option.fontMetrics  # type: ignore[attr-defined]
        rect = QRectF(option.rect).adjusted(4, 3, -4, -3)  # type: ignore[attr-defined]
        width = min(rect.width(), fm.horizontalAdvance(text) + 18)
        pill = QRectF(rect.left(), rect.top(), width, rect.height())
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(BADGE_COLORS.get(word, QColor("#7d838c")))
        painter.drawRoundedRect(pill, pill.height() / 2, pill.height() / 2)
        painter.setPen(QColor("white"))
        painter.drawText(
            pill,
            int(Qt.AlignmentFlag.AlignCenter),
            fm.elidedText(text, Qt.TextElideMode.ElideRight, int(width) - 12),
        )
        painter.restore()

    def sizeHint(
        self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> QSize:
        size = super().sizeHint(option, index)
        return QSize(size.width() + 24, max(size.height(), 24))
