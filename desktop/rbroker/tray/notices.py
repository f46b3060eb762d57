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
"""

from __future__ import annotations

import getpass
import os
import sys
from typing import Any

from PySide6.QtCore import QObject, Signal

from rbroker.base.display import fmt_mib
from rbroker.tray.state import Snapshot
from rbroker_protocol.results import ListedLease

GRANT_NOTICE_MIN_WAIT_S = 1.0
"""A grant is announced when its request waited at least this long (seconds)."""


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


def _mine(owner: object, me: str) -> bool:
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

    def on_snapshot(self, snap: Snapshot) -> None:
        """A fresh read of the broker: announce new grants and new over-grant episodes."""
        self._connected = True
        mine = [x for x in snap.leases if _mine(x.get("owner"), self.me)]
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

    def on_disconnected(self, message: str) -> None:
        """The link lost the broker (or found none): announce it once per outage."""
        self._known = None
        if self._connected:
            self._connected = False
            self.notice.emit("rbroker: the broker went away", message)
