"""What one list answer holds for the user who asks: all of its own entries and at most
`MAX_LISTED_OTHERS` of other users', the rest counted (architecture.md §5, bounds).

Each user's leases, waiting requests and jobs are bounded (`BrokerConfig.max_*_per_user`);
their sum over the users of a shared computer is not, and one answer holding all of them
could pass what one connection may be sent (`max_unsent_bytes`), so that every user's
`rbroker status`, `rbroker top` and tray lost the broker. With this cap a `leases.list`
answer holds at most the asker's own (≤ `max_leases_per_user` + `max_waiting_per_user`)
plus 2 × 2 000 other entries of ≈ 0.7 KB: under 5 MB, which a reading client takes in well
under a second.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, TypeVar

T = TypeVar("T")

MAX_LISTED_OTHERS: Final = 2000
"""Entries of other users one list answer holds at most (per list: leases, queue, jobs)."""


def for_asker(
    items: Sequence[T],
    asker: str,
    owner: Callable[[T], str],
    keep_first: Callable[[T], float] | None = None,
    max_others: int = MAX_LISTED_OTHERS,
    newest: bool = False,
) -> tuple[list[T], int]:
    """`items` as user `asker` is shown them, in their order: each of its own, and of the
    other users' the `max_others` that rank first by `keep_first` (smallest first; None:
    the first in `items`' order, or with `newest` the last); and how many of the others
    were left out."""
    others = [i for i, item in enumerate(items) if owner(item) != asker]
    if len(others) <= max_others:
        return list(items), 0
    if keep_first is None:
        kept = set(others[-max_others:] if newest else others[:max_others])
    else:
        ranked = sorted(others, key=lambda i: (keep_first(items[i]), i))
        kept = set(ranked[:max_others])
    shown = [item for i, item in enumerate(items) if owner(item) == asker or i in kept]
    return shown, len(others) - max_others
