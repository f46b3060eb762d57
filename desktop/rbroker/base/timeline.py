"""The next hours of each GPU's bookings as lines of text for a terminal (`rbroker bookings`,
issue 41): one row per GPU, one character per time slot, how much of the GPU's usable memory
the bookings take in that slot, and where the viewer's own bookings are.

A cell shows the peak, over its slot, of the MiB that bookings overlapping it hold together,
as a share of the row's usable MiB (total − headroom): nothing, under a third, under two
thirds, under all, all (or more). A slot in which one of the viewer's bookings lies is drawn
with the circle of the same share, so the viewer sees both where they are and how full the
GPU is then:

    share        none   < 1/3   < 2/3   < 1   full
    others only   ' '    ░       ▒       ▓     █
    with mine            ◔       ◑       ◕     ●      (any share, ASCII: *)
    ASCII         ' '    .       :       +     #

The ASCII marks are for consoles that cannot print Unicode (a Windows console on cp1252);
there a slot with one of the viewer's bookings is `*` whatever its share.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Sequence
from datetime import timedelta, tzinfo
from typing import Final, NamedTuple

from rbroker.base.when import local_time


class TimelineSpan(NamedTuple):
    """One booking on one GPU: [`start_s`, `end_s`) in UTC Unix seconds, `mib` MiB, and
    whether it is the viewer's (`mine`)."""

    start_s: float
    end_s: float
    mib: int
    mine: bool


class TimelineRow(NamedTuple):
    """One GPU's row: its `label` (`GPU 0`; any text, cleaned before it is drawn), its usable
    MiB (total − headroom) and its bookings, in any order (those outside the drawn hours,
    empty or of negative MiB are left out)."""

    label: str
    usable_mib: int
    spans: Sequence[TimelineSpan]


_SHADES: Final = " ░▒▓█"
_MINE: Final = "◔◑◕●"
_ASCII_SHADES: Final = " .:+#"
_ASCII_MINE: Final = "****"

LEGENDS: Final = (
    "░ <⅓  ▒ <⅔  ▓ <all  █ all of the usable MiB booked;  ◔◑◕● the same, with yours",
    "░▒▓█ share of usable MiB booked; ◔◑◕● with yours",
    "░▒▓█ booked; ◔◑◕● yours",
)
"""The legend line, the longest that fits the width first."""

ASCII_LEGENDS: Final = (
    ". <1/3  : <2/3  + <all  # all of the usable MiB booked;  * with yours",
    ".:+# share of usable MiB booked; * with yours",
    ".:+# booked; * yours",
)

_TICK_STEPS_H: Final = (1, 2, 3, 4, 6, 8, 12, 24)
_TICK_SPACING: Final = 7
"""Columns from one hour label to the next at least: `14:00` and two spaces."""

_DROPPED: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
"""Controls (ESC, NUL, C1…), format characters (bidi controls, zero-width), surrogates,
private-use and unassigned code points, line and paragraph separators."""


def render_timeline(
    rows: Sequence[TimelineRow],
    origin_s: float,
    *,
    hours: int = 24,
    width: int = 80,
    zone: tzinfo | None = None,
    ascii_only: bool = False,
) -> list[str]:
    """The lines that draw `rows` over `hours` hours from `origin_s` (UTC Unix seconds,
    usually now cut to the hour): a header of local hour labels (`14:00`, every 1 to 24 hours
    as the width allows, in `zone`; `None`: the system's), one line per row (its label,
    cleaned of control characters and padded, a space, one cell per slot), and the legend
    last (see the module's doc). No line is wider than `width` columns (double-width
    characters count two). The cells fill what the labels leave, a whole number per hour
    when there is room for one an hour (so 72 cells of 20 min at 80 columns beside `GPU 0`).
    Raises `ValueError` when `hours` < 1 or `width` leaves no room for a cell."""
    if hours < 1:
        raise ValueError(f"a timeline covers at least one hour, not {hours}")
    labels = [_plain(row.label, ascii_only) for row in rows]
    label_w = min(max((_cols(label) for label in labels), default=0), width // 4)
    room = width - label_w - 1
    if room < 1:
        raise ValueError(f"{width} columns leave no room for a timeline")
    cells = room // hours * hours if room >= hours else room
    total_s = hours * 3600
    slot_s = total_s / cells
    shades, mine = (_ASCII_SHADES, _ASCII_MINE) if ascii_only else (_SHADES, _MINE)
    lines = [_header(origin_s, hours, cells, label_w + 1, zone)]
    for label, row in zip(labels, rows, strict=True):
        peaks = _peaks(row.spans, origin_s, slot_s, cells)
        marks = "".join(
            _mark(peak, has_mine, row.usable_mib, shades, mine) for peak, has_mine in peaks
        )
        lines.append(f"{_fit(label, label_w, '~' if ascii_only else '…')} {marks}")
    legends = ASCII_LEGENDS if ascii_only else LEGENDS
    lines.append(next((lg for lg in legends if _cols(lg) <= width), legends[-1][:width]))
    return lines


def _peaks(
    spans: Sequence[TimelineSpan], origin_s: float, slot_s: float, cells: int
) -> list[tuple[int, bool]]:
    """`(peak MiB, one of mine overlaps)` of each slot: one sweep over the spans' starts and
    ends in time order (an end before a start at the same instant: [start, end) windows
    that touch do not overlap)."""
    end_s = origin_s + slot_s * cells
    events: list[tuple[float, int, int, int]] = []  # (time, 0 end / 1 start, ±MiB, ±mine)
    for span in spans:
        if span.end_s <= span.start_s or span.mib < 0:
            continue
        if span.end_s <= origin_s or span.start_s >= end_s:
            continue
        own = 1 if span.mine else 0
        events.append((span.start_s, 1, span.mib, own))
        events.append((span.end_s, 0, -span.mib, -own))
    events.sort()
    out: list[tuple[int, bool]] = []
    held = mine = i = 0
    for cell in range(cells):
        t0 = origin_s + cell * slot_s
        t1 = origin_s + (cell + 1) * slot_s if cell + 1 < cells else end_s
        while i < len(events) and events[i][0] <= t0:  # the state at the slot's start
            held, mine, i = held + events[i][2], mine + events[i][3], i + 1
        peak, any_mine = held, mine > 0
        while i < len(events) and events[i][0] < t1:  # and every change within it
            held, mine, i = held + events[i][2], mine + events[i][3], i + 1
            peak, any_mine = max(peak, held), any_mine or mine > 0
        out.append((peak, any_mine))
    return out


def _mark(peak: int, has_mine: bool, usable_mib: int, shades: str, mine: str) -> str:
    """The cell of a slot whose bookings hold `peak` MiB of `usable_mib` at most."""
    if peak <= 0 and not has_mine:
        return shades[0]
    if peak >= usable_mib:
        level = 3
    elif 3 * peak < usable_mib:
        level = 0
    elif 3 * peak < 2 * usable_mib:
        level = 1
    else:
        level = 2
    return mine[level] if has_mine else shades[level + 1]


def _header(origin_s: float, hours: int, cells: int, indent: int, zone: tzinfo | None) -> str:
    """The hour labels over the cells: at each whole local hour that is a multiple of the
    step (the fewest hours that keep labels `_TICK_SPACING` columns apart), each label
    starting at the column of the slot its hour begins, none cut or run into another."""
    total_s = hours * 3600
    step = next((h for h in _TICK_STEPS_H if h * cells / hours >= _TICK_SPACING), 0)
    if step == 0:
        return ""
    line = [" "] * (indent + cells)
    first = local_time(origin_s, zone)
    offset_s = (first.utcoffset() or timedelta(0)).total_seconds()
    t = origin_s + (-(origin_s + offset_s)) % 3600  # the first whole local hour
    free = 0  # the first column a label may take
    while t < origin_s + total_s:
        at = local_time(t, zone)
        if at.minute == 0 and at.hour % step == 0:
            col = indent + math.floor((t - origin_s) * cells / total_s + 1e-9)
            label = f"{at.hour:02d}:00"
            if col >= free and col + len(label) <= len(line):
                line[col : col + len(label)] = label
                free = col + len(label) + 2
        t += 3600
    return "".join(line).rstrip()


def _plain(text: str, ascii_only: bool) -> str:
    """`text` on one line with nothing a terminal would obey: controls (ESC, C1), format
    characters (bidi overrides, zero-width) and the like dropped, white-space controls
    spaced; outside ASCII a `?` each when `ascii_only`."""
    out = []
    for ch in text:
        if ch in "\t\n\v\f\r\x1c\x1d\x1e\x85\u2028\u2029":
            out.append(" ")
        elif unicodedata.category(ch) in _DROPPED:
            continue
        elif ascii_only and not ch.isascii():
            out.append("?")
        else:
            out.append(ch)
    return "".join(out)


def _char_cols(ch: str) -> int:
    """Terminal columns of one character: 0 combining, 2 wide (East Asian W/F), else 1."""
    if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me"):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def _cols(text: str) -> int:
    """Terminal columns of `text` (see `_char_cols`)."""
    return sum(_char_cols(ch) for ch in text)


def _fit(label: str, cols: int, ellipsis: str) -> str:
    """`label` padded with spaces to `cols` columns, or cut to `cols - 1` and `ellipsis`."""
    if _cols(label) <= cols:
        return label + " " * (cols - _cols(label))
    out, used = "", 0
    for ch in label:
        if used + _char_cols(ch) > cols - 1:
            break
        out, used = out + ch, used + _char_cols(ch)
    cut = out + (ellipsis if cols >= 1 else "")
    return cut + " " * (cols - _cols(cut))
