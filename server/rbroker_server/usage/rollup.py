"""What one applied report adds to the daily usage rollup (`daily_usage`, architecture.md §7).

A report's active leases are taken to have been held since the computer's previous applied
report, by the coordinator's receive times (never the computer's clock): each adds
`granted_mib × GPUs × hours` granted and `Σ observed_mib × hours` used to its project and
owner on that UTC day (an interval across midnight is split between the two days). The
interval counts at most `stale_after_s`, the time after which a silent computer is shown
stale: a computer that went silent, or a coordinator that was down, does not accrue for the
gap. The first report of a run adds nothing (its leases are at most as old as the broker
run, and the previous report was another run's).

Only the declared `project` and `owner` and the MiB figures are read (they are the report's
redacted state: a value that broke a description rule is `[redacted]`); names are kept to
`NAME_MAX` characters, as the description rules accept them.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any, Final

NAME_MAX: Final = 64
"""Longest project or owner kept (`rbroker_protocol.descriptions.MAX_LENGTHS`)."""

SECONDS_PER_HOUR: Final = 3600.0


def day_parts(start: datetime, end: datetime) -> list[tuple[date, float]]:
    """[`start`, `end`) cut at UTC midnights: (UTC date, seconds) per day, oldest first;
    empty when `end` is not after `start`."""
    parts: list[tuple[date, float]] = []
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    while start < end:
        midnight = datetime.combine(start.date() + timedelta(days=1), datetime.min.time(), UTC)
        stop = min(end, midnight)
        parts.append((start.date(), (stop - start).total_seconds()))
        start = stop
    return parts


def lease_mib(leases: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[int, int]]:
    """(project, owner) → (granted MiB, used MiB) summed over the active leases of a report's
    stored state (`LeaseReport` fields as JSON, as the schema checked them): granted is
    `granted_mib` on each of its GPUs, used the MiB observed on all of them. Names with
    neither are left out."""
    sums: dict[tuple[str, str], tuple[int, int]] = {}
    for lease in leases:
        if lease.get("state", "active") != "active":
            continue
        granted = (lease.get("granted_mib") or 0) * max(1, len(lease.get("gpu_uuids") or ()))
        observed = lease.get("observed_mib")
        used = sum(observed.values()) if observed else 0
        if granted <= 0 and used <= 0:
            continue
        key = ((lease.get("project") or "")[:NAME_MAX], (lease.get("owner") or "")[:NAME_MAX])
        if key in sums:
            g, u = sums[key]
            sums[key] = (g + granted, u + used)
        else:
            sums[key] = (granted, used)
    return sums


def usage_rows(
    computer_id: str,
    leases: list[dict[str, Any]],
    previous_at: datetime | None,
    now: datetime,
    max_interval_s: float,
) -> list[dict[str, Any]]:
    """The `daily_usage` increments of one report received at `now` whose computer's
    previous applied report was received at `previous_at` (None: none, or another run's):
    one dict per day, project and owner (the table's columns), sorted by their key so that
    writers take row locks in one order.

    The interval is `now - previous_at`, at most `max_interval_s` (`stale_after_s`).
    """
    if previous_at is None or not leases:
        return []
    seconds = min((now - previous_at).total_seconds(), max_interval_s)
    if seconds <= 0:
        return []
    sums = lease_mib(leases)
    if not sums:
        return []
    start = now - timedelta(seconds=seconds)
    if start.date() == now.date() and now.tzinfo is UTC:  # the usual case: one day
        parts = [(now.date(), seconds)]
    else:
        parts = day_parts(start, now)
    keys = sorted(sums) if len(sums) > 1 else list(sums)
    return [
        {
            "computer_id": computer_id,
            "day": day,
            "project": project,
            "owner": owner,
            "granted_mib_hours": sums[project, owner][0] * part_s / SECONDS_PER_HOUR,
            "used_mib_hours": sums[project, owner][1] * part_s / SECONDS_PER_HOUR,
        }
        for day, part_s in parts
        for project, owner in keys
    ]
