"""`rbroker jobs`: parallel jobs with progress bars, items per second and ETA."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

import rbroker
from rbroker.cli.exits import unusable_exit
from rbroker.cli.views import finished_note, jobs_table, print_view
from rbroker_protocol.results import JobView

RECONNECT_S = 1.0
"""Pause between attempts to reach the broker again while `--watch` has lost it."""


class _Watch:
    """The jobs of one broker, fetched over a connection that is opened again when the
    broker restarts or goes away (`--watch`): a lost broker is a line on screen, never the
    end of the watch."""

    def __init__(self, socket: str | None, active_only: bool, client: rbroker.Client) -> None:
        self._socket = socket
        self._active_only = active_only
        self._client: rbroker.Client | None = client
        self.lost: str | None = None
        """Why the broker is not answering now (None while it answers)."""
        self.lost_exit = 0
        self.note: str | None = None
        """What the list leaves out (`finished_note`), under the table."""
        """The exit code for what `lost` says (`rbroker.cli.exits.unusable_exit`)."""

    def fetch(self) -> list[JobView] | None:
        """The jobs, or None while the broker cannot be reached (`lost` says why)."""
        if self._client is None:
            try:
                self._client = rbroker.Client(self._socket, timeout_s=5)
            except (rbroker.BrokerUnavailable, rbroker.NotAllowed) as exc:
                self.lost, self.lost_exit = str(exc), unusable_exit(exc)
                return None
        try:
            answer = self._client.jobs_list(include_finished=not self._active_only)
        except (rbroker.BrokerUnavailable, rbroker.NotAllowed, OSError) as exc:
            self.lost, self.lost_exit = str(exc), unusable_exit(exc)
            self.close()
            return None
        self.lost = None
        self.note = finished_note(answer)
        return list(answer["jobs"])

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _lost_line(lost: str) -> str:
    return f"broker not answering, trying again every {RECONNECT_S:g} s: {lost}"


def run_jobs(args: argparse.Namespace) -> int:
    """Print the jobs once (or live with --watch, reconnecting when the broker restarts).
    Exit 0, 69 when no broker answers at the start, 2 when the broker refuses this user
    (`rbroker.cli.exits`)."""
    console = Console()
    try:
        client = rbroker.Client(args.socket, timeout_s=5)
    except (rbroker.BrokerUnavailable, rbroker.NotAllowed) as exc:
        # a broker that refuses this user (its socket's permissions or allowed group, its
        # per-user connection cap) is there: a refusal (2), not "no broker" (69)
        Console(stderr=True).print(f"rbroker jobs: {exc}", markup=False, soft_wrap=True)
        return unusable_exit(exc)
    watch = _Watch(args.socket, args.active, client)
    try:
        jobs = watch.fetch()
        if jobs is None:
            assert watch.lost is not None
            Console(stderr=True).print(f"rbroker jobs: {watch.lost}", markup=False, soft_wrap=True)
            return watch.lost_exit
        if args.json:
            print(json.dumps(jobs, indent=2))
            return 0
        if not args.watch:
            print_view(console, jobs_table(jobs, watch.note))
            return 0
        # "until Ctrl-C" also where the shell started it with SIGINT ignored (a background
        # job of a script), as `rbroker demo` does
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            if console.is_terminal:
                _watch_live(console, watch, jobs)
            else:
                _watch_plain(console, watch, jobs)
        except KeyboardInterrupt:
            pass
        return 0
    finally:
        watch.close()


def _watch_plain(console: Console, watch: _Watch, jobs: list[JobView] | None) -> None:
    """A pipe or file: plain tables, one every 2 s; a lost broker is one line on stderr
    when it goes and one when it is back."""
    said_lost = False
    while True:
        if jobs is not None:
            if said_lost:
                print("rbroker jobs: the broker answers again", file=sys.stderr, flush=True)
                said_lost = False
            print_view(console, jobs_table(jobs, watch.note))
            time.sleep(2.0)
        else:
            if not said_lost and watch.lost is not None:
                print(f"rbroker jobs: {_lost_line(watch.lost)}", file=sys.stderr, flush=True)
                said_lost = True
            time.sleep(RECONNECT_S)
        jobs = watch.fetch()


def _watch_live(console: Console, watch: _Watch, jobs: list[JobView]) -> None:
    """A terminal: the table redrawn every 0.5 s; while the broker is lost, the last table
    stays with a line under it saying so."""
    last = jobs_table(jobs, watch.note)
    with Live(last, console=console, refresh_per_second=4) as live:
        while True:
            time.sleep(0.5 if watch.lost is None else RECONNECT_S)
            fetched = watch.fetch()
            if fetched is not None:
                last = jobs_table(fetched, watch.note)
                live.update(last)
            elif watch.lost is not None:
                live.update(Group(last, Text(_lost_line(watch.lost), style="bold yellow")))
