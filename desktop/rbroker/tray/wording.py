"""Messages shown in the tray's window, in the window's words. No Qt here.

Errors from shared code may name a command-line flag (`pass --ca-file …`); a tray user has
no command line, so every message the window shows passes through `gui_text`, which names
the Settings control that does the same thing instead, and drops any other flag.
"""

from __future__ import annotations

import re

FLAG_WORDS = {
    "--ca-file": 'the "CA file" setting',
    "--key-file": 'the "Keep the private key in a file" option',
    "--new-identity": '"Enroll again"',
    "--data-dir": "the broker's data directory",
    "--token": "a viewer token",
    "--url": "the coordinator URL",
}
"""Flags that shared messages may name → what the Settings tab calls the same thing."""

_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def gui_text(message: str) -> str:
    """`message` without command-line flags: known ones become the Settings control's name,
    any other one is dropped (a flag never reaches a window)."""
    message = re.sub(r"\b(pass|use|add|give) (?=--[a-z])", "choose ", message)
    for flag, words in FLAG_WORDS.items():
        message = re.sub(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", words, message)
    message = _FLAG.sub("", message)
    return re.sub(r"  +", " ", message).strip()


def error_text(exc: BaseException) -> str:
    """An exception for the window: the tray form of uplink errors (`for_gui()`), else its
    text, in either case through `gui_text`."""
    for_gui = getattr(exc, "for_gui", None)
    text = for_gui() if callable(for_gui) else str(exc) or type(exc).__name__
    return gui_text(str(text))


IDLE_MEANING = (
    "Idle: no GPU utilization by the lease's processes and no job progress for the broker's "
    "idle_after_s (30 min unless its broker.toml says otherwise)."
)
"""What a lease's `idle …` state means (docs/architecture.md §3 "Idle"), for a tool tip."""


def idle_tip(idle_state: object) -> str:
    """What a lease's `idle 2 h 10 min` or `idle: unknown` (`idle_state` `idle` or `unknown`)
    means, for the tool tip under it: why it is unknown, then what idle means."""
    if idle_state != "unknown":
        return IDLE_MEANING
    return (
        "Unknown: the GPU utilization of the lease's processes cannot be read here (MIG "
        "without per-process counters, a process in another pid namespace), so it is never "
        f"counted idle.\n{IDLE_MEANING}"
    )
