"""Wall-clock times and durations as people type and read them (a booking's `--start WHEN
--for DURATION`, issue 41): parsed into UTC, shown in the viewer's zone.

A calendar time is a promise made on the wall clock, so a local time of day is resolved with
the zone's rules at *that* date, not with the offset in force now: `tomorrow 14:00` typed the
evening before a daylight-saving change is 14:00 on tomorrow's clock. Every function takes
`zone`: a `tzinfo` with real rules (`zoneinfo.ZoneInfo("Europe/Berlin")`), or `None` for the
system's own local rules, applied through a naive datetime's `timestamp()` and `astimezone()`
(the C library's local time: no tz database needed, so it works on Windows without the
`tzdata` package). Not through a naive `astimezone(UTC)`: in CPython 3.11 that reads a
skipped time with the offset after the change, against PEP 495 and its own `timestamp()`.

Two wall times need a rule (PEP 495's `fold=0`, the same on both paths):

- a time the clock skips (spring forward, 02:30 in Berlin on the last Sunday of March) is
  read with the offset before the change, so it lands as far after the gap's end as it was
  after the gap's start: 02:30 → 03:30 summer time;
- a time the clock shows twice (fall back, 02:30 on the last Sunday of October) is the
  first one, still on summer time.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from typing import Final

MAX_DURATION_S: Final = 366 * 86_400
"""The longest duration `parse_duration` accepts: 366 days."""

WHEN_FORMS: Final = (
    'expected "now", HH:MM, "tomorrow 09:30", "mon 14:00", '
    'ISO 8601 like 2026-12-08T14:00, or "in 2h"'
)
"""The accepted forms of `parse_when`, as its errors name them."""

DURATION_FORMS: Final = "expected a number with a unit, like 2h, 90m, 1h30m, 1.5h, 1d or 2:30"
"""The accepted forms of `parse_duration`, as its errors name them."""

_WEEKDAYS: Final = {
    name: day
    for day, names in enumerate(
        (
            ("mon", "monday"),
            ("tue", "tues", "tuesday"),
            ("wed", "wednesday"),
            ("thu", "thur", "thurs", "thursday"),
            ("fri", "friday"),
            ("sat", "saturday"),
            ("sun", "sunday"),
        )
    )
    for name in names
}
"""Weekday names (English, lower case) → `date.weekday()` (Monday 0)."""

_DAY_NAMES: Final = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")

_CLOCK: Final = re.compile(r"(\d{1,2}):(\d{2})")
_RELATIVE: Final = re.compile(r"(?:\+|in\s+)(.+)")
_PART: Final = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(d|h|min|m|s)(?![a-z])")
_UNIT_S: Final = {"d": 86_400, "h": 3_600, "min": 60, "m": 60, "s": 1}
_UNIT_RANK: Final = {"d": 0, "h": 1, "min": 2, "m": 2, "s": 3}


# -- zones -----------------------------------------------------------------------------------
def local_zone() -> tzinfo:
    """The system's local zone as it stands now: a fixed offset with the system's name for it
    (`CET`, `UTC+01:00` style). For naming and for now only: a fixed offset is wrong across a
    daylight-saving change, so the functions here resolve wall times with `zone=None`
    (the system's rules at each date), never with this."""
    zone = datetime.now().astimezone().tzinfo
    assert zone is not None  # astimezone() always sets one
    return zone


def local_time(at_utc_s: float, zone: tzinfo | None = None) -> datetime:
    """The aware local date-time of `at_utc_s` (Unix seconds) in `zone`, or in the system's
    local zone (with the offset in force at that instant) when `zone` is `None`."""
    at = datetime.fromtimestamp(at_utc_s, UTC)
    return at.astimezone(zone) if zone is not None else at.astimezone()


def zone_name(zone: tzinfo | None = None) -> str:
    """`"CET"`, `"UTC"`, `"UTC+05:30"`: the name of `zone` (`None`: the system's) as it stands
    now, for a line like "times in CET". A name that is not a short abbreviation (Windows
    writes "W. Europe Standard Time", the tz database "+03") is given as the offset."""
    now = datetime.now(zone) if zone is not None else datetime.now().astimezone()
    name = now.tzname() or ""
    if re.fullmatch(r"[A-Za-z]{2,6}", name):
        return name
    offset = now.utcoffset() or timedelta(0)
    minutes = round(offset.total_seconds() / 60)
    if minutes == 0:
        return "UTC"
    sign = "+" if minutes > 0 else "-"
    hh, mm = divmod(abs(minutes), 60)
    return f"UTC{sign}{hh:02d}:{mm:02d}"


def _resolve(wall: datetime, zone: tzinfo | None) -> datetime:
    """The UTC instant of the naive local `wall` in `zone` (`None`: the system's rules at that
    date), with `fold=0` (see the module's doc). `ValueError` when out of range."""
    wall = wall.replace(fold=0)
    try:
        if zone is not None:
            return wall.replace(tzinfo=zone).astimezone(UTC)
        return datetime.fromtimestamp(wall.timestamp(), UTC)
    except (OverflowError, OSError, ValueError):  # beyond what the platform's clocks take
        raise ValueError(f'"{wall.isoformat(" ")}": out of range') from None


# -- parsing ---------------------------------------------------------------------------------
def parse_when(text: str, now: datetime, zone: tzinfo | None = None) -> datetime:
    """The aware UTC date-time that `text` names, seen from `now` (aware; `TypeError` if
    naive) in `zone` (`None`: the system's local rules, which is what people mean).

    Forms (case and surrounding spaces do not matter):

    - `now`: `now` itself;
    - `14:00`, `9:30`: today at that local time if it is still ahead (or is now), else
      tomorrow;
    - `today 14:00`, `tomorrow 09:30`: that day at that local time (`today` may be past);
    - `mon 14:00`, `monday 14:00` (any English weekday, three letters or whole): the next
      such day at that time, today if today is that day and the time is still ahead;
    - `+2h`, `in 2h`, `in 90m`, `in 1h30m`: `now` plus a `parse_duration` (elapsed time: a
      day across a daylight-saving change is still 24 h);
    - ISO 8601 date-times, `2026-12-08T14:00`, `2026-12-08 14:00` (local time), or with a
      zone, `2026-12-08T14:00+01:00`, `2026-12-08T13:00Z`; a date alone, `2026-12-08`, is
      00:00 local time.

    Local times are resolved with the zone's rules at their own date; a time the clock skips
    or shows twice follows the module's rule (`fold=0`). Raises `ValueError` with one line
    naming `text`, the problem and the accepted forms."""
    if now.tzinfo is None or now.utcoffset() is None:
        raise TypeError("parse_when: `now` must be an aware datetime")
    s = " ".join(text.strip().lower().split())
    if not s:
        raise ValueError(f'"{text}": no time given ({WHEN_FORMS})')
    if s == "now":
        return now.astimezone(UTC)
    relative = _RELATIVE.fullmatch(s)
    if relative:
        try:
            seconds = parse_duration(relative.group(1))
        except ValueError as exc:
            raise ValueError(f'"{text}": {_reason(exc)}') from None
        return now.astimezone(UTC) + timedelta(seconds=seconds)
    today = (now.astimezone(zone) if zone is not None else now.astimezone()).date()
    words = s.split(" ")
    if len(words) <= 2 and (words[0] in ("today", "tomorrow") or words[0] in _WEEKDAYS):
        if len(words) == 1:
            raise ValueError(f'"{text}": needs a time of day, like "{words[0]} 14:00"')
        clock = _clock(words[1], text)
        if words[0] == "today":
            return _resolve(datetime.combine(today, clock), zone)
        if words[0] == "tomorrow":
            return _resolve(datetime.combine(today + timedelta(days=1), clock), zone)
        ahead = (_WEEKDAYS[words[0]] - today.weekday()) % 7
        at = _resolve(datetime.combine(today + timedelta(days=ahead), clock), zone)
        if at < now:
            at = _resolve(datetime.combine(today + timedelta(days=ahead + 7), clock), zone)
        return at
    if ":" in s and "-" not in s:
        clock = _clock(s, text)
        at = _resolve(datetime.combine(today, clock), zone)
        if at < now:
            at = _resolve(datetime.combine(today + timedelta(days=1), clock), zone)
        return at
    return _iso(s, text, zone)


def _clock(word: str, text: str) -> time:
    """`"9:30"` → `time(9, 30)`; `ValueError` naming `text` otherwise."""
    m = _CLOCK.fullmatch(word)
    if m and int(m.group(1)) < 24 and int(m.group(2)) < 60:
        return time(int(m.group(1)), int(m.group(2)))
    raise ValueError(f'"{text}": not a time ({WHEN_FORMS})')


def _iso(s: str, text: str, zone: tzinfo | None) -> datetime:
    """An ISO 8601 date or date-time (`s`, lower-cased) as UTC; naive ones are local."""
    if not re.match(r"\d{4}-?\d{2}", s):
        raise ValueError(f'"{text}": not a time ({WHEN_FORMS})')
    try:
        at = datetime.fromisoformat(s.upper())
    except ValueError:
        raise ValueError(f'"{text}": not a date and time ({WHEN_FORMS})') from None
    if at.tzinfo is None:
        return _resolve(at, zone)
    try:
        return at.astimezone(UTC)
    except OverflowError:
        raise ValueError(f'"{text}": out of range') from None


def parse_duration(text: str) -> float:
    """The seconds that `text` names: `2h`, `90m` (or `90 min`), `1h30m`, `45s`, `1d`,
    `1d2h`, `1.5h`, `2:30` (hours:minutes), units largest first, each once, spaces allowed
    (`fmt_duration`'s own `1 h 30 min` reads back). A bare number is refused (minutes or
    hours? say which). Raises `ValueError` with one line naming `text` and the problem: no
    unit, not a duration, not more than zero, negative, longer than 366 days."""
    s = text.strip().lower()
    clock = _CLOCK.fullmatch(s)
    if clock:
        if int(clock.group(2)) >= 60:
            raise ValueError(f'"{text}": not a duration (minutes over 59; {DURATION_FORMS})')
        seconds = float(int(clock.group(1)) * 3600 + int(clock.group(2)) * 60)
    else:
        if s.startswith("-"):
            raise ValueError(f'"{text}": a duration cannot be negative')
        if re.fullmatch(r"\d+(\.\d+)?", s):
            raise ValueError(f'"{text}": needs a unit, like {s}m or {s}h')
        seconds, pos, rank = 0.0, 0, -1
        while pos < len(s):
            m = _PART.match(s, pos)
            if not m or _UNIT_RANK[m.group(2)] <= rank:
                raise ValueError(f'"{text}": not a duration ({DURATION_FORMS})')
            rank = _UNIT_RANK[m.group(2)]
            seconds += float(m.group(1)) * _UNIT_S[m.group(2)]
            pos = m.end()
            while pos < len(s) and s[pos] == " ":
                pos += 1
        if rank < 0:
            raise ValueError(f'"{text}": not a duration ({DURATION_FORMS})')
    if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
        raise ValueError(f'"{text}": longer than 366 days')
    if seconds <= 0:
        raise ValueError(f'"{text}": a duration must be more than zero')
    return seconds


def _reason(exc: ValueError) -> str:
    """A `parse_duration` error without its leading `"text": `."""
    return str(exc).split(": ", 1)[-1]


# -- writing ---------------------------------------------------------------------------------
def fmt_duration(seconds: float) -> str:
    """`14_400` → `"4 h"`, `5_400` → `"1 h 30 min"`, `900` → `"15 min"`, `183_600` →
    `"2 d 3 h"`, `45` → `"45 s"`, `0` → `"0 s"`: the nonzero units, largest first, rounded to
    the second, and to the minute from one hour on. `parse_duration` reads it back. Raises
    `ValueError` for a negative or non-finite `seconds`."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"a duration of {seconds} s cannot be written")
    whole = math.floor(seconds + 0.5)
    if whole >= 3600:
        whole = (whole + 30) // 60 * 60
    if whole == 0:
        return "0 s"
    parts = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60), ("s", 1)):
        count, whole = divmod(whole, size)
        if count:
            parts.append(f"{count} {unit}")
    return " ".join(parts)


def fmt_when(at_utc_s: float, now_utc_s: float, zone: tzinfo | None = None) -> str:
    """`at_utc_s` (Unix seconds) as a person in `zone` (`None`: the system's) reads it, seen
    from `now_utc_s`: `"14:00"` on today's date (past or ahead), `"tomorrow 09:30"`,
    `"Mon 14:00"` from 2 to 6 days ahead, else `"2026-12-20 14:00"`. Minutes are cut, not
    rounded (14:59:59 is 14:59)."""
    at = local_time(at_utc_s, zone)
    return _fmt_on(at, local_time(now_utc_s, zone).date())


def _fmt_on(at: datetime, today: date) -> str:
    days = (at.date() - today).days
    clock = f"{at.hour:02d}:{at.minute:02d}"
    if days == 0:
        return clock
    if days == 1:
        return f"tomorrow {clock}"
    if 2 <= days <= 6:
        return f"{_DAY_NAMES[at.weekday()]} {clock}"
    return f"{at.date().isoformat()} {clock}"


def fmt_window(start_s: float, end_s: float, now_s: float, zone: tzinfo | None = None) -> str:
    """`"14:00–18:00"`, `"22:00–24:00"`, `"Mon 14:00–Tue 02:00"`, `"tomorrow 22:00–Sat 02:00"`:
    the window [`start_s`, `end_s`) (Unix seconds) as `fmt_when` writes its ends, the end
    as a bare time when it falls on the start's date, or `24:00` at the midnight after it.
    Raises `ValueError` when `end_s` is not after `start_s`."""
    if not end_s > start_s:
        raise ValueError(f"a window ends after it starts (start {start_s}, end {end_s})")
    today = local_time(now_s, zone).date()
    start, end = local_time(start_s, zone), local_time(end_s, zone)
    if end.date() == start.date():
        tail = f"{end.hour:02d}:{end.minute:02d}"
    elif end.date() == start.date() + timedelta(days=1) and end.time() == time(0, 0):
        tail = "24:00"
    else:
        tail = _fmt_on(end, today)
    return f"{_fmt_on(start, today)}–{tail}"
