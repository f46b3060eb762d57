"""Where the Fleet tab gets the group's computers: a small `FleetSource` interface.

No Qt here. `UplinkFleet` reads the coordinator with this computer's
signature (architecture.md §7); until the computer is enrolled the tab shows a "not enrolled" state.

A computer is a plain dict, as `rbroker.uplink.fleet.computers_from_fleet_view` makes it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rbroker.tray.state import age_text


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


class UplinkFleet:
    """The group's fleet read from the coordinator, signed with this computer's key (the
    enrollment kept in the broker's data dir by `rbroker enroll` or the Settings tab)."""

    def __init__(self, data_dir: Path, timeout_s: float = 10.0) -> None:
        self.data_dir = data_dir
        self.timeout_s = timeout_s

    def enrolled(self) -> bool:
        from rbroker.uplink.config import UplinkConfig

        try:
            return UplinkConfig.load(self.data_dir) is not None
        except ValueError:
            return True  # enrolled, but the config is broken: computers() says why

    def computers(self) -> list[dict[str, Any]]:
        from rbroker.uplink.fleet import FleetError, computers_from_fleet_view, fetch_fleet

        try:
            body = fetch_fleet(self.data_dir, timeout_s=self.timeout_s)
        except (FleetError, ValueError) as exc:
            from rbroker.tray.wording import error_text

            raise FleetUnavailable(error_text(exc)) from None
        return computers_from_fleet_view(body)
