"""Child processes that do not outlive the rbroker process that started them."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys

if sys.platform == "win32":
    HARD_KILL: int = signal.SIGTERM
    STOP_SIGNALS: tuple[int, ...] = (signal.SIGTERM,)
else:
    HARD_KILL = signal.SIGKILL
    STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# HARD_KILL: the signal for `Popen.send_signal` that ends a child at once: SIGKILL on POSIX;
# on Windows SIGTERM, which `Popen.send_signal` turns into TerminateProcess (no SIGKILL there).
# STOP_SIGNALS: signals besides SIGINT that ask an rbroker command to stop (SIGHUP: the
# terminal closed; Windows has no SIGHUP).

PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal this process gets when the thread that forked it exits."""


def die_with_parent() -> None:  # pragma: no cover - runs in the child, before exec
    """Linux: this process gets SIGTERM when its parent dies without cleaning up (also on
    kill -9 of the parent). A no-op elsewhere. For `preexec_fn`: it only calls prctl."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
