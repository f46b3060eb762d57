"""The tray's connection to the broker: a change stream in, snapshots out, never on the GUI
thread.

Two plain threads, each with its own `rbroker.Client`:

* the event thread connects, calls `events.subscribe` and blocks in `wait_event()`; every
  event marks the state dirty. When the broker goes away it reports "disconnected" and
  reconnects with backoff (0.25 s doubling to 5 s).
* the refresh thread waits until the state is dirty and reads `gpus.list`, `leases.list`,
  `broker.status`, `jobs.list` and `bookings.list` (a broker without `jobs.list` or
  `bookings.list` gives `jobs=None` or `bookings=None`), at most every `min_interval_s`, so a
  burst of events costs one read.

The event thread also hands the events about bookings (`booking`, `booking_notice`) to the GUI
as they come (`booking_event`), for the notices of `rbroker.tray.notices`.

A third thread, the room thread, asks `room.check` for the one watch set
(`set_room_watch`, `rbroker.tray.room`) every `CHECK_EVERY_S` and at each event, and says
`room_fits` once it fits (the watch then ends) or `room_failed` when the broker refuses it.

Results reach the GUI thread through Qt signals (queued connections).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from PySide6.QtCore import QObject, Signal

from rbroker.base.exceptions import (
    BrokerUnavailable,
    InvalidParams,
    RBrokerError,
    TelemetryUnavailable,
)
from rbroker.client.local import Client
from rbroker.tray.room import CHECK_EVERY_S, RoomWatch
from rbroker.tray.state import Snapshot
from rbroker_protocol.results import JobView

log = logging.getLogger(__name__)

_T = TypeVar("_T")

BACKOFF_START_S = 0.25
BACKOFF_MAX_S = 5.0


BOOKING_EVENTS = frozenset({"booking", "booking_notice", "idle_notice"})
"""The event kinds `BrokerLink.booking_event` passes on (docs/architecture.md §2a; and the
idle notices of §3 "Idle", toasted as booking notices are)."""


def _optional(missing: set[str], method: str, read: Callable[[], _T]) -> _T | None:
    """`read()`, or None when the broker has no `method` (an older broker: noted in
    `missing`, and not asked again on this connection)."""
    if method in missing:
        return None
    try:
        return read()
    except InvalidParams as exc:
        if exc.code != "method_not_found":
            raise
        missing.add(method)
        return None


def read_snapshot(client: Client, missing: set[str] | None = None) -> Snapshot:
    """One read of the broker's state. `missing`: the optional methods (`jobs.list`,
    `bookings.list`) this broker lacks, as earlier reads found; those found now are added.

    Raises:
        BrokerUnavailable: the broker went away.
    """
    missing = set() if missing is None else missing
    gpus = client.gpus()
    view = client.leases()
    status = client.status()
    jobs: list[JobView] | None = _optional(
        missing, "jobs.list", lambda: [job.copy() for job in client.jobs()]
    )
    bookings = _optional(missing, "bookings.list", client.bookings)
    snap = Snapshot(
        gpus=[gpu.copy() for gpu in gpus],
        leases=[lease.copy() for lease in view["leases"]],
        queue=[request.copy() for request in view["queue"]],
        status=status.copy(),
        jobs=jobs,
        leases_left_out=view.get("leases_left_out", 0),
        queue_left_out=view.get("queue_left_out", 0),
        bookings=bookings,
    )
    return snap


class BrokerLink(QObject):
    """Live view of one broker for the GUI.

    Signals:
        snapshot(Snapshot): a fresh read, after every change (coalesced).
        connected(): the change stream is (re)established.
        disconnected(str): no broker answers; the reason in words.
        command_done(str, object): a command finished: (method, result).
        command_failed(str, str): a command failed: (method, message).
        booking_event(str, object): a `booking`, `booking_notice` or `idle_notice` event:
            (kind, data).
        room_fits(object, object): the watch set has room now: (RoomWatch, RoomCheckResult).
        room_failed(object, str): the broker refuses the watch: (RoomWatch, message).
    """

    snapshot = Signal(object)
    connected = Signal()
    disconnected = Signal(str)
    command_done = Signal(str, object)
    command_failed = Signal(str, str)
    booking_event = Signal(str, object)
    room_fits = Signal(object, object)
    room_failed = Signal(object, str)

    def __init__(
        self, socket: str | None, min_interval_s: float = 0.25, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self.socket = socket
        self.min_interval_s = min_interval_s
        self.is_connected = False
        self.last: Snapshot | None = None
        self._stop = threading.Event()
        self._dirty = threading.Event()
        self._lock = threading.Lock()
        self._event_client: Client | None = None
        self._refresh_client: Client | None = None
        self._room_client: Client | None = None
        self._room_watch: RoomWatch | None = None
        self._room_wake = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        for target, name in (
            (self._event_loop, "events"),
            (self._refresh_loop, "refresh"),
            (self._room_loop, "room"),
        ):
            t = threading.Thread(target=target, name=f"rbroker-tray-{name}", daemon=True)
            self._threads.append(t)
            t.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop both threads and close their connections."""
        self._stop.set()
        self._dirty.set()
        self._room_wake.set()
        with self._lock:
            clients = [self._event_client, self._refresh_client, self._room_client]
        for c in clients:
            if c is not None:
                c.close()
        for t in self._threads:
            t.join(timeout_s)
        self._threads.clear()

    def refresh(self) -> None:
        """Ask for a new snapshot now (e.g. after a command)."""
        self._dirty.set()

    # -- the room watch ------------------------------------------------------------------------
    def set_room_watch(self, watch: RoomWatch | None) -> None:
        """Watch for room for `watch` (replacing any watch set), or stop watching (None)."""
        with self._lock:
            self._room_watch = watch
        self._room_wake.set()

    @property
    def room_watch(self) -> RoomWatch | None:
        """The watch the room thread checks, None when none is set."""
        with self._lock:
            return self._room_watch

    def _end_room_watch(self, watch: RoomWatch) -> bool:
        """Clear `watch` if it is still the one set; True when it was."""
        with self._lock:
            if self._room_watch is not watch:
                return False
            self._room_watch = None
            return True

    # -- commands ------------------------------------------------------------------------------
    def run_command(self, name: str, command: Callable[[Client], object]) -> None:
        """Run `command` (one typed client call, e.g. `lambda c: c.pause(True)`) on a
        short-lived thread and connection; the answer comes back as `command_done` or
        `command_failed` with `name` (the local-API method, for messages), and a refresh
        follows."""

        def run() -> None:
            try:
                with Client(self.socket, timeout_s=10) as c:
                    result = command(c)
            except RBrokerError as exc:
                self.command_failed.emit(name, exc.message)
            else:
                self.command_done.emit(name, result)
            self._dirty.set()

        t = threading.Thread(target=run, name=f"rbroker-tray-{name}", daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def set_paused(self, paused: bool) -> None:
        """Pause or resume new admissions (`broker.pause`)."""
        self.run_command("broker.pause", lambda c: c.pause(paused))

    # -- threads -------------------------------------------------------------------------------
    def _set_client(self, which: str, client: Client | None) -> bool:
        with self._lock:
            if self._stop.is_set():
                if client is not None:
                    client.close()
                return False
            setattr(self, which, client)
            return True

    def _event_loop(self) -> None:
        backoff = BACKOFF_START_S
        reported_down = False
        while not self._stop.is_set():
            try:
                client = Client(self.socket, timeout_s=5)
            except RBrokerError as exc:
                if not reported_down:
                    self.is_connected = False
                    self.disconnected.emit(exc.message)
                    reported_down = True
                self._stop.wait(backoff)
                backoff = min(BACKOFF_MAX_S, backoff * 2)
                continue
            if not self._set_client("_event_client", client):
                return
            try:
                client.subscribe()
                self.is_connected = True
                reported_down = False
                backoff = BACKOFF_START_S
                self.connected.emit()
                self._dirty.set()
                while not self._stop.is_set():
                    event = client.wait_event(None)
                    if event is not None:
                        self._pass_on(event)
                        self._dirty.set()
                        self._room_wake.set()
            except RBrokerError as exc:
                if self._stop.is_set():
                    break
                log.info("lost the broker: %s", exc)
                self.is_connected = False
                self.disconnected.emit(f"lost the broker: {exc.message}")
                reported_down = True
            finally:
                self._set_client("_event_client", None)
                client.close()

    def _pass_on(self, event: Mapping[str, object]) -> None:
        """A booking event (an `event` notification's params: `kind`, `data`) to the GUI,
        before the refresh it causes is read."""
        kind = event.get("kind")
        data = event.get("data")
        if kind in BOOKING_EVENTS and isinstance(data, dict):
            self.booking_event.emit(str(kind), dict(data))

    def _refresh_loop(self) -> None:
        client: Client | None = None
        missing: set[str] = set()
        while not self._stop.is_set():
            self._dirty.wait()
            if self._stop.is_set():
                break
            self._dirty.clear()
            try:
                if client is None:
                    client = Client(self.socket, timeout_s=10)
                    missing = set()
                    if not self._set_client("_refresh_client", client):
                        return
                snap = read_snapshot(client, missing)
            except RBrokerError as exc:
                if client is not None:
                    client.close()
                    client = None
                    self._set_client("_refresh_client", None)
                if not isinstance(exc, BrokerUnavailable):
                    log.warning("reading the broker failed: %s", exc)
                continue  # the event thread reports the outage and sets dirty on reconnect
            self.last = snap
            self.snapshot.emit(snap)
            self._stop.wait(self.min_interval_s)
        if client is not None:
            client.close()

    def _room_loop(self) -> None:
        client: Client | None = None
        while not self._stop.is_set():
            watch = self.room_watch
            if watch is None:
                self._room_wake.wait()
                self._room_wake.clear()
                continue
            self._room_wake.clear()
            try:
                if client is None:
                    client = Client(self.socket, timeout_s=10)
                    if not self._set_client("_room_client", client):
                        return
                answer = client.check_room(watch.mib, watch.gpus)
            except (BrokerUnavailable, TelemetryUnavailable) as exc:
                if isinstance(exc, BrokerUnavailable) and client is not None:
                    client.close()
                    client = None
                    self._set_client("_room_client", None)
                log.info("room check for %s: %s", watch.describe(), exc)
            except RBrokerError as exc:  # refused: infeasible, bad figures, not allowed
                if self._end_room_watch(watch):
                    self.room_failed.emit(watch, exc.message)
                continue
            else:
                if answer["fits"]:
                    if self._end_room_watch(watch):
                        self.room_fits.emit(watch, answer)
                    continue
            self._room_wake.wait(CHECK_EVERY_S)
        if client is not None:
            client.close()


def wait_for_broker(socket: str | None, timeout_s: float) -> bool:
    """True when a broker answers at `socket` within `timeout_s` (no Qt involved)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with Client(socket, timeout_s=2):
                return True
        except RBrokerError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
