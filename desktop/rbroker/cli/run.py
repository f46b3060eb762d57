"""`rbroker run --mib N -- CMD...`: hold a lease while CMD runs (architecture.md §3).

Sets `CUDA_VISIBLE_DEVICES` (an index with `CUDA_DEVICE_ORDER=PCI_BUS_ID`, or the UUID for
MIG slices; `--cuda-devices` chooses, see `rbroker.base.cuda`), `RBROKER_LEASE_ID` and what keeps
frameworks inside the grant (`rbroker._frameworks.framework_env`: `RBROKER_GRANTED_MIB`,
`RBROKER_GPU_TOTAL_MIB`, `XLA_PYTHON_CLIENT_MEM_FRACTION`, `TF_FORCE_GPU_ALLOW_GROWTH`) in
CMD's environment, replaces `{mib}`, `{fraction}` and `{gpu}` in CMD's arguments (no
other `{` is touched), forwards SIGINT/SIGTERM/SIGHUP to it, releases the lease when it
exits, and exits with its code (128 + N when it was killed by signal N). On Windows the
console itself gives Ctrl-C and Ctrl-Break to CMD (it runs in `rbroker run`'s console process
group): `rbroker run` outlives CMD to release the lease; CMD runs in a Job object that ends it
when `rbroker run` ends (`rbroker.base.children`). The command line
itself never leaves this process: the lease's session and purpose default to the program's
name only.

By default it does not wait: with no room now it exits 75 at once. With `--wait S` it queues
up to S seconds and says on stderr what it waits for (the broker's queue reason, updated as
it changes). Flag values are checked against the local API's limits before anything is
sent, and errors name the flag (`--mib must be at least 1`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading

import rbroker
from rbroker._frameworks import (
    PLACEHOLDER,
    fraction_text,
    framework_env,
    memory_fraction,
    override_env,
    override_note,
    substitute,
)
from rbroker._lease import LEASE_LOST
from rbroker._lease import log as lease_log
from rbroker.base.children import STOP_SIGNALS, forward_signal, spawn
from rbroker.base.display import AHEAD_SAID, ahead_words, fmt_mib
from rbroker.cli.exits import unusable_exit
from rbroker_protocol.eta import eta_words

# The request's model loads only to word a refusal, rich only to say something, and neither
# `typing` nor `logging` load at all when all goes well (start-up, docs/architecture.md §10):
# the idiom type checkers read as typing.TYPE_CHECKING (PEP 484's constant).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    import logging
    from collections.abc import Mapping
    from types import FrameType
    from typing import Any

    from pydantic import ValidationError
    from rich.console import Console
    from rich.status import Status

    from rbroker_protocol.results import BookingView

EX_USAGE = 2
EX_TEMPFAIL = 75  # sysexits.h: no room now / within --wait

FLAGS = {
    "mib": "--mib",
    "gpus": "--gpus",
    "gpu_uuid": "--gpu",
    "project": "--project",
    "session": "--session",
    "purpose": "--purpose",
    "wait_s": "--wait",
    "ttl_s": "--ttl",
    "expected_s": "--expected",
    "booking_id": "--booking",
}
"""Local API parameter → the `rbroker run` flag that sets it."""


def flag_error(exc: ValidationError) -> str:
    """The first problem of `exc` in the flag's words: `--mib must be at least 1`,
    `--wait must be at least 0 seconds (0, the default, does not wait)`."""
    err = exc.errors()[0]
    field = str(err["loc"][0]) if err["loc"] else ""
    flag = FLAGS.get(field, field)
    ctx: dict[str, object] = dict(err.get("ctx") or {})  # the failed constraint's bounds
    kind = err["type"]
    bound_value = ctx.get("ge", ctx.get("gt", ctx.get("le", ctx.get("lt"))))
    unit = ""
    if field in ("wait_s", "ttl_s", "expected_s"):
        unit = " second" if bound_value == 1 else " seconds"
    if kind in ("greater_than_equal", "greater_than"):
        bound = ctx.get("ge", ctx.get("gt"))
        word = "at least" if kind == "greater_than_equal" else "more than"
        text = f"{flag} must be {word} {_n(bound)}{unit}"
        if field == "wait_s":
            text += " (0, the default, does not wait)"
        return text
    if kind in ("less_than_equal", "less_than"):
        bound = ctx.get("le", ctx.get("lt"))
        word = "at most" if kind == "less_than_equal" else "less than"
        return f"{flag} must be {word} {_n(bound)}{unit}"
    if kind == "string_too_short":
        return f"{flag} must have at least {ctx.get('min_length')} characters"
    if kind == "string_too_long":
        return f"{flag} must have at most {ctx.get('max_length')} characters"
    if kind == "string_pattern_mismatch" and field == "gpu_uuid":
        return f"{flag} must be a GPU UUID as `rbroker status` shows it (GPU-… or MIG-…)"
    if kind == "finite_number":
        return f"{flag} must be a finite number{' of seconds' if unit else ''}"
    return f"{flag}: {err['msg'].lower()}"


def _in_flag_words(request: Mapping[str, Any]) -> str | None:
    """What the local API's model (`AcquireParams`) finds wrong in `request`, in the flag's
    words (`flag_error`); None when it finds nothing."""
    from pydantic import ValidationError

    from rbroker_protocol.localapi import AcquireParams

    try:
        AcquireParams.model_validate(dict(request))
    except ValidationError as exc:
        return flag_error(exc)
    return None


def _n(bound: object) -> str:
    if isinstance(bound, float) and bound.is_integer():
        bound = int(bound)  # 2 592 000 seconds, not 2.592e+06
    return fmt_mib(bound) if isinstance(bound, int) else f"{bound:g}"


class StderrConsole:
    """rich's `Console` on stderr, made when it first says something: a run that starts
    and ends quietly never loads rich (about a quarter of `rbroker run`'s own start, issue
    44). What it prints goes through rich as before: markup off, control codes stripped."""

    def __init__(self) -> None:
        self._console: Console | None = None

    @property
    def real(self) -> Console:
        """The console itself (made now if it was not)."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(stderr=True, highlight=False)
        return self._console

    @property
    def is_terminal(self) -> bool:
        return self.real.is_terminal

    def print(self, *objects: Any, **options: Any) -> None:
        """`Console.print` on the real console."""
        self.real.print(*objects, **options)


class WaitDisplay:
    """Says on stderr what `rbroker run` waits for: a spinner line updated in place in a
    terminal, one line per change of reason or estimate otherwise. Thread-safe (`show` is
    called from the SDK's helper thread)."""

    def __init__(self, console: StderrConsole | Console, mib: int, wait_s: float) -> None:
        self.console = console
        self.head = f"rbroker run: waiting up to {wait_s:g} s for {fmt_mib(mib)} MiB"
        self.status: Status | None = None
        self.lock = threading.Lock()
        self.closed = False

    def show(self, entry: Mapping[str, Any]) -> None:
        """One queue entry (`waiting` event data, a `QueuedRequest`; the SDK's `on_wait`
        hands it over as a plain dict) → the current line: its reason, and when it
        will likely fit where the broker estimates it (sent again when the estimate moves)."""
        reason = str(entry.get("reason", "")).removeprefix("waiting: ")
        ahead = int(entry.get("ahead") or 0)
        line = f"{self.head}: {reason}"
        if ahead and not AHEAD_SAID.search(reason):  # the broker's reason may say it already
            line += f"; {ahead_words(ahead)}"
        if entry.get("eta_s") is not None:  # "; likely in ~40 s (because …)"
            line += f"; {eta_words(entry)}"
        with self.lock:
            if self.closed:
                return
            if not self.console.is_terminal:
                self.console.print(line, markup=False, highlight=False, soft_wrap=True)
            elif self.status is None:
                from rich.status import Status

                given = self.console
                real = given.real if isinstance(given, StderrConsole) else given
                self.status = Status(line, console=real)
                self.status.start()
            else:
                self.status.update(line)

    def close(self) -> None:
        """Stop the spinner (the child's own output follows)."""
        with self.lock:
            self.closed = True
            if self.status is not None:
                self.status.stop()


def _placeholders(
    lease: rbroker.Lease, args: list[str], env: dict[str, str], console: StderrConsole
) -> list[str]:
    """Add the framework variables to `env` and replace the placeholders in `args`;
    says on stderr which fraction `{fraction}` is when the lease's GPUs differ in size.

    Raises:
        ValueError: `{fraction}` is used but the GPUs' totals are unknown.
    """
    totals, overridden = lease.gpu_total_mib, lease.gpu_total_override
    if totals and overridden:
        env.update(override_env(lease.granted_mib, totals))
        note = override_note(lease.granted_mib, overridden)
        console.print(f"rbroker run: {note}", markup=False, soft_wrap=True)
    elif totals:
        env.update(framework_env(lease.granted_mib, totals))
    used = {m.group(1) for a in args for m in PLACEHOLDER.finditer(a)}
    if not used:
        return list(args)
    values = {"mib": str(lease.granted_mib), "gpu": env["CUDA_VISIBLE_DEVICES"]}
    if "fraction" in used:
        if not totals:
            raise ValueError("{fraction}: the totals of the lease's GPUs are unknown")
        if overridden:
            raise ValueError(
                f"{{fraction}}: no memory fraction on {', '.join(overridden)} (a capacity "
                "override, not the total a framework sees); give the framework {mib} MiB"
            )
        values["fraction"] = env["RBROKER_MEMORY_FRACTION"]
        if len(set(totals)) > 1:
            each = ", ".join(
                f"{fraction_text(memory_fraction(lease.granted_mib, t))} of {fmt_mib(t)} MiB"
                for t in totals
            )
            console.print(
                f"rbroker run: {{fraction}} is {values['fraction']}, the smallest of the "
                f"lease's GPUs ({each}), so every GPU stays inside "
                f"{fmt_mib(lease.granted_mib)} MiB",
                markup=False,
                soft_wrap=True,
            )
    return substitute(args, values)


def _not_lease_lost(record: logging.LogRecord) -> bool:
    return not getattr(record, LEASE_LOST, False)


def _wait_noting_loss(
    child: subprocess.Popen[bytes], lease: Any, console: StderrConsole | Console
) -> int:
    """Wait for `child`; when its lease is lost meanwhile (released by another process,
    expired, reclaimed), say once that the command runs on without one, also when the loss
    is first seen after the command ended (it ran its last part without one: a reclaim told
    while the command was finishing went unsaid). rbroker never stops the command
    (architecture.md §3): `rbroker run` still exits with its code. Returns `child`'s code."""
    while True:
        try:
            code: int | None = child.wait(timeout=0.25)
        except subprocess.TimeoutExpired:
            code = None
        if lease.lost:
            then = "runs on" if code is None else "ran its last part"
            console.print(
                f"rbroker run: lease {lease.lease_id} lost ({lease.error}); the command {then} "
                "WITHOUT a lease: its GPU memory is no longer reserved and others may be "
                "granted it (rbroker does not stop the command)",
                markup=False,
                soft_wrap=True,
            )
            return child.wait() if code is None else code
        if code is not None:
            return code


def _claimed_booking(given: str, socket: str | None, console: StderrConsole) -> BookingView | int:
    """The live booking of this user's that `given` names (its id or a unique prefix, as
    `rbroker bookings` shows it), with something left unclaimed; or the exit code after one
    line on stderr: no broker (69, or 2 refused), no such booking, nothing of it left (2)."""
    from rbroker.cli.bookings import clean, resolve_booking  # only for a claim

    try:
        with rbroker.Client(socket, timeout_s=10) as client:
            found = resolve_booking(client, given, mine_only=True)
    except (rbroker.BrokerUnavailable, rbroker.NotAllowed) as exc:
        console.print(f"rbroker run: {exc}", markup=False, soft_wrap=True)
        return unusable_exit(exc)
    except rbroker.RBrokerError as exc:
        console.print(f"rbroker run: {exc}", markup=False, soft_wrap=True)
        return EX_USAGE
    if isinstance(found, str):
        console.print(f"rbroker run: {clean(found)}", markup=False, soft_wrap=True)
        return EX_USAGE
    return found


def run_command(args: argparse.Namespace) -> int:
    """Run `args.cmd` under a lease; returns the exit code described in the module doc."""
    console = StderrConsole()
    # the loss of the lease is said once, by `_wait_noting_loss`, not also by the SDK's log
    lease_log.addFilter(_not_lease_lost)
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        console.print(
            "rbroker run: give the command after --, "
            "e.g. rbroker run --mib 8192 -- python train.py",
            markup=False,
            soft_wrap=True,
        )
        return EX_USAGE
    program = os.path.basename(cmd[0]) or "command"
    expected_s: float | None = getattr(args, "expected", None)
    booking_id: str | None = getattr(args, "booking", None)
    if booking_id is not None:
        booked = _claimed_booking(booking_id, args.socket, console)
        if isinstance(booked, int):
            return booked
        booking_id = booked["booking_id"]
        left = int(booked["mib"]) - int(booked.get("claimed_mib") or 0)
        if args.mib is None and left <= 0:
            console.print(
                f"rbroker run: booking {booking_id} is claimed in full "
                f"({fmt_mib(int(booked['mib']))} MiB): give --mib to ask for more",
                markup=False,
                soft_wrap=True,
            )
            return EX_USAGE
        if args.mib is None:
            args.mib = left
        if args.gpus is None:
            args.gpus = len(booked["gpu_uuids"])
        # the lease says what the booking said, unless told otherwise
        args.project = args.project if args.project != "default" else booked["project"]
        args.purpose = args.purpose or booked["purpose"]
    if args.mib is None:
        console.print(
            "rbroker run: give --mib MiB (or --booking ID to claim a booking)",
            markup=False,
            soft_wrap=True,
        )
        return EX_USAGE
    if args.gpus is None:
        args.gpus = 1
    request = {
        "mib": args.mib,
        "project": args.project,
        "session": args.session or program,
        "purpose": args.purpose or f"run {program}",
        "wait_s": args.wait,
        "gpus": args.gpus,
        "gpu_uuid": args.gpu_uuid,
        "ttl_s": args.ttl,
        "expected_s": expected_s,
        "booking_id": booking_id,
    }
    display = WaitDisplay(console, args.mib, args.wait)
    try:
        ctx = rbroker.lease(
            args.mib,
            project=request["project"],
            session=request["session"],
            purpose=request["purpose"],
            wait_s=args.wait,
            gpus=args.gpus,
            gpu_uuid=args.gpu_uuid,
            ttl_s=args.ttl,
            socket=args.socket,
            on_wait=display.show,
            expected_s=expected_s,
            booking=booking_id,
        )
        lease = ctx.__enter__()
    except rbroker.BrokerUnavailable as exc:
        display.close()
        console.print(f"rbroker run: {exc}", markup=False, soft_wrap=True)
        return unusable_exit(exc)  # 69, or 2 where the broker is there and refuses this user
    except rbroker.CapacityUnavailable as exc:
        display.close()
        hint = "" if args.wait > 0 else " (add --wait SECONDS to queue for room)"
        console.print(f"rbroker run: {exc}{hint}", markup=False, soft_wrap=True)
        return EX_TEMPFAIL
    except rbroker.InvalidParams as exc:
        # the broker checks the request with the local API's model; the same model, here,
        # says which flag it was in the flag's words (loaded only now: a run that starts
        # pays nothing for it)
        display.close()
        console.print(
            f"rbroker run: {_in_flag_words(request) or exc}", markup=False, soft_wrap=True
        )
        return EX_USAGE
    except rbroker.RBrokerError as exc:
        display.close()
        said = str(exc)
        if exc.code in ("booking_conflict", "booking_not_started"):
            from rbroker.cli.bookings import refusal_words  # said in this viewer's zone

            said = refusal_words(exc)
        console.print(f"rbroker run: {said}", markup=False, soft_wrap=True)
        return EX_USAGE
    except KeyboardInterrupt:
        display.close()
        return 128 + signal.SIGINT
    display.close()
    child: subprocess.Popen[bytes] | None = None
    forwarded = (signal.SIGINT, *STOP_SIGNALS)
    previous = {}

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child is not None:
            forward_signal(child, signum)

    try:
        env = dict(os.environ)
        try:
            env.update(lease.cuda_env(getattr(args, "cuda_devices", "auto")))
        except ValueError as exc:
            console.print(f"rbroker run: {exc}", soft_wrap=True, markup=False)
            return EX_USAGE
        env["RBROKER_LEASE_ID"] = lease.lease_id
        try:
            cmd = cmd[:1] + _placeholders(lease, cmd[1:], env, console)
        except ValueError as exc:
            console.print(f"rbroker run: {exc}", soft_wrap=True, markup=False)
            return EX_USAGE
        for sig in forwarded:
            previous[sig] = signal.signal(sig, forward)
        try:
            # the command must not run on without its lease: if `rbroker run` is killed
            # (kill -9 releases the lease with its connection), the command ends too
            # (Linux: SIGTERM; Windows: its Job object closes)
            child = spawn(cmd, env=env)
        except OSError as exc:
            console.print(
                f"rbroker run: cannot start the command {cmd[0]!r}: {exc.strerror}"
                + (" (not found on PATH)" if isinstance(exc, FileNotFoundError) else ""),
                markup=False,
                soft_wrap=True,
            )
            return 127 if isinstance(exc, FileNotFoundError) else 126
        code = _wait_noting_loss(child, lease, console)
        return 128 - code if code < 0 else code
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        ctx.__exit__(None, None, None)
