"""The coordinator's usage history (`GET /api/v1/usage`, architecture.md §7): GPU memory
granted and used per day, per project or per user, in MiB-hours.

A MiB-hour is one MiB held for one hour: a lease of 4 096 MiB on each of two GPUs held for
30 minutes is 4 096 MiB-hours granted. The figures are integrated from a computer's signed
reports (each report's active leases over the time since the computer's previous report, by
the coordinator's clock), so they hold only declared names and numbers: a lease's `project`
and `owner` (the OS account), never a command line or anything else the report leaves out.
Days are UTC dates.
"""

from __future__ import annotations

from datetime import date
from typing import Final, Literal

from pydantic import BaseModel

UsageBy = Literal["project", "user"]
"""What the figures are summed by: the lease's declared `project`, or its `owner` (user)."""

USAGE_BY: Final[tuple[UsageBy, ...]] = ("project", "user")
"""The values `by` takes."""

UsageFormat = Literal["json", "csv"]
"""How `GET /api/v1/usage` answers: `UsageView` as JSON, or CSV with a header row."""

USAGE_FORMATS: Final[tuple[UsageFormat, ...]] = ("json", "csv")
"""The values `format` takes."""

DEFAULT_USAGE_DAYS: Final = 30
"""Days read when the query names none (today included)."""

CSV_FIELDS: Final = ("day", "{by}", "granted_mib_hours", "used_mib_hours")
"""The CSV header row, `{by}` being `project` or `user`; one row per day and name, the
figures with up to three decimals."""


class UsageDay(BaseModel):
    """One name's figures on one day (UTC).

    `name` is a project or a user as declared; `""` when the lease declared none, and
    `[redacted]` where the declared text broke a description rule (§8).
    """

    day: date
    name: str
    granted_mib_hours: float
    """Σ over the leases of granted MiB per GPU × GPUs × hours held."""
    used_mib_hours: float
    """Σ over the leases of observed MiB (all its GPUs) × hours: what their processes used."""


class UsageTotal(BaseModel):
    """One name's figures over the whole span."""

    name: str
    granted_mib_hours: float
    used_mib_hours: float


class UsageView(BaseModel):
    """The caller's group's usage over `days` days up to today (UTC), `since` to `until`
    inclusive. `usage` lists days and names with usage only, oldest day first and by name
    within a day; `totals` the same names over the span, the most granted first."""

    group: str
    by: UsageBy
    days: int
    since: date
    until: date
    usage: list[UsageDay]
    totals: list[UsageTotal]


__all__ = [
    "CSV_FIELDS",
    "DEFAULT_USAGE_DAYS",
    "USAGE_BY",
    "USAGE_FORMATS",
    "UsageBy",
    "UsageDay",
    "UsageFormat",
    "UsageTotal",
    "UsageView",
]
