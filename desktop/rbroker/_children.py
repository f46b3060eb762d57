"""Child processes that do not outlive the rbroker process that started them."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal this process gets when the thread that forked it exits."""


def die_with_parent() -> None:  # pragma: no cover - runs in the child, before exec
    """Linux: this process gets SIGTERM when its parent dies without cleaning up (also on
    kill -9 of the parent). A no-op elsewhere. For `preexec_fn`: it only calls prctl."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
