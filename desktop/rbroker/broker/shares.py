"""Shares per project (opt-in, `[shares]` in the broker's config file): when several
projects wait, the queue serves first the project whose use is lowest against its weight.

The order of one admission pass (`Shares.turns`): each project's waiting requests stay in
arrival order (FIFO within a project); among the projects, the next request is the first of
the project with the lowest `granted MiB now / weight`, ties to the project whose first
request arrived first, and the use counts each grant of the pass as it is made. What
admission does with the request is unchanged: it is granted only when it fits, and one that
does not fit holds its GPUs for the requests after it in this order, as in FIFO (so a
large request is not passed over forever). A project not named gets the weight of `*`
(1 when `*` is not named either): every project has a share, so none waits forever once the
leases ahead of it end (its use then falls to 0, the lowest there is). Without `[shares]`
the order is the arrival order (`Shares.enabled` is False).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Protocol, TypeVar

DEFAULT_KEY = "*"
"""The `[shares]` key whose weight every project not named gets."""


class _Asks(Protocol):
    @property
    def project(self) -> str: ...


T = TypeVar("T", bound=_Asks)


class Shares:
    """Weights per project (`{project: weight}`, weights > 0; `*` for the others)."""

    def __init__(self, weights: Mapping[str, float] | None = None) -> None:
        """Raises:
        ValueError: a weight that is not a positive finite number, or an empty project.
        """
        self.weights = dict(weights or {})
        for project, weight in self.weights.items():
            if not project.strip():
                raise ValueError("[shares]: a project name is empty")
            if isinstance(weight, bool) or not isinstance(weight, int | float):
                raise ValueError(f"[shares]: the weight of {project!r} must be a number")
            if not 0 < weight < math.inf:
                raise ValueError(
                    f"[shares]: the weight of {project!r} must be over 0, got {weight}"
                )
        self.default = float(self.weights.get(DEFAULT_KEY, 1.0))

    @property
    def enabled(self) -> bool:
        """Whether any share is set (else the queue is FIFO)."""
        return bool(self.weights)

    def words(self) -> str:
        """The weights in words, for the broker's start-up lines: "vision 2, nlp 1, others
        1" (projects by name, then `*`'s weight as "others"); "" when no share is set."""
        if not self.enabled:
            return ""
        named = [f"{p} {w:g}" for p, w in sorted(self.weights.items()) if p != DEFAULT_KEY]
        return ", ".join([*named, f"others {self.default:g}"])

    def weight(self, project: str) -> float:
        """The weight of `project` (the `*` weight, or 1, when it is not named)."""
        return float(self.weights.get(project, self.default))

    def turns(self, waiting: Sequence[T], use_mib: MutableMapping[str, int]) -> Iterator[T]:
        """`waiting` (in arrival order) in the order of the module docstring, reading
        `use_mib` (project → granted MiB now) at every step: the caller adds a grant's MiB
        to it (the project just taken) before asking for the next request. FIFO when no
        share is set.

        The projects wait in a heap by (use / weight, arrival of their first request): a
        pass over N requests of P projects costs O(N log P), where choosing the lowest
        project afresh for each request cost O(N × P) (a queue of 1 024 requests of
        different projects, one user's cap, took 0.15 s a pass and the estimate's passes
        tens of seconds). An entry whose project's use changed since it was pushed takes
        its place again by the use now."""
        if not self.enabled:
            yield from waiting
            return
        lines: dict[str, deque[tuple[int, T]]] = {}
        for i, item in enumerate(waiting):
            lines.setdefault(item.project, deque()).append((i, item))
        heap = [(self._load(p, use_mib), line[0][0], p) for p, line in lines.items()]
        heapq.heapify(heap)
        while heap:
            load, first, project = heapq.heappop(heap)
            now_load = self._load(project, use_mib)
            if now_load != load:
                heapq.heappush(heap, (now_load, first, project))
                continue
            line = lines[project]
            yield line.popleft()[1]
            if line:
                heapq.heappush(heap, (self._load(project, use_mib), line[0][0], project))

    def _load(self, project: str, use_mib: Mapping[str, int]) -> float:
        """`project`'s granted MiB now against its weight (lower goes first)."""
        return use_mib.get(project, 0) / self.weight(project)

    def order(self, waiting: Sequence[T], use_mib: Mapping[str, int]) -> list[T]:
        """`waiting` in the order a pass would take them if nothing were granted (the
        queue's shown order and positions)."""
        return list(self.turns(waiting, dict(use_mib)))

    def view(
        self, use_mib: Mapping[str, int], waiting: Mapping[str, int]
    ) -> list[tuple[str, float, float, int, int]]:
        """Per project `(project, weight, share, granted_mib, waiting)`: the named ones
        (`*` last) and every other project holding or asking now; `share` is its weight over
        the weights of the projects holding or asking now (0 when it does neither)."""
        named = [p for p in self.weights if p != DEFAULT_KEY]
        others = sorted((set(use_mib) | set(waiting)) - set(named))
        active = [p for p in named + others if use_mib.get(p, 0) > 0 or waiting.get(p, 0) > 0]
        total = sum(self.weight(p) for p in active)
        rows = []
        for p in named + others:
            share = self.weight(p) / total if p in active and total > 0 else 0.0
            rows.append((p, self.weight(p), share, use_mib.get(p, 0), waiting.get(p, 0)))
        if DEFAULT_KEY in self.weights:
            rows.append((DEFAULT_KEY, self.default, 0.0, 0, 0))
        return rows


def turns_bypassing(
    shares: Shares, waiting: Sequence[T], use: MutableMapping[str, int], aged: Callable[[T], bool]
) -> Iterator[T]:
    """`shares.turns(waiting, use)` after the requests that bypass it: the first request of
    each project (arrival order) for which `aged(it)` holds, those past the bypass bound
    (`rbroker.broker.admission`, and the estimates of `rbroker.broker.eta`), in arrival
    order. Only the head of a project's line, so that requests queued early do not turn the
    whole queue into FIFO."""
    seen: set[str] = set()
    heads: list[T] = []
    for item in waiting:
        if item.project in seen:
            continue
        seen.add(item.project)
        if aged(item):
            heads.append(item)
    if not heads:
        return shares.turns(waiting, use)
    first = {id(item) for item in heads}
    rest = [item for item in waiting if id(item) not in first]
    return itertools.chain(heads, shares.turns(rest, use))
