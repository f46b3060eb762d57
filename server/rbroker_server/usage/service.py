"""Usage reads: the caller's group's daily usage (`daily_usage`, summed over its computers)
per project or per user, as `rbroker_protocol.usage.UsageView` or CSV; and the query's
checks, each refusal one line naming the parameter.

Revoked computers' usage still counts (it happened); other groups' computers never do.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, timedelta
from typing import Final

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from rbroker_protocol.usage import (
    CSV_FIELDS,
    DEFAULT_USAGE_DAYS,
    USAGE_BY,
    USAGE_FORMATS,
    UsageBy,
    UsageDay,
    UsageFormat,
    UsageTotal,
    UsageView,
)
from rbroker_server.auth.caller import Scope
from rbroker_server.db import utcnow
from rbroker_server.models import Computer, DailyUsage, Group
from rbroker_server.query import QueryInvalid, QueryRules
from rbroker_server.settings import Settings

USAGE = DailyUsage.__table__  # type: ignore[attr-defined]
COMPUTERS = Computer.__table__  # type: ignore[attr-defined]
GROUPS = Group.__table__  # type: ignore[attr-defined]

QUERY_NAMES: Final = ("days", "by", "format")
"""The query parameters of a usage read."""

DECIMALS: Final = 3
"""MiB-hours are given to a thousandth (3.6 MiB-seconds)."""

FORMULA_STARTS: Final = ("=", "+", "-", "@")
"""A CSV cell starting with one of these is a formula to a spreadsheet: such a name is
written with a leading `'` (OWASP's advice on CSV injection)."""

_COLUMN: Final = {"project": USAGE.c.project, "user": USAGE.c.owner}


class UsageQueryInvalid(QueryInvalid):
    """A usage query the read cannot answer: one line naming the parameter (400)."""


_RULES: Final = QueryRules(QUERY_NAMES, UsageQueryInvalid, shown_chars=24)


@dataclass(frozen=True, slots=True)
class UsageQuery:
    """A checked usage query: `days` (1 to `usage_window_days`, today included), what the
    figures are summed by, and the answer's format."""

    days: int = DEFAULT_USAGE_DAYS
    by: UsageBy = "project"
    format: UsageFormat = "json"


def parse_query(params: Mapping[str, list[str]], settings: Settings) -> UsageQuery:
    """Check a usage query given as name → the values sent (a name sent twice has two).

    Raises:
        UsageQueryInvalid: an unknown or repeated parameter, `days` not a whole number from
            1 to `usage_window_days`, `by` not `project` or `user`, `format` not `json` or
            `csv`.
    """
    _RULES.check_names(params)
    most = settings.usage_window_days
    # Six digits: `usage_window_days` is at most 100 000 (`Settings`).
    days = _RULES.whole(params, "days", most, "the days kept", digits=6)
    by = _RULES.choice(params, "by", USAGE_BY, "project")
    fmt = _RULES.choice(params, "format", USAGE_FORMATS, "json")
    return UsageQuery(
        days=min(DEFAULT_USAGE_DAYS, most) if days is None else days,
        by=by,  # type: ignore[arg-type]
        format=fmt,  # type: ignore[arg-type]
    )


def usage(engine: Engine, scope: Scope, query: UsageQuery, today: date | None = None) -> UsageView:
    """The caller's group's usage over the `query.days` days up to `today` (UTC)."""
    today = today or utcnow().astimezone(UTC).date()
    since = today - timedelta(days=query.days - 1)
    name = _COLUMN[query.by].label("name")
    granted = sa.func.sum(USAGE.c.granted_mib_hours).label("granted")
    used = sa.func.sum(USAGE.c.used_mib_hours).label("used")
    statement = (
        sa.select(USAGE.c.day, name, granted, used)
        .join(COMPUTERS, COMPUTERS.c.id == USAGE.c.computer_id)
        .where(
            COMPUTERS.c.group_id == scope.group_id,
            USAGE.c.day >= since,
            USAGE.c.day <= today,
        )
        .group_by(USAGE.c.day, name)
        .order_by(USAGE.c.day, name)
    )
    with engine.connect() as conn:
        group = conn.execute(sa.select(GROUPS.c.name).where(GROUPS.c.id == scope.group_id)).one()
        rows = conn.execute(statement).all()
    days = [
        UsageDay(
            day=r.day,
            name=r.name,
            granted_mib_hours=round(float(r.granted), DECIMALS),
            used_mib_hours=round(float(r.used), DECIMALS),
        )
        for r in rows
    ]
    sums: dict[str, tuple[float, float]] = {}
    for r in rows:
        g, u = sums.get(r.name, (0.0, 0.0))
        sums[r.name] = (g + float(r.granted), u + float(r.used))
    totals = [
        UsageTotal(name=n, granted_mib_hours=round(g, DECIMALS), used_mib_hours=round(u, DECIMALS))
        for n, (g, u) in sorted(sums.items(), key=lambda item: (-item[1][0], item[0]))
    ]
    return UsageView(
        group=str(group.name),
        by=query.by,
        days=query.days,
        since=since,
        until=today,
        usage=days,
        totals=totals,
    )


_SPLIT_THEN_FORMULA: Final = re.compile(r"""(^|[,;\t|:"'\r\n]|\s)(\s*)([=+\-@])""")
"""A formula start (`FORMULA_STARTS`) at the start of a name or after a character that some
reader splits a cell on, or trims, or opens a quote with (`,` `;` tab `|` `:` quotes, line
breaks, spaces)."""


def csv_cell(name: str) -> str:
    """`name` as a CSV cell that no spreadsheet runs as a formula, whichever separator it
    splits the row on: a `'` goes before each formula start (`FORMULA_STARTS`) that begins the
    name or follows a character a reader may split on (`_SPLIT_THEN_FORMULA`), so that every
    piece a reader could cut from it starts as text (OWASP's advice on CSV injection names
    both the first character and the separators)."""
    return _SPLIT_THEN_FORMULA.sub(r"\1\2'\3", name)


def to_csv(view: UsageView) -> str:
    """`view` as CSV (RFC 4180, CRLF line ends): the header `CSV_FIELDS`, then one row per
    day and name, oldest day first. Names are `csv_cell`s, so that no piece a spreadsheet can
    cut from one starts a formula, whichever separator it reads with (`;` in much of Europe,
    a tab): a project named `x;=1+1;x` was three cells to a `;` reader, the middle one
    `=1+1`, a formula; quoting the cell does not help, as a reader splitting on another
    separator does not honour the quotes."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow([f.format(by=view.by) for f in CSV_FIELDS])
    for d in view.usage:
        writer.writerow(
            [
                d.day.isoformat(),
                csv_cell(d.name),
                f"{d.granted_mib_hours:.{DECIMALS}f}",
                f"{d.used_mib_hours:.{DECIMALS}f}",
            ]
        )
    return out.getvalue()


def csv_filename(view: UsageView) -> str:
    """`rbroker-usage-by-project-2026-11-06-2026-12-05.csv` (ASCII only)."""
    return f"rbroker-usage-by-{view.by}-{view.since.isoformat()}-{view.until.isoformat()}.csv"
