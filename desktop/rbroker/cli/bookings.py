"""`rbroker book`, `rbroker book cancel ID` and `rbroker bookings` (issue 41, architecture.md
§2a): MiB on GPUs booked ahead for a wall-clock window, and the bookings of the broker as a
table and a 24-hour timeline per GPU.

Times are typed and shown in the local zone, the zone named (`Tue 14:00–18:00 (CET)`). Every
refusal is one line on stderr: exit 2 for bad input or a broker that says no (a
`booking_conflict` line carries the broker's arithmetic and the nearest window where the
booking fits), 69 when no broker answers (`rbroker.cli.exits`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import unicodedata
from collections.abc import Mapping, Sequence

from rich.console import Console
from rich.text import Text

import rbroker
from rbroker._booking import window
from rbroker.base.display import booking_conflict_words, fmt_count, fmt_mib, short_uuid
from rbroker.base.timeline import TimelineRow, TimelineSpan, render_timeline
from rbroker.base.when import fmt_duration, fmt_when, fmt_window, zone_name
from rbroker.cli.exits import EX_REFUSED, unusable_exit
from rbroker.cli.sheet import Cell, Column, Sheet, unique_prefixes
from rbroker.cli.views import View, gpu_labels, print_view
from rbroker_protocol.results import BookingsListResult, BookingView, GpuView

LIVE = frozenset({"booked", "held", "claimed"})
TIMELINE_HOURS = 24
DEFAULT_SESSION = "rbroker book"
"""The session of a booking made without --session."""
_DROPPED = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_BLOCKS = "░▒▓█◔◑◕●–…"


def clean(text: str) -> str:
    """`text` without control, format, private-use or unassigned characters (each becomes
    a space), for a line printed to a terminal: the broker refuses them in descriptions,
    this is what keeps an owner's name or an older record from steering the terminal."""
    return "".join(" " if unicodedata.category(ch) in _DROPPED else ch for ch in text)


def _say(command: str, message: str) -> None:
    """One line on stderr, printed as it is (no rich markup)."""
    Console(stderr=True, highlight=False).print(
        f"rbroker {command}: {clean(message)}", markup=False, soft_wrap=True
    )


def gpu_words(uuids: Sequence[str], gpus: Sequence[GpuView]) -> str:
    """`GPU 0`, `GPUs 0, 1`, or the UUIDs' heads where the index is unknown
    (`GPU GPU-3f2a…`)."""
    index = {g["uuid"]: g.get("index") for g in gpus}
    shown = [str(index[u]) if index.get(u) is not None else short_uuid(u) for u in uuids]
    return ("GPU " if len(shown) == 1 else "GPUs ") + ", ".join(shown)


def booked_line(view: BookingView, gpus: Sequence[GpuView], now_s: float) -> str:
    """`booked book-1a2b3c4d: 16 000 MiB on GPU 0, Tue 14:00–18:00 (CET)`."""
    span = fmt_window(view["start_at"], view["end_at"], now_s)
    return (
        f"booked {view['booking_id']}: {fmt_mib(view['mib'])} MiB on "
        f"{gpu_words(view['gpu_uuids'], gpus)}, {span} ({zone_name()})"
    )


def _open(command: str, socket: str | None) -> rbroker.Client | int:
    """A client of the broker, or the exit code after saying why there is none."""
    try:
        return rbroker.Client(socket, timeout_s=10)
    except (rbroker.BrokerUnavailable, rbroker.NotAllowed) as exc:
        _say(command, str(exc))
        return unusable_exit(exc)


def run_book(args: argparse.Namespace) -> int:
    """`rbroker book ...` (book) or `rbroker book cancel ID`; returns the exit code."""
    if args.action == "cancel":
        return _cancel(args)
    if args.action is not None or args.booking_id is not None:
        _say("book", f"unknown action {args.action!r}: give the flags, or 'cancel ID'")
        return EX_REFUSED
    missing = [
        flag
        for flag, value in (
            ("--mib", args.mib),
            ("--start", args.start),
            ("--project", args.project),
            ("--purpose", args.purpose),
        )
        if value is None
    ]
    if missing:
        _say("book", f"{', '.join(missing)} required (see rbroker book --help)")
        return EX_REFUSED
    if (args.duration is None) == (args.until is None):
        _say("book", "give the booking's length: --for DURATION or --until WHEN (one of them)")
        return EX_REFUSED
    try:
        start_s, end_s = window(args.start, args.duration, args.until)
    except rbroker.InvalidParams as exc:
        message = str(exc).replace("duration: ", "--for: ", 1).replace("end: ", "--until: ", 1)
        _say("book", message.replace("start: ", "--start: ", 1))
        return EX_REFUSED
    client = _open("book", args.socket)
    if isinstance(client, int):
        return client
    with client:
        try:
            view = client.book(
                mib=args.mib,
                start_at=start_s,
                end_at=end_s,
                project=args.project,
                session=args.session or DEFAULT_SESSION,
                purpose=args.purpose,
                gpus=args.gpus,
                gpu_uuid=args.gpu_uuid,
            )
        except (rbroker.BrokerUnavailable, rbroker.NotAllowed) as exc:
            _say("book", str(exc))
            return unusable_exit(exc)
        except rbroker.RBrokerError as exc:
            try:
                gpus = client.gpus()
            except rbroker.RBrokerError:
                gpus = []
            _say("book", refusal_words(exc, gpus))
            return EX_REFUSED
        if args.json:
            print(json.dumps(view, indent=2))
            return 0
        try:
            gpus = client.gpus()
        except rbroker.RBrokerError:
            gpus = []
    print(clean(booked_line(view, gpus, time.time())))
    return 0


def refusal_words(exc: rbroker.RBrokerError, gpus: Sequence[GpuView] = ()) -> str:
    """A broker's refusal about a booking in this viewer's zone: the broker says its times in
    UTC (it does not know the asker's zone); `booking_conflict` and `booking_not_started` are
    said again from their data in local time, the zone named; anything else as it came."""
    data = exc.data
    now = time.time()
    zone = zone_name()
    if exc.code == "booking_conflict" and isinstance(data.get("start_at"), int | float):
        index = {g["uuid"]: g.get("index") for g in gpus}.get(str(data.get("gpu_uuid")))
        gpu = f"GPU {index}" if index is not None else short_uuid(str(data.get("gpu_uuid")))
        words = booking_conflict_words(
            gpu, data, lambda a, b: fmt_window(a, b, now), "no window ahead fits"
        )
        return f"{words} (times in {zone})"
    if exc.code == "booking_not_started" and isinstance(data.get("start_at"), int | float):
        start = float(data["start_at"])
        return (
            f"booking {data.get('booking_id')} starts in {fmt_duration(max(60.0, start - now))}"
            f", at {fmt_when(start, now)} ({zone}); claim it then"
        )
    return str(exc)


def resolve_booking(client: rbroker.Client, given: str, mine_only: bool) -> BookingView | str:
    """The live booking `given` names: its id, or a unique prefix of it with or without
    `book-` (as a narrow table shows it); only the asker's with `mine_only`. The reason in
    words when none or several match."""
    key = given.strip().lower().removeprefix("book-")
    listed = client.bookings()["bookings"]
    me = client.hello()["owner"] if mine_only else None
    pool = [b for b in listed if me is None or b["owner"] == me]
    exact = [b for b in pool if b["booking_id"].lower() == given.strip().lower()]
    found = exact or [
        b for b in pool if b["booking_id"].lower().removeprefix("book-").startswith(key)
    ]
    if not key or not found:
        whose = "of yours " if mine_only else ""
        return f"no live booking {given!r} {whose}(rbroker bookings lists them)"
    if len(found) > 1:
        ids = ", ".join(b["booking_id"] for b in found[:5])
        return f"{given!r} names {len(found)} bookings ({ids}): give more of the id"
    return found[0]


def _cancel(args: argparse.Namespace) -> int:
    if not args.booking_id:
        _say("book", "give the booking to cancel: rbroker book cancel ID")
        return EX_REFUSED
    client = _open("book", args.socket)
    if isinstance(client, int):
        return client
    with client:
        try:
            found = resolve_booking(client, args.booking_id, mine_only=False)
            if isinstance(found, str):
                _say("book", found)
                return EX_REFUSED
            view = client.cancel_booking(found["booking_id"])
        except (rbroker.BrokerUnavailable, rbroker.NotAllowed) as exc:
            _say("book", str(exc))
            return unusable_exit(exc)
        except rbroker.RBrokerError as exc:
            _say("book", str(exc))
            return EX_REFUSED
    if args.json:
        print(json.dumps(view, indent=2))
        return 0
    span = fmt_window(view["start_at"], view["end_at"], time.time())
    print(clean(f"cancelled {view['booking_id']}: {span} ({zone_name()})"))
    return 0


def bookings_table(
    listed: Sequence[BookingView], gpus: Sequence[GpuView], now_s: float, note: str | None
) -> Sheet:
    """The bookings in the broker's order (the asker's first, then everyone's, each by
    start): id, owner, project, purpose, MiB (each GPU), GPU(s), window (local zone), state;
    `note` under them."""
    zone = zone_name()
    sheet = Sheet(
        f"Bookings ({fmt_count(len(listed))}), times in {zone}",
        [
            Column("booking"),
            Column("owner", free_text=True, min_free=5),
            Column("project", free_text=True, min_free=6, optional=True),
            Column("purpose", free_text=True, min_free=8),
            Column("MiB", "right"),
            Column("GPU"),
            Column("window"),
            Column("state"),
        ],
        empty="no bookings",
    )
    short = unique_prefixes([b["booking_id"] for b in listed], strip="book-")
    styles = {"held": "yellow", "claimed": "green", "lapsed": "red", "cancelled": "dim"}
    for b in listed:
        state = b["state"]
        if state == "claimed" and b.get("claimed_mib"):
            state = f"claimed {fmt_mib(b['claimed_mib'])}"
        mib = int(b["mib"])
        sheet.add(
            Cell(b["booking_id"], short=short[b["booking_id"]]),
            clean(str(b.get("owner", ""))),
            clean(b["project"]),
            clean(b["purpose"]),
            Cell(Text(fmt_mib(mib)), plain=str(mib)),
            gpu_words(b["gpu_uuids"], gpus).removeprefix("GPUs ").removeprefix("GPU "),
            fmt_window(b["start_at"], b["end_at"], now_s),
            Cell(Text(state, style=styles.get(b["state"], "")), plain=state),
        )
    if note:
        sheet.notes.append(Text(note, style="dim"))
    return sheet


NEXT_PER_GPU = 2
"""How many of each GPU's next bookings `rbroker status` and `rbroker top` show."""


def next_bookings(
    listed: Sequence[BookingView], gpus: Sequence[GpuView], per_gpu: int = NEXT_PER_GPU
) -> list[BookingView]:
    """The live bookings among the `per_gpu` next (or current) ones of some GPU, by start."""
    chosen: dict[str, BookingView] = {}
    for gpu in gpus:
        on = sorted(
            (b for b in listed if b["state"] in LIVE and gpu["uuid"] in b["gpu_uuids"]),
            key=lambda b: (b["start_at"], b["booking_id"]),
        )
        for b in on[:per_gpu]:
            chosen[b["booking_id"]] = b
    return sorted(chosen.values(), key=lambda b: (b["start_at"], b["booking_id"]))


def next_bookings_table(
    listed: Sequence[BookingView], gpus: Sequence[GpuView], now_s: float
) -> Sheet | None:
    """`rbroker status`'s and `rbroker top`'s table of each GPU's next bookings (None when
    no GPU has one); `rbroker bookings` lists them all."""
    shown = next_bookings(listed, gpus)
    if not shown:
        return None
    sheet = bookings_table(shown, gpus, now_s, "all of them: rbroker bookings")
    sheet.title = sheet.title.replace("Bookings (", "Next bookings per GPU (", 1)
    return sheet


def can_print_blocks(encoding: str | None) -> bool:
    """Whether an output in `encoding` prints the timeline's block and circle characters."""
    try:
        _BLOCKS.encode(encoding or "ascii")
    except (LookupError, UnicodeEncodeError):
        return False
    return True


def timeline_lines(
    answer: BookingsListResult,
    gpus: Sequence[GpuView],
    me: str,
    width: int,
    ascii_only: bool,
) -> list[str]:
    """The next 24 hours of each GPU's live bookings (`render_timeline`), from the hour
    the broker's clock is in; a GPU's usable MiB from the answer (total − headroom)."""
    labels = gpu_labels(gpus)
    usable: Mapping[str, int] = answer.get("usable_mib") or {}
    uuids = [g["uuid"] for g in gpus if g["uuid"] in usable] or sorted(usable)
    rows = []
    for uuid in uuids:
        spans = [
            TimelineSpan(b["start_at"], b["end_at"], int(b["mib"]), b.get("owner") == me)
            for b in answer["bookings"]
            if b["state"] in LIVE and uuid in b["gpu_uuids"]
        ]
        rows.append(TimelineRow(labels.get(uuid, short_uuid(uuid)), int(usable[uuid]), spans))
    if not rows:
        return []
    origin = math.floor(answer["now_at"] / 3600) * 3600
    return render_timeline(rows, origin, hours=TIMELINE_HOURS, width=width, ascii_only=ascii_only)


def run_bookings(args: argparse.Namespace) -> int:
    """`rbroker bookings [--all] [--json]`: the table, then the timeline; returns the exit
    code."""
    client = _open("bookings", args.socket)
    if isinstance(client, int):
        return client
    with client:
        try:
            answer = client.bookings(include_ended=args.all)
            if args.json:
                print(json.dumps(answer, indent=2))
                return 0
            gpus = client.gpus()
            me = client.hello()["owner"]
        except (rbroker.BrokerUnavailable, rbroker.NotAllowed) as exc:
            _say("bookings", str(exc))
            return unusable_exit(exc)
        except rbroker.RBrokerError as exc:
            _say("bookings", str(exc))
            return EX_REFUSED
    console = Console(highlight=False)
    left_out = int(answer.get("others_left_out") or 0)
    note = f"{fmt_count(left_out)} of other users' bookings not listed" if left_out else None
    sheet = bookings_table(answer["bookings"], gpus, answer["now_at"], note)
    print_view(console, View(sheet))
    width = console.width if console.is_terminal else 80
    ascii_only = not can_print_blocks(getattr(sys.stdout, "encoding", None))
    lines = timeline_lines(answer, gpus, me, max(width, 20), ascii_only)
    if lines:
        out = sys.stdout
        out.write("\n" + "\n".join(lines) + "\n")
        out.flush()
    return 0


__all__ = [
    "booked_line",
    "clean",
    "next_bookings_table",
    "refusal_words",
    "resolve_booking",
    "run_book",
    "run_bookings",
    "timeline_lines",
]
