"""Text from other users and computers reaches the tray as plain text, never as markup.

Project, session, purpose, job, owner, computer and GPU names, reasons and messages are
written by other people (or a coordinator, or a broker of another version). Qt reads a label's
or a tool tip's text as HTML when it looks like HTML: `<img width=20000 height=20000>` as a
name once made a tray grow to several GiB and freeze, and `<a>`/`<b>` showed as a link and in
bold. Here hostile names go through the tray's real code (the link's signals, the fleet
feed, the Settings tab) into its window, menu, tool tips and notices, and then every widget,
action and table cell is read back.
"""

from __future__ import annotations

import html
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from PySide6.QtCore import QAbstractItemModel
from PySide6.QtGui import QAction, Qt, QTextDocument, QTextFormat
from PySide6.QtWidgets import QAbstractItemView, QApplication, QLabel, QSystemTrayIcon, QWidget
from pytestqt.qtbot import QtBot

from rbroker.tray import notification_server
from rbroker.tray.app import TrayApp
from rbroker.tray.fleet import StaticFleet
from rbroker.tray.notices import my_user
from rbroker.tray.plain import WORD_JOINER
from rbroker.tray.settings import TraySettings
from rbroker.tray.state import Snapshot

pytestmark = pytest.mark.contract  # it starts processes or servers of its own

TIMEOUT_MS = 10_000

IMG = "<img src=x width=20000 height=20000>"
BOLD = "<b>bold</b>"
LINK = "<a href='x'>link</a>"
MNEMONIC = "&File"
ANSI = "\x1b[31mred\x1b[0m"
RLO = "abc\u202edef"
HOSTILE = (IMG, BOLD, LINK, MNEMONIC, ANSI, RLO)
"""Names as another user may write them: an image, bold, a link, a menu mnemonic, a terminal
colour and a right-to-left override."""

MARKUP = ("<img", "<b>", "<a ")
"""What a hostile name's markup looks like when it is shown as the text it is."""


def _name(i: int) -> str:
    return HOSTILE[i % len(HOSTILE)] + f" {i}"


def _gpu(i: int, telemetry: str = "ok") -> dict[str, Any]:
    return {
        "uuid": f"GPU-{i}{IMG}",
        "index": i,
        "name": _name(i),
        "total_mib": 24576,
        "available_mib": 8000,
        "headroom_mib": 1229,
        "leased_in_use_mib": 100,
        "outstanding_mib": 100,
        "other_in_use_mib": 100,
        "leases": 1,
        "telemetry": telemetry,
        "telemetry_reason": f"{IMG} {BOLD} {ANSI} {RLO}",
    }


def _lease(i: int, owner: str) -> dict[str, Any]:
    return {
        "lease_id": f"lease-{i}",
        "owner": owner,
        "project": _name(i),
        "session": _name(i + 1),
        "purpose": _name(i + 2),
        "granted_mib": 1024,
        "gpu_uuid": f"GPU-0{IMG}",
        "gpu_uuids": [f"GPU-0{IMG}", LINK],
        "state": BOLD,
        "granted_at": time.time() - 5,
        "expires_in_s": 60,
        "waited_s": 5.0,
        "over_grant_noticed": True,
        "over_grant_mib": 10,
        "observed_mib": {"1": 100},
        "idle_state": ("idle", "unknown", "active")[i % 3],  # the state cell's tool tips
        "idle_s": 7800.0,
    }


def _job(i: int) -> dict[str, Any]:
    return {
        "job_id": f"job-{i}",
        "project": _name(i),
        "purpose": _name(i + 1),
        "handler": _name(i + 2),
        "state": _name(i + 3),
        "workers": 2,
        "completed_items": 1,
        "failed_items": 0,
        "total_items": 4,
    }


def _snapshot(mine: bool) -> Snapshot:
    leases = [_lease(i, _name(i)) for i in range(len(HOSTILE))]
    if mine:  # a lease of this user's, so the notices name its hostile project and session
        leases.append(_lease(99, my_user()) | {"project": IMG + MNEMONIC, "session": RLO + ANSI})
    return Snapshot(
        gpus=[_gpu(0, telemetry=f"{BOLD}{MNEMONIC}{ANSI}"), _gpu(1)],
        leases=leases,
        queue=[
            {
                "request_id": i,
                "owner": _name(i),
                "project": _name(i + 1),
                "session": _name(i + 2),
                "purpose": _name(i + 3),
                "mib": 512,
                "gpus": 1,
                "gpu_uuid": f"GPU-0{IMG}",
                "waiting_s": 3,
                "ahead": 0,
                "reason": f"waiting: {_name(i)}",
            }
            for i in range(len(HOSTILE))
        ],
        jobs=[_job(i) for i in range(len(HOSTILE))],
        status={
            "version": IMG,
            "telemetry_source": LINK,
            "uptime_s": 5,
            "paused": True,
            "coordinator": {
                "link": f"error: {BOLD}",
                "computer_id": MNEMONIC,
                "url": LINK,
                "detail": f"{IMG} {ANSI} {RLO}",
            },
        },
    )


def _computers() -> list[dict[str, Any]]:
    return [
        {
            "computer_id": f"c{i}",
            "name": _name(i),
            "freshness": "stale",
            "last_seen_age_s": 400,
            "gpus": [_gpu(i), _gpu(i + 1, telemetry=_name(i))],
            "leases": [_lease(i, _name(i))],
            "jobs": [_job(i)],
        }
        for i in range(len(HOSTILE))
    ]


# -- what is checked -----------------------------------------------------------------------------
def _no_controls(text: str, where: str) -> None:
    """No terminal escape, bidi override or other control or format character (newlines are
    the tray's own line breaks in multi-line tool tips and notices)."""
    bad = [
        f"U+{ord(ch):04X}"
        for ch in text
        if ch != "\n" and unicodedata.category(ch) in {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}
    ]
    assert not bad, f"{where}: {bad} in {text!r}"


def _safe_rich(text: str, where: str) -> None:
    """`text` as Qt shows it where it detects rich text: plain, or rich text in which every
    character is literal text (no image, link or bold), and small."""
    _no_controls(text, where)
    if not Qt.mightBeRichText(text):
        return
    doc = QTextDocument()
    doc.setHtml(text)
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fmt = it.fragment().charFormat()
            assert not fmt.isImageFormat(), f"{where}: an image in {text!r}"
            assert fmt.objectType() == QTextFormat.ObjectTypes.NoObject, f"{where}: {text!r}"
            assert not fmt.isAnchor(), f"{where}: a link in {text!r}"
            assert fmt.fontWeight() <= 400, f"{where}: bold in {text!r}"
            it += 1
        block = block.next()
    size = doc.size()
    assert size.width() < 3000 and size.height() < 3000, f"{where}: {size} for {text!r}"


def _no_mnemonic(text: str, where: str) -> None:
    """A menu entry's text (which menus draw as plain text): every `&` doubled, so none
    underlines the next letter."""
    assert "&" not in text.replace("&&", ""), f"{where}: a mnemonic in {text!r}"


def _models(root: QWidget) -> Iterator[tuple[str, QAbstractItemModel]]:
    for view in root.findChildren(QAbstractItemView):
        model = view.model()
        if model is not None:
            yield f"{type(view).__name__} {view.objectName() or id(view)}", model


def _walk(tray: TrayApp, seen: set[str]) -> None:
    """Every widget's text, tool tip and title, every action, every table cell: plain. The
    hostile names that were shown are noted in `seen` (so the test knows they got there)."""
    for w in QApplication.allWidgets():
        where = f"{type(w).__name__} {w.objectName()!r}"
        _safe_rich(w.windowTitle(), f"{where} title")
        _safe_rich(w.toolTip(), f"{where} tool tip")
        if isinstance(w, QLabel):
            text = w.text()
            if any(m in text for m in ("20000", "bold", "link", "File", "red")):
                seen.add(text)
                assert w.textFormat() == Qt.TextFormat.PlainText, f"{where}: {text!r}"
            _no_controls(text, where)
            hint = w.sizeHint()
            assert hint.width() < 5000 and hint.height() < 3000, f"{where}: {hint} for {text!r}"
        for action in w.actions():
            _no_mnemonic(action.text(), f"{where} action")
            _no_controls(action.text(), f"{where} action")
            _safe_rich(action.toolTip(), f"{where} action tool tip")
    for action in tray.menu.findChildren(QAction):
        _no_mnemonic(action.text(), "menu")
        _no_controls(action.text(), "menu")
        _safe_rich(action.toolTip(), "menu tool tip")
    assert tray.tray is not None
    tip = tray.tray.toolTip()  # plain everywhere: word joiners keep Qt from seeing tags
    assert not Qt.mightBeRichText(tip), tip
    _no_controls(tip.replace("\u2060", ""), "tray icon tool tip")
    for where, model in [*_models(tray.window)]:
        for r in range(model.rowCount()):
            for c in range(model.columnCount()):
                index = model.index(r, c)
                display = str(model.data(index, Qt.ItemDataRole.DisplayRole) or "")
                if any(m in display for m in MARKUP):
                    seen.add(display)
                _no_controls(display, f"{where} ({r}, {c})")
                tip = model.data(index, Qt.ItemDataRole.ToolTipRole)
                _safe_rich(str(tip or ""), f"{where} ({r}, {c}) tool tip")


@pytest.fixture
def tray(qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TrayApp]:
    """A tray app with a tray icon (the offscreen platform has none), not started: the test
    feeds its link's signals itself. Its notifications are recorded, not shown."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setattr(QSystemTrayIcon, "isSystemTrayAvailable", staticmethod(lambda: True))
    monkeypatch.setattr(QSystemTrayIcon, "supportsMessages", staticmethod(lambda: True))
    app = TrayApp(str(tmp_path / "none.sock"), TraySettings(), fleet=StaticFleet(_computers()))
    qtbot.addWidget(app.window)
    yield app
    app.shutdown()


def test_names_from_others_reach_every_widget_as_plain_text(
    qtbot: QtBot, tray: TrayApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tray.tray is not None
    shown: list[tuple[str, str]] = []
    monkeypatch.setattr(
        tray.tray, "showMessage", lambda title, text, *_: shown.append((title, text))
    )

    tray.link.snapshot.emit(_snapshot(mine=False))
    tray.link.snapshot.emit(_snapshot(mine=True))  # a new lease of mine: a notice names it
    tray.link.command_failed.emit("broker.pause", f"{IMG} {RLO}")
    tray.broker_failed.emit(f"{BOLD} {ANSI}")
    tray.fleet_feed.refresh()
    fleet = tray.window.fleet
    qtbot.waitUntil(lambda: fleet.computers.rowCount() == len(HOSTILE), timeout=TIMEOUT_MS)
    fleet.computers_view.selectRow(1)
    tab = tray.window.settings_tab
    config = SimpleNamespace(
        url=LINK, group=BOLD, name=IMG, computer_id=RLO, key_backend="file", ca_file=ANSI
    )
    tab.set_enrollment(config, keyring_ok=False, why=IMG)  # type: ignore[arg-type]
    tray.enroll_finished.emit(False, f"{LINK} {MNEMONIC}")

    seen: set[str] = set()
    _walk(tray, seen)
    for title, text in [*shown, *tray.notices]:  # but the word joiners that keep tags inert
        _no_controls(title + text.replace(WORD_JOINER, ""), "notice")
    assert len(shown) >= 2
    # no notification server reads markup here: the tags reach it inert (word joiners)
    assert any(f"<{WORD_JOINER}img src=x width=20000" in text for _, text in shown)
    assert not any(Qt.mightBeRichText(text) for _, text in shown)

    tray.link.disconnected.emit(f"{IMG} {ANSI} {RLO}")  # the broker went away
    _walk(tray, seen)
    for title, text in [*shown, *tray.notices]:  # but the word joiners that keep tags inert
        _no_controls(title + text.replace(WORD_JOINER, ""), "notice")
    # the names got there, as the text they are
    assert any(IMG in s for s in seen) and any(BOLD in s for s in seen)
    assert any(LINK in s for s in seen) and any("red" in s for s in seen)

    tray.window.show()
    qtbot.waitExposed(tray.window)
    hint = tray.window.sizeHint()
    assert hint.width() < 5000 and hint.height() < 5000, hint


def test_the_helpers_keep_text_as_written_and_drop_only_controls() -> None:
    from rbroker.tray.plain import WORD_JOINER, clean, clean_lines, menu_text, tool_tip, tray_tip

    assert clean("vision / run-42") == "vision / run-42"  # the usual case, untouched
    assert clean(ANSI) == "[31mred[0m"  # ESC goes, the rest stays as text
    assert clean(RLO) == "abcdef" and clean("a\tb\nc") == "a b c"
    assert clean_lines("GPU 0: a\x1b\nGPU 1: b\u200b") == "GPU 0: a\nGPU 1: b"
    assert tool_tip("2 048 MiB granted\nGPU 0") == "2 048 MiB granted\nGPU 0"
    assert tool_tip(BOLD) == "<p style='white-space:pre'>&lt;b&gt;bold&lt;/b&gt;</p>"
    assert tool_tip("&lt;b&gt;") == "<p style='white-space:pre'>&amp;lt;b&amp;gt;</p>"
    for text in (IMG, BOLD, LINK, "&lt;b&gt;", "x\n" + IMG):
        assert not Qt.mightBeRichText(tray_tip(text))
        assert tray_tip(text).replace(WORD_JOINER, "") == clean_lines(text)
    assert tray_tip("rbroker: no leases") == "rbroker: no leases"
    assert menu_text("R&D " + MNEMONIC) == "R&&D &&File"


def test_a_notification_server_that_reads_markup_gets_the_body_escaped(
    tray: TrayApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tray.tray is not None
    shown: list[tuple[str, str]] = []
    monkeypatch.setattr(
        tray.tray, "showMessage", lambda title, text, *_: shown.append((title, text))
    )
    monkeypatch.setattr(notification_server, "reads_markup", lambda: True)
    tray._markup = None  # asked again
    tray.notify(f"lease of {IMG}", f"{IMG} & {BOLD}")
    assert shown == [(f"lease of {IMG}", html.escape(f"{IMG} & {BOLD}", quote=False))]
    assert tray.notices[-1] == (f"lease of {IMG}", f"{IMG} & {BOLD}")  # kept as written
