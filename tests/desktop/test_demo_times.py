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
