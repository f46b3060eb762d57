"""`rbroker top` (also `rbroker status --watch`): the local broker's state, live.

The same calls as `rbroker status` (`broker.status`, `gpus.list`, `leases.list`) and
`jobs.list` are made and drawn as one frame (`frame`). In a terminal a frame is read when the
broker tells of a change (a second connection subscribed to its events: leases, the queue,
capacity, jobs; at most one read per `MIN_GAP_S`) and otherwise every `IDLE_REFRESH_S`, for
the ages and countdowns: an idle broker is read every few seconds, not every second (issue
44). Piped, a plain frame each `REFRESH_S`. A frame: the header, the GPUs with their
capacity bars (leases' use, granted, others' use, headroom, available, in MiB), the leases,
the queue with each request's whole reason (wrapped, never cut) and its ETA where the broker
gives one, and the active jobs with their progress. Every table fits 80 columns (see
`rbroker.cli.sheet`). `q` or Ctrl-C ends it (exit 0, no traceback); a broker that goes away
is one line above the last frame while it is tried again every second; `--once` draws one
frame and ends (plain rows when the output is not a terminal).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

import rbroker
from rbroker.cli.bookings import next_bookings_table
from rbroker.cli.exits import unusable_exit
from rbroker.cli.status import status_header
from rbroker.cli.views import View, broker_view, jobs_table, print_view, shares_table
from rbroker_protocol.results import (
    BookingView,
    BrokerStatus,
    GpuView,
    JobView,
    LeasesListResult,
)

REFRESH_S = 1.0
"""Seconds between two plain frames, and between attempts to reach a broker that has gone."""
IDLE_REFRESH_S = 5.0
"""Seconds between two readings in a terminal while the broker tells of no change (the ages,
countdowns and the clock move)."""
MIN_GAP_S = 0.25
"""At least this long between two readings that changes asked for (a burst of events is
one reading)."""
SLICE_S = 0.1
"""How long each wait for a key, then for a change, lasts in a terminal's loop."""
QUIT_KEYS = frozenset("qQ")


@dataclass(frozen=True)
class Snapshot:
    """One reading of the broker: the answers of `broker.status`, `gpus.list`, `leases.list`,
    `jobs.list` (active jobs only) and `bookings.list` (live bookings), and `found`
    (`{"address", "found_by"}`)."""

    status: BrokerStatus
    gpus: list[GpuView]
    leases: LeasesListResult
    jobs: list[JobView]
    found: dict[str, str]
    bookings: list[BookingView] = field(default_factory=list)


class Source:
    """The local broker, read over one connection that is opened again after the broker
    restarts or goes away: `read()` gives a `Snapshot`, or None while no broker answers
    (`lost` says why, in the client's words)."""

    def __init__(self, socket: str | None) -> None:
        self._socket = socket
        self._client: rbroker.Client | None = None
        self._events: rbroker.Client | None = None
        self.lost: str | None = None
        self.lost_exit = 0
        """The exit code for what `lost` says (`rbroker.cli.exits.unusable_exit`)."""

    def read(self) -> Snapshot | None:
        """A `Snapshot`, or None (and `lost` set) when the broker cannot be reached or
        refuses this user (`NotAllowed`: for this user no broker answers)."""
        try:
            if self._client is None:
                self._client = rbroker.Client(self._socket, timeout_s=5)
            client = self._client
            snapshot = Snapshot(
                status=client.status(),
                gpus=list(client.gpus()),
                leases=client.leases(),
                jobs=list(client.jobs_list(include_finished=False)["jobs"]),
                found={"address": client.address, "found_by": client.found_by},
                bookings=client.live_bookings(),
            )
        except (rbroker.BrokerUnavailable, rbroker.NotAllowed, OSError) as exc:
            self.lost, self.lost_exit = str(exc), unusable_exit(exc)
            self.close()
            return None
        self.lost = None
        return snapshot

    def follow(self) -> None:
        """Subscribe a second connection to the broker's events (`changed` waits on it);
        where that fails, `changed` only waits (the frame is then read every
        `IDLE_REFRESH_S`)."""
        if self._events is not None:
            return
        try:
            events = rbroker.Client(self._client.address if self._client else self._socket)
            events.subscribe()
        except (rbroker.RBrokerError, OSError):
            return
        self._events = events

    def changed(self, timeout_s: float) -> bool:
        """Whether the broker told of a change within `timeout_s` (what came meanwhile is
        taken too); True also when the events connection broke (the next `read` says why)."""
        events = self._events
        if events is None:
            time.sleep(timeout_s)
            return False
        try:
            if events.wait_event(timeout_s) is None:
                return False
        except (rbroker.RBrokerError, OSError):
            self._close_events()
            return True
        while events.next_event(0) is not None:
            pass
        return True

    def _close_events(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        self._close_events()


def frame(snapshot: Snapshot, now_wall: float | None = None, once: bool = False) -> View:
    """One frame: `rbroker status`'s header with the time of the reading and how to quit
    (at the top, so a terminal too short for the frame still shows it; not for `once`, the
    one frame of `--once`, which quits by itself), the GPUs with bars,
    the leases, the queue (reason whole; ETA where the entries carry `eta_s`), the jobs (a
    line saying there are none), each GPU's next bookings, each project's share and use
    where `[shares]` is set, and the coordinator's warning if any."""
    clock = time.strftime("%H:%M:%S", time.localtime(now_wall))
    quits = "" if once else " — q or Ctrl-C quits"
    header = f"{status_header(snapshot.status, snapshot.found)}\nread at {clock}{quits}"
    view = broker_view(snapshot.gpus, snapshot.leases, header, jobs=snapshot.jobs)
    if not snapshot.jobs:
        view.parts.append(jobs_table([]))
    booked = next_bookings_table(snapshot.bookings, snapshot.gpus, time.time())
    if booked is not None:
        view.parts.append(booked)
    if snapshot.status.get("shares"):  # [shares] set: each project's share and use
        view.parts.append(shares_table(snapshot.status["shares"]))
    warning = snapshot.status.get("coordinator", {}).get("warning")
    if warning:
        view.parts.append(Text(f"warning: {warning}", style="bold yellow"))
    return view


def lost_line(lost: str) -> Text:
    """What is shown under the last frame while the broker does not answer."""
    return Text(
        f"broker not answering, trying again every {REFRESH_S:g} s: {lost}", style="bold yellow"
    )


def run_top(args: argparse.Namespace) -> int:
    """`rbroker top [--once]` and `rbroker status --watch`. Exit 0 (after `q` or Ctrl-C, or
    after the one frame of `--once`), 69 when no broker answers at the start, 2 when the
    broker refuses this user (`rbroker.cli.exits`)."""
    console = Console()
    source = Source(args.socket)
    try:
        snapshot = source.read()
        if snapshot is None:
            Console(stderr=True).print(f"rbroker top: {source.lost}", markup=False, soft_wrap=True)
            return source.lost_exit
        if getattr(args, "once", False):
            print_view(console, frame(snapshot, once=True))
            return 0
        try:
            if console.is_terminal:
                _live(console, source, snapshot)
            else:
                _plain(console, source, snapshot)
        except KeyboardInterrupt:
            pass
        return 0
    finally:
        source.close()


def _plain(console: Console, source: Source, snapshot: Snapshot | None) -> None:
    """A pipe or file: a plain frame each second; a lost broker is one line on stderr when it
    goes and one when it is back. Ends on Ctrl-C (KeyboardInterrupt, caught by the caller)."""
    said_lost = False
    while True:
        if snapshot is not None:
            if said_lost:
                print("rbroker top: the broker answers again", file=sys.stderr, flush=True)
                said_lost = False
            print_view(console, frame(snapshot))
            console.file.write("\n")
            console.file.flush()
        elif not said_lost and source.lost is not None:
            print(f"rbroker top: {lost_line(source.lost).plain}", file=sys.stderr, flush=True)
            said_lost = True
        time.sleep(REFRESH_S)
        snapshot = source.read()


def _live(console: Console, source: Source, snapshot: Snapshot) -> None:
    """A terminal: the frame on the alternate screen, read anew when the broker tells of a
    change and every `IDLE_REFRESH_S` besides, until `q` (or Ctrl-C, a KeyboardInterrupt the
    caller catches); while the broker is lost the line saying so comes first, above the last
    frame, and it is tried every `REFRESH_S`. A frame taller than the terminal shows its top
    part (the header, GPUs, leases first)."""
    last: RenderableType = frame(snapshot)
    with _keys() as pressed, Live(last, console=console, screen=True, auto_refresh=False) as live:
        live.refresh()
        read_at = time.monotonic()
        while True:
            source.follow()
            # keys and the broker's news, a slice at a time, until a change or the idle read
            # (a broker that is gone is tried every REFRESH_S)
            idle_s = IDLE_REFRESH_S if source.lost is None else REFRESH_S
            changed = False
            while (left := read_at + idle_s - time.monotonic()) > 0:
                if pressed(min(left, SLICE_S)) in QUIT_KEYS:
                    return
                if not changed:
                    changed = source.changed(min(left, SLICE_S))
                if changed and time.monotonic() - read_at >= MIN_GAP_S:
                    break
            read_at = time.monotonic()
            fetched = source.read()
            if fetched is not None:
                last = frame(fetched)
                live.update(last, refresh=True)
            elif source.lost is not None:
                live.update(Group(lost_line(source.lost), last), refresh=True)


def _no_keys(timeout_s: float) -> str:
    """No keyboard to read: only waits."""
    time.sleep(timeout_s)
    return ""


if sys.platform == "win32":
    import msvcrt

    @contextlib.contextmanager
    def _keys() -> Iterator[Any]:
        """`pressed(timeout_s)`: the key typed within `timeout_s`, or "" (the console's
        keyboard buffer, read without echo)."""

        def pressed(timeout_s: float) -> str:
            end = time.monotonic() + timeout_s
            while time.monotonic() < end:
                if msvcrt.kbhit():
                    return msvcrt.getwch()
                time.sleep(0.05)
            return ""

        yield pressed

else:
    import os
    import select
    import termios
    import tty

    @contextlib.contextmanager
    def _keys() -> Iterator[Any]:
        """`pressed(timeout_s)`: the key typed within `timeout_s`, or "". The terminal is in
        cbreak mode meanwhile (keys arrive unechoed, one at a time; Ctrl-C still interrupts)
        and is put back as it was on the way out; where stdin is not a terminal no key is
        read and `pressed` only waits."""
        fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else -1
        if fd < 0:
            yield _no_keys
            return
        saved = termios.tcgetattr(fd)
        tty.setcbreak(fd)

        def pressed(timeout_s: float) -> str:
            ready, _, _ = select.select([fd], [], [], timeout_s)
            key = os.read(fd, 1) if ready else b""
            if ready and not key:  # the terminal is gone: nothing more to read
                time.sleep(timeout_s)
            return key.decode(errors="replace")

        try:
            yield pressed
        finally:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
