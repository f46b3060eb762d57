"""`rbroker demo`'s times: measured from the kill (taken before the signal is sent) and never
printed negative (the demo once printed "freed -3 ms after the kill")."""

from __future__ import annotations

import pytest

from rbroker.cli.demo import ms_text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0123, "12 ms"), (0.0, "0 ms"), (-0.003, "0 ms"), (-5.0, "0 ms"), (1.2345, "1234 ms")],
)
def test_milliseconds_are_whole_and_never_negative(seconds: float, text: str) -> None:
    assert ms_text(seconds) == text


@pytest.mark.parametrize("given", ["-3", "0", "9.9", "601", "nan", "inf", "ten"])
def test_demo_seconds_out_of_bounds_is_a_usage_error_naming_them(
    given: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `--seconds -3` was accepted and ran until killed, `--seconds 1` took 32 s."""
    from rbroker.cli.main import build_parser

    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["demo", "--seconds", given])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "argument --seconds: must be from 10 to 600 seconds (the worker part's length" in err
    assert err.rstrip().endswith(f"got {given!r}")


@pytest.mark.parametrize(("given", "value"), [("10", 10.0), ("20", 20.0), ("600", 600.0)])
def test_demo_seconds_within_bounds_is_taken(given: str, value: float) -> None:
    from rbroker.cli.main import build_parser

    assert build_parser().parse_args(["demo", "--seconds", given]).seconds == value
    assert build_parser().parse_args(["demo"]).seconds == 20.0


def test_the_summary_says_how_far_the_estimate_was_from_the_grant() -> None:
    from rbroker.cli.demo import _eta_line

    line = _eta_line((0.5, 9.0, "1 lease of a declared to end by then"), 2.0)
    assert line.endswith("likely in ~9 s; granted after 1.5 s: 7.5 s sooner than told"), line
    assert _eta_line((0.0, 2.0, "x"), 3.0).endswith("granted after 3.0 s: 1.0 s later than told")


@pytest.mark.parametrize(
    ("now", "job_moved", "stops"),
    [
        (29.0, 0.0, False),  # inside the budget: never
        (31.0, 20.0, False),  # past it, the job's last chunk 11 s ago: let it finish
        (31.0, 15.5, True),  # past it, no chunk for 15.5 s: a stuck job is not waited for
        (31.0, 0.0, True),  # past it and the job never reported
        (89.0, 88.0, False),
        (91.0, 90.5, True),  # past three budgets, whatever the job does
    ],
)
def test_past_its_budget_the_demo_waits_only_for_a_job_that_still_reports(
    now: float, job_moved: float, stops: bool
) -> None:
    """The Windows demo under a loaded test run once stopped a job that was reporting (4 of
    24 chunks) at the 30 s budget and failed its own check."""
    from rbroker.cli.demo import _over_time

    assert _over_time(now, 30.0, job_moved) is stops
