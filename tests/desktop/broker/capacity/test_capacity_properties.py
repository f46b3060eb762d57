"""Properties of the capacity arithmetic (architecture.md §2), checked with hypothesis."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rbroker.base.display import explain, fmt_mib
from rbroker.broker.capacity import (
    HEADROOM_MIN_MIB,
    Capacity,
    default_headroom_mib,
    outstanding_mib,
)

MIB_MAX = 16 * 1024 * 1024
totals = st.integers(min_value=1, max_value=MIB_MAX)
amounts = st.integers(min_value=0, max_value=MIB_MAX)


@st.composite
def capacities(draw: st.DrawFn) -> Capacity:
    total = draw(totals)
    return Capacity(
        total_mib=total,
        headroom_mib=draw(st.integers(min_value=0, max_value=total)),
        device_used_mib=draw(st.integers(min_value=0, max_value=total)),
        outstanding_mib=draw(st.integers(min_value=0, max_value=2 * total)),
    )


@given(capacities())
def test_available_is_never_negative(cap: Capacity) -> None:
    assert cap.available_mib >= 0
    assert cap.available_mib <= cap.usable_mib <= cap.total_mib


@given(capacities(), st.integers(min_value=1, max_value=MIB_MAX))
def test_a_grant_that_fits_keeps_the_sum_within_total(cap: Capacity, mib: int) -> None:
    if cap.fits(mib):
        assert cap.device_used_mib + cap.outstanding_mib + mib + cap.headroom_mib <= cap.total_mib
    else:
        assert mib > cap.total_mib - cap.headroom_mib - cap.device_used_mib - cap.outstanding_mib


@given(
    totals,
    st.integers(min_value=0, max_value=MIB_MAX),
    st.lists(st.integers(min_value=1, max_value=MIB_MAX // 4), max_size=40),
)
def test_grants_in_sequence_never_over_admit(total: int, used: int, requests: list[int]) -> None:
    """Book every request that fits, one after the other, as the admission pass does: the
    booked total never pushes past total − headroom − device_used."""
    headroom = default_headroom_mib(total)
    used = min(used, total)
    booked: list[tuple[int, int]] = []
    for mib in requests:
        cap = Capacity(total, headroom, used, outstanding_mib(booked))
        if cap.fits(mib):
            booked.append((mib, 0))
        after = Capacity(total, headroom, used, outstanding_mib(booked))
        if booked:
            assert used + after.outstanding_mib + headroom <= total
        assert after.available_mib >= 0


@given(st.lists(st.tuples(amounts, amounts), max_size=30))
def test_outstanding_counts_only_what_is_not_yet_allocated(pairs: list[tuple[int, int]]) -> None:
    total = outstanding_mib(pairs)
    assert total >= 0
    assert total == sum(g - o for g, o in pairs if g > o)
    assert total <= sum(g for g, _ in pairs)


@given(totals)
def test_default_headroom_is_max_of_512_and_5_percent_rounded_up(total: int) -> None:
    five_percent_up = -(-total * 5 // 100)  # exact integer ceil(total × 5 / 100)
    headroom = default_headroom_mib(total)
    assert headroom == max(HEADROOM_MIN_MIB, five_percent_up)
    assert headroom * 100 >= total * 5
    assert headroom >= 512


def test_default_headroom_examples() -> None:
    assert default_headroom_mib(8192) == 512
    assert default_headroom_mib(24576) == 1229
    assert default_headroom_mib(81920) == 4096
    assert default_headroom_mib(10240) == 512
    assert default_headroom_mib(10260) == 513


@given(capacities())
def test_explanation_carries_the_numbers(cap: Capacity) -> None:
    text = explain("GPU-5a1e0000-0000-0000-0000-000000000001", cap)
    for value in (cap.available_mib, cap.total_mib, cap.headroom_mib, cap.device_used_mib):
        assert fmt_mib(value) in text
    assert cap.as_dict()["available_mib"] == cap.available_mib


@given(st.integers(min_value=0, max_value=10**12))
def test_fmt_mib_groups_thousands(value: int) -> None:
    text = fmt_mib(value)
    assert int(text.replace(" ", "")) == value
    assert all(len(group) == 3 for group in text.split(" ")[1:])
