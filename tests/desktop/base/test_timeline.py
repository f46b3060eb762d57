"""A day of bookings per GPU as terminal lines (`rbroker.base.timeline`, issue 41): the exact
drawing of a small case in Unicode and in ASCII, what a cell's mark says (the peak within its
slot, windows that touch not overlapping, the viewer's own bookings), hour labels in the
viewer's zone, no line wider than asked, and no control character from a label reaching the
terminal."""

from __future__ import annotations

import unicodedata
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rbroker.base.timeline import TimelineRow, TimelineSpan, render_timeline

H = 3_600
CET = timezone(timedelta(hours=1), "CET")
ORIGIN = datetime(2026, 12, 6, 18, 0, tzinfo=UTC).timestamp()
"""19:00 in CET."""

ROWS = [
    TimelineRow(
        "GPU 0",
        24_000,
        [
            TimelineSpan(ORIGIN + 1 * H, ORIGIN + 4 * H, 6_000, mine=False),  # a quarter
            TimelineSpan(ORIGIN + 3 * H, ORIGIN + 6 * H, 12_000, mine=True),  # a half, mine
        ],
    ),
    TimelineRow("GPU 1", 10_000, [TimelineSpan(ORIGIN + 10.5 * H, ORIGIN + 30 * H, 10_000, False)]),
]


def _cols(text: str) -> int:
    """Terminal columns: combining marks none, East Asian wide and full-width two."""
    return sum(
        0
        if unicodedata.combining(ch)
        else 2
        if unicodedata.east_asian_width(ch) in ("W", "F")
        else 1
        for ch in text
    )


def test_a_small_day_at_40_columns() -> None:
    assert render_timeline(ROWS, ORIGIN, width=40, zone=CET) == [
        "           00:00   08:00",
        "GPU 0  ░░◕◑◑                  ",
        "GPU 1           ██████████████",
        "░▒▓█ booked; ◔◑◕● yours",
    ]


def test_the_same_in_ascii() -> None:
    lines = render_timeline(ROWS, ORIGIN, width=40, zone=CET, ascii_only=True)
    assert lines == [
        "           00:00   08:00",
        "GPU 0  ..***                  ",
        "GPU 1           ##############",
        ".:+# booked; * yours",
    ]
    assert all(line.encode("cp1252") and line.isascii() for line in lines)


def test_at_80_columns_an_hour_is_three_cells() -> None:
    lines = render_timeline(ROWS, ORIGIN, zone=CET)
    assert lines[0] == ("            21:00    00:00    03:00    06:00    09:00    12:00    15:00")
    assert lines[1] == "GPU 0    ░░░░░░◕◕◕◑◑◑◑◑◑" + " " * 54
    assert lines[2] == "GPU 1 " + " " * 31 + "█" * 41  # from 10:20, the slot of the start
    assert lines[3] == (
        "░ <⅓  ▒ <⅔  ▓ <all  █ all of the usable MiB booked;  ◔◑◕● the same, with yours"
    )
    assert max(_cols(line) for line in lines) <= 80


@pytest.mark.parametrize(
    ("spans", "cells"),
    [
        # [0, 1 h) and [1 h, 2 h) touch: neither slot holds both
        ([(0, 1, 5_000, False), (1, 2, 5_000, False)], "▒▒  "),
        # the peak within a slot counts, not its average
        ([(0.5, 0.6, 9_000, False)], "▓   "),
        ([(0, 4, 10_000, False)], "████"),
        ([(0, 4, 12_000, False)], "████"),  # over the usable: full
        ([(0, 1, 3_333, False), (1, 2, 3_334, False), (2, 3, 6_667, False)], "░▒▓ "),
        ([(0, 1, 0, True), (3, 4, 10_000, True)], "◔  ●"),  # mine, whatever its size
        ([(2, 3, 1_000, True), (2, 3, 8_000, False)], "  ◕ "),  # mine among others
        ([(-5, 0, 10_000, False), (4, 9, 10_000, True)], "    "),  # outside the hours
        ([(2, 1, 10_000, False), (1, 2, -5, False)], "    "),  # empty, negative: left out
    ],
)
def test_what_a_cell_shows(spans: list[tuple[float, float, int, bool]], cells: str) -> None:
    row = TimelineRow(
        "g", 10_000, [TimelineSpan(ORIGIN + a * H, ORIGIN + b * H, m, o) for a, b, m, o in spans]
    )
    lines = render_timeline([row], ORIGIN, hours=4, width=6, zone=CET)
    assert lines[1] == "g " + cells


def test_hour_labels_fall_on_whole_local_hours() -> None:
    """A zone half an hour off UTC: the first label is at the first whole local hour."""
    india = timezone(timedelta(hours=5, minutes=30))
    lines = render_timeline([TimelineRow("GPU 0", 1, [])], ORIGIN, hours=6, width=80, zone=india)
    # 72 cells of 5 min from 23:30 local: 00:00 at cell 6, then every hour (12 cells)
    assert (
        lines[0] == " " * 6 + " " * 6 + "".join(f"{h:02d}:00" + " " * 7 for h in range(6)).rstrip()
    )
    assert lines[1] == "GPU 0 " + " " * 72


def test_a_daylight_saving_change_shows_in_the_labels() -> None:
    try:
        from zoneinfo import ZoneInfo

        berlin = ZoneInfo("Europe/Berlin")
    except Exception:  # no tz database here (tzdata missing)
        pytest.skip("no tz database for Europe/Berlin (the tzdata package is missing)")
    origin = datetime(2026, 3, 28, 23, 0, tzinfo=UTC).timestamp()  # 00:00 CET on the 29th
    lines = render_timeline([TimelineRow("GPU 0", 1, [])], origin, hours=6, width=80, zone=berlin)
    # 01:00 CET is followed by 03:00 CEST: no 02:00 that day
    assert lines[0] == " " * 6 + "00:00       01:00       03:00       04:00       05:00       06:00"


def test_labels_carry_no_control_characters() -> None:
    rows = [
        TimelineRow(
            "GPU\x1b[2J 0\u202e\x9b\x00", 100, [TimelineSpan(ORIGIN, ORIGIN + H, 50, False)]
        ),
        TimelineRow("line\nbreak\ttab", 100, []),
    ]
    for ascii_only in (False, True):
        lines = render_timeline(rows, ORIGIN, width=60, zone=CET, ascii_only=ascii_only)
        assert lines[1].startswith("GPU[2J 0      ")
        assert lines[2].startswith("line break tab ")
        for line in lines:
            assert not any(unicodedata.category(ch) in ("Cc", "Cf") for ch in line)


def test_long_and_wide_labels_are_cut_to_a_quarter_of_the_width() -> None:
    rows = [TimelineRow("GPU 0 · A100-SXM4-80GB", 1, []), TimelineRow("显卡一号机器", 1, [])]
    lines = render_timeline(rows, ORIGIN, width=40, zone=CET)
    assert lines[1].startswith("GPU 0 · A… ")
    assert lines[2].startswith("显卡一号…  ")  # 8 columns and …, padded to 10
    ascii_lines = render_timeline(rows, ORIGIN, width=40, zone=CET, ascii_only=True)
    assert ascii_lines[1].startswith("GPU 0 ? A~ ")
    assert ascii_lines[2].startswith("??????     ")


@pytest.mark.parametrize(("hours", "width"), [(0, 80), (24, 1)])
def test_a_timeline_that_cannot_be_drawn(hours: int, width: int) -> None:
    with pytest.raises(ValueError):
        render_timeline(ROWS, ORIGIN, hours=hours, width=width, zone=CET)


spans = st.builds(
    TimelineSpan,
    st.floats(-30 * H, 60 * H).map(lambda s: ORIGIN + s),
    st.floats(-30 * H, 60 * H).map(lambda s: ORIGIN + s),
    st.integers(-10, 100_000),
    st.booleans(),
)
rows = st.builds(
    TimelineRow, st.text(max_size=30), st.integers(-1, 100_000), st.lists(spans, max_size=8)
)


@given(
    st.lists(rows, max_size=4),
    st.integers(1, 72),
    st.integers(2, 200),
    st.booleans(),
)
def test_no_line_is_wider_than_asked(
    drawn: list[TimelineRow], hours: int, width: int, ascii_only: bool
) -> None:
    lines = render_timeline(
        drawn, ORIGIN, hours=hours, width=width, zone=CET, ascii_only=ascii_only
    )
    assert len(lines) == len(drawn) + 2
    assert all(_cols(line) <= width for line in lines)
    if ascii_only:
        assert all(line.isascii() for line in lines)


def test_a_thousand_bookings_on_eight_gpus() -> None:
    """The size `rbroker bookings` may meet (timing checked by hand: a few ms)."""
    many = [
        TimelineRow(
            f"GPU {g}",
            80_000,
            [
                TimelineSpan(ORIGIN + i * 90, ORIGIN + i * 90 + 2 * H, 500, i % 7 == g)
                for i in range(1_000)
            ],
        )
        for g in range(8)
    ]
    lines = render_timeline(many, ORIGIN, zone=CET)
    assert len(lines) == 10 and all(_cols(line) <= 80 for line in lines)
