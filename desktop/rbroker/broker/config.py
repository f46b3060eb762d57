"""Broker settings, with the defaults of architecture.md §2–§3."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from rbroker.base.display import fmt_mib
from rbroker.broker.bookings import BookingSettings
from rbroker.broker.members import Members
from rbroker.broker.project_names import ProjectNames
from rbroker.broker.shares import Shares


@dataclass(frozen=True, slots=True)
class IdleReclaim:
    """When the broker ends an idle lease (`[idle]` of broker.toml; issue 42; docs/architecture.md
    §3 "Idle"; `rbroker.broker.reclaim`).

    `reclaim_after_s`: seconds of idleness after which a lease is reclaimed (None: never, the
    default). `only_when_waiting`: only while a request waits on one of its GPUs (default
    True). `exempt_projects`: projects whose leases are never reclaimed (compared ignoring
    case).

    Raises:
        ValueError: a `reclaim_after_s` that is not positive and finite.
    """

    reclaim_after_s: float | None = None
    only_when_waiting: bool = True
    exempt_projects: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.reclaim_after_s is not None and not 0 < self.reclaim_after_s < float("inf"):
            raise ValueError(
                f"reclaim_after_s must be over 0 seconds and finite, got {self.reclaim_after_s}"
            )


class HeadroomTooLarge(ValueError):
    """A configured headroom is at least a GPU's total: nothing could ever be granted
    there. Raised when the broker starts (`Broker._check_headroom`); the
    message names the GPU and both figures in MiB."""


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Settings of one broker. Times in seconds, memory in MiB.

    `headroom_mib=None` uses the per-GPU default max(512, 5 % of total) (architecture.md §2);
    `headroom_overrides` sets it per GPU UUID. `capacity_overrides_mib` gives the total of a
    GPU whose NVML memory query is not supported; its use is then the sum of the memory NVML
    lists per process (unknown counts 0), so set it only where that list is complete.
    `release_sample_gap_s`: samples asked for by releases come at most this often per GPU
    (architecture.md §2's release rule; a grant's sample is never delayed).
    `allowed_group`: only the broker's user and this OS group's members may connect (§5).
    `shared_socket`: the socket is for every local user (a system broker; §5).
    `machine_lock`: the name of the machine-wide broker lock (None: `$RBROKER_BROKER_LOCK`,
    else `rbroker-broker` on real GPUs and a lock of its own, `per-socket`, for a simulated
    broker; `rbroker.hosting.machine_lock`).
    `over_grant_grace_s`: how long a lease's observed memory may stay above its grant before
    the broker reports it (the `over_grant` event, docs/architecture.md §2).

    Fairness between the users of one broker (docs/architecture.md §5): `max_wait_s` is the
    longest `wait_s` a request may ask (a longer one is refused, `wait_too_long`; default
    24 h); per OS user at most `max_waiting_per_user` waiting requests
    (`too_many_waiting`), `max_leases_per_user` live leases (`too_many_leases`) and
    `max_open_jobs_per_user` jobs not yet finished (`too_many_jobs`), the newest
    `max_finished_jobs_per_user` finished jobs kept (older ones dropped, oldest first), and
    `max_chunks_per_user` chunk ids kept for its jobs' idempotent reports (past it the oldest
    finished jobs are dropped, then `too_many_chunks`); answers unsent to one
    connection past `max_unsent_bytes` hold its reading back (and drop it after 10 s),
    and a user whose connections together leave more than `max_unsent_bytes_per_user`
    unsent loses the connection with the most (`unsent_over_limit`). A job stalled with no
    worker, connection or report for `job_abandon_s` seconds (default 24 h) ends
    `cancelled`, reason `abandoned: …` (`rbroker.broker.jobs`).

    `shares`: `[shares]` of the broker's config file, project → weight (`*`: every project
    not named); empty: the queue is FIFO (`rbroker.broker.shares`). `max_share_bypass_s`:
    with shares, how long a waiting request may be passed by later requests of projects
    using less of their share; past it, it is served in arrival order before them (default
    10 s; `rbroker.broker.admission`).
    `members`: `[members]` of the config file, project → OS user names and `@group`s who
    may declare it (others are refused, `not_a_member`); a project not named is open to
    everyone (`rbroker.broker.members`).
    `bookings`: `[bookings]` of the config file (`rbroker.broker.bookings.BookingSettings`).
    `idle_after_s`: a lease whose holders showed no GPU utilization and whose job reported
    no chunk for this long is idle (default 30 min, issue 42; `rbroker.broker.idle`).
    `idle_reclaim`: when an idle lease is reclaimed (`IdleReclaim`; default never).
    """

    socket_path: Path
    data_dir: Path
    simulate: bool = False
    scenario: Path | None = None
    headroom_mib: int | None = None
    headroom_overrides: dict[str, int] = field(default_factory=dict)
    max_sample_age_s: float = 2.0
    nvml_deadline_s: float = 1.5
    sample_interval_s: float = 1.0
    release_sample_gap_s: float = 0.02
    tick_s: float = 0.1
    holder_check_s: float = 0.25
    stall_threshold_s: float = 2.0
    ended_history: int = 500
    default_ttl_s: float = 30.0
    reattach_grace_s: float = 30.0
    lease_reattach_grace_s: float = 10.0
    release_all_on_exit: bool = False
    absence_confirm_samples: int = 3
    absence_confirm_s: float = 5.0
    nvml_retry_max_s: float = 30.0
    enumerate_interval_s: float = 10.0
    capacity_overrides_mib: dict[str, int] = field(default_factory=dict)
    admin_group: str | None = None
    allowed_group: str | None = None
    shared_socket: bool = False
    machine_lock: str | None = None
    over_grant_grace_s: float = 10.0
    max_wait_s: float = 24 * 3600.0
    max_waiting_per_user: int = 1024
    max_leases_per_user: int = 1024
    max_open_jobs_per_user: int = 1024
    max_finished_jobs_per_user: int = 100
    max_chunks_per_user: int = 1_000_000
    job_abandon_s: float = 24 * 3600.0
    max_unsent_bytes: int = 4 * 1024 * 1024
    max_unsent_bytes_per_user: int = 32 * 1024 * 1024
    shares: dict[str, float] = field(default_factory=dict)
    max_share_bypass_s: float = 10.0
    members: dict[str, tuple[str, ...]] = field(default_factory=dict)
    bookings: BookingSettings = field(default_factory=BookingSettings)
    idle_after_s: float = 30 * 60.0
    idle_reclaim: IdleReclaim = field(default_factory=IdleReclaim)

    def __post_init__(self) -> None:
        """Refuse settings that would admit more than a GPU holds.

        Raises:
            ValueError: a negative headroom, a capacity override that is not positive, an
                over-grant grace that is negative or not finite, a longest wait, a
                `job_abandon_s` or an `idle_after_s` that is not positive and finite, a
                per-user cap below 1, a
                share whose weight is not a positive number, or a members list that is not
                a list of names (`rbroker.broker.members.Members`), or one project listed
                in two spellings (`rbroker.broker.project_names`).
        """
        Shares(self.shares)  # raises ValueError naming the bad weight
        Members(self.members)  # raises ValueError naming the bad entry
        ProjectNames(self.members, self.shares)  # two spellings of one project
        if not 0 < self.max_wait_s < float("inf"):
            raise ValueError(f"the longest wait must be over 0 seconds, got {self.max_wait_s}")
        if not 0 <= self.max_share_bypass_s < float("inf"):
            raise ValueError(
                f"max_share_bypass_s must be 0 seconds or more, got {self.max_share_bypass_s}"
            )
        if not 0 < self.idle_after_s < float("inf"):
            raise ValueError(
                f"idle_after_s must be over 0 seconds and finite, got {self.idle_after_s}"
            )
        if not 0 < self.job_abandon_s < float("inf"):
            raise ValueError(
                f"job_abandon_s must be over 0 seconds and finite, got {self.job_abandon_s}"
            )
        for name in (
            "max_waiting_per_user",
            "max_leases_per_user",
            "max_open_jobs_per_user",
            "max_finished_jobs_per_user",
            "max_chunks_per_user",
            "max_unsent_bytes",
            "max_unsent_bytes_per_user",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be 1 or more, got {getattr(self, name)}")
        if not 0 <= self.over_grant_grace_s < float("inf"):
            raise ValueError(
                f"the over-grant grace must be 0 seconds or more, got {self.over_grant_grace_s}"
            )
        headrooms = [("headroom_mib", self.headroom_mib)] + [
            (f"headroom for {uuid}", mib) for uuid, mib in self.headroom_overrides.items()
        ]
        for name, mib in headrooms:
            if mib is not None and mib < 0:
                raise ValueError(f"{name} must be 0 MiB or more, got {fmt_mib(mib)}")
        for uuid, mib in self.capacity_overrides_mib.items():
            if mib <= 0:
                raise ValueError(f"capacity override for {uuid} must be positive, got {mib}")


CONFIG_FILE = "broker.toml"
"""The broker's config file in its data directory, read when it exists."""


@dataclass(frozen=True, slots=True)
class ConfigFile:
    """What the broker's config file sets: `shares` (project → weight), `members`
    (project → OS user names and `@group`s), `bookings` (`BookingSettings`) and
    `idle_after_s` and `idle_reclaim` (`[idle]`; `BrokerConfig.idle_after_s`,
    `IdleReclaim`)."""

    shares: dict[str, float] = field(default_factory=dict)
    members: dict[str, tuple[str, ...]] = field(default_factory=dict)
    bookings: BookingSettings = field(default_factory=BookingSettings)
    idle_after_s: float = 30 * 60.0
    idle_reclaim: IdleReclaim = field(default_factory=IdleReclaim)

    def open_exempt(self) -> list[str]:
        """The `[idle] exempt_projects` that no `[members]` list keeps to its people, while
        idle leases are reclaimed: a project is only a name a request declares, so any user
        may declare one of these to keep an idle lease from being reclaimed (compared
        ignoring case, as the exemption is)."""
        if self.idle_reclaim.reclaim_after_s is None:
            return []
        listed = {p.casefold() for p in self.members}
        return [p for p in self.idle_reclaim.exempt_projects if p.casefold() not in listed]

    def reclaim_before_idle(self) -> bool:
        """Whether `[idle] reclaim_after_s` is shorter than `idle_after_s`: a lease is then
        reclaimed as soon as it is idle (and warned at once), not after the time written."""
        after = self.idle_reclaim.reclaim_after_s
        return after is not None and after < self.idle_after_s


KNOWN_TABLES = ("shares", "members", "bookings", "idle")

IDLE_KEYS = ("idle_after_s", "reclaim_after_s", "only_when_waiting", "exempt_projects")
"""The keys of `[idle]`."""


def _seconds(key: str, value: object) -> float:
    """`[idle] key` as a positive finite number of seconds.

    Raises:
        ValueError: anything else.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value < float("inf")
    ):
        raise ValueError(f"[idle] {key} must be a number of seconds over 0, got {value!r}")
    return float(value)


def _idle(table: object) -> tuple[float, IdleReclaim]:
    """`[idle]`: `idle_after_s` in seconds (30 min when absent) and the reclaim policy
    (`IdleReclaim`: `reclaim_after_s` seconds, absent: never; `only_when_waiting`, true or
    false, default true; `exempt_projects`, a list of project names; issue 42).

    Raises:
        ValueError: not a table, an unknown key, a time that is not a positive finite
            number, an `only_when_waiting` that is not true or false, an `exempt_projects`
            that is not a list of names.
    """
    if not isinstance(table, dict):
        raise ValueError("[idle] must be a table of setting = value")
    for key in table:
        if key not in IDLE_KEYS:
            raise ValueError(f"[idle] has no setting {key!r} (known: {', '.join(IDLE_KEYS)})")
    idle_after_s = _seconds("idle_after_s", table.get("idle_after_s", 30 * 60.0))
    reclaim = table.get("reclaim_after_s")
    reclaim_after_s = None if reclaim is None else _seconds("reclaim_after_s", reclaim)
    waiting = table.get("only_when_waiting", True)
    if not isinstance(waiting, bool):
        raise ValueError(f"[idle] only_when_waiting must be true or false, got {waiting!r}")
    exempt = table.get("exempt_projects", [])
    if not isinstance(exempt, list) or not all(isinstance(p, str) and p for p in exempt):
        raise ValueError(
            f'[idle] exempt_projects must be a list of project names ["a", "b"], got {exempt!r}'
        )
    return idle_after_s, IdleReclaim(reclaim_after_s, waiting, tuple(exempt))


BOOKING_KEYS = {
    "protect_s": float,
    "claim_grace_s": float,
    "max_per_user": int,
    "horizon_s": float,
    "max_duration_s": float,
}
"""The keys of `[bookings]` and their types (`BookingSettings`)."""


def _booking_settings(table: object) -> BookingSettings:
    """`[bookings]` read into `BookingSettings`.

    Raises:
        ValueError: not a table, an unknown key, a value of the wrong type or out of bounds.
    """
    if not isinstance(table, dict):
        raise ValueError("[bookings] must be a table of setting = value")
    values: dict[str, float | int] = {}
    for key, value in table.items():
        kind = BOOKING_KEYS.get(key)
        if kind is None:
            known = ", ".join(BOOKING_KEYS)
            raise ValueError(f"[bookings] has no setting {key!r} (known: {known})")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"[bookings] {key} must be a number, got {value!r}")
        if kind is int and not isinstance(value, int):
            raise ValueError(f"[bookings] {key} must be a whole number, got {value!r}")
        values[key] = kind(value)
    return BookingSettings(**values)  # type: ignore[arg-type]


def read_config(path: Path) -> ConfigFile:
    """The settings of the broker's config file (TOML) at `path`: its `[shares]` table,
    project → weight, its `[members]` table, project → list of OS user names and
    `"@group"`s, its `[bookings]` table and its `[idle]` table (docs/operator-guide.md).
    Unknown tables are refused, so a misspelt one is not silently ignored.

    Raises:
        ValueError: one line naming the file and the problem (unreadable, not TOML, an
            unknown table, a weight that is not a positive number, a members list that is
            not a list of names, an `@group` on Windows).
    """
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not TOML: {exc}") from None
    unknown = sorted(set(doc) - set(KNOWN_TABLES))
    if unknown:
        known = ", ".join(f"[{t}]" for t in KNOWN_TABLES)
        raise ValueError(f"{path}: unknown setting {unknown[0]!r} (known: {known})")
    shares = doc.get("shares", {})
    if not isinstance(shares, dict):
        raise ValueError(f"{path}: [shares] must be a table of project = weight")
    members = doc.get("members", {})
    if not isinstance(members, dict):
        raise ValueError(f'{path}: [members] must be a table of project = ["user", "@group"]')
    try:
        Shares(shares)
        Members(members)
        ProjectNames(members, shares)
        bookings = _booking_settings(doc.get("bookings", {}))
        idle_after_s, idle_reclaim = _idle(doc.get("idle", {}))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return ConfigFile(
        {str(k): float(v) for k, v in shares.items()},
        {str(k): tuple(v) for k, v in members.items()},
        bookings,
        idle_after_s,
        idle_reclaim,
    )
