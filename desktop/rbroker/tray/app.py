"""The tray app: single-instance guard, the broker (in-process or attached), the tray icon
and its menu, and the main window, wired together; and the process's lifetime around Qt's
event loop (SIGINT/SIGTERM quit it cleanly; after the loop everything is torn down in an order
that never leaves Qt objects for the interpreter's exit to free).

`run(args)` is what `rbroker tray` and `rbroker-tray` end up in.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import logging
import signal
import sys
import threading
from pathlib import Path
from socket import gethostname

from PySide6.QtCore import QEvent, QObject, QTimer, Signal
from PySide6.QtGui import QAction, QGuiApplication
from PySide6.QtWidgets import QApplication, QInputDialog, QMenu, QSystemTrayIcon

from rbroker.base.exceptions import RBrokerError
from rbroker.base.startup import check_broker_paths, os_error_line
from rbroker.client.local import Client
from rbroker.client.paths import default_data_dir, default_socket_path
from rbroker.hosting.embedded import EmbeddedBroker
from rbroker.tray import autostart, notification_server
from rbroker.tray.fleet import FleetSource, NotEnrolled, UplinkFleet
from rbroker.tray.fleet_tab import FleetFeed
from rbroker.tray.icons import app_icon, state_icon
from rbroker.tray.link import BrokerLink
from rbroker.tray.notices import Notifier
from rbroker.tray.plain import (
    clean,
    clean_lines,
    menu_text,
    notification_body,
    tool_tip,
    tray_tip,
)
from rbroker.tray.room import RoomWatch, room_text
from rbroker.tray.settings import TraySettings, settings_path
from rbroker.tray.settings_tab import EnrollRequest
from rbroker.tray.single import SingleInstance, instance_name
from rbroker.tray.state import (
    STATE_TEXT,
    Snapshot,
    TrayState,
    derive_state,
    run_snippet,
    summary,
)
from rbroker.tray.window import MainWindow
from rbroker.tray.wording import error_text, gui_text
from rbroker_protocol.results import RoomCheckResult
from rbroker_protocol.startup import EXIT_TRAY_ALREADY_RUNNING, check_socket_path, one_line

log = logging.getLogger(__name__)

TRAY_RETRY_MS = 2000
FLEET_REFRESH_MS = 15000
CLOCK_REFRESH_MS = 5000
"""While the window is shown, its ages and expiries are read again this often (they move with
the clock; the broker's events bring every other change). Hidden, nothing is read on a timer."""


class TrayApp(QObject):
    """The controller: owns the link to the broker, the window and (once the desktop has a
    system tray) the tray icon.

    Args:
        socket: the broker's address (None: the default).
        settings: the tray's saved settings.
        embedded: the in-process broker, when this app started one (stopped on quit).
        fleet: where the Fleet tab reads the group's computers.
        show_window: open the window at start (it is always shown when there is no tray).
        origin: how the broker was found, shown in the window ("started by this app"...).
    """

    broker_failed = Signal(str)
    enroll_finished = Signal(bool, str)

    def __init__(
        self,
        socket: str | None,
        settings: TraySettings,
        embedded: EmbeddedBroker | None = None,
        fleet: FleetSource | None = None,
        show_window: bool = False,
        origin: str = "",
        guard: SingleInstance | None = None,
        snippet_socket: str | None = None,
        data_dir: Path | None = None,
    ) -> None:
        super().__init__()
        self.socket = socket
        self.snippet_socket = snippet_socket
        self.settings = settings
        self.embedded = embedded
        self.data_dir = data_dir
        self.guard = guard
        self.state = TrayState.BROKER_DOWN
        self.snapshot: Snapshot | None = None
        self.tray: QSystemTrayIcon | None = None
        self._shut_down = False

        self.window = MainWindow(settings)
        self.window.local.origin = origin
        self.link = BrokerLink(socket, parent=self)
        self.link.snapshot.connect(self.on_snapshot)
        self.link.disconnected.connect(self.on_disconnected)
        self.link.command_failed.connect(self.on_command_failed)
        self.notices: collections.deque[tuple[str, str]] = collections.deque(maxlen=20)
        self._markup: bool | None = None  # the notification server reads markup: asked once
        self.notifier = Notifier(parent=self)
        self.link.snapshot.connect(self.notifier.on_snapshot)
        self.link.disconnected.connect(self.notifier.on_disconnected)
        self.notifier.notice.connect(self.notify)
        self.link.booking_event.connect(self.notifier.on_event)
        self.link.room_fits.connect(self.on_room_fits)
        self.link.room_failed.connect(self.on_room_failed)
        self.room_watch: RoomWatch | None = None
        self.window.local.me = self.notifier.me
        self.window.local.pause_toggled.connect(self.set_paused)
        self.broker_failed.connect(self.on_broker_failed)
        self.enroll_finished.connect(self.on_enroll_finished)
        self._enroll_thread: threading.Thread | None = None
        # True from an enrollment's request until its answer is shown (not the worker thread's
        # liveness: the thread may still be returning once its answer is shown, and a click
        # then must start the next enrollment, not be dropped)
        self._enrolling = False

        self.fleet_feed = FleetFeed(fleet or NotEnrolled(), parent=self)
        self.fleet_feed.computers.connect(self.window.fleet.set_computers)
        self.fleet_feed.failed.connect(self.window.fleet.set_error)
        self.fleet_feed.not_enrolled.connect(self.window.fleet.set_not_enrolled)
        # the window's children: they ask whether it is shown, so they go with it
        self.fleet_timer = QTimer(self.window)
        self.fleet_timer.timeout.connect(self._refresh_fleet)
        self.clock_timer = QTimer(self.window)
        self.clock_timer.timeout.connect(self._refresh_clock)
        self.window.shown.connect(self.fleet_feed.refresh)
        self.window.shown.connect(self.link.refresh)

        st = self.window.settings_tab
        st.saved.connect(self.save_settings)
        st.enroll_requested.connect(self.enroll)
        st.autostart_toggled.connect(self.set_autostart)
        self._show_autostart()
        self.refresh_enrollment()

        self.menu = QMenu()
        self.status_action = QAction("rbroker: starting", self.menu)
        self.status_action.setEnabled(False)
        self.open_action = QAction("Open rbroker", self.menu)
        self.open_action.triggered.connect(self.window.bring_to_front)
        self.pause_action = QAction("Pause new admissions", self.menu)
        self.pause_action.setCheckable(True)
        self.pause_action.setEnabled(False)
        self.pause_action.triggered.connect(self.set_paused)
        self.watch_action = QAction("Tell me when … MiB are free…", self.menu)
        self.watch_action.triggered.connect(self.ask_room_watch)
        self.unwatch_action = QAction("Cancel the watch for free MiB", self.menu)
        self.unwatch_action.setEnabled(False)
        self.unwatch_action.triggered.connect(self.cancel_room_watch)
        self.snippet_action = QAction("Copy a `rbroker run` snippet", self.menu)
        self.snippet_action.triggered.connect(self.copy_snippet)
        self.quit_action = QAction(
            "Quit (stops the broker and ends its leases)" if embedded is not None else "Quit",
            self.menu,
        )
        self.quit_action.triggered.connect(self.quit)
        for a in (self.status_action, None, self.open_action, self.pause_action):
            self.menu.addAction(a) if a else self.menu.addSeparator()
        for a in (self.watch_action, self.unwatch_action, None, self.snippet_action):
            self.menu.addAction(a) if a else self.menu.addSeparator()
        for a in (None, self.quit_action):
            self.menu.addAction(a) if a else self.menu.addSeparator()

        self.tray_timer = QTimer(self)
        self.tray_timer.timeout.connect(self.ensure_tray)
        self.set_state(TrayState.BROKER_DOWN)
        if not self.ensure_tray():
            # no system tray yet (early at login, or a desktop without one): keep a window
            # reachable and create the icon once the tray appears
            self.tray_timer.start(TRAY_RETRY_MS)
            if show_window:
                self.window.show()
            else:
                self.window.showMinimized()
        elif show_window:
            self.window.show()

    def start(self) -> None:
        """Start listening to the broker and reading the fleet."""
        self.link.start()
        self.fleet_feed.refresh()
        self.fleet_timer.start(FLEET_REFRESH_MS)
        self.clock_timer.start(CLOCK_REFRESH_MS)

    def window_shown(self) -> bool:
        """Whether the window is on screen (shown and not minimized)."""
        return self.window.isVisible() and not self.window.isMinimized()

    def _refresh_fleet(self) -> None:
        """The fleet from the coordinator, only while the window is shown (issue 44: an idle
        tray costs about nothing)."""
        if self.window_shown():
            self.fleet_feed.refresh()

    def _refresh_clock(self) -> None:
        """The broker's snapshot again while the window is shown: its ages and expiries."""
        if self.window_shown():
            self.link.refresh()

    # -- tray icon ---------------------------------------------------------------------------
    def ensure_tray(self) -> bool:
        """Create the tray icon if the desktop has a system tray; True when there is one."""
        if self.tray is not None:
            return True
        if not QSystemTrayIcon.isSystemTrayAvailable():
            return False
        tray = QSystemTrayIcon(state_icon(self.state), self)
        tray.setContextMenu(self.menu)
        tray.setToolTip(
            tray_tip(summary(self.snapshot) if self.link.is_connected else summary(None))
        )
        tray.activated.connect(self._on_tray_activated)
        tray.show()
        self.tray = tray
        self.window.close_to_tray = True
        self.tray_timer.stop()
        log.info("system tray available: icon created")
        return True

    def _on_tray_activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason in (
            QSystemTrayIcon.ActivationReason.Trigger,
            QSystemTrayIcon.ActivationReason.DoubleClick,
        ):
            if self.window.isVisible() and not self.window.isMinimized():
                self.window.hide()
            else:
                self.window.bring_to_front()

    def set_state(self, state: TrayState) -> None:
        self.state = state
        tip = summary(self.snapshot if state is not TrayState.BROKER_DOWN else None)
        line = tip.removeprefix("rbroker: ")
        line = line[:1].upper() + line[1:]
        self.status_action.setText(menu_text(line))
        self.status_action.setToolTip(tool_tip(line))
        if self.tray is not None:
            self.tray.setIcon(state_icon(state))
            self.tray.setToolTip(tray_tip(tip))

    # -- broker events -----------------------------------------------------------------------
    def on_snapshot(self, snap: Snapshot) -> None:
        self.snapshot = snap
        self.window.apply_snapshot(snap)
        self.window.settings_tab.set_link(snap.status.get("coordinator") or {})
        self.pause_action.setEnabled(True)
        self.pause_action.setChecked(snap.paused)
        self.set_state(derive_state(snap))

    def on_disconnected(self, message: str) -> None:
        self.snapshot = None
        self.pause_action.setEnabled(False)
        self.window.set_broker_down(message)
        self.set_state(TrayState.BROKER_DOWN)

    def on_broker_failed(self, message: str) -> None:
        self.window.local.origin = ""
        self.window.broker_note = f"This app could not start the broker: {message}"
        self.window.show_banner(self.window.broker_note, "error")

    def on_command_failed(self, method: str, message: str) -> None:
        self.window.show_banner(f"{method} failed: {message}", "error")
        if self.snapshot is not None:
            self.pause_action.setChecked(self.snapshot.paused)

    def set_paused(self, paused: bool) -> None:
        self.link.set_paused(bool(paused))

    def notify(self, title: str, text: str) -> None:
        """A notice (`rbroker.tray.notices`) as a desktop notification from the tray icon;
        without a tray it is only logged. The last 20 are kept in `notices`. Both are
        `clean`ed: they name projects and sessions and repeat the broker's messages."""
        title, text = clean(title), clean_lines(text)
        self.notices.append((title, text))
        log.info("%s: %s", title, text)
        self._show_message(title, text, 8000)

    def _show_message(self, title: str, text: str, shown_ms: int) -> None:
        """A desktop notification from the tray icon (none without a tray), its body written
        for the notification server that shows it (`plain.notification_body`; whether that
        server reads markup is asked once)."""
        if self.tray is None or not QSystemTrayIcon.supportsMessages():
            return
        if self._markup is None:
            self._markup = notification_server.reads_markup()
        body = notification_body(text, self._markup)
        self.tray.showMessage(title, body, state_icon(self.state), shown_ms)

    # -- "tell me when N MiB are free" (rbroker.tray.room) ---------------------------------------
    def ask_room_watch(self) -> None:
        """Ask for the MiB (and GPUs) with two small dialogs, then `set_room_watch`."""
        parent = self.window if self.window.isVisible() else None
        replaces = (
            f"\n(One watch at a time: this replaces the one for {self.room_watch.describe()}.)"
            if self.room_watch is not None
            else "\n(One watch at a time.)"
        )
        mib, ok = QInputDialog.getInt(
            parent,
            "Tell me when MiB are free",
            f"Tell me when this many MiB could be granted to me:{replaces}",
            self.room_watch.mib if self.room_watch is not None else 8000,
            1,
            2**31 - 1,
            1024,
        )
        if not ok:
            return
        gpus, ok = QInputDialog.getInt(
            parent, "Tell me when MiB are free", "On how many GPUs at once:", 1, 1, 64, 1
        )
        if ok:
            self.set_room_watch(mib, gpus)

    def set_room_watch(self, mib: int, gpus: int = 1) -> RoomWatch:
        """Watch for room for `mib` MiB on each of `gpus` GPUs (the link's room thread checks;
        nothing is taken); it replaces the watch set, if any."""
        watch = RoomWatch(mib, gpus)
        self.room_watch = watch
        self.link.set_room_watch(watch)
        self._show_room_watch()
        return watch

    def cancel_room_watch(self) -> None:
        """Stop watching; no notice comes for the watch cancelled."""
        self.room_watch = None
        self.link.set_room_watch(None)
        self._show_room_watch()

    def _show_room_watch(self) -> None:
        watch = self.room_watch
        self.unwatch_action.setEnabled(watch is not None)
        self.unwatch_action.setText(
            f"Cancel the watch for {watch.describe()}"
            if watch is not None
            else "Cancel the watch for free MiB"
        )

    def on_room_fits(self, watch: RoomWatch, answer: RoomCheckResult) -> None:
        if watch is not self.room_watch:  # cancelled or replaced meanwhile
            return
        self.room_watch = None
        self._show_room_watch()
        self.notify("rbroker: room now", room_text(answer, watch.mib))

    def on_room_failed(self, watch: RoomWatch, message: str) -> None:
        if watch is not self.room_watch:
            return
        self.room_watch = None
        self._show_room_watch()
        self.notify("rbroker: watch ended", f"no watch for {watch.describe()}: {message}")

    def copy_snippet(self) -> None:
        text = run_snippet(self.snapshot, self.snippet_socket)
        QGuiApplication.clipboard().setText(text)
        self._show_message("rbroker", f"Copied:\n{text}", 4000)

    # -- settings ----------------------------------------------------------------------------
    def _show_autostart(self) -> None:
        self.window.settings_tab.set_autostart(autostart.is_enabled(), autostart.location())

    def set_autostart(self, on: bool) -> None:
        try:
            autostart.set_enabled(on)
        except OSError as exc:
            self.window.settings_tab.message.setText(f"Could not change start at login: {exc}")
        self._show_autostart()

    def save_settings(self, settings: TraySettings) -> None:
        try:
            settings.save()
        except OSError as exc:
            self.window.settings_tab.message.setText(f"Not saved: {exc}")
            return
        self.settings = settings
        self.window.settings_tab.message.setText("Saved.")

    def refresh_enrollment(self) -> None:
        """Show the enrollment kept in the broker's data dir, and offer the key file when no
        OS keyring is usable (the check is bounded: a hanging keyring gives up in seconds)."""
        tab = self.window.settings_tab
        if self.data_dir is None:
            tab.set_enroll_unknown(
                "Unknown: this app did not start the broker, so it does not know where the "
                "broker keeps its enrollment."
            )
            return
        from rbroker.uplink.config import UplinkConfig
        from rbroker.uplink.keyrings import KeyStoreError, choose_keyring

        try:
            config = UplinkConfig.load(self.data_dir)
        except ValueError as exc:
            tab.set_enrollment(None)
            tab.enrollment.setText(gui_text(f"The enrollment cannot be read: {exc}"))
            return
        try:
            choice = choose_keyring()
            usable, why = choice.refusal is None, choice.refusal or choice.name
        except KeyStoreError as exc:
            usable, why = False, str(exc)
        tab.set_enrollment(config, usable, gui_text(why))

    def enroll(self, request: EnrollRequest) -> None:
        """Enroll this computer (what `rbroker enroll` does) on a worker thread."""
        label = self.window.settings_tab.enroll_state
        if not request.url or not request.code:
            label.setText("Enter the coordinator URL and the enrollment code first.")
            return
        if self.data_dir is None:
            label.setText(
                "This app did not start the broker: enroll in a terminal with "
                f"rbroker enroll {request.url} CODE"
            )
            return
        if self._enrolling:
            return
        self._enrolling = True
        label.setText(f"Enrolling at {request.url}…")
        self.window.settings_tab.enroll_button.setEnabled(False)
        self.window.settings_tab.reenroll_button.setEnabled(False)
        data_dir = self.data_dir

        def run() -> None:
            from rbroker.uplink.enroll import EnrollError
            from rbroker.uplink.enroll import enroll as uplink_enroll

            try:
                config = uplink_enroll(
                    request.url,
                    request.code,
                    gethostname(),
                    data_dir,
                    ca_file=request.ca_file or None,
                    key_file=request.key_file,
                    new_identity=request.new_identity,
                )
            except EnrollError as exc:
                self.enroll_finished.emit(False, error_text(exc))
            except Exception as exc:  # never let a bad answer take the tray down
                self.enroll_finished.emit(False, error_text(exc))
            else:
                self.enroll_finished.emit(
                    True,
                    f"Enrolled {config.name} as {config.computer_id} in group {config.group}. "
                    "The broker starts reporting within seconds.",
                )

        self._enroll_thread = threading.Thread(target=run, name="rbroker-tray-enroll", daemon=True)
        self._enroll_thread.start()

    def on_enroll_finished(self, ok: bool, message: str) -> None:
        tab = self.window.settings_tab
        self._enrolling = False
        tab.enroll_button.setEnabled(True)
        tab.reenroll_button.setEnabled(True)
        tab.enroll_state.setText(message if ok else f"Not enrolled: {message}")
        if ok:
            tab.code.clear()
            self.fleet_feed.refresh()
        self.refresh_enrollment()

    # -- quit --------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the link, the fleet reads and the in-process broker (if any). Idempotent."""
        if self._shut_down:
            return
        self._shut_down = True
        self.tray_timer.stop()
        self.fleet_timer.stop()
        self.clock_timer.stop()
        self.link.stop()
        self.fleet_feed.join()
        if self._enroll_thread is not None:
            self._enroll_thread.join(5)
        if self.embedded is not None:
            self.embedded.stop()
        if self.guard is not None:
            self.guard.release()
        if self.tray is not None:
            self.tray.hide()
        self.window.quitting = True
        self.window.close()

    def quit(self) -> None:
        self.shutdown()
        app = QApplication.instance()
        if app is not None:
            app.quit()


def _probe(socket: str) -> bool:
    try:
        with Client(socket, timeout_s=2):
            return True
    except RBrokerError:
        return False


def _answering() -> str | None:
    """The address of the broker a client finds now (`discovery_order`), None if none."""
    try:
        with Client(None, timeout_s=2) as client:
            return client.address
    except RBrokerError:
        return None


def run(args: argparse.Namespace) -> int:
    """Run the tray app (see `rbroker.tray.run_tray`)."""
    logging.basicConfig(
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from rbroker.uplink import quiet_http_client_logs

    quiet_http_client_logs()

    # the first broker that answers (the system broker's before the per-user one), else
    # the per-user address, where this app starts its own
    socket = args.socket or _answering() or default_socket_path()
    data_dir = args.data_dir or default_data_dir()
    try:  # a broker this app would start must be able to listen and keep its state
        check_socket_path(socket)
        if not args.attach_only and not _probe(socket):
            check_broker_paths(socket, data_dir)
    except OSError as exc:
        code, line = os_error_line(exc, socket, data_dir)
        print(f"rbroker tray: {one_line(line)}", file=sys.stderr)
        return code

    app = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(app, QApplication)
    app.setApplicationName("rbroker")
    app.setQuitOnLastWindowClosed(False)
    app.setWindowIcon(app_icon())

    guard = SingleInstance(instance_name(args.socket))
    if not guard.acquire():
        print("rbroker tray is already running; its window was brought to the front.")
        return EXIT_TRAY_ALREADY_RUNNING

    first_run = not settings_path().exists()
    settings = TraySettings.load()
    if first_run:  # a new user sees the window once; later starts sit in the tray
        with contextlib.suppress(OSError):
            settings.save()
    embedded: EmbeddedBroker | None = None
    if _probe(socket) or args.attach_only:
        origin = "attached"
        log.info("attached to the broker at %s", socket)
    else:
        from rbroker.hosting.host import make_config

        headroom = args.headroom_mib if args.headroom_mib is not None else settings.headroom_mib
        config = make_config(
            socket,
            data_dir,
            simulate=args.simulate is not None,
            scenario=Path(args.simulate) if args.simulate else None,
            headroom_mib=headroom,
        )
        # Quitting the tray ends the leases of the broker it hosts (its menu says so)
        config = dataclasses.replace(config, release_all_on_exit=True)
        embedded = EmbeddedBroker(config)
        origin = "started by this app; quitting it stops the broker and ends its leases"

    controller = TrayApp(
        args.socket,
        settings,
        embedded=embedded,
        show_window=args.show or first_run,
        origin=origin,
        guard=guard,
        snippet_socket=args.socket,
        data_dir=data_dir,
        fleet=UplinkFleet(data_dir),
    )
    guard.activated.connect(controller.window.bring_to_front)
    if embedded is not None:
        embedded.on_failed = lambda exc: controller.broker_failed.emit(str(exc))
        embedded.start()
    controller.start()
    app.aboutToQuit.connect(controller.shutdown)
    quit_on_signals(controller)
    code = int(app.exec())
    teardown(app, controller, guard)
    return code


def quit_on_signals(controller: TrayApp) -> None:
    """SIGINT/SIGTERM quit cleanly (the in-process broker stops, its socket is removed).

    Python runs signal handlers between bytecodes, so a timer wakes the interpreter while
    Qt's event loop is idle."""
    if sys.platform == "win32":  # pragma: no cover - no SIGTERM from the session manager
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: QTimer.singleShot(0, controller.quit))
    wake = QTimer(controller)
    wake.timeout.connect(lambda: None)
    wake.start(250)


def teardown(app: QApplication, controller: TrayApp, guard: SingleInstance) -> None:
    """After the event loop: end everything that could call into Qt, then delete the Qt
    objects in order while Qt still runs, then the application itself, so nothing is left
    for the interpreter's exit to free in an arbitrary order (which once crashed with
    "Fatal Python error: bool_dealloc").

    Order: signal handlers back to the default (they queue Qt timers); the controller's
    shutdown (threads joined, timers stopped, the broker stopped; idempotent); signal
    connections cut; windows and the tray icon deleted and the deletions run; the
    application shut down (PySide6 `QCoreApplication.shutdown`)."""
    if sys.platform != "win32":
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
    controller.shutdown()
    with contextlib.suppress(RuntimeError, TypeError):
        app.aboutToQuit.disconnect(controller.shutdown)
    with contextlib.suppress(RuntimeError, TypeError):
        guard.activated.disconnect()
    for child in controller.findChildren(QTimer):
        child.stop()
    if controller.tray is not None:
        controller.tray.deleteLater()
    controller.window.deleteLater()
    controller.deleteLater()
    app.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    app.processEvents()
    shutdown = getattr(app, "shutdown", None)
    if shutdown is not None:
        shutdown()


__all__ = ["STATE_TEXT", "TrayApp", "run"]
