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

OTHER_NAME: Final = "(other)"
"""The name under which usage is summed that no single name's row holds: a computer's
pairs of project and owner past the coordinator's `usage_names_per_day` on one day (the
rest of that day's usage of that computer), and in a read the names past its `top`."""

DEFAULT_USAGE_TOP: Final = 50
"""Names a usage read shows when the query names no `top` (the most granted first; the
rest summed under `OTHER_NAME`)."""

MAX_USAGE_TOP: Final = 1000
"""The largest `top` a usage read takes."""

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
    within a day; `totals` the same names over the span, the most granted first and
    `OTHER_NAME` last."""

    group: str
    by: UsageBy
    days: int
    since: date
    until: date
    usage: list[UsageDay]
    totals: list[UsageTotal]
    names_left_out: int = 0
    """Names past the read's `top` (the least granted over the span), whose figures are
    summed into `OTHER_NAME`'s rows."""


__all__ = [
    "CSV_FIELDS",
    "DEFAULT_USAGE_DAYS",
    "DEFAULT_USAGE_TOP",
    "MAX_USAGE_TOP",
    "OTHER_NAME",
    "USAGE_BY",
    "USAGE_FORMATS",
    "UsageBy",
    "UsageDay",
    "UsageFormat",
    "UsageTotal",
    "UsageView",
]
