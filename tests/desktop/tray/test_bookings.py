"""Bookings in the tray (issue 41) on a real Qt event loop (offscreen): This computer's 24-hour
timeline per GPU and its list, fed by a real simulated broker process, and the notices at a
booking of mine's start and lapse and for a `booking_notice` addressed to me. A broker
process runs on the real clock: its config makes the claim grace short, so a booking booked
to start in a few seconds starts and lapses while the test waits. Other users' bookings and
names with markup or control codes are fed to the timeline and the notifier directly."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QPointF
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

import rbroker
from rbroker.tray.app import TrayApp
from rbroker.tray.bookings import MINE, THEIRS, BookingsPanel, Row
from rbroker.tray.notices import Notifier
from rbroker.tray.plain import tool_tip
from rbroker_protocol.results import BookingsListResult, BookingView, GpuView
from tests.conftest import GPU0, GPU1, BrokerProcess, gpu, scenario

TIMEOUT_MS = 20_000
TWO_24G = scenario(gpu(GPU0, name="Simulated RTX 4090"), gpu(GPU1, name="Simulated RTX 4090"))
USABLE = 24576 - 1229


def _book(
    c: rbroker.Client, uuid: str, mib: int, start_in_s: float, for_s: float, **kw: str
) -> str:
    now = time.time()
    desc = {"project": "vision", "session": "s", "purpose": "fine-tune ViT-B", **kw}
    view = c.book(
        mib=mib, start_at=now + start_in_s, end_at=now + start_in_s + for_s, gpu_uuid=uuid, **desc
    )
    return view["booking_id"]


def _color_at(widget: Any, point: QPointF) -> int:
    """The RGB of the pixel the widget paints at `point`."""
    image: QImage = widget.grab().toImage()
    return int(image.pixelColor(point.toPoint()).rgb())


def test_the_timeline_paints_a_row_per_gpu_with_its_booking(
    qtbot: QtBot, broker_factory: Callable[..., BrokerProcess], make_tray: Callable[..., TrayApp]
) -> None:
    broker = broker_factory(TWO_24G)
    with broker.client() as c:
        first = _book(c, GPU0, 16000, 2 * 3600, 4 * 3600)
        second = _book(c, GPU1, 8000, 6 * 3600, 3 * 3600, purpose="eval <b>bold</b> & <i>x</i>")
        me = c.hello()["owner"]
    tray = make_tray(broker.socket, show_window=True)
    tray.window.resize(1180, 860)
    local = tray.window.local
    panel = local.bookings
    qtbot.waitUntil(lambda: len(panel.timeline.bars()) == 2, timeout=TIMEOUT_MS)
    timeline = panel.timeline
    assert [(r.label, r.usable_mib) for r in timeline.rows] == [
        ("GPU 0", USABLE),
        ("GPU 1", USABLE),
    ]
    bars = {bar.booking["booking_id"]: bar for bar in timeline.bars()}
    assert (bars[first].row, bars[second].row) == (0, 1)
    assert bars[first].mine and bars[second].mine
    # positioned by time: the second starts 4 h after the first; heights by share of usable MiB
    hour = timeline._plot().width() / 24
    assert abs(bars[second].rect.left() - bars[first].rect.left() - 4 * hour) < 2
    assert abs(bars[first].rect.width() - 4 * hour) < 2
    ratio = bars[second].rect.height() / bars[first].rect.height()
    assert abs(ratio - 8000 / 16000) < 0.1
    for bar in bars.values():  # painted: the bar's middle has my colour
        assert _color_at(timeline, bar.rect.center()) == MINE.rgb()
    lines = panel.text().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(
        f"{first} · {me} · vision · fine-tune ViT-B · 16 000 MiB on GPU 0 · "
    )
    assert lines[1].startswith(
        f"{second} · {me} · vision · eval <b>bold</b> & <i>x</i> · 8 000 MiB on GPU 1 · "
    )
    assert all(line.endswith(" · booked · yours") for line in lines)
    assert local.bookings_box.title() == "Bookings (2)"
    assert second in timeline.tip_at(bars[second].rect.center())
    assert "times in " in panel.legend.text()


def _view(booking_id: str, owner: str, uuid: str, mib: int, start: float, **kw: Any) -> BookingView:
    view: dict[str, Any] = {
        "booking_id": booking_id,
        "owner": owner,
        "project": "p",
        "session": "s",
        "purpose": "q",
        "mib": mib,
        "gpu_uuids": [uuid],
        "start_at": start,
        "end_at": start + 3 * 3600,
        "created_at": start - 60,
        "state": "booked",
        "claims": [],
        "claimed_mib": 0,
        "claim_until": None,
        "ended_reason": "",
        "ended_at": 0.0,
        **kw,
    }
    return view  # type: ignore[return-value]


def test_other_users_bookings_and_hostile_names_show_as_text(qtbot: QtBot) -> None:
    now = time.time()
    hostile = "<img src=x width=20000 height=20000> <b>R&D</b>\x1b[31m\u202eevil\nline"
    listing: BookingsListResult = {
        "bookings": [
            _view("book-aaaa", "alice", GPU0, 12000, now + 3600, project=hostile),
            _view("book-bbbb", "bob\x07<a href='x'>", GPU1, 20000, now + 7200, purpose=hostile),
        ],
        "now_at": now,
        "usable_mib": {GPU0: USABLE, GPU1: USABLE},
    }
    gpus: list[GpuView] = [
        {"uuid": GPU0, "index": 0},  # type: ignore[typeddict-item]
        {"uuid": GPU1, "index": 1},  # type: ignore[typeddict-item]
    ]
    panel = BookingsPanel()
    qtbot.addWidget(panel)
    panel.resize(900, 300)
    panel.set_bookings(listing, gpus, "alice")
    panel.show()
    qtbot.waitExposed(panel)
    timeline = panel.timeline
    assert timeline.rows == [Row(GPU0, "GPU 0", USABLE), Row(GPU1, "GPU 1", USABLE)]
    mine, theirs = timeline.bars()
    assert (mine.mine, theirs.mine) == (True, False)
    assert _color_at(timeline, mine.rect.center()) == MINE.rgb()
    assert _color_at(timeline, theirs.rect.center()) == THEIRS.lighter(115).rgb()
    shown = "<img src=x width=20000 height=20000> <b>R&D</b>[31mevil line"
    assert panel.text().splitlines() == [
        f"book-aaaa · alice · {shown} · q · 12 000 MiB on GPU 0 · "
        + panel.text().splitlines()[0].split(" · ")[5]
        + " · booked · yours",
        f"book-bbbb · bob<a href='x'> · p · {shown} · 20 000 MiB on GPU 1 · "
        + panel.text().splitlines()[1].split(" · ")[5]
        + " · booked",
    ]
    assert "\x1b" not in panel.text() and "\u202e" not in panel.text()
    assert panel.list.textFormat().name == "PlainText"
    tip = timeline.tip_at(theirs.rect.center())
    assert tip.startswith("book-bbbb · bob<a href='x'> · p · <img")
    assert tool_tip(tip).startswith("<p style='white-space:pre'>book-bbbb · bob&lt;a href='x'&gt;")
    assert timeline.tip_at(QPointF(5, 2)) == ""  # the hours' axis
    QApplication.processEvents()


def _notices(me: str) -> tuple[Notifier, list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    notifier = Notifier(me=me)
    notifier.notice.connect(lambda title, text: seen.append((title, text)))
    return notifier, seen


def test_only_my_bookings_and_notices_to_me_are_announced_once(qtbot: QtBot) -> None:
    from rbroker.tray.state import Snapshot

    notifier, seen = _notices("alice")
    for owner in ("bob", "alice"):
        for state in ("booked", "held", "lapsed", "held", "lapsed"):
            notifier.on_event(
                "booking",
                {
                    "booking_id": f"book-{owner}",
                    "owner": owner,
                    "state": state,
                    "ended_reason": "not claimed within 15 min" if state == "lapsed" else "",
                },
            )
    notice = {
        "booking_id": "book-bob",
        "owner": "bob",
        "notice": "overlaps",
        "lease_id": "lease-1",
        "start_at": 0.0,
        "end_at": 1.0,
    }
    notifier.on_event("booking_notice", {**notice, "to": "bob", "message": "to bob"})
    notifier.on_event("booking_notice", {**notice, "to": "alice", "message": "your lease <b>"})
    notifier.on_event("booking_notice", {**notice, "to": "alice", "message": "your lease <b>"})
    now = time.time()
    held = _view("book-alice", "alice", GPU0, 1, now - 5, state="held", claim_until=now + 895)
    notifier.on_snapshot(Snapshot(bookings={"bookings": [held], "now_at": now, "usable_mib": {}}))
    assert seen == [
        ("rbroker: booking lapsed", "your booking book-alice lapsed: not claimed within 15 min"),
        ("rbroker: booking", "your lease <b>"),
        (
            "rbroker: booking started",
            "your booking book-alice has started: claim it with rbroker run --booking "
            "book-alice within 15 min",
        ),
    ]


def test_my_booking_start_lapse_and_notice_are_toasts(
    qtbot: QtBot,
    broker_factory: Callable[..., BrokerProcess],
    make_tray: Callable[..., TrayApp],
    tmp_path: Path,
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("[bookings]\nclaim_grace_s = 3\n")
    broker = broker_factory(extra_args=["--config", str(config)])
    tray = make_tray(broker.socket)
    qtbot.waitUntil(lambda: tray.snapshot is not None, timeout=TIMEOUT_MS)
    with rbroker.lease(
        20000, project="vision", session="early", purpose="before the booking", socket=broker.socket
    ):
        with broker.client() as c:
            # my lease leaves the booking less room at its start: told ahead (may_wait, overlaps)
            booking_id = _book(c, GPU0, 16000, 4, 3600)
        titles = lambda: [t for t, _ in tray.notices]  # noqa: E731
        qtbot.waitUntil(lambda: "rbroker: booking lapsed" in titles(), timeout=TIMEOUT_MS)
        qtbot.wait(1000)  # nothing more comes: each once
    told = [(t, x) for t, x in tray.notices if t.startswith("rbroker: booking")]
    started = [x for t, x in told if t == "rbroker: booking started"]
    assert len(started) == 1
    assert started[0].startswith(
        f"your booking {booking_id} has started: claim it with rbroker run --booking {booking_id}"
    )
    assert [x for t, x in told if t == "rbroker: booking lapsed"] == [
        f"your booking {booking_id} lapsed: not claimed within 3 s"
    ]
    messages = [x for t, x in told if t == "rbroker: booking"]
    assert messages and all(booking_id in m for m in messages)
    assert len(messages) == len(set(messages))
    assert [t for t, _ in told].index("rbroker: booking") < [t for t, _ in told].index(
        "rbroker: booking started"
    )
