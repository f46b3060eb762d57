"""When will it fit: an estimate, for each waiting request, of how long until it is granted.

Pure arithmetic over what the broker knows now (`estimate`). Each active lease is expected
to end when its holder declared it would (`expected_s` after its grant, `lease.acquire`'s
declared duration) while that time has not passed; otherwise after the lifetimes seen for
its session (or its project: `rbroker.broker.lifetimes`) given how long it has lived: the
median of what those lifetimes leave past its age (a lease older than every lifetime seen
has no expected end). Then the queue is played forward, in
the order admission takes it (FIFO, or by shares: `rbroker.broker.shares`): at each
expected end the memory it holds on its GPUs comes back, and one admission pass runs as
the broker's does (a request is granted when enough of its candidate GPUs have room, the
smallest that fits first; one that does not fit holds its GPUs for the requests after
it). A request granted on the way holds its memory for its own declared duration, or its
project's median lifetime. A request's estimate is the time of the pass that grants it; its
reason names the leases whose ends it waited for, and whether those ends were declared
("1 lease of search declared to end by then") or judged from history ("likely ends").

No estimate (`eta_s` None) when admission cannot run (paused, telemetry), when what it
waits for has no expected end (no lifetime seen yet for that project, or a lease older
than every one seen: each its own reason), when it does not fit even after every lease
ends (memory used outside rbroker's leases), or when it is too far back in the queue: only
the first `ESTIMATED_REQUESTS` requests in admission's order are played, at most
`MAX_PASSES` passes, so one estimate costs at most `MAX_PASSES` × `ESTIMATED_REQUESTS`
placements however long the queue (2 048 waiting requests took 0.24 s, 0.55 s with
[shares], when every request was played). Times are seconds on the monotonic clock, from
now.
"""

from __future__ import annotations

import heapq
import itertools
import statistics
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rbroker.broker.lifetimes import Lifetimes
from rbroker.broker.shares import Shares, turns_bypassing

NO_HISTORY = "no declared or observed duration yet"
"""Said of the leases ahead whose project has no lifetime seen ("1 lease of new has …")."""
OUTLIVED = "outlived every lifetime seen for"
"""Said of the leases ahead older than every lifetime seen ("1 lease of vision has … it")."""
TOO_FAR = "too far back in the queue to estimate"

RETELL_FRACTION = 0.2
RETELL_MAX_S = 30.0
RETELL_MIN_S = 1.0
RETELL_EVERY_S = 1.0
"""A waiter told an estimate is told again (`retell`) when the time it names moves by more
than `RETELL_FRACTION` of the wait told or `RETELL_MAX_S`, whichever is less (at least
`RETELL_MIN_S`), at most once every `RETELL_EVERY_S` of its wait (the broker's default
sample interval: its estimates move no faster)."""

MAX_PASSES = 256
"""The most admission passes one estimate plays (one per expected end); requests still
waiting after them get no estimate (`TOO_FAR`)."""

ESTIMATED_REQUESTS = 64
"""Only this many waiting requests, the first in admission's order now, are played; the
others get no estimate (`TOO_FAR`). With `MAX_PASSES` it bounds what one estimate costs,
so that no queue, however long, makes the broker slow to answer."""


@dataclass(frozen=True, slots=True)
class Holding:
    """An active lease as the estimate sees it: what its end gives back on each of its GPUs
    (`frees_mib`: max(granted, observed) MiB), whose it is (`project`, `session` and the OS
    user `owner`, whose history judges it), how long it has lived (`age_s`; None: unknown)
    and how long until its declared end (`declared_left_s`, seconds: None when its holder
    declared no duration; 0 or less when that end has passed)."""

    gpu_uuids: tuple[str, ...]
    frees_mib: dict[str, int]
    project: str
    session: str
    age_s: float | None
    declared_left_s: float | None = None
    owner: str = ""


@dataclass(frozen=True, slots=True)
class Asking:
    """A waiting request: `key` (its request id), `mib` on each of `gpus` GPUs among
    `candidates`, whose it is (`project`, `session`, OS user `owner`), `stuck`: why
    admission cannot grant it now whatever the memory (paused, telemetry), or "" when only
    memory decides, and `expected_s`: how long it will hold its grant by its declaration
    (seconds; None: not declared); `waited_s`: how long it has waited so far (seconds)."""

    key: int
    mib: int
    gpus: int
    candidates: tuple[str, ...]
    project: str
    session: str
    stuck: str = ""
    expected_s: float | None = None
    owner: str = ""
    waited_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Estimate:
    """`eta_s`: seconds from now (None: no estimate); `reason`: what it rests on, or why
    there is none."""

    eta_s: float | None
    reason: str


def remaining_s(lifetimes: Sequence[float], age_s: float | None) -> float | None:
    """The median of what `lifetimes` (seconds) leave past `age_s` (None: unknown age, so
    the median lifetime); None when none is left (no lifetime, or all shorter)."""
    if age_s is None:
        return statistics.median(lifetimes) if lifetimes else None
    left = [t - age_s for t in lifetimes if t > age_s]
    return statistics.median(left) if left else None


History = Callable[[str, str, str], Sequence[float]]
"""(owner, project, session) → the lifetimes (seconds) to judge such a lease by."""


def expected_end_s(lease: Holding, history: History) -> tuple[float | None, bool]:
    """When `lease` is expected to end, seconds from now, and whether that is its declared
    end: its declared end while that has not passed, else what its history leaves past its
    age (`remaining_s`); (None, False) when neither says."""
    if lease.declared_left_s is not None and lease.declared_left_s > 0:
        return lease.declared_left_s, True
    return remaining_s(history(lease.owner, lease.project, lease.session), lease.age_s), False


def history_of(lifetimes: Lifetimes) -> History:
    """The lifetimes to judge a lease of (owner, project, session) by (`Lifetimes.of`)."""
    return lambda owner, project, session: lifetimes.of(owner, project, session)[0]


def estimate(
    available_mib: dict[str, int],
    holdings: Iterable[Holding],
    queue: Sequence[Asking],
    history: History,
    shares: Shares | None = None,
    use_mib: dict[str, int] | None = None,
    limit: int = ESTIMATED_REQUESTS,
    bypass_s: float | None = None,
) -> dict[int, Estimate]:
    """An estimate for each request of `queue` (in arrival order), by request key.

    `available_mib`: each GPU's available MiB now (architecture.md §2; a GPU without a
    capacity yet is absent); `holdings`: the active leases; `history(project, session)`:
    the lifetimes (seconds) to expect of a lease; `shares` and `use_mib` (project → MiB
    granted now): the order of the queue, as admission's (None: FIFO), with `bypass_s`
    (`BrokerConfig.max_share_bypass_s`) as admission's too: at each play's time a request
    that will have waited that long goes first, in arrival order; `limit`: how many
    waiting requests, the first in that order, are played (the others: `TOO_FAR`).
    """
    free = dict(available_mib)
    use = dict(use_mib or {})
    # (when, tie, lease, whether that end was declared): a heap
    ends: list[tuple[float, int, Holding, bool]] = []
    # GPU → (project, whether it outlived its history) of each lease with no expected end
    unknown: dict[str, list[tuple[str, bool]]] = {}
    for n, lease in enumerate(holdings):
        left, declared = expected_end_s(lease, history)
        if left is None:
            seen = bool(history(lease.owner, lease.project, lease.session))
            for u in lease.gpu_uuids:
                unknown.setdefault(u, []).append((lease.project, seen))
        else:
            heapq.heappush(ends, (left, n, lease, declared))
    tie = len(ends) + len(queue)
    out: dict[int, Estimate] = {}
    waiting = [a for a in queue if not a.stuck]
    for a in queue:
        if a.stuck:
            out[a.key] = Estimate(None, a.stuck)
    order = shares or Shares()
    if len(waiting) > limit:
        played = {a.key for a in itertools.islice(order.turns(waiting, dict(use)), limit)}
        for a in waiting:
            if a.key not in played:
                out[a.key] = Estimate(None, TOO_FAR)
        waiting = [a for a in waiting if a.key in played]
    now = 0.0
    # GPU → (project, declared end?) of the leases that ended on it so far
    freed_by: dict[str, list[tuple[str, bool]]] = {}
    passes = 0
    while waiting and passes < MAX_PASSES:
        passes += 1
        blocked: set[str] = set()
        granted: list[Asking] = []
        for a in _turns(order, waiting, use, bypass_s if shares else None, now):
            room = sorted(
                (free[u], u)
                for u in a.candidates
                if u in free and u not in blocked and free[u] >= a.mib
            )
            if len(room) >= a.gpus:
                chosen = tuple(u for _, u in room[: a.gpus])
                for u in chosen:
                    free[u] -= a.mib
                use[a.project] = use.get(a.project, 0) + a.mib * a.gpus
                out[a.key] = Estimate(now, _because(now, chosen, freed_by))
                granted.append(a)
                held = Holding(
                    chosen,
                    {u: a.mib for u in chosen},
                    a.project,
                    a.session,
                    0.0,
                    a.expected_s,
                    a.owner,
                )
                lifetime, declared = expected_end_s(held, history)
                if lifetime is None:
                    for u in chosen:
                        unknown.setdefault(u, []).append((a.project, False))
                else:
                    tie += 1
                    heapq.heappush(ends, (now + lifetime, tie, held, declared))
            else:
                blocked.update(a.candidates)
        if granted:
            keys = {a.key for a in granted}
            waiting = [a for a in waiting if a.key not in keys]
        if not waiting or not ends:
            break
        now = ends[0][0]
        while ends and ends[0][0] <= now:
            _, _, lease, declared = heapq.heappop(ends)
            for u in lease.gpu_uuids:
                if u in free:
                    free[u] += lease.frees_mib.get(u, 0)
                freed_by.setdefault(u, []).append((lease.project, declared))
                use[lease.project] = max(0, use.get(lease.project, 0) - lease.frees_mib.get(u, 0))
    for a in waiting:
        why = TOO_FAR if ends else _why_none(a, free, unknown)
        out[a.key] = Estimate(None, why)
    return out


def _turns(
    order: Shares, waiting: list[Asking], use: dict[str, int], bypass_s: float | None, now: float
) -> Iterator[Asking]:
    """`waiting` in admission's order `now` seconds from now (`Admission._turns`): each
    project's first request that will have waited `bypass_s` by then first, in arrival
    order, then `order.turns`."""
    if bypass_s is None:
        return order.turns(waiting, use)
    return turns_bypassing(order, waiting, use, lambda a: a.waited_s + now >= bypass_s)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _because(
    now: float, chosen: tuple[str, ...], freed_by: dict[str, list[tuple[str, bool]]]
) -> str:
    """What a grant at `now` waited for: the leases that ended on its GPUs by then, those
    whose end was declared first ("1 lease of search declared to end by then and 2 leases
    of vision likely end by then")."""
    if now <= 0:
        return "it fits now"
    ended = [e for u in chosen for e in freed_by.get(u, [])]
    if not ended:
        return "the requests ahead of it are served by then"
    declared = [p for p, d in ended if d]
    judged = [p for p, d in ended if not d]
    parts = []
    if declared:
        parts.append(f"{_leases_of(declared)} declared to end")
    if judged:
        parts.append(f"{_leases_of(judged)} likely {'ends' if len(judged) == 1 else 'end'}")
    return " and ".join(parts) + " by then"


def _has(projects: list[str]) -> str:
    return "has" if len(projects) == 1 else "have"


def _leases_of(projects: list[str]) -> str:
    """ "2 leases of a, b": how many leases, of which projects (the first three named)."""
    names = sorted(set(projects))
    shown = ", ".join(names[:3]) + (" …" if len(names) > 3 else "")
    return f"{_plural(len(projects), 'lease')} of {shown}"


def _why_none(a: Asking, free: dict[str, int], unknown: dict[str, list[tuple[str, bool]]]) -> str:
    """Why request `a` has no estimate after every expected end was played: "1 lease of
    new has no declared or observed duration yet", "2 leases of vision have outlived every
    lifetime seen for them", or both joined by "and"."""
    if not any(u in free for u in a.candidates):
        return "no GPU it may take has a capacity sample yet"
    ahead = [e for u in a.candidates for e in unknown.get(u, [])]
    if ahead:
        parts = []
        unseen = [p for p, outlived in ahead if not outlived]
        old = [p for p, outlived in ahead if outlived]
        if unseen:
            parts.append(f"{_leases_of(unseen)} {_has(unseen)} {NO_HISTORY}")
        if old:
            parts.append(
                f"{_leases_of(old)} {_has(old)} {OUTLIVED} {'it' if len(old) == 1 else 'them'}"
            )
        return " and ".join(parts)
    if sum(1 for u in a.candidates if free.get(u, 0) >= a.mib) >= a.gpus:
        return "the requests ahead of it have no estimate"
    return (
        "it does not fit even after every lease ends: memory used outside rbroker's "
        "leases would have to be freed"
    )


def retell(told: Mapping[str, Any] | None, entry: Mapping[str, Any]) -> bool:
    """Whether a waiter last told its queue entry `told` (None: nothing yet) should be told
    `entry`, its queue entry now (`reason`, `waiting_s`, `eta_s`, `eta_reason`): at once when
    its reason changed; for its estimate, when one appeared or went away, its `eta_reason`
    changed, or the grant time it names (waiting_s + eta_s, on the request's own clock)
    moved by more than the bound of `RETELL_FRACTION`, never within `RETELL_EVERY_S` of
    the last."""
    if told is None or entry["reason"] != told["reason"]:
        return True
    told_wait_s, wait_s = float(told["waiting_s"]), float(entry["waiting_s"])
    if wait_s - told_wait_s < RETELL_EVERY_S:
        return False
    if entry.get("eta_reason") != told.get("eta_reason"):
        return True
    told_eta_s, eta_s = told.get("eta_s"), entry.get("eta_s")
    if told_eta_s is None or eta_s is None:
        return (told_eta_s is None) != (eta_s is None)
    moved_s = abs((wait_s + float(eta_s)) - (told_wait_s + float(told_eta_s)))
    return moved_s > max(RETELL_MIN_S, min(RETELL_MAX_S, RETELL_FRACTION * float(told_eta_s)))
