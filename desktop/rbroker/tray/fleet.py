"""Where the Fleet tab gets the group's computers: a small `FleetSource` interface.

No Qt here. The real source (signed fleet reads through the uplink, DESIGN §7) plugs in
behind this protocol; until the computer is enrolled the tab shows a "not enrolled" state.

A computer is a plain dict::

    {"computer_id": str, "name": str,
     "freshness": "online" | "stale" | "offline", "last_seen_age_s": float | None,
     "gpus": [...fields of gpus.list...], "leases": [...fields of leases.list...],
     "jobs": [...fields of jobs.list...]}
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from rbroker.tray.state import age_text

FRESHNESS = ("online", "stale", "offline")


class FleetUnavailable(Exception):
    """The fleet could not be read now (coordinator unreachable, rejected); the message
    says why in words a person can act on."""


@runtime_checkable
class FleetSource(Protocol):
    """The group's computers as the coordinator last saw them."""

    def enrolled(self) -> bool:
        """True when this computer belongs to a group (the fleet can be read)."""
        ...

    def computers(self) -> list[dict[str, Any]]:
        """Every computer of the group. Blocking (network); called off the GUI thread.

        Raises:
            FleetUnavailable: the fleet cannot be read now.
        """
        ...


class NotEnrolled:
    """The source of a computer that has not joined a group."""

    def enrolled(self) -> bool:
        return False

    def computers(self) -> list[dict[str, Any]]:
        return []


class StaticFleet:
    """A fixed list of computers (tests, demos, screenshots) or a callable producing one."""

    def __init__(
        self, computers: list[dict[str, Any]] | Callable[[], list[dict[str, Any]]]
    ) -> None:
        self._computers = computers

    def enrolled(self) -> bool:
        return True

    def computers(self) -> list[dict[str, Any]]:
        c = self._computers
        return list(c() if callable(c) else c)


def freshness_text(computer: dict[str, Any]) -> str:
    """`online`, `stale · last known 7 min ago`, `offline · last seen 3 h ago`."""

    fresh = computer.get("freshness", "offline")
    age = computer.get("last_seen_age_s")
    if fresh == "online":
        return "online"
    if fresh == "stale":
        return f"stale · last known {age_text(age)} ago" if age is not None else "stale"
    return f"offline · last seen {age_text(age)} ago" if age is not None else "offline"
