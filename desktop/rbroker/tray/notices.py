"""Desktop notifications for the moments a person waits for (docs/architecture.md §9): a
waiting request of mine was granted, a lease of mine went over its grant, the broker went
away. Worked out from the link's snapshots and its `disconnected` signal; the controller
shows them (`TrayApp.notify`).

- **Granted**: a lease of mine that was not in the previous snapshot and waited at least
  `GRANT_NOTICE_MIN_WAIT_S` in the queue (a grant that came at once needs no notice). The
  first snapshot after (re)connecting only records what is there.
- **Over its grant**: a lease of mine the broker reported (`over_grant_noticed`: over its
  grant for longer than the broker's grace), once per episode: again only after the lease
  was back inside its grant.
- **Broker went away**: once when a connected link loses the broker, again only after it
  came back.
- **Bookings** (docs/architecture.md §2a), from the link's `booking_event`s: a booking of mine
  started (`held`: claim it with `rbroker run --booking ID` within the time left, as the
  snapshot read right after the event says it), a booking of mine lapsed (the broker's
  reason: not claimed within its grace), and each `booking_notice` addressed to me (its
  `message`). Each once per booking (per notice and lease): a broker restarted, or a claim
  ended before the booking's end, holds it again without a second notice.
- **Idle** (docs/architecture.md §3 "Idle"), from the link's `idle_notice` events: a lease of
  mine became idle, will be reclaimed in 10 min, or was reclaimed (its `message`); the broker
  tells each once per idle episode, so each is shown as it comes.
"""

from __future__ import annotations

import getpass
import math
import os
import sys
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from typing import Any

from PySide6.QtCore import QObject, Signal

from rbroker.base.display import fmt_mib
from rbroker.base.when import fmt_duration
from rbroker.tray.state import Snapshot
from rbroker_protocol.results import BookingView, ListedLease

IDLE_TITLES = {
    "idle": "rbroker: idle lease",
    "reclaim_soon": "rbroker: idle lease reclaimed soon",
    "reclaimed": "rbroker: idle lease reclaimed",
}
"""The title of an idle notice's toast, by its `notice`."""

GRANT_NOTICE_MIN_WAIT_S = 1.0
"""A grant is announced when its request waited at least this long (seconds)."""

TOLD_KEPT = 1000
"""How many booking notices given are remembered (so each is given once)."""


def my_user() -> str:
    """This process's OS user name, as the broker names lease owners (`pwd` on POSIX; the
    uid as a number where the passwd database has no entry for it, as the broker does)."""
    if sys.platform != "win32":
        import pwd

        try:
            return pwd.getpwuid(os.getuid()).pw_name
        except KeyError:
            return str(os.getuid())
    return getpass.getuser()


def is_mine(owner: object, me: str) -> bool:
    """`owner` (a lease's or booking's owner, a notice's `to`) names the user `me` (on
    Windows also as `DOMAIN\\me`, in any case)."""
    name = str(owner or "")
    return name == me or name.rsplit("\\", 1)[-1].lower() == me.lower()


def _mib(value: Any) -> str:
    return fmt_mib(int(value or 0))


def _who(lease: ListedLease) -> str:
    return f"{lease.get('project', '')} / {lease.get('session', '')}"


class Notifier(QObject):
    """Turns snapshots into notices. Signal `notice(title, text)`; slots `on_snapshot`,
    `on_disconnected`. `me`: whose leases count as mine (default: this OS user)."""

    notice = Signal(str, str)

    def __init__(self, me: str | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.me = me if me is not None else my_user()
        self._known: set[str] | None = None  # my lease ids in the previous snapshot
        self._over_told: set[str] = set()
        self._connected = False
        self._told: OrderedDict[Hashable, None] = OrderedDict()  # booking notices given
        self._starting: list[str] = []  # my bookings started: told with the next snapshot

    def on_snapshot(self, snap: Snapshot) -> None:
        """A fresh read of the broker: announce new grants and new over-grant episodes."""
        self._connected = True
        mine = [x for x in snap.leases if is_mine(x.get("owner"), self.me)]
        ids = {str(x.get("lease_id")) for x in mine}
        if self._known is not None:
            for lease in mine:
                if str(lease.get("lease_id")) in self._known:
                    continue
                waited = float(lease.get("waited_s") or 0.0)
                if waited >= GRANT_NOTICE_MIN_WAIT_S:
                    self.notice.emit(
                        "rbroker: granted",
                        f"{_who(lease)}: {_mib(lease.get('granted_mib'))} MiB granted "
                        f"after waiting {waited:.0f} s",
                    )
        self._known = ids
        for lease in mine:
            lease_id = str(lease.get("lease_id"))
            if not lease.get("over_grant_noticed"):
                self._over_told.discard(lease_id)
            elif lease_id not in self._over_told:
                self._over_told.add(lease_id)
                self.notice.emit(
                    "rbroker: over its grant",
                    f"{_who(lease)} uses {_mib(lease.get('over_grant_mib'))} MiB more than its "
                    f"grant of {_mib(lease.get('granted_mib'))} MiB (rbroker does not stop it)",
                )
        self._over_told &= ids
        self._tell_started(snap)

    # -- bookings ------------------------------------------------------------------------------
    def on_event(self, kind: str, data: Mapping[str, Any]) -> None:
        """A `booking`, `booking_notice` or `idle_notice` event (the link's `booking_event`)."""
        if kind == "idle_notice":
            if is_mine(data.get("owner"), self.me):
                title = IDLE_TITLES.get(str(data.get("notice")), "rbroker: idle lease")
                self.notice.emit(title, str(data.get("message") or ""))
            return
        booking_id = str(data.get("booking_id") or "")
        if kind == "booking_notice":
            if not is_mine(data.get("to"), self.me):
                return
            key = ("notice", booking_id, str(data.get("notice")), str(data.get("lease_id")))
            if self._once(key):
                self.notice.emit("rbroker: booking", str(data.get("message") or ""))
            return
        if kind != "booking" or not is_mine(data.get("owner"), self.me):
            return
        state = str(data.get("state") or "")
        if state == "held" and self._once(("held", booking_id)):
            self._starting.append(booking_id)  # the snapshot this event causes says the grace
        elif state == "lapsed" and self._once(("lapsed", booking_id)):
            reason = str(data.get("ended_reason") or "not claimed in time")
            self.notice.emit(
                "rbroker: booking lapsed", f"your booking {booking_id} lapsed: {reason}"
            )

    def _once(self, key: Hashable) -> bool:
        """True the first time `key` is seen (the last `TOLD_KEPT` are remembered)."""
        if key in self._told:
            return False
        self._told[key] = None
        while len(self._told) > TOLD_KEPT:
            self._told.popitem(last=False)
        return True

    def _tell_started(self, snap: Snapshot) -> None:
        if not self._starting:
            return
        listing = snap.bookings
        views = {b.get("booking_id"): b for b in (listing["bookings"] if listing else [])}
        now = float(listing["now_at"]) if listing else snap.taken_at
        for booking_id in self._starting:
            self.notice.emit(
                "rbroker: booking started", started_text(booking_id, views.get(booking_id), now)
            )
        self._starting = []

    def on_disconnected(self, message: str) -> None:
        """The link lost the broker (or found none): announce it once per outage."""
        self._known = None
        for booking_id in self._starting:  # no snapshot will say the grace: told without it
            self.notice.emit("rbroker: booking started", started_text(booking_id, None, 0.0))
        self._starting = []
        if self._connected:
            self._connected = False
            self.notice.emit("rbroker: the broker went away", message)


def started_text(booking_id: str, view: BookingView | None, now_at: float) -> str:
    """`your booking book-1a2b has started: claim it with rbroker run --booking book-1a2b
    within 15 min`: the time left from the booking's `claim_until` (whole minutes, rounded
    up; seconds under one), the part after the command left out when it is not known."""
    text = (
        f"your booking {booking_id} has started: claim it with rbroker run --booking {booking_id}"
    )
    until = view.get("claim_until") if view is not None else None
    if view is None or view.get("state") != "held" or until is None:
        return text
    left = max(0.0, float(until) - now_at)
    if left >= 60:
        left = math.ceil(left / 60 - 1e-6) * 60
    return f"{text} within {fmt_duration(left)}"
