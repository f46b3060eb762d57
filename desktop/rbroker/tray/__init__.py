"""The desktop face of rbroker: a PySide6 tray app and its main window (architecture.md §9).

This module imports no Qt: `rbroker tray` and the `rbroker-tray` gui-script come here
first, and a missing PySide6 ends with a message naming the extra to install. Everything
that imports PySide6 lives in the submodules of this package (and only there, architecture.md §1).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from rbroker.base.version import __version__
from rbroker.client.paths import socket_option

MISSING_QT = (
    "rbroker tray needs PySide6, which is not installed.\n"
    "Install rbroker with its desktop extra, from the wheel built in a clone (uv build):\n"
    f"  pip install 'dist/rbroker-{__version__}-py3-none-any.whl[desktop]'\n"
    "or, in the clone itself:  pip install '.[desktop]'\n"
    "(installed with uv tool or pipx: uv tool install --force, or pipx install --force, "
    "with the same wheel and [desktop])"
)


def add_tray_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `rbroker tray` (shared by the CLI subcommand and `rbroker-tray`)."""
    p.add_argument(
        "--socket",
        type=socket_option,
        help="broker socket path (default: RBROKER_SOCKET, else the system broker when it "
        "answers, else per-user)",
    )
    p.add_argument("--data-dir", type=Path, help="state directory of an in-process broker")
    p.add_argument(
        "--simulate",
        nargs="?",
        const="",
        default=None,
        metavar="SCENARIO.toml",
        help="start the in-process broker on simulated GPUs (default scenario or the file)",
    )
    p.add_argument("--headroom-mib", type=int, help="headroom per GPU of an in-process broker")
    p.add_argument(
        "--attach-only",
        action="store_true",
        help="never start a broker; wait for one to appear at the socket",
    )
    p.add_argument("--show", action="store_true", help="open the main window at start")
    p.add_argument("-v", "--verbose", action="store_true", help="log to stderr")


def qt_available() -> bool:
    """True when PySide6 can be imported."""
    try:
        return importlib.util.find_spec("PySide6") is not None
    except (ImportError, ValueError):
        return False


def run_tray(args: argparse.Namespace) -> int:
    """Run the tray app until the user quits. Exit codes: 0 quit, 1 cannot start (no
    PySide6), 3 another instance already runs (it was asked to show its window), and, when
    the broker it would start could not listen or keep its state, the startup codes of
    `rbroker_protocol.startup` (10 socket path too long, 11 permission denied, 13 read-only
    file system, 14 no space, 19 other OS error), each with one line on stderr."""
    if not qt_available():
        print(MISSING_QT, file=sys.stderr)
        return 1
    from rbroker.tray.xcb import check

    problem = check()  # before Qt: a plugin that cannot load would abort without names
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    from rbroker.tray.app import run

    return run(args)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rbroker-tray` gui-script."""
    parser = argparse.ArgumentParser(prog="rbroker-tray", description="rbroker tray app")
    add_tray_arguments(parser)
    return run_tray(parser.parse_args(argv))


__all__ = ["MISSING_QT", "add_tray_arguments", "main", "qt_available", "run_tray"]
