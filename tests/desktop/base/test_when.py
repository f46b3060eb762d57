"""Times and durations as people type and read them (`rbroker.base.when`, issue 41): every
accepted form and every refusal with its exact value, local times across daylight-saving
changes in Berlin and New York resolved with the rules of their own date (through a tz
database zone and through the system's own rules alike), the skipped and the repeated hour,
and durations written and read back."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone, tzinfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rbroker.base.when import (
    MAX_DURATION_S,
    fmt_duration,
    fmt_when,
    fmt_window,
    local_time,
    local_zone,
    parse_duration,
    parse_when,
    zone_name,
)

POSIX_RULES = {
    "Europe/Berlin": "CET-1CEST,M3.5.0,M10.5.0/3",
    "America/New_York": "EST5EDT,M3.2.0,M11.1.0",
}
"""The same rules as POSIX `TZ` strings, which the C library reads without a tz database."""


def _zoneinfo(name: str) -> tzinfo:
    try:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError
    except ImportError:  # pragma: no cover
        pytest.skip("no zoneinfo module")
    try:
        return ZoneInfo(name)
    except ZoneInfoNotFoundError:
        pytest.skip(f"no tz database here for {name} (the tzdata package is missing)")


def _system_zone(name: str) -> Iterator[None]:
    """The system's local zone set to `name`'s rules for the while of a test."""
    if not hasattr(time, "tzset"):
        pytest.skip("the system's zone cannot be changed here (time.tzset is POSIX only)")
    mp = pytest.MonkeyPatch()
    mp.setenv("TZ", POSIX_RULES[name])
    time.tzset()
    try:
        yield
    finally:
        mp.undo()
        time.tzset()


@pytest.fixture(params=["zoneinfo", "system"])
def berlin(request: pytest.FixtureRequest) -> Iterator[tzinfo | None]:
    """Europe/Berlin as `zone` (a tz database zone), or as the system's zone (`None`)."""
    if request.param == "zoneinfo":
        yield _zoneinfo("Europe/Berlin")
    else:
        yield from _system_zone("Europe/Berlin")


@pytest.fixture(params=["zoneinfo", "system"])
def new_york(request: pytest.FixtureRequest) -> Iterator[tzinfo | None]:
    """America/New_York as `zone` (a tz database zone), or as the system's zone (`None`)."""
    if request.param == "zoneinfo":
        yield _zoneinfo("America/New_York")
    else:
        yield from _system_zone("America/New_York")


NOW = datetime(2026, 12, 6, 18, 30, tzinfo=UTC)
"""Sunday 2026-12-06, 19:30 in Berlin (CET, UTC+1)."""


def _utc(year: int, month: int, day: int, hour: int, minute: int, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


# -- parse_when ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("NOW", NOW),
        ("21:00", _utc(2026, 12, 6, 20, 0)),  # still ahead today
        ("19:30", NOW),  # now itself is not past
        ("14:00", _utc(2026, 12, 7, 13, 0)),  # past: tomorrow
        ("9:30", _utc(2026, 12, 7, 8, 30)),
        ("  09:30 ", _utc(2026, 12, 7, 8, 30)),
        ("tomorrow 09:30", _utc(2026, 12, 7, 8, 30)),
        ("Tomorrow  9:30", _utc(2026, 12, 7, 8, 30)),
        ("today 14:00", _utc(2026, 12, 6, 13, 0)),  # today may be past
        ("today 23:59", _utc(2026, 12, 6, 22, 59)),
        ("mon 14:00", _utc(2026, 12, 7, 13, 0)),
        ("monday 14:00", _utc(2026, 12, 7, 13, 0)),
        ("MON 14:00", _utc(2026, 12, 7, 13, 0)),
        ("tue 08:00", _utc(2026, 12, 8, 7, 0)),
        ("thurs 08:00", _utc(2026, 12, 10, 7, 0)),
        ("sat 00:00", _utc(2026, 12, 11, 23, 0)),
        ("sun 20:00", _utc(2026, 12, 6, 19, 0)),  # today is Sunday and 20:00 is ahead
        ("sunday 19:00", _utc(2026, 12, 13, 18, 0)),  # past today: a week on
        ("+2h", _utc(2026, 12, 6, 20, 30)),
        ("in 2h", _utc(2026, 12, 6, 20, 30)),
        ("in 90m", _utc(2026, 12, 6, 20, 0)),
        ("in 1h30m", _utc(2026, 12, 6, 20, 0)),
        ("+1:30", _utc(2026, 12, 6, 20, 0)),
        ("2026-12-08T14:00", _utc(2026, 12, 8, 13, 0)),
        ("2026-12-08 14:00", _utc(2026, 12, 8, 13, 0)),
        ("2026-12-08t14:00:30", _utc(2026, 12, 8, 13, 0, 30)),
        ("2026-12-08T14:00+01:00", _utc(2026, 12, 8, 13, 0)),
        ("2026-12-08T14:00-05:00", _utc(2026, 12, 8, 19, 0)),
        ("2026-12-08T13:00Z", _utc(2026, 12, 8, 13, 0)),
        ("2026-12-08", _utc(2026, 12, 7, 23, 0)),  # 00:00 local
        ("2026-07-08 14:00", _utc(2026, 7, 8, 12, 0)),  # summer time on that date
        ("2026-11-30 10:00", _utc(2026, 11, 30, 9, 0)),  # in the past: taken as it is
    ],
)
def test_each_form_names_its_instant(text: str, expected: datetime, berlin: tzinfo | None) -> None:
    at = parse_when(text, NOW, berlin)
    assert at == expected
    assert at.utcoffset() == timedelta(0)


def test_now_may_be_in_any_zone() -> None:
    now = NOW.astimezone(timezone(timedelta(hours=-8)))  # what matters is the instant
    assert parse_when("21:00", now, _zoneinfo("Europe/Berlin")) == _utc(2026, 12, 6, 20, 0)


def test_a_naive_now_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="aware"):
        parse_when("now", datetime(2026, 12, 6, 19, 30))


FORMS = (
    'expected "now", HH:MM, "tomorrow 09:30", "mon 14:00", '
    'ISO 8601 like 2026-12-08T14:00, or "in 2h"'
)
DURATIONS = "expected a number with a unit, like 2h, 90m, 1h30m, 1.5h, 1d or 2:30"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("25:00", f'"25:00": not a time ({FORMS})'),
        ("12:60", f'"12:60": not a time ({FORMS})'),
        ("1400", f'"1400": not a time ({FORMS})'),
        ("noon", f'"noon": not a time ({FORMS})'),
        ("", f'"": no time given ({FORMS})'),
        ("   ", f'"   ": no time given ({FORMS})'),
        ("tomorrow", '"tomorrow": needs a time of day, like "tomorrow 14:00"'),
        ("mon", '"mon": needs a time of day, like "mon 14:00"'),
        ("tomorrow 24:00", f'"tomorrow 24:00": not a time ({FORMS})'),
        ("tomorrow at 09:30", f'"tomorrow at 09:30": not a time ({FORMS})'),
        ("mo 14:00", f'"mo 14:00": not a time ({FORMS})'),
        ("2026-13-01", f'"2026-13-01": not a date and time ({FORMS})'),
        ("2026-12-08T25:00", f'"2026-12-08T25:00": not a date and time ({FORMS})'),
        ("in 2x", f'"in 2x": not a duration ({DURATIONS})'),
        ("in 2", '"in 2": needs a unit, like 2m or 2h'),
        ("in -2h", '"in -2h": a duration cannot be negative'),
        ("+0m", '"+0m": a duration must be more than zero'),
        ("in 400d", '"in 400d": longer than 366 days'),
        ("9999-12-31T23:59-05:00", '"9999-12-31T23:59-05:00": out of range'),
        ("0001-01-01T00:00", '"0001-01-01 00:00:00": out of range'),
    ],
)
def test_each_refusal_is_one_line(text: str, message: str, berlin: tzinfo | None) -> None:
    with pytest.raises(ValueError) as caught:
        parse_when(text, NOW, berlin)
    assert str(caught.value) == message


# -- daylight saving -------------------------------------------------------------------------
# 2026: Europe springs forward on Sunday 29 March (02:00 CET → 03:00 CEST) and falls back on
# Sunday 25 October (03:00 CEST → 02:00 CET); New York on Sunday 8 March (02:00 EST → 03:00
# EDT) and Sunday 1 November (02:00 EDT → 01:00 EST). Each `now` is the evening before.
@pytest.mark.parametrize(
    ("now", "text", "expected"),
    [
        (_utc(2026, 3, 28, 19, 0), "tomorrow 14:00", _utc(2026, 3, 29, 12, 0)),  # CEST, +2
        (_utc(2026, 3, 28, 19, 0), "sun 14:00", _utc(2026, 3, 29, 12, 0)),
        (_utc(2026, 3, 28, 19, 0), "14:00", _utc(2026, 3, 29, 12, 0)),
        (_utc(2026, 3, 28, 19, 0), "tomorrow 01:59", _utc(2026, 3, 29, 0, 59)),  # still CET
        (_utc(2026, 3, 28, 19, 0), "tomorrow 02:30", _utc(2026, 3, 29, 1, 30)),  # gap: 03:30
        (_utc(2026, 3, 28, 19, 0), "tomorrow 03:00", _utc(2026, 3, 29, 1, 0)),
        (_utc(2026, 3, 28, 19, 0), "in 1d", _utc(2026, 3, 29, 19, 0)),  # 24 h elapsed
        (_utc(2026, 10, 24, 18, 0), "tomorrow 14:00", _utc(2026, 10, 25, 13, 0)),  # CET, +1
        (_utc(2026, 10, 24, 18, 0), "2026-10-25 14:00", _utc(2026, 10, 25, 13, 0)),
        (_utc(2026, 10, 24, 18, 0), "tomorrow 02:30", _utc(2026, 10, 25, 0, 30)),  # 1st 02:30
        (_utc(2026, 10, 24, 18, 0), "tomorrow 03:00", _utc(2026, 10, 25, 2, 0)),
    ],
)
def test_berlin_across_its_changes(
    now: datetime, text: str, expected: datetime, berlin: tzinfo | None
) -> None:
    assert parse_when(text, now, berlin) == expected


@pytest.mark.parametrize(
    ("now", "text", "expected"),
    [
        (_utc(2026, 3, 8, 1, 0), "tomorrow 14:00", _utc(2026, 3, 8, 18, 0)),  # EDT, −4
        (_utc(2026, 3, 8, 1, 0), "tomorrow 02:30", _utc(2026, 3, 8, 7, 30)),  # gap: 03:30
        (_utc(2026, 3, 8, 1, 0), "sunday 01:30", _utc(2026, 3, 8, 6, 30)),  # still EST
        (_utc(2026, 11, 1, 0, 0), "tomorrow 14:00", _utc(2026, 11, 1, 19, 0)),  # EST, −5
        (_utc(2026, 11, 1, 0, 0), "tomorrow 01:30", _utc(2026, 11, 1, 5, 30)),  # 1st 01:30
        (_utc(2026, 11, 1, 0, 0), "2026-11-01T01:30", _utc(2026, 11, 1, 5, 30)),
    ],
)
def test_new_york_across_its_changes(
    now: datetime, text: str, expected: datetime, new_york: tzinfo | None
) -> None:
    assert parse_when(text, now, new_york) == expected


def test_a_fixed_offset_would_be_wrong_here() -> None:
    """What the rules above guard against: the offset in force the evening before."""
    now = _utc(2026, 3, 28, 19, 0)
    cet = timezone(timedelta(hours=1), "CET")
    assert parse_when("tomorrow 14:00", now, cet) == _utc(2026, 3, 29, 13, 0)


# -- parse_duration --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2h", 7_200.0),
        ("90m", 5_400.0),
        ("90min", 5_400.0),
        ("1h30m", 5_400.0),
        ("1h 30m", 5_400.0),
        ("1 h 30 min", 5_400.0),
        ("45s", 45.0),
        ("1d", 86_400.0),
        ("1d2h", 93_600.0),
        ("2 d 3 h", 183_600.0),
        ("2:30", 9_000.0),
        ("0:45", 2_700.0),
        ("1.5h", 5_400.0),
        ("0.5s", 0.5),
        (" 2H ", 7_200.0),
        ("366d", 31_622_400.0),
    ],
)
def test_each_duration_form(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("90", '"90": needs a unit, like 90m or 90h'),
        ("1.5", '"1.5": needs a unit, like 1.5m or 1.5h'),
        ("0h", '"0h": a duration must be more than zero'),
        ("0:00", '"0:00": a duration must be more than zero'),
        ("-2h", '"-2h": a duration cannot be negative'),
        ("367d", '"367d": longer than 366 days'),
        ("366d1s", '"366d1s": longer than 366 days'),
        ("9" * 400 + "h", f'"{"9" * 400}h": longer than 366 days'),  # inf after float()
        ("inf", f'"inf": not a duration ({DURATIONS})'),
        ("nan", f'"nan": not a duration ({DURATIONS})'),
        ("2x", f'"2x": not a duration ({DURATIONS})'),
        ("h", f'"h": not a duration ({DURATIONS})'),
        ("", f'"": not a duration ({DURATIONS})'),
        ("1h1h", f'"1h1h": not a duration ({DURATIONS})'),
        ("30m1h", f'"30m1h": not a duration ({DURATIONS})'),
        ("1mon", f'"1mon": not a duration ({DURATIONS})'),
        ("2:60", f'"2:60": not a duration (minutes over 59; {DURATIONS})'),
    ],
)
def test_each_duration_refusal_is_one_line(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_duration(text)
    assert str(caught.value) == message


# -- fmt_duration ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"),
        (0.4, "0 s"),
        (0.5, "1 s"),
        (45, "45 s"),
        (60, "1 min"),
        (900, "15 min"),
        (3_599, "59 min 59 s"),
        (3_600, "1 h"),
        (3_629, "1 h"),  # from an hour on, to the minute
        (3_630, "1 h 1 min"),
        (5_400, "1 h 30 min"),
        (14_400, "4 h"),
        (86_400, "1 d"),
        (183_600, "2 d 3 h"),
        (183_660, "2 d 3 h 1 min"),
    ],
)
def test_durations_are_written_compactly(seconds: float, text: str) -> None:
    assert fmt_duration(seconds) == text


@pytest.mark.parametrize("seconds", [-1.0, math.inf, math.nan])
def test_a_duration_that_cannot_be_written(seconds: float) -> None:
    with pytest.raises(ValueError, match="cannot be written"):
        fmt_duration(seconds)


@given(st.integers(min_value=1, max_value=MAX_DURATION_S))
def test_a_written_duration_reads_back(seconds: int) -> None:
    back = parse_duration(fmt_duration(seconds))
    if seconds < 3_600 or seconds % 60 == 0:
        assert back == seconds
    else:
        assert abs(back - seconds) <= 30 and back % 60 == 0


# -- fmt_when, fmt_window, zone names --------------------------------------------------------
T0 = NOW.timestamp()
H = 3_600


@pytest.mark.parametrize(
    ("delta_s", "text"),
    [
        (0, "19:30"),
        (-10 * H, "09:30"),  # earlier today
        (-20 * H, "2026-12-05 23:30"),  # yesterday
        (59.9, "19:30"),  # minutes are cut
        (4 * H + 29 * 60, "23:59"),
        (5 * H, "tomorrow 00:30"),
        (24 * H, "tomorrow 19:30"),
        (2 * 24 * H, "Tue 19:30"),
        (6 * 24 * H, "Sat 19:30"),
        (7 * 24 * H, "2026-12-13 19:30"),
    ],
)
def test_an_instant_as_the_viewer_reads_it(
    delta_s: float, text: str, berlin: tzinfo | None
) -> None:
    assert fmt_when(T0 + delta_s, T0, berlin) == text


@pytest.mark.parametrize(
    ("start", "end", "text"),
    [
        (-1.5 * H, 0.5 * H, "18:00–20:00"),
        (0.5 * H, 4.5 * H, "20:00–24:00"),  # ends at midnight
        (0.5 * H, 6.5 * H, "20:00–tomorrow 02:00"),
        (24 * H, 27 * H, "tomorrow 19:30–22:30"),
        (42.5 * H, 54.5 * H, "Tue 14:00–Wed 02:00"),
        (42.5 * H, 52.5 * H, "Tue 14:00–24:00"),
        (-20 * H, -17 * H, "2026-12-05 23:30–02:30"),
    ],
)
def test_a_window_as_the_viewer_reads_it(
    start: float, end: float, text: str, berlin: tzinfo | None
) -> None:
    assert fmt_window(T0 + start, T0 + end, T0, berlin) == text


def test_a_window_ends_after_it_starts() -> None:
    with pytest.raises(ValueError, match="ends after it starts"):
        fmt_window(T0, T0, T0)


def test_across_a_change_each_end_has_its_own_offset(berlin: tzinfo | None) -> None:
    now = _utc(2026, 3, 28, 19, 0).timestamp()
    start = _utc(2026, 3, 29, 0, 0).timestamp()  # 01:00 CET
    assert fmt_window(start, start + 2 * H, now, berlin) == "tomorrow 01:00–04:00"
    assert local_time(start + 2 * H, berlin).utcoffset() == timedelta(hours=2)


@pytest.mark.parametrize(
    ("zone", "names"),
    [
        ("Europe/Berlin", {"CET", "CEST"}),
        ("Asia/Kolkata", {"IST"}),
        ("Asia/Dubai", {"UTC+04:00"}),  # the tz database's "+04"
        ("UTC", {"UTC"}),
    ],
)
def test_a_zone_is_named_shortly(zone: str, names: set[str]) -> None:
    assert zone_name(_zoneinfo(zone)) in names


@pytest.mark.parametrize(
    ("zone", "name"),
    [
        (UTC, "UTC"),
        (timezone(timedelta(hours=-3, minutes=-30)), "UTC-03:30"),
        (timezone(timedelta(hours=1), "W. Europe Standard Time"), "UTC+01:00"),
        (timezone(timedelta(hours=1), "CET"), "CET"),
    ],
)
def test_a_long_or_numeric_name_becomes_the_offset(zone: tzinfo, name: str) -> None:
    assert zone_name(zone) == name


@pytest.mark.skipif(sys.platform == "win32", reason="time.tzset is POSIX only")
def test_the_system_zone_is_named_and_fixed_for_now() -> None:
    for _ in _system_zone("Europe/Berlin"):
        assert zone_name() in {"CET", "CEST"}
        zone = local_zone()
        assert zone.tzname(None) == zone_name()
        assert zone.utcoffset(None) in {timedelta(hours=1), timedelta(hours=2)}
