"""Where the Fleet tab gets the group's computers: a small `FleetSource` interface.

No Qt here. `UplinkFleet` reads the coordinator with this computer's
signature (architecture.md §7); until the computer is enrolled the tab shows a "not enrolled" state.

A computer is a plain dict, as `rbroker.uplink.fleet.computers_from_fleet_view` makes it
(`FleetComputer`); its lists hold the coordinator's JSON as sent (`FleetGpu`, `FleetLease`,
`FleetQueueEntry`, `FleetJob`: mirrors of `rbroker_protocol.fleet`'s models, which the answer
was checked against) or, in demos and screenshots, `rbroker.demo.fleet.demo_fleet`'s data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, TypedDict, cast, runtime_checkable

from rbroker.tray.state import age_text


class FleetGpu(TypedDict, total=False):
    """A GPU of a computer: `rbroker_protocol.fleet.FleetGpuView` as JSON. `telemetry_reason`
    and `waiting` come only with demo data (the coordinator does not send them)."""

    uuid: str
    index: int
    name: str
    telemetry: str
    total_mib: int | None
    headroom_mib: int | None
    device_used_mib: int | None
    outstanding_mib: int | None
    available_mib: int | None
    leased_in_use_mib: int | None
    other_in_use_mib: int | None
    state: str
    leases: int
    telemetry_reason: str
    waiting: int


class FleetLease(TypedDict, total=False):
    """An active lease of a computer: `rbroker_protocol.fleet.FleetLeaseView` as JSON.
    `gpu_uuid` comes only with demo data."""

    lease_id: str
    gpu_uuids: list[str]
    granted_mib: int
    owner: str
    project: str
    session: str
    purpose: str
    state: str
    granted_at: float | None
    expires_in_s: float | None
    observed_mib: dict[str, int]
    over_grant: bool
    expected_s: float | None
    idle_state: str
    idle_s: float | None
    gpu_uuid: str


class FleetQueueEntry(TypedDict, total=False):
    """A waiting request of a computer: `rbroker_protocol.reports.QueueEntry` as JSON."""

    mib: int
    gpus: int
    owner: str
    project: str
    session: str
    purpose: str
    waiting_s: float
    reason: str
    eta_s: float | None
    eta_reason: str


class FleetJob(TypedDict, total=False):
    """A declared job of a computer: `rbroker_protocol.fleet.FleetJobView` as JSON."""

    job_id: str
    project: str
    purpose: str
    handler: str
    state: str
    workers: int
    total_items: int | None
    completed_items: int
    failed_items: int


class FleetComputer(TypedDict):
    """One computer as `rbroker.uplink.fleet.computers_from_fleet_view` makes it from the
    coordinator's `FleetView` (`freshness`: `online`, `stale` or `offline`)."""

    computer_id: str
    name: str
    freshness: Literal["online", "stale", "offline"]
    last_seen_age_s: float | None
    gpus: list[FleetGpu]
    leases: list[FleetLease]
    queue: list[FleetQueueEntry]
    jobs: list[FleetJob]


class FleetUnavailable(Exception):
    """The fleet could not be read now (coordinator unreachable, rejected); the message
    says why in words a person can act on."""


@runtime_checkable
class FleetSource(Protocol):
    """The group's computers as the coordinator last saw them."""

    def enrolled(self) -> bool:
        """True when this computer belongs to a group (the fleet can be read)."""
        ...

    def computers(self) -> list[FleetComputer]:
        """Every computer of the group. Blocking (network); called off the GUI thread.

        Raises:
            FleetUnavailable: the fleet cannot be read now.
        """
        ...


class NotEnrolled:
    """The source of a computer that has not joined a group."""

    def enrolled(self) -> bool:
        return False

    def computers(self) -> list[FleetComputer]:
        return []


class StaticFleet:
    """A fixed list of computers (tests, demos, screenshots) or a callable producing one:
    data in `FleetComputer`'s shape (`rbroker.demo.fleet.demo_fleet`'s, typed as plain
    mappings there)."""

    def __init__(
        self,
        computers: Sequence[Mapping[str, Any]] | Callable[[], Sequence[Mapping[str, Any]]],
    ) -> None:
        self._computers = computers

    def enrolled(self) -> bool:
        return True

    def computers(self) -> list[FleetComputer]:
        c = self._computers
        return cast("list[FleetComputer]", list(c() if callable(c) else c))


def freshness_text(computer: FleetComputer) -> str:
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

    def computers(self) -> list[FleetComputer]:
        from rbroker.uplink.fleet import FleetError, computers_from_fleet_view, fetch_fleet

        try:
            body = fetch_fleet(self.data_dir, timeout_s=self.timeout_s)
        except (FleetError, ValueError) as exc:
            from rbroker.tray.wording import error_text

            raise FleetUnavailable(error_text(exc)) from None
        # computers_from_fleet_view makes `FleetComputer`s (it declares plain dicts)
        return cast("list[FleetComputer]", computers_from_fleet_view(body))
