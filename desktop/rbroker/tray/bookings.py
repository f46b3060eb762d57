"""The bookings of This computer (docs/architecture.md §2a, issue 41): the next 24 hours of
each GPU as a painted timeline, and a list naming each booking.

- `BookingsTimeline`: one row per GPU; each booking a bar from its start to its end (clipped
  to the 24 hours from now), as tall as its share of the GPU's usable MiB (total − headroom),
  bookings that overlap in time stacked; the viewer's own in the leases' blue with an
  outline, other users' in orange. A bar's tool tip names its booking.
- `booking_line`: one booking as one line of plain text (id, owner, project, purpose, MiB,
  GPUs, window in the local zone, state); `BookingsPanel` shows the timeline and these lines.

Every name here comes from other users: text is drawn with `QPainter.drawText` (never read as
markup) after `plain.clean`, lines go through `PlainLabel`, tool tips through
`plain.tool_tip`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import tzinfo
from typing import Any, NamedTuple

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt, QTimer
from PySide6.QtGui import QHelpEvent, QPainter, QPalette, QPen
from PySide6.QtWidgets import QSizePolicy, QToolTip, QVBoxLayout, QWidget

from rbroker.base.display import fmt_mib
from rbroker.base.when import fmt_window, local_time, zone_name
from rbroker.tray.notices import is_mine
from rbroker.tray.plain import PlainLabel, clean, tool_tip
from rbroker.tray.widgets import LEASED, OTHERS
from rbroker_protocol.results import BookingsListResult, BookingView, GpuView

HOURS = 24
"""How far ahead the timeline reaches."""
ROW_H = 24
LABEL_W = 60
AXIS_H = 16
TICK_EVERY_H = 3
REPAINT_MS = 60_000
"""The bars move with the clock: repainted this often between reads."""

MINE = LEASED
THEIRS = OTHERS


class Row(NamedTuple):
    """One GPU's row: its UUID, label (`GPU 0`) and usable MiB (total − headroom)."""

    uuid: str
    label: str
    usable_mib: int


class Bar(NamedTuple):
    """One booking drawn on one row: where, which, and whether it is the viewer's."""

    rect: QRectF
    row: int
    booking: BookingView
    mine: bool


def gpu_label_map(gpus: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    return {str(g.get("uuid")): f"GPU {g.get('index', '?')}" for g in gpus}


def booking_line(
    b: BookingView,
    labels: Mapping[str, str],
    now_s: float,
    mine: bool = False,
    zone: tzinfo | None = None,
) -> str:
    """`book-1a2b3c4d · alice · vision · fine-tune ViT-B · 16 000 MiB on GPU 0 ·
    14:00–18:00 · booked`, one line of plain text (each name `clean`ed); `· yours` after the
    viewer's own."""
    gpus = ", ".join(labels.get(u) or u for u in b.get("gpu_uuids") or []) or "?"
    each = " each" if len(b.get("gpu_uuids") or []) > 1 else ""
    start, end = float(b.get("start_at") or 0.0), float(b.get("end_at") or 0.0)
    try:
        window = fmt_window(start, end, now_s, zone)
    except (ValueError, OverflowError, OSError):
        window = "?"
    parts = [
        b.get("booking_id", ""),
        b.get("owner", ""),
        b.get("project", ""),
        b.get("purpose", ""),
        f"{fmt_mib(int(b.get('mib') or 0))} MiB{each} on {gpus}",
        window,
        b.get("state", ""),
    ]
    line = " · ".join(clean(p) for p in parts)
    return f"{line} · yours" if mine else line


class BookingsTimeline(QWidget):
    """The next `HOURS` hours of each GPU's bookings (see the module's doc)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.rows: list[Row] = []
        self.bookings: list[BookingView] = []
        self.labels: dict[str, str] = {}
        self.me = ""
        self.zone: tzinfo | None = None
        self._now_at = time.time()  # the broker's wall clock at the read…
        self._read_at = time.monotonic()  # …and this process's clock then
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self._timer = QTimer(self)
        self._timer.timeout.connect(self.update)
        self._timer.start(REPAINT_MS)

    def set_bookings(self, listing: BookingsListResult, gpus: Sequence[GpuView], me: str) -> None:
        """Show `listing` (`bookings.list`) on a row per GPU of `gpus` (and per other GPU a
        booking names)."""
        self.me = me
        self.bookings = list(listing.get("bookings") or [])
        self._now_at = float(listing.get("now_at") or time.time())
        self._read_at = time.monotonic()
        usable = {str(k): int(v) for k, v in (listing.get("usable_mib") or {}).items()}
        self.labels = gpu_label_map(gpus)
        uuids = [str(g.get("uuid")) for g in gpus]
        for b in self.bookings:
            uuids += [u for u in b.get("gpu_uuids") or [] if u not in uuids]
        self.rows = [
            Row(u, self.labels.get(u) or u, usable.get(u) or self._usable_of(u, gpus))
            for u in uuids
        ]
        self.setFixedHeight(self.sizeHint().height())
        self.updateGeometry()
        self.update()

    @staticmethod
    def _usable_of(uuid: str, gpus: Sequence[GpuView]) -> int:
        for g in gpus:
            if str(g.get("uuid")) == uuid:
                return max(0, int(g.get("total_mib") or 0) - int(g.get("headroom_mib") or 0))
        return 0

    def now(self) -> float:
        """The broker's wall clock now (its last read, moved on by this process's clock)."""
        return self._now_at + (time.monotonic() - self._read_at)

    def sizeHint(self) -> QSize:
        return QSize(480, AXIS_H + ROW_H * max(1, len(self.rows)) + 2)

    def minimumSizeHint(self) -> QSize:
        return QSize(LABEL_W + 120, self.sizeHint().height())

    def owned(self, b: BookingView) -> bool:
        return is_mine(b.get("owner"), self.me)

    def _plot(self) -> QRectF:
        return QRectF(
            LABEL_W, AXIS_H, max(1.0, self.width() - LABEL_W - 1.0), ROW_H * len(self.rows)
        )

    def bars(self) -> list[Bar]:
        """Each booking's bar on each of its GPUs' rows within the next `HOURS` hours, in
        widget coordinates (what `paintEvent` draws and the tool tips find)."""
        plot = self._plot()
        origin = self.now()
        span = HOURS * 3600.0
        out: list[Bar] = []
        for i, row in enumerate(self.rows):
            top = plot.top() + i * ROW_H + 2
            height = ROW_H - 4.0
            placed: list[tuple[float, float, int]] = []
            on_row = [b for b in self.bookings if row.uuid in (b.get("gpu_uuids") or [])]
            for b in sorted(on_row, key=lambda b: float(b.get("start_at") or 0.0)):
                start = max(float(b.get("start_at") or 0.0), origin)
                end = min(float(b.get("end_at") or 0.0), origin + span)
                if end <= start:
                    continue
                mib = max(0, int(b.get("mib") or 0))
                usable = max(1, row.usable_mib)
                below = sum(m for s, e, m in placed if s < end and start < e)
                placed.append((start, end, mib))
                h = height * min(1.0, mib / usable)
                y = top + height - height * min(1.0, (below + mib) / usable)
                x0 = plot.left() + plot.width() * (start - origin) / span
                x1 = plot.left() + plot.width() * (end - origin) / span
                rect = QRectF(x0, max(top, y), max(2.0, x1 - x0), max(2.0, h))
                out.append(Bar(rect, i, b, self.owned(b)))
        return out

    def paintEvent(self, event: Any) -> None:
        p = QPainter(self)
        pal = self.palette()
        plot = self._plot()
        p.fillRect(plot, pal.color(QPalette.ColorRole.Base))
        fm = p.fontMetrics()
        text_pen = QPen(pal.color(QPalette.ColorRole.WindowText))
        grid_pen = QPen(pal.color(QPalette.ColorRole.Mid), 1, Qt.PenStyle.DotLine)
        origin = self.now()
        # hour ticks: each TICK_EVERY_H-th local hour, labelled on the axis
        first = local_time(origin, self.zone).replace(minute=0, second=0, microsecond=0)
        step = 3600.0
        at = first.timestamp() + step
        while at < origin + HOURS * 3600.0:
            hour = local_time(at, self.zone).hour
            if hour % TICK_EVERY_H == 0:
                x = plot.left() + plot.width() * (at - origin) / (HOURS * 3600.0)
                p.setPen(grid_pen)
                p.drawLine(QPointF(x, plot.top()), QPointF(x, plot.bottom()))
                p.setPen(text_pen)
                label = f"{hour:02d}:00"
                p.drawText(QPointF(x - fm.horizontalAdvance(label) / 2, AXIS_H - 4), label)
            at += step
        p.setPen(text_pen)
        for i, row in enumerate(self.rows):
            rect = QRectF(0, plot.top() + i * ROW_H, LABEL_W - 6, ROW_H)
            label = fm.elidedText(clean(row.label), Qt.TextElideMode.ElideRight, LABEL_W - 6)
            p.drawText(
                rect, int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter), label
            )
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        for bar in self.bars():
            color = MINE if bar.mine else THEIRS
            p.setBrush(color if bar.mine else color.lighter(115))
            p.setPen(QPen(color.darker(150), 1.5) if bar.mine else Qt.PenStyle.NoPen)
            p.drawRoundedRect(bar.rect, 2, 2)
        p.setRenderHint(QPainter.RenderHint.Antialiasing, False)
        p.setBrush(Qt.BrushStyle.NoBrush)
        p.setPen(QPen(pal.color(QPalette.ColorRole.Mid), 1))
        for i in range(1, len(self.rows)):
            y = plot.top() + i * ROW_H
            p.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
        p.drawRect(plot)
        p.end()

    def tip_at(self, pos: QPointF) -> str:
        """The plain text of the tool tip at `pos`: the bookings whose bars are under it,
        else those of its row; empty off the rows."""
        lines = [
            booking_line(bar.booking, self.labels, self.now(), bar.mine, self.zone)
            for bar in self.bars()
            if bar.rect.contains(pos)
        ]
        if lines:
            return "\n".join(lines)
        row = int((pos.y() - AXIS_H) // ROW_H)
        if pos.y() < AXIS_H or not 0 <= row < len(self.rows):
            return ""
        uuid = self.rows[row].uuid
        lines = [
            booking_line(b, self.labels, self.now(), self.owned(b), self.zone)
            for b in self.bookings
            if uuid in (b.get("gpu_uuids") or [])
        ]
        return "\n".join(lines) or f"{self.rows[row].label}: no bookings"

    def event(self, e: QEvent) -> bool:
        if e.type() == QEvent.Type.ToolTip and isinstance(e, QHelpEvent):
            text = self.tip_at(QPointF(e.pos()))
            if text:
                QToolTip.showText(e.globalPos(), tool_tip(text), self)
            else:
                QToolTip.hideText()
                e.ignore()
            return True
        return super().event(e)


class BookingsPanel(QWidget):
    """The timeline, the zone its hours are in, and a line per booking (yours first)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(4)
        self.timeline = BookingsTimeline()
        self.legend = PlainLabel()
        self.legend.setStyleSheet("color: palette(dark);")
        self.list = PlainLabel()
        self.list.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.timeline)
        layout.addWidget(self.legend)
        layout.addWidget(self.list)
        layout.addStretch(1)

    def set_bookings(self, listing: BookingsListResult, gpus: Sequence[GpuView], me: str) -> None:
        tl = self.timeline
        tl.set_bookings(listing, gpus, me)
        now = tl.now()
        self.legend.setText(
            f"Next {HOURS} hours, times in {zone_name(tl.zone)}; bar height: share of the "
            "GPU's usable MiB booked; yours outlined in blue, others' in orange."
        )
        mine = [b for b in tl.bookings if tl.owned(b)]
        others = [b for b in tl.bookings if not tl.owned(b)]
        self.list.setText(
            "\n".join(booking_line(b, tl.labels, now, tl.owned(b), tl.zone) for b in mine + others)
        )

    def text(self) -> str:
        """The bookings as the list under the timeline names them (plain text)."""
        return self.list.text()
