"""`rbroker demo`'s capacity check: granted + others' use + headroom ≤ total, where others' use
is memory of processes without a lease. Memory the broker books as a holder's own outside its
lease (a sample that began before the grant showed the holder's first allocation) is not
others' use: counted as such, a loaded machine's demo once reported 24 781 MiB committed on
a 24 576 MiB GPU that never held more than its grants."""

from __future__ import annotations

from typing import Any

from rbroker.cli.demo import DemoState, _check_snapshot

UUID = "GPU-de300000-0000-0000-0000-000000000001"


def _gpu(**figures: Any) -> Any:
    base = {"uuid": UUID, "total_mib": 24576, "headroom_mib": 1229}
    return {**base, **figures}


def test_a_holders_memory_outside_its_lease_is_not_others_use() -> None:
    """The failed run's figures: 22 528 granted could not fit beside the desktop's 1 024,
    but 21 504 granted with a new holder's first 1 024 MiB step booked outside its lease do."""
    state = DemoState()
    gpu = _gpu(granted_mib=21504, other_in_use_mib=2048, held_outside_mib=1024)
    _check_snapshot(state, [gpu])
    assert (state.violations, state.min_margin_mib) == ([], 819)


def test_a_grant_beyond_the_gpu_is_reported() -> None:
    state = DemoState()
    _check_snapshot(state, [_gpu(granted_mib=22528, other_in_use_mib=1024, held_outside_mib=0)])
    assert state.min_margin_mib == -205
    assert state.violations == ["GPU-de3000…0001: 24 781 MiB committed > 24 576 total"]


def test_an_older_broker_without_the_split_counts_all_as_others() -> None:
    state = DemoState()
    _check_snapshot(state, [_gpu(granted_mib=21504, other_in_use_mib=2048)])
    assert state.min_margin_mib == -205 and len(state.violations) == 1
