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
    DEFAULT_USAGE_TOP,
    MAX_USAGE_TOP,
    OTHER_NAME,
    USAGE_BY,
    USAGE_FORMATS,
    UsageBy,
    UsageDay,
    UsageFormat,
    UsageTotal,
    UsageView,
)
from rbroker_server.api.query import QueryInvalid, QueryRules
from rbroker_server.auth.caller import Scope
from rbroker_server.db.engine import utcnow
from rbroker_server.db.tables import COMPUTERS, GROUPS, USAGE
from rbroker_server.settings import Settings

QUERY_NAMES: Final = ("days", "by", "format", "top")
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
    figures are summed by, the answer's format, and how many names it shows (`top`: the
    most granted over the span; the rest summed under `OTHER_NAME`)."""

    days: int = DEFAULT_USAGE_DAYS
    by: UsageBy = "project"
    format: UsageFormat = "json"
    top: int = DEFAULT_USAGE_TOP


def parse_query(params: Mapping[str, list[str]], settings: Settings) -> UsageQuery:
    """Check a usage query given as name → the values sent (a name sent twice has two).

    Raises:
        UsageQueryInvalid: an unknown or repeated parameter, `days` not a whole number from
            1 to `usage_window_days`, `by` not `project` or `user`, `format` not `json` or
            `csv`, `top` not a whole number from 1 to `MAX_USAGE_TOP`.
    """
    _RULES.check_names(params)
    most = settings.usage_window_days
    # Six digits: `usage_window_days` is at most 100 000 (`Settings`).
    days = _RULES.whole(params, "days", most, "the days kept", digits=6)
    by = _RULES.choice(params, "by", USAGE_BY, "project")
    fmt = _RULES.choice(params, "format", USAGE_FORMATS, "json")
    top = _RULES.whole(params, "top", MAX_USAGE_TOP, "the names shown")
    return UsageQuery(
        days=min(DEFAULT_USAGE_DAYS, most) if days is None else days,
        by=by,  # type: ignore[arg-type]
        format=fmt,  # type: ignore[arg-type]
        top=DEFAULT_USAGE_TOP if top is None else top,
    )


def usage(engine: Engine, scope: Scope, query: UsageQuery, today: date | None = None) -> UsageView:
    """The caller's group's usage over the `query.days` days up to `today` (UTC): the
    `query.top` names with the most granted over the span, each per day and in total, and
    the rest summed per day under `OTHER_NAME` (their count is `names_left_out`). Three
    statements, each bounded by the answer's size: the top names' totals with the count of
    all names and the grand totals, the top names per day, and each day's totals."""
    today = today or utcnow().astimezone(UTC).date()
    since = today - timedelta(days=query.days - 1)
    column = _COLUMN[query.by]
    rows = (
        sa.select(USAGE)
        .join(COMPUTERS, COMPUTERS.c.id == USAGE.c.computer_id)
        .where(COMPUTERS.c.group_id == scope.group_id, USAGE.c.day >= since, USAGE.c.day <= today)
        .subquery()
    )
    name = rows.c[column.name]
    r_granted, r_used = sa.func.sum(rows.c.granted_mib_hours), sa.func.sum(rows.c.used_mib_hours)
    with engine.connect() as conn:
        group = conn.execute(sa.select(GROUPS.c.name).where(GROUPS.c.id == scope.group_id)).one()
        top = conn.execute(
            sa.select(name.label("name"), r_granted.label("granted"), r_used.label("used"))
            .group_by(name)
            .order_by(r_granted.desc(), name)
            .limit(query.top + 1)
        ).all()
        shown = [r.name for r in top[: query.top]]
        left_out = 0
        if len(top) > query.top:
            left_out = conn.execute(sa.select(sa.func.count(sa.distinct(name)))).scalar_one()
            left_out -= query.top
        per_day = conn.execute(
            sa.select(
                rows.c.day, name.label("name"), r_granted.label("granted"), r_used.label("used")
            )
            .where(name.in_(shown))
            .group_by(rows.c.day, name)
            .order_by(rows.c.day, name)
        ).all()
        day_sums = (
            conn.execute(
                sa.select(rows.c.day, r_granted.label("granted"), r_used.label("used"))
                .group_by(rows.c.day)
                .order_by(rows.c.day)
            ).all()
            if left_out
            else []
        )
    figures: dict[tuple[date, str], list[float]] = {
        (r.day, r.name): [float(r.granted), float(r.used)] for r in per_day
    }
    if left_out:
        shown_sums: dict[date, list[float]] = {}
        for (day, _), (g, u) in figures.items():
            day_sum = shown_sums.setdefault(day, [0.0, 0.0])
            day_sum[0] += g
            day_sum[1] += u
        for r in day_sums:
            g0, u0 = shown_sums.get(r.day, [0.0, 0.0])
            rest = [max(0.0, float(r.granted) - g0), max(0.0, float(r.used) - u0)]
            if rest[0] <= 0 and rest[1] <= 0:
                continue
            kept = figures.setdefault((r.day, OTHER_NAME), [0.0, 0.0])
            kept[0] += rest[0]
            kept[1] += rest[1]
    days = [
        UsageDay(
            day=day,
            name=n,
            granted_mib_hours=round(g, DECIMALS),
            used_mib_hours=round(u, DECIMALS),
        )
        for (day, n), (g, u) in sorted(figures.items())
    ]
    sums: dict[str, tuple[float, float]] = {}
    for (_, n), (g, u) in figures.items():
        g0, u0 = sums.get(n, (0.0, 0.0))
        sums[n] = (g0 + g, u0 + u)
    totals = [
        UsageTotal(name=n, granted_mib_hours=round(g, DECIMALS), used_mib_hours=round(u, DECIMALS))
        for n, (g, u) in sorted(
            sums.items(), key=lambda item: (item[0] == OTHER_NAME, -item[1][0], item[0])
        )
    ]
    return UsageView(
        group=str(group.name),
        by=query.by,
        days=query.days,
        since=since,
        until=today,
        usage=days,
        totals=totals,
        names_left_out=left_out,
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
