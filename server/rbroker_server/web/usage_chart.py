"""The usage page's chart, worked out on the server: one row of day bars per project (or
user), granted MiB-hours with the used part inside, every row on one scale, drawn as
inline SVG by `usage.html` (no script).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from typing import Final

from rbroker_protocol.usage import UsageView

MAX_SERIES: Final = 20
"""Rows drawn at most (the most granted first); the others are counted, and in the CSV."""

BAR_STEP: Final = 10
"""Width of a day in the SVG's own units; a bar is `BAR_WIDTH` of it."""
BAR_WIDTH: Final = 8
HEIGHT: Final = 40
"""Height of a row's SVG in its own units (the tallest bar of the chart)."""

NONE_NAME: Final = "(none declared)"
"""How a lease without a declared project (or owner) is labelled."""


@dataclass(frozen=True, slots=True)
class UsageBar:
    """One day of one row: where its bars go (SVG units) and what they stand for."""

    day: date
    x: float
    granted_y: float
    granted_height: float
    used_x: float
    used_y: float
    used_height: float
    granted_mib_hours: float
    used_mib_hours: float


@dataclass(frozen=True, slots=True)
class UsageSeries:
    """One project or user: its label, totals and day bars (days without usage left out)."""

    label: str
    granted_mib_hours: float
    used_mib_hours: float
    bars: list[UsageBar]
    summary: str
    """The row as one sentence, for screen readers."""


@dataclass(frozen=True, slots=True)
class UsageChart:
    """The rows, the SVG width (`days × BAR_STEP`), the scale and the rows not drawn."""

    series: list[UsageSeries]
    width: int
    height: int
    scale_mib_hours: float
    """What a full-height bar stands for."""
    more: int


def label(name: str) -> str:
    """A name as shown: `NONE_NAME` for an empty one."""
    return name or NONE_NAME


def fmt_hours(mib_hours: float) -> str:
    """`1 234.5` (thin grouping, one decimal; `0` for nothing)."""
    if mib_hours == 0:
        return "0"
    return f"{mib_hours:,.1f}".replace(",", "\u202f")


def usage_chart(view: UsageView) -> UsageChart:
    """The chart of `view`: a row per name, most granted first, at most `MAX_SERIES`."""
    index = {view.since + timedelta(days=i): i for i in range(view.days)}
    shown = view.totals[:MAX_SERIES]
    names = {t.name for t in shown}
    scale = max(
        [max(d.granted_mib_hours, d.used_mib_hours) for d in view.usage if d.name in names] or [0.0]
    )
    by_name: dict[str, list[UsageBar]] = {t.name: [] for t in shown}
    for d in view.usage:
        i = index.get(d.day)
        if d.name not in by_name or i is None or scale <= 0:
            continue
        g = HEIGHT * d.granted_mib_hours / scale
        u = HEIGHT * d.used_mib_hours / scale
        x = i * BAR_STEP + (BAR_STEP - BAR_WIDTH) / 2
        by_name[d.name].append(
            UsageBar(
                day=d.day,
                x=round(x, 2),
                granted_y=round(HEIGHT - g, 2),
                granted_height=round(g, 2),
                used_x=round(x + BAR_WIDTH / 4, 2),
                used_y=round(HEIGHT - u, 2),
                used_height=round(u, 2),
                granted_mib_hours=d.granted_mib_hours,
                used_mib_hours=d.used_mib_hours,
            )
        )
    series = [
        UsageSeries(
            label=label(t.name),
            granted_mib_hours=t.granted_mib_hours,
            used_mib_hours=t.used_mib_hours,
            bars=by_name[t.name],
            summary=(
                f"{label(t.name)}: {fmt_hours(t.granted_mib_hours)} MiB-hours granted, "
                f"{fmt_hours(t.used_mib_hours)} used, on {len(by_name[t.name])} of "
                f"{view.days} days"
            ),
        )
        for t in shown
    ]
    return UsageChart(
        series=series,
        width=view.days * BAR_STEP,
        height=HEIGHT,
        scale_mib_hours=scale,
        more=max(0, len(view.totals) - len(shown)),
    )
