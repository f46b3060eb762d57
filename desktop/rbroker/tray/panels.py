"""Building blocks of the main window's tabs: sortable record tables, titled boxes with an
"empty" line, and the grid of GPU cards.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QSortFilterProxyModel, Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QGridLayout,
    QGroupBox,
    QHeaderView,
    QLabel,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from rbroker.tray.models import SORT_ROLE, GpuRow, RecordTableModel
from rbroker.tray.plain import PlainLabel
from rbroker.tray.widgets import GpuCard


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
    empty = PlainLabel(empty_text)
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
        self.empty = PlainLabel("No GPUs reported.")
        self.empty.setStyleSheet("color: palette(mid);")
        self.grid.addWidget(self.empty, 0, 0)

    def set_gpus(self, gpus: Sequence[GpuRow]) -> None:
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


def gpu_labels(gpus: Sequence[GpuRow]) -> dict[str, str]:
    return {str(g.get("uuid")): f"GPU {g.get('index', '?')}" for g in gpus}
