"""`rbroker` command line: broker, status, top, run, demo, tray."""

from __future__ import annotations

import contextlib
import os
import sys

from rbroker.base.version import __version__
from rbroker.client.paths import socket_option

# No `typing` and, for `rbroker run` and `rbroker status` as scripts call them, no argparse on
# the command line's start (issue 44: `quick_args`): the idiom type checkers read as
# typing.TYPE_CHECKING (PEP 484's constant, never true at run time).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable
    from typing import TypeAlias

    QuickOption: TypeAlias = tuple[str, Callable[[str], object] | None]

CLIENT_SOCKET_HELP = (
    "the broker's address (default: $RBROKER_SOCKET when set, and only it; else the first "
    "that answers of the system broker's address, /run/rbroker/broker.sock "
    "(\\\\.\\pipe\\rbroker on Windows; $RBROKER_SYSTEM_SOCKET moves it), and the per-user address)"
)
"""The `--socket` help of the commands that talk to a broker: the discovery order of
`rbroker.client.paths.discovery_order`."""
BROKER_SOCKET_HELP = (
    "where this broker listens (default: $RBROKER_SOCKET, else the per-user address; "
    "with --system the system broker's address)"
)


def _add_socket(p: argparse.ArgumentParser, help_text: str = CLIENT_SOCKET_HELP) -> None:
    p.add_argument("--socket", type=socket_option, help=help_text)


def _demo_seconds(text: str) -> float:
    """`--seconds` of `rbroker demo`: a finite number from 10 to 600.

    Raises:
        argparse.ArgumentTypeError: anything else, with the bounds (a usage error, exit 2).
    """
    import argparse

    from rbroker.cli.demo import SECONDS_MAX, SECONDS_MIN

    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not SECONDS_MIN <= value <= SECONDS_MAX:  # also nan and inf
        raise argparse.ArgumentTypeError(
            f"must be from {SECONDS_MIN:g} to {SECONDS_MAX:g} seconds (the worker part's "
            f"length; below {SECONDS_MIN:g} s its waits and its kill run into one another), "
            f"got {text!r}"
        )
    return value


def _whole(text: str, most: int, what: str) -> int:
    """A whole number from 1 to `most`.

    Raises:
        argparse.ArgumentTypeError: anything else, with the bounds (a usage error, exit 2).
    """
    import argparse

    raw = text.strip()
    value = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= len(str(most)) else 0
    if not 1 <= value <= most:
        raise argparse.ArgumentTypeError(f"must be a whole number of {what} from 1 to {most}")
    return value


def _room_mib(text: str) -> int:
    """`--room` of `rbroker fleet`: MiB, as the coordinator's room read takes them."""
    return _whole(text, 2**40, "MiB")


def _room_gpus(text: str) -> int:
    """`--gpus` of `rbroker fleet`: 1 to 64 GPUs, as the coordinator's room read takes them."""
    return _whole(text, 64, "GPUs")


def _broker_arguments(b: argparse.ArgumentParser) -> None:
    """`rbroker broker`'s arguments."""
    from pathlib import Path  # only the broker's options are paths

    b.epilog = (
        "On Linux, `rbroker broker install-system` (as root) installs the system broker "
        "as a systemd service and `rbroker broker uninstall-system` removes it (each with "
        "--help)."
    )
    _add_socket(b, BROKER_SOCKET_HELP)
    b.add_argument("--data-dir", type=Path, help="state directory (default: per-user data dir)")
    b.add_argument(
        "--simulate",
        nargs="?",
        const="",
        default=None,
        metavar="SCENARIO.toml",
        help="simulate GPUs (default scenario: two 24 GiB GPUs, or the given file)",
    )
    b.add_argument("--headroom-mib", type=int, help="headroom per GPU (default max(512, 5%%))")
    b.add_argument(
        "--capacity-mib",
        action="append",
        default=[],
        metavar="UUID=MIB",
        help="total MiB of a GPU whose NVML memory query is not supported (repeatable)",
    )
    b.add_argument(
        "--admin-group",
        metavar="GROUP",
        help="OS group whose members may also pause admissions, end any lease and cancel any "
        "waiting request (default: the broker's user and root only)",
    )
    b.add_argument(
        "--system",
        action="store_true",
        help="the computer's broker for every local user (Linux): socket "
        "/run/rbroker/broker.sock, data /var/lib/rbroker (as `rbroker broker install-system` "
        "runs it)",
    )
    b.add_argument(
        "--allowed-group",
        metavar="GROUP",
        help="only the broker's user and members of this OS group may connect (e.g. rbroker)",
    )
    b.add_argument(
        "--machine-lock",
        metavar="NAME",
        help="name of the one-broker-per-computer lock, with --simulate only (default: "
        "RBROKER_BROKER_LOCK, else 'per-socket': a lock of its own per socket address, so a "
        "simulated broker neither blocks nor is blocked by a real one); 'rbroker-broker' "
        "makes it take what a real broker takes; a broker on real GPUs always takes that",
    )
    b.add_argument(
        "--release-all-on-exit",
        action="store_true",
        help="end every lease when the broker stops (default: keep them for the restart)",
    )
    b.add_argument(
        "--over-grant-grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long a lease may use more than its grant before it is reported (default 10)",
    )
    b.add_argument(
        "--max-wait",
        type=float,
        default=24 * 3600.0,
        metavar="SECONDS",
        help="the longest wait a request may ask for; a longer one is refused "
        "(wait_too_long; default 86400, 24 h)",
    )
    for flag, code in (
        ("--max-waiting-per-user", "too_many_waiting"),
        ("--max-leases-per-user", "too_many_leases"),
        ("--max-jobs-per-user", "too_many_jobs"),
    ):
        b.add_argument(
            flag,
            type=int,
            default=1024,
            metavar="N",
            help=f"per OS user, at most N (default 1024; past it: {code})",
        )
    b.add_argument(
        "--max-finished-jobs-per-user",
        type=int,
        default=100,
        metavar="N",
        help="per OS user, the newest N finished jobs are kept (default 100; older ones are "
        "dropped)",
    )
    b.add_argument(
        "--max-chunks-per-user",
        type=int,
        default=1_000_000,
        metavar="N",
        help="per OS user, at most N chunk ids kept for its jobs' reports (default 1000000; "
        "past it the oldest finished jobs are dropped, then: too_many_chunks)",
    )
    b.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="the broker's config file, TOML ([shares]: project = weight); default: "
        "broker.toml in the data directory, when it exists",
    )
    b.add_argument("-v", "--verbose", action="store_true", help="log every lease")


def _status_arguments(s: argparse.ArgumentParser) -> None:
    """`rbroker status`'s arguments."""
    _add_socket(s)
    shown = s.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="print the raw JSON")
    shown.add_argument("--watch", action="store_true", help="live until q or Ctrl-C (= top)")


def _top_arguments(t: argparse.ArgumentParser) -> None:
    """`rbroker top`'s arguments."""
    t.description = (
        "The local broker's GPUs with capacity bars, its leases, its queue with "
        "each request's reason and ETA, and its jobs with their progress, read again on the "
        "broker's changes and every 5 s "
        "until q or Ctrl-C. The same as `rbroker status --watch`."
    )
    t.epilog = "exit codes: 0; 69 no broker answers at the start"
    _add_socket(t)
    t.add_argument("--once", action="store_true", help="draw one frame and exit")


def _run_arguments(r: argparse.ArgumentParser) -> None:
    """`rbroker run`'s arguments."""
    import argparse

    r.description = (
        "Lease GPU memory, run COMMAND with CUDA_VISIBLE_DEVICES set to the "
        "granted GPU(s), release the lease when it exits. By default it does not wait: "
        "with no room now it exits 75 at once; --wait SECONDS queues for room and says "
        "what it waits for. The lease's project, session and purpose are shown to every "
        "user of this computer and, when it is enrolled, sent to its coordinator; without "
        "--session and --purpose they come from the command's file name ('python' and 'run "
        "python' for 'python train.py'): set them to say what others should see (never a "
        "secret)."
    )
    r.epilog = (
        "exit codes: the command's own; 69 no broker; 75 no room now (or within "
        "--wait); 2 refused (infeasible, bad input, description rejected); 126 the command "
        "cannot be started, 127 it is not found"
    )
    _add_socket(r)
    r.add_argument(
        "--mib",
        type=int,
        help="GPU memory to lease on each GPU, MiB (required, except with --booking: the "
        "booking's unclaimed MiB)",
    )
    r.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="how many GPUs (default 1; with --booking, the booking's)",
    )
    r.add_argument(
        "--booking",
        metavar="ID",
        default=None,
        help="claim this booking of yours (from rbroker book): from its start the lease is "
        "granted on its GPUs ahead of the queue",
    )
    r.add_argument(
        "--gpu", dest="gpu_uuid", metavar="UUID", help="pin to this GPU (UUID from rbroker status)"
    )
    r.add_argument(
        "--project", default="default", help="project the lease is for (default: 'default')"
    )
    r.add_argument("--session", default=None, help="session name (default: the command's name)")
    r.add_argument(
        "--purpose", default=None, help="what the lease is for (default: 'run <command name>')"
    )
    r.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="queue up to SECONDS for room (default 0: do not wait, exit 75 at once)",
    )
    r.add_argument(
        "--ttl",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="heartbeat window: the lease ends this long after this process stops renewing "
        "it (default 30)",
    )
    r.add_argument(
        "--expected",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long the command will likely run: requests waiting behind its lease are told "
        "they will likely fit when it ends (a hint: nothing stops the command)",
    )
    r.add_argument(
        "--cuda-devices",
        choices=("auto", "index", "uuid"),
        default="auto",
        help="how CUDA_VISIBLE_DEVICES names the granted GPU: 'index' (with "
        "CUDA_DEVICE_ORDER=PCI_BUS_ID, what tools that parse integers need), 'uuid' (GPU-… or "
        "MIG-…), or 'auto' (default: the index, the UUID for MIG slices)",
    )
    r.add_argument(
        "cmd",
        nargs=argparse.REMAINDER,
        help="-- COMMAND [ARGS...]; {mib}, {fraction} and {gpu} in ARGS become the grant "
        "in MiB, its fraction of the GPU and the CUDA_VISIBLE_DEVICES value",
    )


def _release_arguments(rl: argparse.ArgumentParser) -> None:
    """`rbroker release`'s arguments."""
    rl.description = (
        "End one of your own leases now, or cancel one of your waiting requests. "
        "ID is a lease's id or a unique prefix of it (e.g. 3f2a1b or lease-3f2a1b), or a "
        "waiting request's req-N, as `rbroker status` shows them. The broker's user, root and "
        "its --admin-group may end anyone's (the reason says 'released by admin USER')."
    )
    _add_socket(rl)
    rl.add_argument(
        "lease", metavar="ID", help="lease id or a unique prefix of it, or req-N (a request)"
    )


def _book_arguments(bk: argparse.ArgumentParser) -> None:
    """`rbroker book`'s arguments."""
    bk.usage = (
        "rbroker book --mib N [--gpus K] [--gpu UUID] --start WHEN "
        "(--for DURATION | --until WHEN) --project P --purpose TEXT [--session S] [--json]\n"
        "       rbroker book cancel ID"
    )
    bk.description = (
        "Book MiB on GPUs for a wall-clock window: the broker accepts it only "
        "where it fits beside the other bookings of that window (else it says the arithmetic "
        "and the nearest window where it fits) and keeps that memory for you from its start; "
        "claim it then with `rbroker run --booking ID -- COMMAND`. WHEN: 14:00, 'tomorrow "
        "09:30', 'mon 14:00', +2h, 'in 90m', an ISO 8601 date-time, 'now' (local time). "
        "DURATION: 4h, 90m, 1h30m, 2:30. `rbroker book cancel ID` cancels one of yours."
    )
    bk.epilog = "exit codes: 0; 2 refused (does not fit, a bound, bad input); 69 no broker"
    _add_socket(bk)
    bk.add_argument("action", nargs="?", choices=("cancel",), help="cancel the booking ID")
    bk.add_argument("booking_id", nargs="?", metavar="ID", help="the booking to cancel")
    bk.add_argument("--mib", type=int, help="GPU memory to book on each GPU, MiB")
    bk.add_argument("--gpus", type=int, default=1, help="how many GPUs (default 1)")
    bk.add_argument("--gpu", dest="gpu_uuid", metavar="UUID", help="book on this GPU")
    bk.add_argument("--start", metavar="WHEN", help="when it starts (local time)")
    length = bk.add_mutually_exclusive_group()
    length.add_argument("--for", dest="duration", metavar="DURATION", help="how long")
    length.add_argument(
        "--until",
        metavar="WHEN",
        help="when it ends, read from the start: 18:00 is the first 18:00 after the start, "
        "+4h four hours after it (local time)",
    )
    bk.add_argument("--project", help="project the booking is for")
    bk.add_argument("--purpose", help="what it is for (shown to every user of this computer)")
    bk.add_argument("--session", help="session name (default: 'rbroker book')")
    bk.add_argument("--json", action="store_true", help="print the booking as JSON")


def _bookings_arguments(bl: argparse.ArgumentParser) -> None:
    """`rbroker bookings`'s arguments."""
    bl.epilog = "exit codes: 0; 2 refused; 69 no broker"
    _add_socket(bl)
    bl.add_argument(
        "--all", action="store_true", help="also the bookings ended, lapsed or cancelled"
    )
    bl.add_argument("--json", action="store_true", help="print the raw JSON")


def _watch_arguments(w: argparse.ArgumentParser) -> None:
    """`rbroker watch`'s arguments."""
    w.epilog = "exit codes: 0 room now; 75 none within --timeout; 2 refused; 69 no broker"
    _add_socket(w)
    w.add_argument("--mib", type=int, required=True, help="MiB on each GPU")
    w.add_argument("--gpus", type=int, default=1, help="how many GPUs at once (default 1)")
    w.add_argument("--gpu", dest="gpu_uuid", metavar="UUID", help="only this GPU")
    w.add_argument("--expected", type=float, metavar="SECONDS", help="how long you would hold it")
    w.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="give up after this long (exit 75); default: wait until Ctrl-C",
    )
    w.add_argument("--json", action="store_true", help="print the answer as JSON")


def _audit_arguments(au: argparse.ArgumentParser) -> None:
    """`rbroker audit`'s arguments."""
    au.description = (
        "The broker's record of actions that touch another user's work or the "
        "whole computer: an administrator ending a lease or cancelling a request or booking, "
        "admissions paused and resumed, an idle lease reclaimed by [idle], a refusal by "
        "[members]. Oldest first, times in the "
        "local zone; a record that does not verify (a line edited or removed) is said first. "
        "Only the broker's user, root and its --admin-group may read it."
    )
    au.epilog = "exit codes: 0; 2 refused (not an administrator); 69 no broker"
    _add_socket(au)
    au.add_argument(
        "--limit", type=int, default=200, metavar="N", help="the newest N entries (default 200)"
    )
    au.add_argument("--json", action="store_true", help="print the raw JSON")


def _jobs_arguments(j: argparse.ArgumentParser) -> None:
    """`rbroker jobs`'s arguments."""
    _add_socket(j)
    j.add_argument("--json", action="store_true", help="print the raw JSON")
    j.add_argument("--active", action="store_true", help="hide finished jobs")
    j.add_argument("--watch", action="store_true", help="refresh live until Ctrl-C")


def _enroll_arguments(e: argparse.ArgumentParser) -> None:
    """`rbroker enroll`'s arguments."""
    e.add_argument("url", help="coordinator URL, e.g. https://rbroker.example.org:8787")
    e.add_argument("code", help="one-time enrollment code from the coordinator's admin")
    e.add_argument("--name", help="this computer's display name (default: host name)")
    e.add_argument("--ca-file", help="PEM CA certificate of a self-signed coordinator")
    e.add_argument("--data-dir", help="the broker's data directory (default: per-user)")
    e.add_argument(
        "--key-file",
        action="store_true",
        help="keep the private key in a 0600 file in the data dir (where no OS keyring that "
        "keeps it encrypted exists: a server, a service account)",
    )
    e.add_argument(
        "--new-identity",
        action="store_true",
        help="enroll again with a new key even though this data dir is enrolled",
    )


def _fleet_arguments(f: argparse.ArgumentParser) -> None:
    """`rbroker fleet`'s arguments."""
    f.add_argument("--token", help="viewer token (default: sign with this computer's key)")
    f.add_argument("--url", help="coordinator URL (default: the enrolled one)")
    f.add_argument("--ca-file", help="PEM CA certificate of a self-signed coordinator")
    f.add_argument("--data-dir", help="the broker's data directory (default: per-user)")
    f.add_argument("--json", action="store_true", help="print the raw JSON")
    f.add_argument(
        "--room",
        type=_room_mib,
        metavar="MIB",
        help="only where MIB MiB are available on a GPU at the last report, freshest first "
        "(a view: nothing is reserved); exit 1 when no computer has the room",
    )
    f.add_argument(
        "--gpus",
        type=_room_gpus,
        metavar="K",
        help="with --room: on K GPUs of one computer (default 1)",
    )


def _demo_arguments(d: argparse.ArgumentParser) -> None:
    """`rbroker demo`'s arguments."""
    d.description = (
        "Start a broker, a coordinator on SQLite and eight worker processes that "
        "lease GPU memory (simulated GPUs unless an NVIDIA driver answers); some wait with "
        "the arithmetic of why, one is killed mid-run, a parallel job reports progress; then "
        "a summary. Setting up takes a few seconds (said as it goes), the worker part about "
        "--seconds."
    )
    d.add_argument(
        "--seconds",
        type=_demo_seconds,
        default=20.0,
        help="length of the worker part, 10 to 600 s (default 20: about 30 s in all)",
    )
    d.add_argument("--no-live", action="store_true", help="plain log lines instead of a live view")
    d.add_argument(
        "--keep",
        action="store_true",
        help="after the summary, keep the broker and the coordinator running until Ctrl-C",
    )
    d.add_argument(
        "--simulate", action="store_true", help="simulated GPUs even where an NVIDIA driver answers"
    )


def _service_arguments(s: argparse.ArgumentParser) -> None:
    """`rbroker service`'s arguments (`rbroker.cli.service_cmd`)."""
    from rbroker.cli.service_cmd import add_service_arguments

    add_service_arguments(s)


def _tray_arguments(p: argparse.ArgumentParser) -> None:
    """`rbroker tray`'s arguments (`rbroker.tray`, which imports no Qt)."""
    from rbroker.tray import add_tray_arguments

    add_tray_arguments(p)


SUBCOMMANDS: tuple[tuple[str, str, Callable[[argparse.ArgumentParser], None]], ...] = (
    ("broker", "run the local broker in the foreground", _broker_arguments),
    ("status", "GPU capacity and leases of the local broker", _status_arguments),
    ("top", "the local broker live: GPUs, leases, queue, jobs (q or Ctrl-C quits)", _top_arguments),
    ("run", "hold a lease while a command runs", _run_arguments),
    (
        "release",
        "end a lease or cancel a waiting request (for a holder that cannot)",
        _release_arguments,
    ),
    ("book", "book GPU memory ahead for a time window (or: book cancel ID)", _book_arguments),
    (
        "bookings",
        "bookings of the local broker: a table and the next 24 hours per GPU",
        _bookings_arguments,
    ),
    ("watch", "wait until MiB could be granted to you now (nothing is taken)", _watch_arguments),
    (
        "audit",
        "the broker's audit trail: actions on others' work or the computer (admins)",
        _audit_arguments,
    ),
    ("jobs", "parallel jobs: progress, items per second, ETA", _jobs_arguments),
    ("enroll", "join a coordinator group (Ed25519 key in the OS keyring)", _enroll_arguments),
    ("fleet", "the group's computers from the coordinator", _fleet_arguments),
    (
        "demo",
        "watch real processes lease GPU memory from a local broker (about 30 s)",
        _demo_arguments,
    ),
    ("service", "the broker as a Windows service (shared workstations)", _service_arguments),
    ("tray", "the desktop tray app (starts the broker)", _tray_arguments),
)
"""Each subcommand in `rbroker --help`'s order: its name, its line in that help, and what
adds its own description and arguments."""


LOCAL_CLIENTS = ("status", "top", "run", "release", "book", "bookings", "watch", "audit", "jobs")
"""The subcommands that talk to the local broker as its clients, briefly: a quick start
(`rbroker.base.lazy.quick_start`): what only some calls need loads on first use, and their
messages go through the standard library's json, whose import costs less than orjson's,
which a command's few messages do not make up (issue 44). The broker, the tray and the demo
load as jobs do."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of every subcommand; given `command` (a subcommand's name, as
    `chosen_command` reads it), only that one's arguments are added: every other subcommand
    is there with its name and help line, which is all that `rbroker --help` and the top
    level's errors show, but empty. Adding every subcommand's arguments (and importing what
    `service` and `tray` take them from) cost about a fifth of `rbroker status --json`'s own
    start (issue 44)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="rbroker", description="GPU memory leases on shared computers."
    )
    parser.add_argument("--version", action="version", version=f"rbroker {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text, add_arguments in SUBCOMMANDS:
        p = sub.add_parser(name, help=help_text)
        if command is None or command == name:
            add_arguments(p)
    return parser


def chosen_command(argv: list[str]) -> str | None:
    """The subcommand that argparse will parse `argv` with: its first word that does not
    start with `-` (the top level's options, `-h` and `--version`, take no value, and `--`
    leaves the next word the subcommand), when that names a subcommand; else None (no
    subcommand, or an unknown one: every subcommand's arguments are then added, and
    argparse says what is wrong as it always did)."""
    word = next((w for w in argv if not w.startswith("-")), None)
    return word if any(word == name for name, _, _ in SUBCOMMANDS) else None


def _cuda_devices_form(text: str) -> str:
    """`rbroker run --cuda-devices`'s value, one of its choices.

    Raises:
        ValueError: another (argparse then says which are allowed).
    """
    if text not in ("auto", "index", "uuid"):
        raise ValueError(text)
    return text


QUICK: dict[str, tuple[dict[str, object], dict[str, QuickOption]]] = {
    "status": (
        {"socket": None, "json": False, "watch": False},
        {
            "--socket": ("socket", socket_option),
            "--json": ("json", None),
            "--watch": ("watch", None),
        },
    ),
    "run": (
        {
            "socket": None,
            "mib": None,
            "gpus": None,
            "booking": None,
            "gpu_uuid": None,
            "project": "default",
            "session": None,
            "purpose": None,
            "wait": 0.0,
            "ttl": 30.0,
            "expected": None,
            "cuda_devices": "auto",
            "cmd": [],
        },
        {
            "--socket": ("socket", socket_option),
            "--mib": ("mib", int),
            "--gpus": ("gpus", int),
            "--booking": ("booking", str),
            "--gpu": ("gpu_uuid", str),
            "--project": ("project", str),
            "--session": ("session", str),
            "--purpose": ("purpose", str),
            "--wait": ("wait", float),
            "--ttl": ("ttl", float),
            "--expected": ("expected", float),
            "--cuda-devices": ("cuda_devices", _cuda_devices_form),
        },
    ),
}
"""The subcommands `quick_args` reads without argparse: each one's namespace as argparse
leaves it when no option is given, and its options (the exact option string → the
attribute it sets and how its value is read; None: a flag that sets True). They must say what
`build_parser` says: tests/desktop/cli/test_cli_parser.py compares both on many command lines."""


def quick_args(argv: list[str]) -> argparse.Namespace | None:
    """`argv` read as argparse would, without loading argparse (with the gettext, locale and
    shutil it loads: a measurable part of `rbroker status --json`'s start, issue 44;
    bench/RESULTS.md), for the plain command lines of `QUICK`'s subcommands:
    the subcommand first, then its options each written out in full (`--mib 100` or
    `--mib=100`) with a value that does not start with `-`, then (`rbroker run`) `--` or the
    command's first word and the rest as the command. None for anything else, and for a
    value argparse would refuse: argparse then reads `argv` and says what is wrong, as always.
    The namespace is a `types.SimpleNamespace` with argparse's attributes."""
    if not argv or argv[0] not in QUICK:
        return None
    command = argv[0]
    defaults, options = QUICK[command]
    values: dict[str, object] = {"command": command, **defaults}
    words = iter(range(1, len(argv)))
    for i in words:
        word = argv[i]
        if command == "run" and (word == "--" or not word.startswith("-")):
            values["cmd"] = argv[i:]  # argparse.REMAINDER: the rest, `--` kept
            break
        name, equals, given = word.partition("=")
        option = options.get(name)
        if option is None:
            return None  # -h, an abbreviation, a positional where none is taken, …
        dest, read = option
        if read is None:  # a flag
            if equals:
                return None
            values[dest] = True
            continue
        if not equals:
            if i + 1 == len(argv):
                return None  # no value: argparse says so
            given = argv[i + 1]
            next(words, None)
        if given.startswith("-"):
            return None  # argparse reads it as an option, or as a negative number
        try:
            values[dest] = read(given)
        except Exception:  # argparse says why, in its words
            return None
    if values.get("json") and values.get("watch"):
        return None  # not allowed together: argparse says so
    import types

    return types.SimpleNamespace(**values)  # type: ignore[return-value]  # argparse's attributes


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rbroker` console script; returns the exit code (130 after a
    Ctrl-C that the command did not handle itself: never a KeyboardInterrupt traceback)."""
    given = sys.argv[1:] if argv is None else argv
    install = given[:1] == ["broker"] and len(given) > 1 and given[1] in _install_actions()
    args = None
    if not install:
        args = quick_args(given) or build_parser(chosen_command(given)).parse_args(argv)
    _never_fail_on_output()
    if args is not None and args.command in LOCAL_CLIENTS:
        from rbroker.base.lazy import quick_start

        quick_start()
    try:
        if args is None:  # `rbroker broker install-system`: a parser of its own
            from rbroker.cli.install_system import run as run_install

            return run_install(given[1:])
        return _dispatch(args)
    except KeyboardInterrupt:
        import signal  # its enums are built at import: only for this rare exit

        return 128 + signal.SIGINT
    except BrokenPipeError:  # `rbroker bookings | head -1`: the reader left, as for any tool
        _quiet_stdout()
        return 0


def _install_actions() -> tuple[str, ...]:
    """`rbroker broker install-system` and `uninstall-system`: the words that take the
    system install's own parser (imported only after `rbroker broker`)."""
    from rbroker.cli.install_system import ACTIONS

    return ACTIONS


def _never_fail_on_output() -> None:
    """Characters this output's encoding cannot print (an ASCII or Latin-1 terminal, a
    pipe read as such) are replaced, never a UnicodeEncodeError traceback."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="replace")


def _quiet_stdout() -> None:
    """Point stdout at the null device, so flushing it at exit writes nothing into a pipe
    whose reader has gone (which would print a second BrokenPipeError)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "broker":
        from rbroker.cli.broker_cmd import run_broker

        return run_broker(args)
    if args.command == "top" or (args.command == "status" and args.watch):
        from rbroker.cli.top import run_top

        return run_top(args)
    if args.command == "status":
        from rbroker.cli.status import run_status

        return run_status(args)
    if args.command == "run":
        from rbroker.cli.run import run_command

        return run_command(args)
    if args.command == "release":
        from rbroker.cli.release import run_release

        return run_release(args)
    if args.command == "book":
        from rbroker.cli.bookings import run_book

        return run_book(args)
    if args.command == "bookings":
        from rbroker.cli.bookings import run_bookings

        return run_bookings(args)
    if args.command == "watch":
        from rbroker.cli.watch import run_watch

        return run_watch(args)
    if args.command == "audit":
        from rbroker.cli.audit import run_audit

        return run_audit(args)
    if args.command == "jobs":
        from rbroker.cli.jobs import run_jobs

        return run_jobs(args)
    if args.command == "enroll":
        from rbroker.cli.uplink_cmds import run_enroll

        return run_enroll(args)
    if args.command == "fleet":
        from rbroker.cli.uplink_cmds import run_fleet

        return run_fleet(args)
    if args.command == "demo":
        from rbroker.cli.demo import run_demo

        return run_demo(args)
    if args.command == "service":
        from rbroker.cli.service_cmd import run_service

        return run_service(args)
    if args.command == "tray":
        from rbroker.tray import run_tray

        return run_tray(args)
    return 2  # pragma: no cover - argparse enforces the choices


if __name__ == "__main__":
    sys.exit(main())
