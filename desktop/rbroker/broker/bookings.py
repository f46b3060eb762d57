"""Bookings: MiB on GPUs reserved for a wall-clock window, kept in the same ledger that admits
the leases of now (docs/architecture.md §2a).

A booking is `mib` on each of its GPUs for [`start_at`, `end_at`), Unix seconds (UTC). Its
life: `booked` (before its start) → `held` (started: its memory is held for a claim by its
owner) ⇄ `claimed` (a lease of its owner claims it) → `ended` (its end came), or `lapsed`
(held unclaimed for `claim_grace_s`), or `cancelled`. While live, each booking *protects*
on each of its GPUs its MiB less what the leases claiming it hold.

The two rules (tests/desktop/broker/bookings):
- **Accepting** a booking never over-commits the future: on a GPU, the protected MiB of the
  bookings overlapping any instant never exceed total − headroom − the memory used outside
  leases now (`BookingBase`); one that does not fit is refused with the arithmetic and the
  nearest window where it fits.
- **A lease of now** is admitted on a GPU only where it fits beside the peak of the
  bookings its horizon overlaps (`peak`): [now, now + `expected_s`) when it declares its
  duration, else [now, now + `protect_s`). A claim of a booking does not count that booking.

Calendar times decide a booking's start and end (`tick` compares them with the wall clock,
so a clock step moves the schedule as a calendar would); a claim's grace is counted on the
monotonic clock, and nothing here ends or extends a lease: a claiming lease goes on as an
ordinary one after its booking ends.
"""

from __future__ import annotations

import bisect
import logging
import math
import secrets
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

from rbroker.base.display import booking_conflict_words, fmt_mib
from rbroker.base.when import fmt_duration, fmt_window
from rbroker.broker.clock import Clock
from rbroker.broker.leases import Lease
from rbroker.broker.store import STORAGE_ERRORS
from rbroker_protocol.errors import ErrorCode, RpcError
from rbroker_protocol.results import BookingView

log = logging.getLogger(__name__)


LIVE_STATES = frozenset({"booked", "held", "claimed"})
"""States in which a booking protects memory."""

MAX_NEAREST_TRIES = 256
"""The most windows a refusal tries for the nearest one that fits (nearest first): a refusal
costs the broker at most that many placements, however many bookings there are."""


def utc_window(start_s: float, end_s: float, now_s: float) -> str:
    """A window in the broker's words: in UTC, said so (`14:00–18:00 UTC`). The broker does
    not know its asker's zone; the CLI and the tray say it again in theirs from the data."""
    return f"{fmt_window(start_s, end_s, now_s, zone=UTC)} UTC"


def in_words(seconds: float) -> str:
    """`in 30 min` (at least a minute), for a time a notice names."""
    return f"in {fmt_duration(max(60.0, round(seconds / 60.0) * 60.0))}"


MIN_DURATION_S = 60.0
"""The shortest booking: a minute (a shorter one would hold a per-user slot for nothing)."""

START_SLACK_S = 60.0
"""A booking may name a start this long in the past (a `now` typed a minute ago); it then
starts now."""


@dataclass(frozen=True, slots=True)
class BookingSettings:
    """`[bookings]` of broker.toml (docs/operator-guide.md): `protect_s` (a lease that
    declares no duration is taken to overlap the bookings starting within it; 4 h),
    `claim_grace_s` (a started booking is held this long for a claim, then lapses; 15 min),
    `max_per_user` (live bookings per OS user; 8), `horizon_s` (how far ahead a booking may
    start; 14 days), `max_duration_s` (the longest booking; 24 h), `keep_ended` (ended,
    lapsed and cancelled bookings kept for the lists; 200), `start_notice_s` (how long before
    a start the holders of leases in its way and its owner are told; 30 min) and
    `end_notice_s` (how long before an end its claiming leases are told; 10 min)."""

    protect_s: float = 4 * 3600.0
    claim_grace_s: float = 15 * 60.0
    max_per_user: int = 8
    horizon_s: float = 14 * 24 * 3600.0
    max_duration_s: float = 24 * 3600.0
    keep_ended: int = 200
    start_notice_s: float = 30 * 60.0
    end_notice_s: float = 10 * 60.0

    def __post_init__(self) -> None:
        """Raises:
        ValueError: a time that is not over 0 and finite, a count below 1."""
        for name in ("protect_s", "claim_grace_s", "horizon_s", "max_duration_s"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise ValueError(f"[bookings] {name} must be over 0 seconds, got {value}")
        for name in ("max_per_user", "keep_ended"):
            if getattr(self, name) < 1:
                raise ValueError(f"[bookings] {name} must be 1 or more, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class BookingBase:
    """What a GPU offers bookings, in MiB: `total_mib` − `headroom_mib` − `outside_mib` (the
    memory its latest sample shows used beyond its leases' grants, as it is now); `index`
    names it to people."""

    index: int
    total_mib: int
    headroom_mib: int
    outside_mib: int

    @property
    def bookable_mib(self) -> int:
        """What bookings may hold at any instant: max(0, total − headroom − outside)."""
        return max(0, self.total_mib - self.headroom_mib - self.outside_mib)


@dataclass(slots=True, eq=False)
class Booking:
    """One booking (see the module docstring). `claims`: the ids of the live leases that
    claim it; `unclaimed_since`: monotonic time it was last held with no claim (its grace
    counts from there); `told`: the notices already sent for it."""

    booking_id: str
    owner: str
    project: str
    session: str
    purpose: str
    gpu_uuids: tuple[str, ...]
    mib: int
    start_at: float
    end_at: float
    created_at: float
    state: str = "booked"
    accepted_at: float = -math.inf
    """Monotonic time it was accepted: the requests that started waiting before it are not
    held back by it, and its claims go ahead only of those that came after (§2a)."""
    claims: list[str] = field(default_factory=list)
    unclaimed_since: float | None = None
    ended_reason: str = ""
    ended_at: float = 0.0
    told: set[str] = field(default_factory=set)

    @property
    def live(self) -> bool:
        """Booked, held or claimed."""
        return self.state in LIVE_STATES

    def to_record(self) -> dict[str, Any]:
        """What the store keeps (the claims are rebuilt from the restored leases)."""
        return {
            "booking_id": self.booking_id,
            "owner": self.owner,
            "project": self.project,
            "session": self.session,
            "purpose": self.purpose,
            "gpu_uuids": list(self.gpu_uuids),
            "mib": self.mib,
            "start_at": self.start_at,
            "end_at": self.end_at,
            "created_at": self.created_at,
            "state": self.state,
            "ended_reason": self.ended_reason,
            "ended_at": self.ended_at,
            "told": sorted(self.told),
        }

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Booking:
        """A booking read back from the store (a held or claimed one comes back `booked`:
        `tick` starts it again, its grace counted from the restart).

        Raises:
            KeyError, TypeError, ValueError: a malformed record.
        """
        state = str(rec["state"])
        return cls(
            booking_id=str(rec["booking_id"]),
            owner=str(rec["owner"]),
            project=str(rec["project"]),
            session=str(rec["session"]),
            purpose=str(rec["purpose"]),
            gpu_uuids=tuple(str(u) for u in rec["gpu_uuids"]),
            mib=int(rec["mib"]),
            start_at=float(rec["start_at"]),
            end_at=float(rec["end_at"]),
            created_at=float(rec["created_at"]),
            state="booked" if state in LIVE_STATES else state,
            ended_reason=str(rec.get("ended_reason", "")),
            ended_at=float(rec.get("ended_at", 0.0)),
            told={str(t) for t in rec.get("told", [])},
        )


@dataclass(frozen=True, slots=True)
class Notice:
    """Something a person is told ahead about a booking (`Bookings.notices`): `kind` is
    `overlaps` (to the owner `to` of lease `lease_id`, granted before the booking was
    accepted, that may still hold its memory at its start), `may_wait` (to the booking's
    owner: such leases exist), `ends_soon` (to the holder of a claiming lease) or
    `cancelled` (to its owner, by an administrator: `Broker.cancel_booking`); `message` says
    it in words."""

    kind: str
    booking: Booking
    to: str
    message: str
    lease_id: str | None = None


Save = Callable[[Booking], None]
"""Writes a booking's record (committed on return); raises `OSError`/`sqlite3.Error`."""


class Bookings:
    """The bookings of one broker, indexed per GPU by start for the admission's `peak`.

    `granted_of(lease_id)` is the MiB a live lease holds on each GPU (0 when it ended);
    `base_of(uuid)` what a GPU offers bookings now (None: never sampled); `save` keeps a
    booking (None: nothing is kept)."""

    def __init__(
        self,
        clock: Clock,
        settings: BookingSettings,
        granted_of: Callable[[str], int],
        base_of: Callable[[str], BookingBase | None],
        save: Save | None = None,
    ) -> None:
        self.clock = clock
        self.settings = settings
        self.granted_of = granted_of
        self.base_of = base_of
        self.save = save
        self.by_id: dict[str, Booking] = {}
        self._on: dict[str, list[Booking]] = {}  # GPU → its live bookings by start
        self._starts: dict[str, list[float]] = {}  # GPU → their starts (for bisect)
        self._longest_s: dict[str, float] = {}  # GPU → the longest live booking's length
        self.by_lease: dict[str, str] = {}  # claiming lease → its booking
        # when `tick` and `notices` next have something to do (`due`): a wall time, a
        # monotonic time (a grace's end), and the wall time last seen (a step back is due)
        self._due_wall = -math.inf
        self._due_mono = math.inf
        self._seen_wall = -math.inf
        # `peak_mib`'s answers while no booking changes (`replan` clears them), by GPU,
        # excluded booking and whole seconds of the window; the newest acceptance (a request
        # older than it sees fewer bookings, and is not cached)
        self._peaks: dict[tuple[str, str | None, int, int], int] = {}
        self._newest_accepted = -math.inf

    # -- the index -------------------------------------------------------------------------------
    def _index(self, booking: Booking) -> None:
        for uuid in booking.gpu_uuids:
            on = self._on.setdefault(uuid, [])
            starts = self._starts.setdefault(uuid, [])
            at = bisect.bisect_right(starts, booking.start_at)
            on.insert(at, booking)
            starts.insert(at, booking.start_at)
            length = booking.end_at - booking.start_at
            self._longest_s[uuid] = max(self._longest_s.get(uuid, 0.0), length)

    def _unindex(self, booking: Booking) -> None:
        for uuid in booking.gpu_uuids:
            on = self._on.get(uuid, [])
            for i, other in enumerate(on):
                if other is booking:
                    del on[i]
                    del self._starts[uuid][i]
                    break
            if not on:
                self._on.pop(uuid, None)
                self._starts.pop(uuid, None)
                self._longest_s.pop(uuid, None)

    def any_on(self, uuid: str) -> bool:
        """Whether a live booking is on `uuid` (the admission's fast path)."""
        return uuid in self._on

    # -- protection ------------------------------------------------------------------------------
    def claimed_mib(self, booking: Booking) -> int:
        """MiB its claiming leases hold on each GPU."""
        return sum(self.granted_of(lease_id) for lease_id in booking.claims)

    def protected_mib(self, booking: Booking) -> int:
        """MiB it protects on each of its GPUs: its MiB less what its claims hold."""
        if not booking.claims:
            return booking.mib if booking.state in LIVE_STATES else 0
        return max(0, booking.mib - self.claimed_mib(booking))

    def overlapping(self, uuid: str, t0: float, t1: float) -> Iterator[Booking]:
        """The live bookings on `uuid` whose window meets [t0, t1), by start."""
        on = self._on.get(uuid)
        if not on:
            return
        starts = self._starts[uuid]
        lo = bisect.bisect_left(starts, t0 - self._longest_s[uuid])
        hi = bisect.bisect_left(starts, t1)
        for booking in on[lo:hi]:
            if booking.end_at > t0:
                yield booking

    def peak(
        self,
        uuid: str,
        t0: float,
        t1: float,
        exclude: str | None = None,
        promised: bool = False,
        accepted_by: float = math.inf,
    ) -> tuple[int, list[Booking]]:
        """The most MiB the live bookings on `uuid` (but `exclude`, and those accepted after
        `accepted_by`, monotonic) protect together at any instant of [t0, t1), and the
        bookings that do at that instant ((0, []) when none). `promised`: count each
        booking's whole MiB, claimed or not (what accepting a booking weighs: a claim that
        ends gives its booking all of its MiB back until its end)."""
        events: list[tuple[float, int, int, Booking]] = []
        for booking in self.overlapping(uuid, t0, t1):
            if booking.booking_id == exclude or booking.accepted_at > accepted_by:
                continue
            mib = booking.mib if promised else self.protected_mib(booking)
            if mib <= 0:
                continue
            events.append((max(booking.start_at, t0), 1, mib, booking))
            events.append((booking.end_at, 0, mib, booking))  # ends sort before starts
        if not events:
            return 0, []
        events.sort(key=lambda e: (e[0], e[1]))
        level, best, live, at_best = 0, 0, [], []
        for _at, starts, mib, booking in events:
            if starts:
                level += mib
                live.append(booking)
                if level > best:
                    best, at_best = level, list(live)
            else:
                level -= mib
                live.remove(booking)
        return best, at_best

    def peak_mib(
        self,
        uuid: str,
        t0: float,
        t1: float,
        exclude: str | None = None,
        accepted_by: float = math.inf,
    ) -> int:
        """`peak(...)[0]` without naming the bookings: what every admission on a GPU with
        bookings asks (`rbroker.broker.admission`), kept lean (a sweep over the starts and
        the ends, each sorted once). For a request that sees every booking, the answer is
        worked out over the window widened to whole seconds (a superset: never less
        cautious) and kept until a booking changes (`replan`), unless a booking in it is
        claimed (its claims' grants may change with a resize): requests of the same second
        cost a dictionary lookup."""
        key: tuple[str, str | None, int, int] | None = None
        if accepted_by >= self._newest_accepted:
            t0, t1 = float(math.floor(t0)), float(math.ceil(t1))
            key = (uuid, exclude, int(t0), int(t1))
            cached = self._peaks.get(key)
            if cached is not None:
                return cached
        starts: list[tuple[float, int]] = []
        ends: list[tuple[float, int]] = []
        for booking in self.overlapping(uuid, t0, t1):
            if booking.booking_id == exclude or booking.accepted_at > accepted_by:
                continue
            if booking.claims:
                key = None  # its protection follows its claims' grants: not kept
            mib = self.protected_mib(booking)
            if mib > 0:
                starts.append((booking.start_at if booking.start_at > t0 else t0, mib))
                ends.append((booking.end_at, mib))
        best = self._sweep(starts, ends)
        if key is not None:
            if len(self._peaks) >= 1024:
                self._peaks.clear()
            self._peaks[key] = best
        return best

    @staticmethod
    def _sweep(starts: list[tuple[float, int]], ends: list[tuple[float, int]]) -> int:
        """The most MiB held at once by spans given as their starts and ends (each with its
        MiB), an end at an instant before a start there."""
        if len(starts) <= 1:
            return starts[0][1] if starts else 0
        starts.sort()
        ends.sort()
        level = best = 0
        j = 0
        for at, mib in starts:
            while ends[j][0] <= at:  # ends at or before this start no longer count
                level -= ends[j][1]
                j += 1
            level += mib
            if level > best:
                best = level
        return best

    def horizon(self, expected_s: float | None) -> tuple[float, float]:
        """The wall-clock window a lease asked for now may overlap: [now, now + its declared
        duration), or [now, now + `protect_s`) when it declares none."""
        now = self.clock.wall()
        return now, now + (expected_s if expected_s is not None else self.settings.protect_s)

    # -- booking ----------------------------------------------------------------------------------
    def live_of(self, owner: str) -> int:
        """How many live bookings `owner` has."""
        return sum(1 for b in self.by_id.values() if b.owner == owner and b.live)

    def create(
        self,
        owner: str,
        project: str,
        session: str,
        purpose: str,
        mib: int,
        gpus: int,
        candidates: tuple[str, ...],
        start_at: float,
        end_at: float,
    ) -> Booking:
        """Accept a booking of `mib` on `gpus` of `candidates` (by index; one when pinned) for
        [start_at, end_at), placed on the GPUs where it fits with the least room to spare.

        Raises:
            RpcError: `invalid_params` (an end not after the start, a start in the past);
                `booking_too_long`, `booking_too_far`, `too_many_bookings` (the bounds of
                `BookingSettings`, `data.limit`); `infeasible` (too few GPUs, more than total
                − headroom); `telemetry_unavailable` (a GPU never sampled);
                `booking_conflict` (the arithmetic; `data.nearest_start_at`);
                `storage_unavailable` (nothing kept).
        """
        now = self.clock.wall()
        cfg = self.settings
        if end_at <= start_at:
            raise RpcError(
                ErrorCode.INVALID_PARAMS,
                "a booking must end after it starts",
                field="end_at",
                start_at=start_at,
                end_at=end_at,
            )
        if start_at < now - START_SLACK_S:
            raise RpcError(
                ErrorCode.INVALID_PARAMS,
                f"a booking cannot start in the past ({utc_window(start_at, end_at, now)})",
                field="start_at",
                start_at=start_at,
                now_at=now,
            )
        start_at = max(start_at, now)
        if end_at - start_at < MIN_DURATION_S:
            raise RpcError(
                ErrorCode.INVALID_PARAMS,
                f"a booking must last at least {fmt_duration(MIN_DURATION_S)} from its start "
                "(or from now, for one that has started)",
                field="end_at",
                min_duration_s=MIN_DURATION_S,
            )
        if end_at - start_at > cfg.max_duration_s:
            raise RpcError(
                ErrorCode.BOOKING_TOO_LONG,
                f"refused: a booking may last at most {fmt_duration(cfg.max_duration_s)} here; "
                f"{fmt_duration(end_at - start_at)} asked",
                limit=cfg.max_duration_s,
                duration_s=end_at - start_at,
            )
        if start_at > now + cfg.horizon_s:
            raise RpcError(
                ErrorCode.BOOKING_TOO_FAR,
                f"refused: a booking may start at most {fmt_duration(cfg.horizon_s)} ahead here",
                limit=cfg.horizon_s,
                start_at=start_at,
            )
        count = self.live_of(owner)
        if count >= cfg.max_per_user:
            raise RpcError(
                ErrorCode.TOO_MANY_BOOKINGS,
                f"refused: {owner} already has {count} bookings, the most one user may have "
                f"here ({cfg.max_per_user}); cancel one first",
                limit=cfg.max_per_user,
                count=count,
            )
        bases = self._bases(candidates, mib, gpus)
        chosen = self._place(bases, mib, gpus, start_at, end_at)
        if chosen is None:
            raise self._conflict(bases, mib, gpus, start_at, end_at)
        booking = Booking(
            booking_id="book-" + secrets.token_hex(4),
            owner=owner,
            project=project,
            session=session,
            purpose=purpose,
            gpu_uuids=tuple(chosen),
            mib=mib,
            start_at=start_at,
            end_at=end_at,
            created_at=now,
            accepted_at=self.clock.monotonic(),
        )
        self._keep(booking)
        self.by_id[booking.booking_id] = booking
        self._index(booking)
        self._newest_accepted = max(self._newest_accepted, booking.accepted_at)
        self.replan()
        return booking

    def _bases(self, candidates: tuple[str, ...], mib: int, gpus: int) -> dict[str, BookingBase]:
        """What each candidate offers bookings (raises when too few could ever hold `mib`)."""
        if gpus > len(candidates):
            raise RpcError(
                ErrorCode.INFEASIBLE,
                f"infeasible: {gpus} GPUs requested, this computer has {len(candidates)}",
                requested_gpus=gpus,
                gpu_count=len(candidates),
            )
        bases: dict[str, BookingBase] = {}
        for uuid in candidates:
            base = self.base_of(uuid)
            if base is not None:
                bases[uuid] = base
        if len(bases) < gpus:
            raise RpcError(
                ErrorCode.TELEMETRY_UNAVAILABLE,
                "refused: the memory of too many GPUs is not known yet to book on them",
                reason="not_sampled",
            )
        usable = sorted((b.total_mib - b.headroom_mib for b in bases.values()), reverse=True)
        if mib > usable[gpus - 1]:
            raise RpcError(
                ErrorCode.INFEASIBLE,
                f"infeasible: {fmt_mib(mib)} MiB requested but no GPU here can ever offer more "
                f"than {fmt_mib(usable[0])} MiB (total − headroom)",
                requested_mib=mib,
                usable_mib=usable[0],
            )
        return bases

    def _room(self, uuid: str, base: BookingBase, t0: float, t1: float) -> int:
        return base.bookable_mib - self.peak(uuid, t0, t1, promised=True)[0]

    def _place(
        self, bases: dict[str, BookingBase], mib: int, gpus: int, t0: float, t1: float
    ) -> list[str] | None:
        """The `gpus` GPUs it fits on in [t0, t1), the ones with the least room first."""
        rooms = [(self._room(u, b, t0, t1), b.index, u) for u, b in bases.items()]
        fit = sorted(r for r in rooms if r[0] >= mib)
        if len(fit) < gpus:
            return None
        return sorted((u for _, _, u in fit[:gpus]), key=lambda u: bases[u].index)

    def _conflict(
        self, bases: dict[str, BookingBase], mib: int, gpus: int, t0: float, t1: float
    ) -> RpcError:
        """`booking_conflict` with the arithmetic of the GPU that blocks (the `gpus`-th
        roomiest) and the nearest window where it fits."""
        ranked = sorted(
            bases.items(), key=lambda ub: (-self._room(ub[0], ub[1], t0, t1), ub[1].index)
        )
        uuid, base = ranked[gpus - 1]
        booked, by = self.peak(uuid, t0, t1, promised=True)
        now = self.clock.wall()
        data: dict[str, Any] = {
            "gpu_uuid": uuid,
            "bookable_mib": max(0, base.bookable_mib - booked),
            "total_mib": base.total_mib,
            "headroom_mib": base.headroom_mib,
            "outside_mib": base.outside_mib,
            "booked_mib": booked,
            "bookings": len(by),
            "requested_mib": mib,
            "start_at": t0,
            "end_at": t1,
            "nearest_start_at": self.nearest(bases, mib, gpus, t0, t1 - t0),
        }
        return RpcError(
            ErrorCode.BOOKING_CONFLICT,
            booking_conflict_words(
                f"GPU {base.index}",
                data,
                lambda a, b: utc_window(a, b, now),
                f"no window within {fmt_duration(self.settings.horizon_s)} fits",
            ),
            **data,
        )

    def nearest(
        self, bases: dict[str, BookingBase], mib: int, gpus: int, start_at: float, length_s: float
    ) -> float | None:
        """The start nearest `start_at` (the later of two as near) of a window of `length_s`
        where it fits, within now … now + horizon; None when there is none. The candidates
        are the instants where the bookings change: now, each booking's end, and each
        booking's start less `length_s`, tried nearest first, at most `MAX_NEAREST_TRIES`."""
        now = self.clock.wall()
        latest = now + self.settings.horizon_s
        times = {now}
        for uuid in bases:
            for booking in self._on.get(uuid, []):
                times.add(booking.end_at)
                times.add(booking.start_at - length_s)
        nearest_first = sorted(
            (t for t in times if now <= t <= latest), key=lambda t: (abs(t - start_at), -t)
        )
        for at in nearest_first[:MAX_NEAREST_TRIES]:
            if self._place(bases, mib, gpus, at, at + length_s) is not None:
                return at
        return None

    def _keep(self, booking: Booking) -> None:
        if self.save is not None:
            self.save(booking)

    def _save_quietly(self, booking: Booking) -> None:
        """Keep a change the broker made itself (a start, lapse, end, claim): a store that
        cannot take it is logged; what is in memory stays right and is written at the next
        change."""
        try:
            self._keep(booking)
        except STORAGE_ERRORS as exc:  # a full disk
            log.warning("booking %s not written: %s", booking.booking_id, exc)

    # -- cancel, claim -----------------------------------------------------------------------------
    def get(self, booking_id: str) -> Booking:
        """Raises:
        RpcError: `booking_not_found`."""
        booking = self.by_id.get(booking_id)
        if booking is None:
            raise RpcError(
                ErrorCode.BOOKING_NOT_FOUND,
                f"no booking {booking_id} (never made, or ended long ago)",
                booking_id=booking_id,
            )
        return booking

    def cancel(self, booking_id: str, user: str, admin: bool) -> Booking:
        """Cancel a live booking: its owner's, or anyone's for an `admin` (the reason says
        who). Its claiming leases go on as ordinary leases.

        Raises:
            RpcError: `booking_not_found`, `not_booking_owner`, `booking_ended` (not live).
        """
        booking = self.get(booking_id)
        if booking.owner != user and not admin:
            raise RpcError(
                ErrorCode.NOT_BOOKING_OWNER,
                f"booking {booking_id} belongs to another user",
                booking_id=booking_id,
            )
        if not booking.live:
            raise RpcError(
                ErrorCode.BOOKING_ENDED,
                f"booking {booking_id} is already {booking.state}",
                booking_id=booking_id,
                state=booking.state,
            )
        who = f"admin {user}" if booking.owner != user else user
        self._finish(booking, "cancelled", f"cancelled by {who}")
        return booking

    def check_claim(
        self, booking_id: str, owner: str, mib: int, gpus: int, gpu_uuid: str | None
    ) -> Booking:
        """The booking a lease of `owner` for `mib` on `gpus` may claim now.

        Raises:
            RpcError: `booking_not_found`; `not_booking_owner`; `booking_not_started`
                (`data.start_at`); `booking_ended` (`data.state`); `invalid_params` (more
                MiB than the booking has unclaimed, other GPUs than its own).
        """
        booking = self.get(booking_id)
        if booking.owner != owner:
            raise RpcError(
                ErrorCode.NOT_BOOKING_OWNER,
                f"booking {booking_id} belongs to another user",
                booking_id=booking_id,
            )
        now = self.clock.wall()
        if booking.state == "booked":
            raise RpcError(
                ErrorCode.BOOKING_NOT_STARTED,
                f"booking {booking_id} is for "
                f"{utc_window(booking.start_at, booking.end_at, now)}"
                f" (it starts in {fmt_duration(max(1.0, booking.start_at - now))}); claim it then",
                booking_id=booking_id,
                start_at=booking.start_at,
            )
        if not booking.live:
            raise RpcError(
                ErrorCode.BOOKING_ENDED,
                f"booking {booking_id} is {booking.state}"
                + (f" ({booking.ended_reason})" if booking.ended_reason else ""),
                booking_id=booking_id,
                state=booking.state,
            )
        if gpus != len(booking.gpu_uuids) or (
            gpu_uuid is not None and booking.gpu_uuids != (gpu_uuid,)
        ):
            raise RpcError(
                ErrorCode.INVALID_PARAMS,
                f"booking {booking_id} is on {len(booking.gpu_uuids)} GPU(s) of its own; ask for "
                f"gpus={len(booking.gpu_uuids)} and no other GPU",
                field="gpus",
            )
        left = booking.mib - self.claimed_mib(booking)
        if mib > left:
            raise RpcError(
                ErrorCode.INVALID_PARAMS,
                f"booking {booking_id} has {fmt_mib(left)} MiB unclaimed; {fmt_mib(mib)} "
                "requested (resize the lease once granted to grow beyond it)",
                field="mib",
                unclaimed_mib=left,
            )
        return booking

    def claimed(self, booking_id: str, lease_id: str) -> None:
        """A lease claiming `booking_id` was granted."""
        booking = self.by_id.get(booking_id)
        if booking is None or not booking.live:
            return
        booking.claims.append(lease_id)
        self.by_lease[lease_id] = booking_id
        self.replan()
        booking.unclaimed_since = None
        if booking.state == "held":
            booking.state = "claimed"
            self._save_quietly(booking)

    def lease_ended(self, lease_id: str) -> Booking | None:
        """A lease ended: when it claimed a booking that is still on and no claim is left, the
        booking is held again for `claim_grace_s`. Returns that booking, else None."""
        booking_id = self.by_lease.pop(lease_id, None)
        booking = self.by_id.get(booking_id) if booking_id is not None else None
        if booking is None:
            return None
        if lease_id in booking.claims:
            booking.claims.remove(lease_id)
        self.replan()
        if booking.state == "claimed" and not booking.claims:
            booking.state = "held"
            booking.unclaimed_since = self.clock.monotonic()
            self._save_quietly(booking)
            return booking
        return None

    # -- time ----------------------------------------------------------------------------------
    RECHECK_S = 60.0
    """Within a booking's start notice, how often the leases in its way are looked at again."""

    def replan(self) -> None:
        """Something changed (a booking made, cancelled, claimed, released): `due` at once,
        and no cached peak stands."""
        self._due_wall = -math.inf
        self._peaks.clear()

    def due(self) -> bool:
        """Whether `tick` or `notices` may have something to do now: a start, end, notice or
        grace's end reached since the last look, a booking changed, or the wall clock went
        back. Cheap, so the broker's tick (10 a second) costs nothing while none is due,
        however many bookings there are."""
        wall, mono = self.clock.wall(), self.clock.monotonic()
        return wall < self._seen_wall or wall >= self._due_wall or mono >= self._due_mono

    def _plan(self) -> None:
        """Note when something is next due (see `due`)."""
        wall = self.clock.wall()
        cfg = self.settings
        due_wall, due_mono = math.inf, math.inf
        for booking in self.by_id.values():
            if not booking.live:
                continue
            for at in (
                booking.start_at - cfg.start_notice_s,
                booking.start_at,
                booking.end_at - cfg.end_notice_s,
                booking.end_at,
            ):
                if at > wall:
                    due_wall = min(due_wall, at)
            if booking.state == "booked" and booking.start_at - wall <= cfg.start_notice_s:
                due_wall = min(due_wall, wall + self.RECHECK_S)
            if booking.state == "held" and booking.unclaimed_since is not None:
                due_mono = min(due_mono, booking.unclaimed_since + cfg.claim_grace_s)
        self._due_wall, self._due_mono, self._seen_wall = due_wall, due_mono, wall

    def turn(self, leases_on: Callable[[str], list[Lease]]) -> tuple[list[Booking], list[Notice]]:
        """The broker tick's turn: when something is `due`, move the bookings along the
        calendar (`tick`) and gather what to tell (`notices`); else nothing, at once."""
        if not self.due():
            return [], []
        moved = self.tick()
        told = self.notices(leases_on)
        self._plan()
        return moved, told

    def tick(self) -> list[Booking]:
        """Move the bookings along the calendar: a start reached holds it (its grace counts
        from now), a held booking unclaimed for `claim_grace_s` lapses, an end reached ends
        it; a held one whose start is ahead again (the wall clock went back) is booked
        again. Returns the bookings that changed."""
        wall, mono = self.clock.wall(), self.clock.monotonic()
        changed: list[Booking] = []
        for booking in [b for b in self.by_id.values() if b.live]:
            before = booking.state
            if wall >= booking.end_at:
                self._finish(booking, "ended", "its end came")
            elif booking.state == "booked" and wall >= booking.start_at:
                booking.state = "held"
                booking.unclaimed_since = mono
            elif booking.state == "held" and wall < booking.start_at:
                booking.state, booking.unclaimed_since = "booked", None
            elif (
                booking.state == "held"
                and booking.unclaimed_since is not None
                and mono - booking.unclaimed_since >= self.settings.claim_grace_s
            ):
                self._finish(
                    booking,
                    "lapsed",
                    f"not claimed within {fmt_duration(self.settings.claim_grace_s)}",
                )
            if booking.state != before:
                if booking.live:
                    self._save_quietly(booking)
                changed.append(booking)
        return changed

    def notices(self, leases_on: Callable[[str], list[Lease]]) -> list[Notice]:
        """What to tell now, each once per booking (kept in `Booking.told`):
        - within `start_notice_s` of a booking's start, when on one of its GPUs the leases
          granted before it was accepted and not declared to end before its start hold more
          than leaves it room beside the other bookings then (total − headroom − outside),
          each such lease's owner (`overlaps`) and the booking's owner (`may_wait`);
        - within `end_notice_s` of its end, each claiming lease's owner (`ends_soon`).
        `leases_on(uuid)` gives the active leases on a GPU. Nothing is ended or changed."""
        wall = self.clock.wall()
        told: list[Notice] = []
        for booking in [b for b in self.by_id.values() if b.live]:
            start_in_s = booking.start_at - wall
            if booking.state == "booked" and start_in_s <= self.settings.start_notice_s:
                told += self._in_the_way(booking, leases_on, wall)
            if booking.claims and booking.end_at - wall <= self.settings.end_notice_s:
                for lease_id in booking.claims:
                    key = f"ends_soon:{lease_id}"
                    if key in booking.told:
                        continue
                    booking.told.add(key)
                    owner = next(
                        (
                            x.owner
                            for u in booking.gpu_uuids
                            for x in leases_on(u)
                            if x.lease_id == lease_id
                        ),
                        booking.owner,
                    )
                    told.append(
                        Notice(
                            "ends_soon",
                            booking,
                            owner,
                            f"booking {booking.booking_id} ends "
                            f"{in_words(booking.end_at - wall)}: lease {lease_id} goes on as an "
                            "ordinary lease, no longer protected",
                            lease_id,
                        )
                    )
                self._save_quietly(booking)
        return told

    def _in_the_way(
        self, booking: Booking, leases_on: Callable[[str], list[Lease]], wall: float
    ) -> list[Notice]:
        """The `overlaps` and `may_wait` notices of a booking about to start (see `notices`)."""
        at = booking.start_at
        when = in_words(at - wall)
        told: list[Notice] = []
        for uuid in booking.gpu_uuids:
            base = self.base_of(uuid)
            if base is None:
                continue
            early = [
                x
                for x in leases_on(uuid)
                if x.booking_id != booking.booking_id
                and x.granted_at_wall < booking.created_at
                and (x.expected_s is None or x.granted_at_wall + x.expected_s > at)
            ]
            held = sum(x.granted_mib for x in early)
            booked, _ = self.peak(uuid, at, at + 1, exclude=booking.booking_id, promised=True)
            room = base.bookable_mib - booked - held
            if not early or room >= booking.mib:
                continue
            for lease in early:
                key = f"overlaps:{lease.lease_id}"
                if key in booking.told:
                    continue
                booking.told.add(key)
                told.append(
                    Notice(
                        "overlaps",
                        booking,
                        lease.owner,
                        f"your lease {lease.lease_id} ({fmt_mib(lease.granted_mib)} MiB on GPU "
                        f"{base.index}) overlaps {booking.owner}'s booking {booking.booking_id} "
                        f"starting {when} ({fmt_mib(booking.mib)} MiB): nothing will end it, but "
                        "release it by then if you can; the booking gets its memory first as "
                        "it frees",
                        lease.lease_id,
                    )
                )
            key = f"may_wait:{uuid}"
            if key not in booking.told:
                booking.told.add(key)
                count = f"{len(early)} lease{'' if len(early) == 1 else 's'}"
                told.append(
                    Notice(
                        "may_wait",
                        booking,
                        booking.owner,
                        f"your booking {booking.booking_id} starting {when} may wait on GPU "
                        f"{base.index}: {count} granted before it ({fmt_mib(held)} MiB) may "
                        "still run then; it gets their memory first as it frees",
                    )
                )
        if told:
            self._save_quietly(booking)
        return told

    def _finish(self, booking: Booking, state: str, reason: str) -> None:
        self.replan()
        self._unindex(booking)
        booking.state, booking.ended_reason = state, reason
        booking.ended_at = self.clock.wall()
        booking.unclaimed_since = None
        for lease_id in booking.claims:
            self.by_lease.pop(lease_id, None)
        booking.claims = []
        self._save_quietly(booking)
        self._forget_old()

    def _forget_old(self) -> None:
        ended = [b for b in self.by_id.values() if not b.live]
        for booking in sorted(ended, key=lambda b: b.ended_at)[: -self.settings.keep_ended]:
            del self.by_id[booking.booking_id]

    def claim_until(self, booking: Booking) -> float | None:
        """While held: the wall time it lapses at unless claimed."""
        if booking.state != "held" or booking.unclaimed_since is None:
            return None
        left = self.settings.claim_grace_s - (self.clock.monotonic() - booking.unclaimed_since)
        return self.clock.wall() + max(0.0, left)

    # -- views and restore -------------------------------------------------------------------------
    def to_wire(self, booking: Booking) -> BookingView:
        """A booking as the local API shows it."""
        return {
            "booking_id": booking.booking_id,
            "owner": booking.owner,
            "project": booking.project,
            "session": booking.session,
            "purpose": booking.purpose,
            "mib": booking.mib,
            "gpu_uuids": list(booking.gpu_uuids),
            "start_at": booking.start_at,
            "end_at": booking.end_at,
            "created_at": booking.created_at,
            "state": booking.state,
            "claims": list(booking.claims),
            "claimed_mib": self.claimed_mib(booking),
            "claim_until": self.claim_until(booking),
            "ended_reason": booking.ended_reason,
            "ended_at": booking.ended_at,
        }

    def listed(self, asker: str, include_ended: bool) -> list[BookingView]:
        """The asker's bookings, then everyone else's, each by start (ended ones only when
        asked)."""
        shown = [b for b in self.by_id.values() if b.live or include_ended]
        shown.sort(key=lambda b: (b.owner != asker, b.start_at, b.booking_id))
        return [self.to_wire(b) for b in shown]

    def restore(self, records: Iterable[dict[str, Any]], claims: dict[str, str]) -> None:
        """Fill from the store's records; `claims` maps each restored lease that claims a
        booking to it. An unreadable record is logged and skipped."""
        for rec in records:
            try:
                booking = Booking.from_record(rec)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("a stored booking is unreadable and was dropped: %s", exc)
                continue
            # its place among requests restored with it: its age by the wall clock (an order,
            # never an expiry), as a restored request's wait is
            age_s = max(0.0, self.clock.wall() - booking.created_at)
            booking.accepted_at = self.clock.monotonic() - age_s
            self._newest_accepted = max(self._newest_accepted, booking.accepted_at)
            self.by_id[booking.booking_id] = booking
            if booking.live:
                self._index(booking)
        self.tick()
        for lease_id, booking_id in claims.items():
            self.claimed(booking_id, lease_id)
