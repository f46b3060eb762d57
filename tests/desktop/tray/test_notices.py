"""Tray notifications on a real Qt event loop (offscreen), fed by a real simulated broker
process and real holder processes: a waiting request of mine granted, a lease of mine over
its grant (once per episode), the broker gone (once per outage)."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
from pytestqt.qtbot import QtBot

from rbroker.tray.app import TrayApp
from rbroker.tray.notices import Notifier, my_user
from rbroker.tray.state import Snapshot
from tests.conftest import BrokerProcess
from tests.desktop.conftest import WorkerProcess

TIMEOUT_MS = 20_000


def _titles(tray: TrayApp) -> list[str]:
    return [title for title, _ in tray.notices]


def test_my_waiting_request_granted_is_announced(
    qtbot: QtBot,
    broker: BrokerProcess,
    make_tray: Callable[[str], TrayApp],
    worker: Callable[..., WorkerProcess],
) -> None:
    tray = make_tray(broker.socket)
    first = worker("hold_lease", broker.socket, "20000", "first", "0")
    assert first.read_line().startswith("granted ")
    qtbot.waitUntil(lambda: tray.snapshot is not None and len(tray.snapshot.leases) == 1)
    second = worker("hold_lease", broker.socket, "10000", "second", "60")
    qtbot.waitUntil(lambda: tray.snapshot is not None and len(tray.snapshot.queue) == 1)
    qtbot.wait(1200)  # it waits over a second
    first.stop()  # its lease ends: the waiting request is granted
    assert second.read_line().startswith("granted ")
    qtbot.waitUntil(lambda: "rbroker: granted" in _titles(tray), timeout=TIMEOUT_MS)
    (text,) = [t for title, t in tray.notices if title == "rbroker: granted"]
    assert text.startswith("tests / second: 10 000 MiB granted after waiting ")
    assert "rbroker: granted" not in _titles(tray)[:-1]  # the first, granted at once: none


def test_my_lease_over_its_grant_is_announced_once(
    qtbot: QtBot,
    broker_factory: Callable[..., BrokerProcess],
    make_tray: Callable[[str], TrayApp],
    worker: Callable[..., WorkerProcess],
) -> None:
    broker = broker_factory(extra_args=["--over-grant-grace", "0.5"])
    tray = make_tray(broker.socket)
    qtbot.waitUntil(lambda: tray.snapshot is not None)
    holder = worker("over_grant_holder", broker.socket, "4096", "6000", "warn")
    qtbot.waitUntil(lambda: "rbroker: over its grant" in _titles(tray), timeout=TIMEOUT_MS)
    text = dict(tray.notices)["rbroker: over its grant"]
    assert text == (
        "tests / over uses 1 904 MiB more than its grant of 4 096 MiB (rbroker does not stop it)"
    )
    qtbot.wait(2000)  # the holder stays over its grant: no second notice
    assert _titles(tray).count("rbroker: over its grant") == 1
    holder.stop()


def test_the_broker_going_away_is_announced_once(
    qtbot: QtBot, broker: BrokerProcess, make_tray: Callable[[str], TrayApp]
) -> None:
    tray = make_tray(broker.socket)
    qtbot.waitUntil(lambda: tray.snapshot is not None)
    assert "rbroker: the broker went away" not in _titles(tray)
    broker.stop()
    qtbot.waitUntil(lambda: "rbroker: the broker went away" in _titles(tray), timeout=TIMEOUT_MS)
    qtbot.wait(1500)  # the link keeps retrying: still one notice
    assert _titles(tray).count("rbroker: the broker went away") == 1


def test_other_users_leases_and_leases_granted_at_once_are_not_announced(qtbot: QtBot) -> None:
    seen: list[tuple[str, str]] = []
    notifier = Notifier(me="alice")
    notifier.notice.connect(lambda title, text: seen.append((title, text)))

    def snap(*leases: dict[str, object]) -> Snapshot:
        return Snapshot(gpus=[], leases=list(leases), queue=[], status={}, jobs=[])

    base = {"project": "p", "session": "s", "granted_mib": 1024, "over_grant_mib": 10}
    notifier.on_snapshot(snap())
    notifier.on_snapshot(
        snap(
            {**base, "lease_id": "a", "owner": "bob", "waited_s": 30.0},
            {**base, "lease_id": "b", "owner": "alice", "waited_s": 0.2},
            {**base, "lease_id": "c", "owner": "bob", "over_grant_noticed": True},
        )
    )
    assert seen == []
    over = {**base, "lease_id": "b", "owner": "alice", "waited_s": 0.2}
    notifier.on_snapshot(snap({**over, "over_grant_noticed": True}))
    notifier.on_snapshot(snap({**over, "over_grant_noticed": True}))
    notifier.on_snapshot(snap({**over, "over_grant_noticed": False}))  # episode over
    notifier.on_snapshot(snap({**over, "over_grant_noticed": True}))  # a new one
    assert [t for t, _ in seen] == ["rbroker: over its grant"] * 2
    assert my_user()  # this OS user's name, as the broker names owners
    assert sys.platform != "win32" or "\\" not in my_user()


@pytest.mark.parametrize("owner", ["CORP\\Alice", "alice"])
def test_windows_owner_names_match_the_user(qtbot: QtBot, owner: str) -> None:
    seen: list[str] = []
    notifier = Notifier(me="alice")
    notifier.notice.connect(lambda title, text: seen.append(title))
    notifier.on_snapshot(Snapshot(gpus=[], leases=[], queue=[], status={}, jobs=[]))
    lease = {"lease_id": "x", "owner": owner, "waited_s": 5.0, "granted_mib": 1}
    notifier.on_snapshot(Snapshot(gpus=[], leases=[lease], queue=[], status={}, jobs=[]))
    assert seen == ["rbroker: granted"]


def test_an_idle_notice_of_my_lease_is_a_toast(qtbot: QtBot) -> None:
    """Issue 42: each `idle_notice` of a lease of mine is shown (the broker tells each once
    per idle episode); another user's is not."""
    seen: list[tuple[str, str]] = []
    notifier = Notifier(me="alice")
    notifier.notice.connect(lambda title, text: seen.append((title, text)))
    base = {"lease_id": "lease-1", "project": "nlp", "idle_s": 1800.0}
    notifier.on_event("idle_notice", {**base, "owner": "bob", "notice": "idle", "message": "b"})
    for kind in ("idle", "reclaim_soon", "reclaimed"):
        notifier.on_event(
            "idle_notice", {**base, "owner": "alice", "notice": kind, "message": kind}
        )
    assert seen == [
        ("rbroker: idle lease", "idle"),
        ("rbroker: idle lease reclaimed soon", "reclaim_soon"),
        ("rbroker: idle lease reclaimed", "reclaimed"),
    ]
